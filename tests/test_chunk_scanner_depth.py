"""Files nested deeper than a grammar's external scanner can hold (tree-sitter-yaml crashes at 254
open blocks, tree-sitter-python at 384 to 511 indentation levels inside a string) are chunked
without their syntax tree: still indexed and searchable, the reason in the log.

The chunker runs in a child process: a regression kills the child (SIGSEGV), not pytest.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from memstrata.layers._chunk_file import chunk_file
from memstrata.layers._chunk_scanners import scanner_overflow
from tests._support import REPO


def _yaml_map(n: int) -> str:
    return "".join("  " * i + f"k{i}:\n" for i in range(n)) + "  " * n + "deepvalue\n"


def _yaml_seq(n: int) -> str:
    return "".join("  " * i + "-\n" for i in range(n)) + "  " * n + "deepvalue\n"


def _yaml_keys_then_dashes(n: int) -> str:
    """A key and a sequence at the same indentation: two open blocks a level."""
    return "".join("  " * i + "k:\n" + "  " * i + "-\n" for i in range(n)) + "  " * n + "deepvalue\n"


def _python_ifs(n: int) -> str:
    """``n`` nested blocks and a string inside the deepest one."""
    return "".join(" " * i + f"if x{i}:\n" for i in range(n)) + " " * n + 'deep = """deepvalue"""\n'


DEEP = {
    "map.yaml": _yaml_map(300),
    "seq.yml": _yaml_seq(300),
    "dashes.yaml": "- " * 300 + "deepvalue\n",
    "questions.yaml": "? " * 300 + "deepvalue\n",
    "pairs.yaml": _yaml_keys_then_dashes(150),
    "block.yaml": _yaml_map(260)[: -len("deepvalue\n")] + "s: |\n" + "  " * 261 + "deepvalue\n",
    "error.yaml": '"x" ' + "- " * 300 + "deepvalue\n",  # blocks opened while the parser recovers
    "deep.py": _python_ifs(520),
}

CHILD = """
import json, logging, sys
logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
from memstrata.layers._chunk_file import chunk_file
for name, text in json.loads(sys.stdin.read()).items():
    print(name, file=sys.stderr, flush=True)  # the last name printed is the file a crash was in
    language, chunks = chunk_file(name, text, tokens=64, overlap=0)
    covered = sorted({n for c in chunks for n in range(c.start_line, c.end_line + 1)})
    print(json.dumps([name, language, len(chunks), covered == list(range(1, text.count(chr(10)) + 1))]))
"""


def _child(code: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``code`` run by a new interpreter, which must exit 0: a scanner's crash kills the child
    (-11), and the test fails instead of the test run."""
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"exit {done.returncode}; stderr ends: {done.stderr[-300:]}"
    return done


def _chunk_in_child(files: dict[str, str]) -> tuple[list[list[Any]], str]:
    done = _child(CHILD, stdin=json.dumps(files))
    return [json.loads(line) for line in done.stdout.splitlines()], done.stderr


def test_files_too_deep_for_their_scanner_are_chunked_line_by_line_and_say_why() -> None:
    results, log = _chunk_in_child(DEEP)
    assert [(name, chunks > 0, whole) for name, _, chunks, whole in results] == [
        (name, True, True) for name in DEEP
    ]
    for name in DEEP:
        (line,) = [line for line in log.splitlines() if line.startswith("INFO") and f"{name}:" in line]
        assert "chunked without its syntax tree" in line, line


def test_flow_collections_and_ordinary_depths_keep_their_syntax_tree() -> None:
    """``[[[`` and ``{a: {`` keep no scanner state; 150 levels of blocks are far from the limit."""
    files = {
        "flow.yaml": "k: " + "[" * 2000 + "]" * 2000 + "\n",
        "ok.yaml": _yaml_map(150),
        "ok.py": _python_ifs(90),
    }
    results, log = _chunk_in_child(files)
    assert [name for name, *_ in results] == list(files)
    assert "chunked without" not in log


def test_a_yaml_file_just_below_the_limit_is_read_by_its_syntax_tree() -> None:
    assert scanner_overflow(".yaml", _yaml_map(190)) is None
    assert scanner_overflow(".yaml", _yaml_map(200)) is not None
    _, chunks = chunk_file("ok.yaml", _yaml_map(190), tokens=64, overlap=0)
    assert chunks[0].symbol == "k0"  # a key path: chunked by its syntax tree


@pytest.mark.parametrize("text", [_yaml_map(254), _yaml_seq(254), _yaml_keys_then_dashes(127), "- " * 254])
def test_the_bound_reaches_the_crash_depth_of_every_block_shape(text: str) -> None:
    reason = scanner_overflow(".yml", text)
    assert reason is not None and "YAML" in reason


def test_python_counts_the_indentation_widths_a_string_could_sit_under() -> None:
    assert scanner_overflow(".py", _python_ifs(299)) is None
    assert scanner_overflow(".py", _python_ifs(300)) is not None
    tabs_and_continuations = "".join("\t" * i + "x = 1 + \\\n" + " " * i + "2\n" for i in range(1, 200))
    assert scanner_overflow(".py", tabs_and_continuations) is not None  # 8 per tab, + spaces after `\\`


def test_other_languages_are_never_refused() -> None:
    assert scanner_overflow(".json", "[" * 10_000 + "]" * 10_000) is None
    assert scanner_overflow(".md", "".join("  " * i + "- item\n" for i in range(600))) is None
    assert scanner_overflow(".txt", _yaml_map(300)) is None


CHILD_INDEX = """
import sys
from pathlib import Path
from memstrata import Codebase, Config
from tests.fakes import FakeEmbedder
root, data = Path(sys.argv[1]), Path(sys.argv[2])
with Codebase.open(root, config=Config(data_dir=data), embedder=FakeEmbedder()) as index:
    stats = index.sync()
    print(stats.files_processed, len(stats.skipped))
    print(" ".join(sorted(hit.path for hit in index.search("deepvalue", mode="keyword"))))
"""


def test_a_deep_yaml_file_is_indexed_and_found(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    root.mkdir()
    (root / "deep.yaml").write_text(_yaml_map(300), encoding="utf-8")
    (root / "ok.py").write_text("def ok():\n    return 1\n", encoding="utf-8")
    done = _child(CHILD_INDEX, str(root), str(tmp_path / "data"))
    assert done.stdout.splitlines() == ["2 0", "deep.yaml"]
