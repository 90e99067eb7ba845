"""Code-retrieval corpora: real sources in several languages, with their doc comments blanked.

The sources are released packages fetched from package registries by ``make bench-data`` (pip
for Python, Debian's crate source packages for Rust, npm for JavaScript) and unpacked under
``benchmarks/.data/``; this module never touches the network. Go modules come as Debian's
``golang-*-dev`` source packages, like the Rust crates. C++ is LLVM's ``Support`` headers where
Debian's ``llvm-14-dev`` installed them (skipped elsewhere). For each language, every
documented definition gives one query: the first sentence of its doc comment. In the indexed
copy the doc comment's lines are blank (Python docstrings become ``...``), so line numbers are
unchanged and the words of the query are not in the code. The relevant result is the chunk
holding the definition's first line.

``python benchmarks/_corpus_code.py unpack DIR`` unpacks what ``make bench-data`` downloaded.
"""

from __future__ import annotations

import ast
import io
import random
import re
import sys
import tarfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DATA", "FETCHED", "SOURCES", "CodeCorpus", "CodeQuery", "load"]

DATA = Path(__file__).resolve().parent / ".data"

# language -> (archives downloaded by `make bench-data` (glob patterns), folder inside them, file
# suffix, files skipped). Rust crates come as Debian source packages (librust-*-dev).
SOURCES: dict[str, tuple[tuple[str, ...], str, str, tuple[str, ...]]] = {
    "python": (("requests-2.32.3-py3-none-any.whl",), "requests", ".py", ()),
    "rust": (
        (
            "librust-itertools-dev_0.10.3-1_*.deb",
            "librust-bytes-dev_1.2.1-1_*.deb",
            "librust-semver-dev_1.0.14-1_*.deb",
        ),
        "usr/share/cargo/registry",
        ".rs",
        (),
    ),
    # lodash.js and core.js repeat every module's documentation in one file: left out
    "javascript": (("lodash-4.17.21.tgz",), "package", ".js", ("lodash.js", "core.js", "fp.js")),
    # Go modules as Debian source packages (golang-*-dev); doc.go files hold only package docs
    "go": (
        (
            "golang-github-gorilla-mux-dev_1.8.0-1_*.deb",
            "golang-github-google-go-cmp-dev_0.5.9-1_*.deb",
            "golang-github-spf13-cobra-dev_1.6.1-1_*.deb",
        ),
        "usr/share/gocode/src",
        ".go",
        ("doc.go",),
    ),
    # C++: LLVM's Support headers as installed by Debian's llvm-14-dev (read where they are; not
    # fetched by `make bench-data`), indexed under a .hpp name: their .h is C++, not C
    "cpp": ((), "/usr/include/llvm-14/llvm/Support", ".h", ()),
}


# the languages `make bench-data` fetches (C++ is read where the system installed it)
FETCHED = ("python", "rust", "javascript", "go")


@dataclass(frozen=True)
class CodeQuery:
    text: str
    path: str  # relative to the corpus root
    line: int  # 1-based first line of the definition


@dataclass(frozen=True)
class CodeCorpus:
    language: str
    files: dict[str, str]  # path -> source with doc comments blanked
    queries: list[CodeQuery]


def _first_sentence(doc: str) -> str | None:
    text = " ".join(doc.split())
    text = re.split(r"(?<=[.!?])\s", text, maxsplit=1)[0]
    if len(text.split()) < 4 or text.startswith(("@", ":", "..", ">>>", "#")):
        return None
    return text[:300]


def _first_paragraph(doc: list[str]) -> str:
    """The comment's first paragraph: its lines up to the first empty one after some text."""
    paragraph: list[str] = []
    for d in doc:
        if not d.strip():
            if paragraph:
                break
            continue
        paragraph.append(d.strip())
    return " ".join(paragraph)


def _comment_blocks(
    lines: list[str],
    doc: re.Pattern[str],
    is_item: Callable[[str], bool],
    ignored: Callable[[str], bool] = lambda line: False,
) -> Iterator[tuple[int, list[str]]]:
    """The line-comment blocks (lines ``doc`` matches, its group 1 the text; ``ignored`` lines
    end a block) directly above a non-empty line ``is_item`` accepts: that line's index and the
    block's text. The block's lines are blanked in ``lines`` before it is given."""
    i = 0
    while i < len(lines):
        start, text = i, []
        while i < len(lines) and (m := doc.match(lines[i])) and not ignored(lines[i]):
            text.append(m.group(1))
            i += 1
        if not text:
            i += 1
            continue
        if i < len(lines) and lines[i].strip() and is_item(lines[i]):
            for n in range(start, i):
                lines[n] = ""
            yield i, text


