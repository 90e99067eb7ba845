"""Searching several indexed roots: one ranking across roots, a broken root skipped, degraded joined."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from memstrata import Config, InvalidInputError, PathOutsideRootError
from memstrata._workspaces import Workspaces
from memstrata.bridges import tools
from memstrata.bridges._app import CliState
from memstrata.bridges._operations import Context, find
from memstrata.bridges.cli import cli
from memstrata.errors import EmbeddingError, StorageError
from memstrata.layers import Codebase, MemoryFiles
from tests._support import write_tree
from tests.fakes import BreakableEmbedder, FakeEmbedder


@pytest.fixture
def registry(data_dir: Path) -> Iterator[Workspaces]:
    with Workspaces(data_dir, config=Config(data_dir=data_dir), embedder=FakeEmbedder()) as workspaces:
        yield workspaces


def _notes(base: Path) -> Path:
    return write_tree(
        base / "ws",
        {
            "MEMORY.md": "# Ops\n\nThe deploy key lives in the vault under ci deploy.\n",
            "memory/deploy.md": "# Deploy\n\nThe deploy key rotates monthly.\n",
        },
    )


# -- one ranking across roots ---------------------------------------------------------------------


def test_an_unrelated_root_does_not_outrank_the_notes_that_answer(
    registry: Workspaces, tmp_path: Path
) -> None:
    """Each root scores its own best hit 1.0: an unrelated codebase's nearest chunk must not
    push a note that answers out of the results."""
    notes = _notes(tmp_path)
    unrelated = write_tree(
        tmp_path / "unrelated", {"linalg.py": "def matrix_multiply(a, b):\n    return a @ b\n"}
    )
    registry.index(notes)
    registry.index(unrelated, kind="code")
    alone = registry.search("where is the deploy key", root=unrelated)
    assert [h.path for h in alone] == ["linalg.py"] and alone[0].score == 1.0  # its own best
    top = registry.search("where is the deploy key", max_results=2)
    assert {h.path for h in top} == {"MEMORY.md", "memory/deploy.md"}
    every = registry.search("where is the deploy key", max_results=3)
    assert every[-1].path == "linalg.py" and every[-1].score < every[1].score
    assert [h.score for h in every] == sorted((h.score for h in every), reverse=True)


def test_equal_hits_of_two_roots_rank_in_root_order(registry: Workspaces, tmp_path: Path) -> None:
    source = {"util.py": "def parse_config(path):\n    return path\n"}
    second = write_tree(tmp_path / "second", source)
    first = write_tree(tmp_path / "first", source)
    registry.index(second, kind="code")  # registered first: listed first
    registry.index(first, kind="code")
    for _ in range(2):
        hits = registry.search("parse config", max_results=5)
        assert [h.root for h in hits] == [second.resolve(), first.resolve()]
        assert hits[0].score > hits[1].score


def test_a_single_root_keeps_its_own_ranking(data_dir: Path, tmp_path: Path) -> None:
    code = write_tree(
        tmp_path / "src",
        {
            "a.py": "def parse_config(path):\n    return open(path).read()\n",
            "b.py": "def load_settings(path):\n    return parse_config(path)\n",
            "c.py": "def render(template):\n    return template.format()\n",
        },
    )
    embedder = FakeEmbedder()
    config = Config(data_dir=data_dir)
    with Workspaces(data_dir, config=config, embedder=embedder) as registry:
        ws, _ = registry.index(code, kind="code")
        found = [(h.path, h.score, h.match_type) for h in registry.search("parse config path", max_results=3)]
    with Codebase.open(code, db_path=ws.db_path, embedder=embedder, config=config) as layer:
        direct = [(h.path, h.score, h.match_type) for h in layer.search("parse config path", top_k=3)]
    assert found == direct


# -- a root that cannot be opened or searched ------------------------------------------------------


def _with_extra_path(config: Config, path: Path) -> Config:
    return dataclasses.replace(config, files=dataclasses.replace(config.files, extra_paths=(str(path),)))


def test_a_failed_index_leaves_nothing_registered(data_dir: Path, tmp_path: Path) -> None:
    one = write_tree(
        tmp_path / "ws1", {"MEMORY.md": "# One\n\nalpha\n", "notes/extra.md": "the heron is grey\n"}
    )
    two = write_tree(tmp_path / "ws2", {"MEMORY.md": "# Two\n\nbeta notes about herons\n"})
    config = _with_extra_path(Config(data_dir=data_dir), one / "notes")  # absolute: inside ws1 only
    with Workspaces(data_dir, config=config, embedder=FakeEmbedder()) as registry:
        registry.index(one)
        files = sorted((data_dir / "workspaces").iterdir())
        with pytest.raises(PathOutsideRootError, match=r"extra_paths entry .* is outside the workspace"):
            registry.index(two)
        assert [w.root for w in registry.roots()] == [one.resolve()]
        assert sorted((data_dir / "workspaces").iterdir()) == files
        found = registry.search("heron")
        assert [h.path for h in found] == ["notes/extra.md"] and found.warnings == []


def test_a_new_root_whose_first_sync_fails_is_not_registered(data_dir: Path, tmp_path: Path) -> None:
    kept = write_tree(tmp_path / "kept", {"MEMORY.md": "# Kept\n\nalpha\n"})
    new = write_tree(tmp_path / "new", {"MEMORY.md": "# New\n\nbeta\n"})
    model = BreakableEmbedder()
    with Workspaces(data_dir, config=Config(data_dir=data_dir), embedder=model) as registry:
        registry.index(kept)
        files = sorted((data_dir / "workspaces").iterdir())
        model.broken = True
        with pytest.raises(EmbeddingError, match="model crashed"):
            registry.index(new)
        assert [w.root for w in registry.roots()] == [kept.resolve()]
        assert sorted((data_dir / "workspaces").iterdir()) == files
        (kept / "memory").mkdir()
        (kept / "memory" / "b.md").write_text("gamma\n", encoding="utf-8")
        with pytest.raises(EmbeddingError, match="model crashed"):
            registry.index(kept)  # a root indexed before stays, whatever its sync does
        assert [w.root for w in registry.roots()] == [kept.resolve()]


def test_a_root_that_cannot_be_opened_is_skipped_with_a_warning(data_dir: Path, tmp_path: Path) -> None:
    """A config that one root refuses: the other roots still answer; that root alone raises."""
    one = write_tree(
        tmp_path / "ws1", {"MEMORY.md": "# One\n\nalpha\n", "notes/extra.md": "the heron is grey\n"}
    )
    two = write_tree(tmp_path / "ws2", {"MEMORY.md": "# Two\n\nbeta notes about the heron\n"})
    with Workspaces(data_dir, config=Config(data_dir=data_dir), embedder=FakeEmbedder()) as registry:
        registry.index(one)
        registry.index(two)
    config = _with_extra_path(Config(data_dir=data_dir), one / "notes")
    with Workspaces(data_dir, config=config, embedder=FakeEmbedder()) as registry:
        found = registry.search("heron")
        assert {h.root for h in found} == {one.resolve()} and found.complete is True
        assert len(found.warnings) == 1
        assert found.warnings[0].startswith(f"memory root {str(two.resolve())!r} cannot be searched: skipped")
        assert "PathOutsideRootError: files.extra_paths entry" in found.warnings[0]
        with pytest.raises(PathOutsideRootError, match="extra_paths"):
            registry.search("heron", root=two)


def test_a_root_whose_index_is_damaged_is_skipped_with_a_warning(data_dir: Path, tmp_path: Path) -> None:
    notes = _notes(tmp_path)
    code = write_tree(tmp_path / "code", {"keys.py": "DEPLOY_KEY_PATH = 'ci/deploy'\n"})
    with Workspaces(data_dir, config=Config(data_dir=data_dir), embedder=FakeEmbedder()) as registry:
        registry.index(notes)
        damaged, _ = registry.index(code, kind="code")
    for suffix in ("-wal", "-shm"):
        Path(str(damaged.db_path) + suffix).unlink(missing_ok=True)
    damaged.db_path.write_bytes(bytes(range(256)) * 16)
    with Workspaces(data_dir, config=Config(data_dir=data_dir), embedder=FakeEmbedder()) as registry:
        found = registry.search("deploy key")
        assert found and {h.root for h in found} == {notes.resolve()}
        assert len(found.warnings) == 1 and str(code.resolve()) in found.warnings[0]
        assert "code root" in found.warnings[0] and "Error: " in found.warnings[0]
        with pytest.raises(StorageError):
            registry.search("deploy key", root=code)


def test_a_root_whose_search_fails_is_skipped_but_a_bad_argument_is_refused(
    registry: Workspaces, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    notes = _notes(tmp_path)
    code = write_tree(tmp_path / "code", {"keys.py": "DEPLOY_KEY_PATH = 'ci/deploy'\n"})
    registry.index(notes)
    registry.index(code, kind="code")

    def failing(self: Codebase, query: str, **options: Any) -> Any:
        raise StorageError("disk I/O error")

    monkeypatch.setattr(Codebase, "search", failing)
    found = registry.search("deploy key")
    assert found and {h.root for h in found} == {notes.resolve()}
    assert found.warnings == [
        f"code root {str(code.resolve())!r} cannot be searched: skipped (StorageError: disk I/O error)"
    ]
    with pytest.raises(StorageError, match="disk I/O error"):
        registry.search("deploy key", root=code)
    with pytest.raises(InvalidInputError, match="max_results"):
        registry.search("deploy key", max_results=5000)  # the same for every root: an error


# -- degraded ranking ------------------------------------------------------------------------------


def _degrading(monkeypatch: pytest.MonkeyPatch, layer: type[Any], reason: str) -> None:
    original = layer.search

    def search(self: Any, query: str, **options: Any) -> Any:
        found = original(self, query, **options)
        found.degraded = reason
        return found

    monkeypatch.setattr(layer, "search", search)


def test_degraded_is_the_distinct_reasons_of_the_roots(
    registry: Workspaces, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    notes = _notes(tmp_path)
    more = write_tree(tmp_path / "more", {"MEMORY.md": "# More\n\nthe deploy key is old\n"})
    code = write_tree(tmp_path / "code", {"keys.py": "DEPLOY_KEY_PATH = 'ci/deploy'\n"})
    for root in (notes, more):
        registry.index(root)
    registry.index(code, kind="code")
    assert registry.search("deploy key").degraded is None
    failed = "the query embedding failed: model crashed; ranked by keywords only"
    _degrading(monkeypatch, MemoryFiles, failed)
    assert registry.search("deploy key").degraded == failed  # two roots, one reason: said once
    assert registry.search("deploy key", root=code).degraded is None
    _degrading(monkeypatch, Codebase, "the code index is keyword-only")
    found = registry.search("deploy key")
    assert found.degraded == f"{failed}; the code index is keyword-only"
    wire = find("search_files").run(Context(None, registry), {"query": "deploy key"})
    assert wire["degraded"] == found.degraded
    said = tools.dispatch("memory_search", {"query": "deploy key"}, None, workspaces=registry)
    assert said["degraded"] == f"files: {found.degraded}"  # the tool names the part it concerns
    shown = CliRunner().invoke(
        cli,
        ["--data-dir", str(registry.data_dir), "search", "deploy key"],
        obj=CliState(embedder=FakeEmbedder()),
    )
    assert shown.exit_code == 0 and f"warning: {failed}; the code index" in shown.stderr
