"""The registry of indexed roots shared by the CLI, `serve`, the tools and MCP."""

from __future__ import annotations

import dataclasses
import queue
import shutil
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from memstrata import Config, InvalidInputError, PathOutsideRootError
from memstrata._workspaces import Workspaces, detect_kind
from memstrata.errors import RootMissingError
from tests._support import write_tree
from tests.fakes import BreakableEmbedder, FakeEmbedder


@pytest.fixture
def registry(data_dir: Path) -> Iterator[Workspaces]:
    config = Config(data_dir=data_dir)
    config = dataclasses.replace(config, files=dataclasses.replace(config.files, watch_debounce_ms=50))
    with Workspaces(data_dir, config=config, embedder=FakeEmbedder()) as workspaces:
        yield workspaces


def test_kind_detection(tmp_path: Path) -> None:
    assert detect_kind(write_tree(tmp_path / "a", {"MEMORY.md": "x"})) == "memory"
    assert detect_kind(write_tree(tmp_path / "b", {"memory/2025-01-01.md": "x"})) == "memory"
    assert detect_kind(write_tree(tmp_path / "c", {"src/app.py": "x = 1\n"})) == "code"
    project = write_tree(tmp_path / "d", {"src/app.py": "x = 1\n", "memory/knowledge/a1.sqlite": ""})
    assert detect_kind(project, project / "memory") == "code"  # memstrata's data dir, not notes
    assert detect_kind(project, tmp_path / "elsewhere") == "memory"


def test_a_project_holding_the_data_dir_as_memory_is_indexed_as_code(tmp_path: Path) -> None:
    """``Config(data_dir="./memory")`` in a project: auto-detection indexes the project's code."""
    project = write_tree(tmp_path / "shop", {"src/cart.py": "def total(items):\n    return sum(items)\n"})
    with Workspaces(project / "memory", embedder=FakeEmbedder()) as registry:
        ws, stats = registry.index(project)
        assert ws.kind == "code" and stats.files_processed == 1


def test_index_registers_once_and_resyncs(registry: Workspaces, tmp_path: Path) -> None:
    root = write_tree(tmp_path / "ws", {"MEMORY.md": "# A\n\nalpha beta\n"})
    ws, stats = registry.index(root)
    assert ws.kind == "memory" and stats.files_processed == 1
    again, stats = registry.index(str(root) + "/")  # another spelling of the same folder
    assert again.root == ws.root and stats.files_processed == 0 and stats.files_unchanged == 1
    assert [w.root for w in registry.roots()] == [root.resolve()]
    assert registry.roots()[0].last_stats is not None


def test_one_root_can_be_indexed_as_both_kinds(registry: Workspaces, tmp_path: Path) -> None:
    root = write_tree(
        tmp_path / "repo", {"MEMORY.md": "# Notes\n\nuse the parser\n", "parser.py": "def parse(): ...\n"}
    )
    registry.index(root, kind="memory")
    registry.index(root, kind="code")
    assert sorted(w.kind for w in registry.find(root)) == ["code", "memory"]
    hits = registry.search("parser", max_results=10, min_score=0)
    assert {h.kind for h in hits} == {"memory", "code"}
    assert registry.forget(root, "code") == 1
    assert [w.kind for w in registry.find(root)] == ["memory"]


def test_a_root_whose_folder_is_gone_can_be_forgotten(registry: Workspaces, tmp_path: Path) -> None:
    """A search warns that the folder is missing and says to forget it: forget must then work."""
    root = write_tree(tmp_path / "gone", {"a.py": "def gone(): return 'gonetoken'\n"})
    ws, _ = registry.index(root, kind="code")
    assert ws.db_path.exists()
    shutil.rmtree(root)
    with pytest.raises(InvalidInputError, match="does not exist"):
        registry.forget(tmp_path / "never-indexed")  # a missing folder that no root is: refused
    with pytest.raises(InvalidInputError, match="does not exist"):
        registry.forget(root, "memory")  # gone, and not registered as that kind: nothing to match
    assert registry.forget(root, "code") == 1
    assert registry.roots() == [] and not ws.db_path.exists()


