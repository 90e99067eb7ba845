"""Which files an index holds, how the tree is walked, and how files are read safely.

One set of rules (:class:`SourceRules`) decides both what a sync indexes and what ``get()``
serves, so ``get()`` can never return a file the index could not hold. Nothing outside the
root is read, even while the tree changes: every walk and every read goes through
:mod:`._safe_fs`, which resolves paths one component at a time from a descriptor of the root
with ``O_NOFOLLOW`` (no path string is handed to the kernel to resolve). Directories that are
symlinks are never entered (no loops, no escapes); a file symlink is followed, by reading its
link text, only when its target is a regular file inside the root; a file is opened with
``O_NOFOLLOW | O_NONBLOCK`` and its ``fstat`` checked (a FIFO or a device never blocks or
streams). Files over the size cap or with a NUL byte in their first 8 KB (binary, or UTF-16 or
UTF-32 text, named so by its byte-order mark) are skipped; invalid UTF-8 is decoded with U+FFFD
replacement characters. A file or directory whose name is not valid UTF-8 is skipped (its path
could not be stored or sent as text) and reported with the bad bytes escaped (:func:`shown`).
"""

from __future__ import annotations

import errno
import fnmatch
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from memstrata.core.closing import Closeable
from memstrata.core.errors import InvalidInputError, PathOutsideRootError
from memstrata.core.validation import has_lone_surrogate, show_path

from . import _safe_fs as safe_fs
from ._chunk import normalize_newlines

__all__ = [
    "MEMORY_FILE_NAMES",
    "Entry",
    "Scan",
    "SkipFile",
    "SourceReader",
    "SourceRules",
    "decode",
    "inside",
    "read_source",
    "read_under",
    "resolve_request",
    "scan",
]

Kind = Literal["memory", "codebase"]
MEMORY_FILE_NAMES = ("MEMORY.md", "memory.md")
MEMORY_DIR = "memory"
BINARY_PROBE = 8192
_PROSE_EXTENSIONS = (".md", ".markdown")
_DRIVE = re.compile(r"^[A-Za-z]:")
_WINDOWS = os.name == "nt"  # where drive letters and backslashes lead out of a root
NOT_UTF8_FILE = "file name is not valid UTF-8"
NOT_UTF8_DIR = "directory name is not valid UTF-8, not entered"


