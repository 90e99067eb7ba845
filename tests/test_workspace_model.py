"""The registry of indexed roots loads the configured embedding model once, for every root."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from memstrata import Config
from memstrata._workspaces import Workspaces
from memstrata.core.config import EmbeddingConfig
from memstrata.errors import EmbedderUnavailableError
from tests._support import write_tree
from tests.fakes import FakeEmbedder


def _counting_loader(monkeypatch: pytest.MonkeyPatch, fail: bool = False) -> list[str | None]:
    """Every place a model is loaded from, counting the loads."""
    loads: list[str | None] = []

    def load(model: str | None, *, dim: int | None = None, threads: int | None = None) -> Any:
        loads.append(model)
        if fail:
            raise EmbedderUnavailableError(f"cannot load embedding model {model!r}: not found")
        return FakeEmbedder(dim=dim or 64, model_id=f"configured:{model}")

    monkeypatch.setattr("memstrata.storage.load_embedder", load)
    monkeypatch.setattr("memstrata.layers._files.load_embedder", load)
    return loads


def _configured(data_dir: Path) -> Config:
    return dataclasses.replace(
        Config(data_dir=data_dir), embedding=EmbeddingConfig(model="org/small-model", dim=32)
    )


def test_a_configured_model_is_loaded_once_for_every_root(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loads = _counting_loader(monkeypatch)
    roots = [
        write_tree(tmp_path / f"proj{n}", {"main.py": f"def handler_{n}():\n    return {n}\n"})
        for n in range(4)
    ]
    with Workspaces(data_dir, config=_configured(data_dir)) as registry:
        assert registry.roots() == [] and loads == []  # loaded on first need only
        for root in roots:
            registry.index(root, kind="code")
        assert registry.search("handler", max_results=4)
        assert loads == ["org/small-model"]
        models = {entry["index"]["embedding"]["model"] for entry in registry.status()}
        assert models == {"configured:org/small-model"}
    with Workspaces(data_dir, config=_configured(data_dir)) as registry:  # a new registry: its own
        assert registry.search("handler", max_results=4)
        assert loads == ["org/small-model"] * 2


def test_a_model_that_cannot_be_loaded_leaves_every_root_keyword_only(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _counting_loader(monkeypatch, fail=True)
    root = write_tree(tmp_path / "proj", {"main.py": "def handler():\n    return 1\n"})
    with Workspaces(data_dir, config=_configured(data_dir)) as registry:
        registry.index(root, kind="code")
        assert [h.path for h in registry.search("handler")] == ["main.py"]
        (entry,) = registry.status()
        assert entry["index"]["mode"] == "keyword-only"
        assert "not found" in entry["index"]["embedding"]["reason"]


def test_an_embedder_given_to_the_registry_is_used_and_nothing_is_loaded(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loads = _counting_loader(monkeypatch)
    root = write_tree(tmp_path / "proj", {"main.py": "def handler():\n    return 1\n"})
    given = FakeEmbedder(model_id="given")
    with Workspaces(data_dir, config=_configured(data_dir), embedder=given) as registry:
        registry.index(root, kind="code")
        assert registry.search("handler") and loads == []
        assert registry.status()[0]["index"]["embedding"]["model"] == "given"