def test_get_reads_a_root_of_both_kinds_through_the_kind_that_serves_the_file(
    registry: Workspaces, tmp_path: Path
) -> None:
    root = write_tree(
        tmp_path / "repo", {"MEMORY.md": "# Notes\n\nuse the parser\n", "parser.py": "def parse(): ...\n"}
    )
    registry.index(root, kind="memory")
    registry.index(root, kind="code")
    for path in ("parser.py", str(root / "parser.py")):  # the memory index serves only notes
        text = registry.get(path)
        assert (text.kind, text.path, text.text) == ("code", "parser.py", "def parse(): ...")
    for path in ("MEMORY.md", str(root / "MEMORY.md")):  # both serve it: the memory index, first
        text = registry.get(path)
        assert (text.kind, text.text) == ("memory", "# Notes\n\nuse the parser")
    registry.forget(root, "code")
    with pytest.raises(InvalidInputError, match=r"'parser\.py' is not served: only MEMORY\.md"):
        registry.get("parser.py")  # the one kind left says why it does not serve it


def test_a_memory_workspace_inside_a_code_root_serves_both_and_lines_come_once(
    registry: Workspaces, tmp_path: Path
) -> None:
    """An agent's notes inside its repository: get serves every hit a search returns, from
    whichever root serves the file, and lines two roots both hold come back once."""
    repo = write_tree(
        tmp_path / "agent",
        {
            "README.md": "# Agent\n\nthe retry helper lives in tools\n",
            "workspace/MEMORY.md": "# Notes\n\nthe retry helper needs a jitter\n",
            "workspace/tools.py": "def retry_helper():\n    return 'jitter'\n",
        },
    )
    registry.index(repo, kind="code")
    registry.index(repo / "workspace", kind="memory")
    hits = registry.search("retry helper jitter", max_results=20, min_score=0)
    places = [(h.absolute_path, h.start_line, h.end_line) for h in hits]
    assert len(places) == len(set(places))
    assert repo.resolve() / "workspace" / "tools.py" in {p for p, _, _ in places}
    for hit in hits:
        text = registry.get(str(hit.absolute_path), from_line=hit.start_line, lines=1)
        assert text.lines == 1, hit
    assert registry.get(str(repo / "workspace" / "tools.py")).kind == "code"
    assert registry.get(str(repo / "workspace" / "MEMORY.md")).kind == "memory"  # the deepest first


def test_a_search_whose_sync_fails_says_its_results_may_be_stale(
    registry: Workspaces, tmp_path: Path
) -> None:
    """The root swapped for a symlink: the search answers from what was indexed, incomplete and
    with a warning naming the root and why, never as if it were up to date."""
    root = write_tree(tmp_path / "ws", {"MEMORY.md": "# A\n\nalpha beta\n"})
    registry.index(root)
    assert registry.search("alpha").warnings == []
    root.rename(tmp_path / "ws.bak")
    root.symlink_to(tmp_path / "ws.bak")
    found = registry.search("alpha")
    assert [h.path for h in found] == ["MEMORY.md"] and found.complete is False
    assert len(found.warnings) == 1 and "sync before search failed" in found.warnings[0]
    assert found.warnings[0].startswith(f"{tmp_path.resolve() / 'ws'} (memory): ")
    with pytest.raises(InvalidInputError, match=r"was indexed as a folder and is now a symlink to .*ws\.bak"):
        registry.get("MEMORY.md", root=root)


def test_registry_persists(data_dir: Path, tmp_path: Path) -> None:
    root = write_tree(tmp_path / "ws", {"MEMORY.md": "# A\n\nalpha\n"})
    with Workspaces(data_dir, embedder=FakeEmbedder()) as first:
        first.index(root)
    with Workspaces(data_dir, embedder=FakeEmbedder()) as second:
        assert [w.root for w in second.roots()] == [root.resolve()]
        assert second.search("alpha")[0].path == "MEMORY.md"