class SkipFile(Exception):
    """A file the rules allow but that cannot be indexed or served; ``reason`` says why."""

    def __init__(self, reason: str, *, sticky: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.sticky = sticky  # the same (size, mtime, mode) will give the same answer: remember it


@dataclass(frozen=True, slots=True)
class SourceRules:
    """Name rules of one index kind. ``allows`` and ``descend`` never touch the filesystem."""

    kind: Kind
    extensions: frozenset[str] = frozenset()
    pruned: frozenset[str] = frozenset()
    exclude: tuple[str, ...] = ()
    extra: tuple[str, ...] = ()  # memory: normalised relative paths inside the root
    max_bytes: int = 2_000_000
    _excluded: re.Pattern[str] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.exclude:  # one regex for every pattern: the walk tests each file against it
            pattern = "|".join(f"(?:{fnmatch.translate(p)})" for p in self.exclude)
            object.__setattr__(self, "_excluded", re.compile(pattern))

    def excluded(self, rel: str) -> bool:
        if self._excluded is None:
            return False
        name = rel.rsplit("/", 1)[-1]
        return self._excluded.match(name) is not None or self._excluded.match(rel) is not None

    def file_in_walk(self, rel: str, name: str) -> bool:
        """:meth:`allows` for a file in a directory the walk entered (its parents are allowed)."""
        if self.kind == "memory":
            return self.allows(rel)
        if name.startswith(".") or os.path.splitext(name)[1].lower() not in self.extensions:
            return False
        return not self.excluded(rel)

    def _dir_ok(self, part: str) -> bool:
        return not part.startswith(".") and (self.kind == "memory" or part not in self.pruned)

    def allows(self, rel: str) -> bool:
        """Whether a file at relative posix path ``rel`` is a source of this index."""
        parts = rel.split("/")
        if not rel or any(p in ("", ".", "..") for p in parts) or self.excluded(rel):
            return False
        if not all(self._dir_ok(p) for p in parts[:-1]) or parts[-1].startswith("."):
            return False
        if any(self.excluded("/".join(parts[:n])) for n in range(1, len(parts))):
            return False  # inside an excluded directory, which a walk never enters
        if self.kind == "codebase":
            return os.path.splitext(parts[-1])[1].lower() in self.extensions
        if rel in MEMORY_FILE_NAMES:
            return True
        is_prose = parts[-1].lower().endswith(_PROSE_EXTENSIONS)
        if parts[0] == MEMORY_DIR and len(parts) > 1 and is_prose:
            return True
        return any(rel == extra or (rel.startswith(extra + "/") and is_prose) for extra in self.extra)

    def descend(self, rel_dir: str) -> bool:
        """Whether a walk enters directory ``rel_dir`` ("" is the root)."""
        if not rel_dir:
            return True
        parts = rel_dir.split("/")
        if not all(self._dir_ok(p) for p in parts) or self.excluded(rel_dir):
            return False
        if self.kind == "codebase":
            return True
        if parts[0] == MEMORY_DIR:
            return True
        return any(
            rel_dir == extra or rel_dir.startswith(extra + "/") or extra.startswith(rel_dir + "/")
            for extra in self.extra
        )

    def describe(self) -> str:
        if self.kind == "codebase":
            return (
                f"files with extensions {', '.join(sorted(self.extensions))} outside hidden and pruned "
                "directories"
            )
        extra = "".join(f", {e}" for e in self.extra)
        return f"MEMORY.md, memory.md, memory/**/*.md{extra}"


@dataclass(frozen=True, slots=True)
class Entry:
    """A source file found by a walk: where it is and what ``stat`` said."""

    rel: str
    target: str  # relative path of the file read (differs from rel only for a symlinked file)
    size: int
    mtime_ns: int
    mode: int


@dataclass(slots=True)
class Scan:
    files: dict[str, Entry] = field(default_factory=dict)
    skipped: list[tuple[str, str]] = field(default_factory=list)


def inside(root: str, real: str) -> bool:
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def scan(root: Path, rules: SourceRules) -> Scan:
    """Walk ``root`` (already resolved) by ``rules``: an ``fstatat`` per candidate file relative
    to the descriptor of the directory listed, nothing read, no symlinked directory entered."""
    result = Scan()
    root_str = str(root)
    try:
        root_fd = safe_fs.open_root(root_str)
    except OSError as exc:  # never read an unmounted or deleted root as "every file was deleted"
        raise InvalidInputError(f"root {root_str} is no longer a readable directory ({_why(exc)})") from exc

    def unreadable(rel: str, refused: safe_fs.Refused) -> None:
        if refused.problem == "symlink":  # swapped for a symlink after it was listed
            result.skipped.append((rel, "symlinked directory, not followed"))
        elif refused.problem != "missing":
            result.skipped.append((rel, f"directory not readable ({refused.strerror})"))

    def descend(rel_dir: str) -> bool:
        if not rules.descend(rel_dir):
            return False
        if not has_lone_surrogate(rel_dir):  # its parents were checked when they were entered
            return True
        result.skipped.append((show_path(rel_dir), NOT_UTF8_DIR))
        return False

    try:
        try:
            for rel_dir, dir_fd, entries in safe_fs.walk(root_fd, descend, unreadable):
                for entry in entries:
                    rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
                    try:
                        is_link = entry.is_symlink()
                    except OSError:
                        continue
                    if not rules.file_in_walk(rel, entry.name):
                        if is_link and rules.descend(rel) and _leads_to_dir(dir_fd, entry.name):
                            result.skipped.append((show_path(rel), "symlinked directory, not followed"))
                        continue
                    if has_lone_surrogate(entry.name):
                        result.skipped.append((show_path(rel), NOT_UTF8_FILE))
                        continue
                    if is_link:
                        _add_link(result, root_fd, root_str, rel, rules)
                    else:
                        _add_file(result, rel, entry, rules)
        except OSError as exc:
            raise InvalidInputError(
                f"root {root_str} is no longer a readable directory ({_why(exc)})"
            ) from exc
        if os.fstat(root_fd).st_nlink == 0:  # removed while it was listed
            raise InvalidInputError(f"root {root_str} is no longer a readable directory (removed)")
    finally:
        os.close(root_fd)
    return result


def _leads_to_dir(dir_fd: int, name: str) -> bool:
    """Whether symlink ``name`` points at a directory: only reported, never entered (one
    ``stat``, which reads no content)."""
    try:
        return stat.S_ISDIR(os.stat(name, dir_fd=dir_fd).st_mode)
    except OSError:
        return False


def _add_file(result: Scan, rel: str, entry: os.DirEntry[str], rules: SourceRules) -> None:
    try:
        st = entry.stat(follow_symlinks=False)  # fstatat relative to the listed directory
    except OSError as exc:
        result.skipped.append((rel, f"cannot stat ({_why(exc)})"))
        return
    _add_stat(result, rel, rel, st, rules)


def _add_link(result: Scan, root_fd: int, root: str, rel: str, rules: SourceRules) -> None:
    """A symlinked file counts when its target, followed inside the root only, is a regular file."""
    try:
        resolved = safe_fs.resolve_links(root_fd, root, rel.split("/"))
    except safe_fs.Refused as refused:
        result.skipped.append((rel, _link_reason(refused)))
        return
    if not resolved.parts:
        result.skipped.append((rel, "not a regular file"))
        return
    _add_stat(result, rel, "/".join(resolved.parts), resolved.st, rules)


def _link_reason(refused: safe_fs.Refused) -> str:
    if refused.problem == "outside":
        return "symlink leads outside the root"
    if refused.problem == "loop":
        return "symlink loop"
    if refused.problem in ("missing", "not_dir"):
        return f"cannot stat ({refused.strerror or 'No such file or directory'})"
    return f"cannot stat ({refused.strerror})"


def _add_stat(result: Scan, rel: str, target: str, st: os.stat_result, rules: SourceRules) -> None:
    if not stat.S_ISREG(st.st_mode):
        result.skipped.append((rel, "not a regular file"))
        return
    if st.st_size > rules.max_bytes:
        result.skipped.append((rel, f"larger than {rules.max_bytes} bytes"))
        return
    result.files[rel] = Entry(rel, target, st.st_size, st.st_mtime_ns, st.st_mode)


def _why(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def read_source(root: Path | str, target: str, max_bytes: int) -> tuple[bytes, os.stat_result]:
    """The bytes of regular file ``target`` (relative to ``root``) of at most ``max_bytes``,
    opened component by component from the root's descriptor, no symlink followed; raises
    :class:`SkipFile`."""
    try:
        root_fd = safe_fs.open_root(root)
    except OSError as exc:
        raise SkipFile(f"root not readable ({_why(exc)})") from exc
    try:
        return read_under(root_fd, target, max_bytes)
    finally:
        os.close(root_fd)


class SourceReader(Closeable):
    """Reads many files of one root through one descriptor of it (what a sync does)."""

    def __init__(self, root: Path | str) -> None:
        self._root = str(root)
        self._fd: int | None = None

    def read(self, target: str, max_bytes: int) -> tuple[bytes, os.stat_result]:
        """:func:`read_source` of ``target``; raises :class:`SkipFile`."""
        if self._fd is None:
            try:
                self._fd = safe_fs.open_root(self._root)
            except OSError as exc:
                raise SkipFile(f"root not readable ({_why(exc)})") from exc
        return read_under(self._fd, target, max_bytes)

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def read_under(root_fd: int, target: str, max_bytes: int) -> tuple[bytes, os.stat_result]:
    """:func:`read_source` relative to an open root descriptor (a sync reads many files)."""
    try:
        fd, st = safe_fs.open_file(root_fd, safe_fs.split_parts(target))
    except safe_fs.Refused as refused:
        raise SkipFile(_read_reason(refused), sticky=refused.errno == errno.EACCES) from None
    except InvalidInputError as exc:
        raise SkipFile(f"not readable ({exc})") from None
    try:
        if not stat.S_ISREG(st.st_mode):
            raise SkipFile("not a regular file")
        if st.st_size > max_bytes:
            raise SkipFile(f"larger than {max_bytes} bytes")
        data = safe_fs.read_limited(fd, max_bytes)
    except OSError as exc:
        raise SkipFile(f"not readable ({_why(exc)})") from exc
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise SkipFile(f"larger than {max_bytes} bytes")
    if b"\x00" in data[:BINARY_PROBE]:
        raise SkipFile(_not_text_reason(data), sticky=True)
    return data, st


def _not_text_reason(data: bytes) -> str:
    """Why a file with a NUL byte near its start is skipped: UTF-16 and UTF-32 text (a note
    saved so on Windows) has NUL bytes too, and is named by its byte-order mark."""
    if data.startswith((b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")):
        return "not UTF-8 text (UTF-32, by its byte-order mark)"
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "not UTF-8 text (UTF-16, by its byte-order mark)"
    return "binary (NUL byte in the first 8 KB)"


def _read_reason(refused: safe_fs.Refused) -> str:
    if refused.problem == "symlink":
        return f"symlink in path at {refused.where!r} (changed during the read), not followed"
    if refused.problem in ("missing", "not_dir"):
        return "vanished during the sync"
    return f"not readable ({refused.strerror})"


def decode(data: bytes) -> str:
    """UTF-8 (a BOM is dropped), invalid bytes replaced by U+FFFD, newlines normalised."""
    return normalize_newlines(data.decode("utf-8-sig", errors="replace"))


def _leaves_by_its_start(path: str) -> bool:
    """Whether ``path`` starts outside any root on this OS: absolute, a home folder that
    ``os.path.expanduser`` would expand (``~``, ``~/x``, ``~user/x``), and on Windows a drive
    (``C:x``) or a backslash. Elsewhere ``~notes.py`` and ``C:x.py`` are plain file names."""
    if os.path.isabs(path) or (path.startswith("~") and os.path.expanduser(path) != path):
        return True
    return _WINDOWS and (path.startswith(("/", "\\")) or _DRIVE.match(path) is not None)


def normalise_relative(path: object, *, what: str = "path") -> str:
    """A safe relative posix path from user input, or a clear error naming the problem."""
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str):
        raise InvalidInputError(f"{what} must be a string, got {type(path).__name__}")
    if not path.strip() or "\x00" in path:
        raise InvalidInputError(f"{what} must be a non-empty relative path, got {path!r}")
    if _leaves_by_its_start(path):
        raise PathOutsideRootError(
            f"{what} {path!r} is absolute or home-relative; give a path relative to the root"
        )
    pieces = re.split(r"[/\\]", path) if _WINDOWS else path.split("/")
    if ".." in pieces:
        raise PathOutsideRootError(f"{what} {path!r} contains '..'; paths must stay inside the root")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts:
        raise InvalidInputError(f"{what} {path!r} names the root itself, not a file")
    return "/".join(parts)


def resolve_request(root: Path, path: object, rules: SourceRules) -> tuple[str, str]:
    """``(rel, target)`` of a file ``get()`` may serve (``target`` is where a symlinked file
    leads, inside the root), or :class:`PathOutsideRootError` / :class:`InvalidInputError` with
    the reason. Checks only: the read itself goes through :func:`read_source` again."""
    rel = normalise_relative(path)
    if has_lone_surrogate(rel):  # never indexed (see scan), so never served
        raise InvalidInputError(f"path '{show_path(rel)}' is not served: its name is not valid UTF-8")
    root_str = str(root)
    parts = rel.split("/")
    try:
        root_fd = safe_fs.open_root(root_str)
    except OSError as exc:
        raise InvalidInputError(f"root {root_str} is not a readable directory ({_why(exc)})") from exc
    try:
        try:
            dir_fd = safe_fs.open_dir(root_fd, parts[:-1])
        except safe_fs.Refused as refused:
            raise _parent_error(root_fd, root_str, rel, refused) from None
        try:
            st = os.stat(parts[-1], dir_fd=dir_fd, follow_symlinks=False)
        except OSError as exc:
            raise InvalidInputError(f"path {rel!r} does not exist") from exc
        finally:
            os.close(dir_fd)
        target = rel
        if stat.S_ISLNK(st.st_mode):
            try:
                resolved = safe_fs.resolve_links(root_fd, root_str, parts)
            except safe_fs.Refused as refused:
                if refused.problem == "outside":
                    raise PathOutsideRootError(f"path {rel!r} is a symlink that leaves the root") from None
                why = "symlink loop" if refused.problem == "loop" else refused.strerror or refused.problem
                raise InvalidInputError(f"path {rel!r} cannot be read ({why})") from None
            target, st = "/".join(resolved.parts), resolved.st
    finally:
        os.close(root_fd)
    if not rules.allows(rel):
        raise InvalidInputError(f"path {rel!r} is not served: only {rules.describe()} are")
    if not target or not stat.S_ISREG(st.st_mode):
        raise InvalidInputError(f"path {rel!r} is not a regular file")
    return rel, target


def _parent_error(root_fd: int, root: str, rel: str, refused: safe_fs.Refused) -> InvalidInputError:
    """The error for a path whose directory part cannot be entered without following a symlink."""
    if refused.problem != "symlink":
        if refused.problem == "unreadable":
            return InvalidInputError(f"path {rel!r} cannot be read ({refused.strerror})")
        return InvalidInputError(f"path {rel!r} does not exist")
    try:  # only to say which error: link texts and lstat, nothing read
        safe_fs.resolve_links(root_fd, root, refused.where.split("/"))
    except safe_fs.Refused as where:
        if where.problem == "outside":
            return PathOutsideRootError(f"path {rel!r} goes through a symlink that leaves the root")
    return InvalidInputError(f"path {rel!r} goes through a symlinked directory, which is never indexed")


def normalise_extra(root: Path, paths: Iterable[str]) -> tuple[str, ...]:
    """Configured extra memory paths as relative posix paths; each must stay inside the root."""
    out = []
    for raw in paths:
        candidate = Path(os.path.expanduser(raw))  # `~drafts.md` names a file when no user has that name
        if candidate.is_absolute():
            resolved = Path(os.path.realpath(candidate))
            if not inside(str(root), str(resolved)):
                raise PathOutsideRootError(f"files.extra_paths entry {raw!r} is outside the workspace {root}")
            rel = resolved.relative_to(root).as_posix()
            if rel in ("", "."):
                raise InvalidInputError(f"files.extra_paths entry {raw!r} is the workspace itself")
        else:
            rel = normalise_relative(raw, what="files.extra_paths entry")
        if rel not in out:
            out.append(rel)
    return tuple(out)