# -- Python: docstrings -------------------------------------------------------------------------


def _python(lines: list[str]) -> Iterator[tuple[int, str]]:
    try:
        tree = ast.parse("\n".join(lines))
    except SyntaxError:
        return
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        body = node.body
        if not (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)):
            continue
        if not isinstance(body[0].value.value, str):
            continue
        doc = body[0]
        first, last = doc.lineno, doc.end_lineno or doc.lineno
        indent = re.match(r"\s*", lines[first - 1]).group(0)  # type: ignore[union-attr]
        lines[first - 1] = indent + "..."
        for n in range(first + 1, last + 1):
            lines[n - 1] = ""
        summary = _first_sentence(body[0].value.value.strip().split("\n\n")[0])
        if summary is not None:
            yield node.lineno, summary


# -- Rust (///) and JavaScript (/** */) ----------------------------------------------------------

_RUST_DOC = re.compile(r"^\s*//(/?)(?![/!])(.*)$")
_RUST_SKIP = re.compile(r"^\s*(#\[|$)")
_RUST_ITEM = re.compile(
    r"^\s*(pub\b|fn |struct |enum |impl\b|trait |mod |const |static |type |unsafe |async )"
)


def _rust(lines: list[str]) -> Iterator[tuple[int, str]]:
    """``///`` doc comments, and plain ``//`` comment blocks directly above an item (the
    sources used here document many functions that way)."""
    i = 0
    while i < len(lines):
        if not _RUST_DOC.match(lines[i]):
            i += 1
            continue
        start = i
        doc, is_doc = [], False
        while i < len(lines) and (m := _RUST_DOC.match(lines[i])):
            doc.append(m.group(2))
            is_doc = is_doc or bool(m.group(1))
            i += 1
        j = i
        while j < len(lines) and _RUST_SKIP.match(lines[j]):
            j += 1
        if j >= len(lines) or not (is_doc or _RUST_ITEM.match(lines[j])):
            continue
        for n in range(start, i):
            lines[n] = ""
        summary = _first_sentence(_first_paragraph(doc))
        if summary is not None and _RUST_ITEM.match(lines[j]):
            yield j + 1, summary


def _javascript(lines: list[str]) -> Iterator[tuple[int, str]]:
    i = 0
    while i < len(lines):
        if not lines[i].lstrip().startswith("/**"):
            i += 1
            continue
        doc = []
        while i < len(lines):
            line = lines[i]
            lines[i] = ""
            done = "*/" in line
            doc.append(line.strip().removeprefix("/**").removesuffix("*/").lstrip("*").strip())
            i += 1
            if done:
                break
        j = i
        while j < len(lines) and not lines[j].strip():
            j += 1
        prose = []
        for piece in doc:
            if piece.startswith("@"):
                break
            prose.append(piece)
        summary = _first_sentence(" ".join(prose))
        if j < len(lines) and summary is not None:
            yield j + 1, summary


_GO_DOC = re.compile(r"^\s*//(?![/!])\s?(.*)$")
_GO_ITEM = re.compile(r"^\s*(func |type |var |const )|^\s*[A-Za-z_]\w*(\s+\S.*)?\s*(=|\{|$)")


_GO_NAME = re.compile(r"^\s*(?:func\s+(?:\([^)]*\)\s*)?|type\s+)([A-Za-z_]\w*)")


def _go(lines: list[str]) -> Iterator[tuple[int, str]]:
    """``//`` comment blocks directly above a declaration (Go's doc comments; a ``//go:``
    directive is kept). The declaration may be inside a ``var (`` / ``const (`` group."""
    for i, doc in _comment_blocks(
        lines,
        _GO_DOC,
        lambda line: bool(_GO_ITEM.match(line)),
        lambda line: line.lstrip().startswith("//go:"),
    ):
        summary = _first_sentence(_first_paragraph(doc))
        name = _GO_NAME.match(lines[i])
        if summary is not None and name is not None:
            # Go docs open with the declared name ("Diff returns ..."): a query without it
            first, _, rest = summary.partition(" ")
            if first == name.group(1) and len(rest.split()) >= 3:
                summary = rest[:1].upper() + rest[1:]
            yield i + 1, summary


_CPP_DOC = re.compile(r"^\s*///(?!/)\s?(.*)$")
_CPP_NOT_ITEM = re.compile(r"^\s*(#|//|/\*|\}|(public|private|protected)\s*:)")
_DOXYGEN_BRIEF = re.compile(r"^[\\@]brief\s+")