def test_get_resolution(registry: Workspaces, tmp_path: Path) -> None:
    outer = write_tree(tmp_path / "outer", {"MEMORY.md": "outer line\n"})
    inner = write_tree(outer / "inner", {"MEMORY.md": "inner line\n"})
    registry.index(outer)
    registry.index(inner)
    assert registry.get(str(inner / "MEMORY.md")).root == inner.resolve()  # the deepest root wins
    assert registry.get(str(outer / "MEMORY.md")).text == "outer line"
    assert registry.get("MEMORY.md", root=inner).text == "inner line"
    with pytest.raises(PathOutsideRootError):
        registry.get(str(tmp_path / "elsewhere.md"))
    with pytest.raises(PathOutsideRootError):
        registry.get("../MEMORY.md", root=inner)
    with pytest.raises(InvalidInputError, match="NUL"):
        registry.get("MEMORY\x00.md")
    with pytest.raises(InvalidInputError, match="is not indexed"):
        registry.search("x", root=tmp_path)


def test_bad_arguments(registry: Workspaces, tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="does not exist"):
        registry.index(tmp_path / "missing")
    (tmp_path / "file.txt").write_text("x", encoding="utf-8")
    with pytest.raises(InvalidInputError, match="not a directory"):
        registry.index(tmp_path / "file.txt")
    with pytest.raises(InvalidInputError, match="kind"):
        registry.index(tmp_path, kind="video")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="max_results"):
        registry.search("x", max_results=0)


def test_watch_hands_each_failure_to_on_error_with_its_root(data_dir: Path, tmp_path: Path) -> None:
    root = write_tree(tmp_path / "ws", {"MEMORY.md": "# Start\n\nnothing yet\n"})
    flaky = BreakableEmbedder()
    config = Config(data_dir=data_dir)
    config = dataclasses.replace(config, files=dataclasses.replace(config.files, watch_debounce_ms=50))
    failures: queue.Queue[tuple[Any, BaseException]] = queue.Queue()
    with Workspaces(data_dir, config=config, embedder=flaky) as registry:
        registry.index(root)
        flaky.broken = True
        registry.watch(root, on_error=lambda ws, exc: failures.put((ws, exc)))
        (root / "memory").mkdir()
        (root / "memory" / "a.md").write_text("a note the model cannot embed\n", encoding="utf-8")
        ws, exc = failures.get(timeout=30)
        assert ws.root == root.resolve() and "model crashed" in str(exc)
        flaky.broken = False
        shutil.rmtree(root)
        ws, exc = failures.get(timeout=30)
        assert ws.root == root.resolve() and isinstance(exc, RootMissingError)


def test_concurrent_searches_and_reads(registry: Workspaces, tmp_path: Path) -> None:
    files = {
        f"memory/2025-01-{d:02d}.md": f"# Day {d}\n\nworked on feature {d} today\n" for d in range(1, 21)
    }
    root = write_tree(tmp_path / "ws", files)
    registry.index(root)

    def work(n: int) -> Any:
        day = n % 20 + 1
        hits = registry.search(f"feature {day}", max_results=3, min_score=0)
        text = registry.get(f"memory/2025-01-{day:02d}.md", lines=1).text
        return hits, text

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(work, range(64)))
    for n, (hits, text) in enumerate(results):
        assert hits and text == f"# Day {n % 20 + 1}"


def test_watch_keeps_the_index_in_sync(registry: Workspaces, tmp_path: Path) -> None:
    root = write_tree(tmp_path / "ws", {"MEMORY.md": "# Start\n\nnothing yet\n"})
    synced = threading.Event()
    seen: list[Any] = []

    def on_synced(ws: Any, stats: Any) -> None:
        seen.append(stats)
        if stats.files_processed:
            synced.set()

    assert [w.root for w in registry.watch(root, on_synced=on_synced)] == [root.resolve()]
    (root / "memory").mkdir()
    (root / "memory" / "2025-02-02.md").write_text("The kiln reached 1200 degrees.\n", encoding="utf-8")
    assert synced.wait(30), seen
    assert registry.search("kiln degrees")[0].path == "memory/2025-02-02.md"
    assert registry.find(root)[0].last_sync_at is not None
    registry.close()
    registry.close()  # idempotent