def _cpp(lines: list[str]) -> Iterator[tuple[int, str]]:
    """Doxygen ``///`` comment blocks directly above a declaration (LLVM's headers); a leading
    ``\\brief`` is dropped from the query."""
    for i, doc in _comment_blocks(lines, _CPP_DOC, lambda line: not _CPP_NOT_ITEM.match(line)):
        summary = _first_sentence(_DOXYGEN_BRIEF.sub("", _first_paragraph(doc)))
        if summary is not None:
            yield i + 1, summary


# a language's blanker blanks the doc comments in a file's lines (in place, so line numbers stay)
# and yields each documented definition's 1-based first line with its query
_BLANKERS = {"python": _python, "rust": _rust, "javascript": _javascript, "go": _go, "cpp": _cpp}


def load(
    language: str, *, max_queries: int, seed: int = 0, data: Path = DATA, offset: int = 0
) -> CodeCorpus | None:
    """The corpus of ``language``, or ``None`` when ``make bench-data`` has not fetched it.

    Queries whose summary is not unique are dropped (they would have several right answers);
    ``max_queries`` of the rest are sampled with ``seed``. ``offset`` skips that many of the
    sample's order first: ``offset=n`` gives queries disjoint from ``max_queries=n`` (held out
    from whatever was tuned on those).
    """
    _, folder, suffix, skipped = SOURCES[language]
    root = data / language / folder
    if not root.is_dir():
        return None
    files: dict[str, str] = {}
    queries: list[CodeQuery] = []
    for path in sorted(root.rglob(f"*{suffix}")):
        if path.name in skipped or path.name.endswith(".min.js"):
            continue
        rel = path.relative_to(root).as_posix()
        if language == "cpp":
            if "/" in rel:
                continue  # the top folder's headers (platform folders repeat them)
            rel = rel.removesuffix(".h") + ".hpp"
        if language == "javascript" and "/" in rel:
            continue  # lodash's fp/ folder: generated wrappers without docs
        if language == "rust" and "/src/" not in f"/{rel}":
            continue  # a crate's library sources, not its tests, benches or examples
        if language == "go" and (path.name.endswith("_test.go") or "/testdata/" in f"/{rel}"):
            continue  # a module's library sources, not its tests
        source = path.read_text(encoding="utf-8", errors="replace").replace("\r\n", "\n")
        lines = source.split("\n")
        queries.extend(CodeQuery(text, rel, line) for line, text in _BLANKERS[language](lines))
        files[rel] = "\n".join(lines)
    counts: dict[str, int] = {}
    for q in queries:
        counts[q.text] = counts.get(q.text, 0) + 1
    unique = [q for q in queries if counts[q.text] == 1]
    random.Random(seed).shuffle(unique)
    picked = unique[offset : offset + max_queries]
    return CodeCorpus(language, files, sorted(picked, key=lambda q: (q.path, q.line)))


def _deb_data(path: Path) -> tarfile.TarFile:
    """The ``data.tar.*`` member of a Debian package (an ``ar`` archive)."""
    blob = path.read_bytes()
    if not blob.startswith(b"!<arch>\n"):
        raise ValueError(f"{path} is not a Debian package")
    pos = 8
    while pos + 60 <= len(blob):
        header = blob[pos : pos + 60]
        name = header[:16].decode("ascii").strip().rstrip("/")
        size = int(header[48:58].decode("ascii").strip())
        start = pos + 60
        if name.startswith("data.tar"):
            return tarfile.open(fileobj=io.BytesIO(blob[start : start + size]))
        pos = start + size + (size % 2)
    raise ValueError(f"{path} has no data.tar member")


def unpack(data: Path) -> None:
    """Unpack each downloaded archive into ``data/<language>/`` (archives come from
    ``data/downloads/``; a missing one is reported and its language skipped)."""
    for language, (patterns, _, _, _) in SOURCES.items():
        if language not in FETCHED:
            continue
        found = [sorted((data / "downloads").glob(pattern)) for pattern in patterns]
        if not all(found):
            missing = [p for p, f in zip(patterns, found, strict=True) if not f]
            print(f"bench-data: {', '.join(missing)} not downloaded; {language} is skipped", file=sys.stderr)
            continue
        target = data / language
        target.mkdir(parents=True, exist_ok=True)
        for source in (f[-1] for f in found):
            if source.name.endswith(".whl"):
                with zipfile.ZipFile(source) as wheel:
                    for name in wheel.namelist():
                        if ".." not in Path(name).parts and not name.startswith("/"):
                            wheel.extract(name, target)
            elif source.name.endswith(".deb"):
                with _deb_data(source) as tar:
                    tar.extractall(target, filter="data")
            else:
                with tarfile.open(source) as tar:
                    tar.extractall(target, filter="data")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "unpack":
        unpack(Path(sys.argv[2]))
    else:
        raise SystemExit("usage: python benchmarks/_corpus_code.py unpack DIR")
