"""The adapters go through a running system: given, or private on a data dir, or temporary."""

from __future__ import annotations

import ast
import asyncio
import datetime as dt
import math
from pathlib import Path

import pytest

from memstrata import Config, MemorySystem
from memstrata.actors import ManualClock
from memstrata.errors import ConfigError, InvalidInputError
from memstrata.integrations._common import open_system
from memstrata.testing import HashEmbedder

REPO = Path(__file__).resolve().parents[1]
_T0 = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


def test_adapters_import_no_private_layer_or_actor_module() -> None:
    for source in sorted((REPO / "integrations").glob("*.py")):
        tree = ast.parse(source.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                assert not name.startswith(("memstrata.layers", "memstrata.actors")), (source.name, name)


def test_one_private_system_per_path_stopped_by_its_last_user(tmp_path: Path) -> None:
    one = open_system(tmp_path / "data", embedder=HashEmbedder())
    two = open_system(str(tmp_path / "data"))
    assert one.system is two.system and one.private
    one.release()
    one.release()  # idempotent: counts once
    assert not two.system.stopped
    two.release()
    assert one.system.stopped
    three = open_system(tmp_path / "data", embedder=HashEmbedder())  # a new one on the same folder
    assert three.system is not one.system and not three.system.stopped
    three.release()


def test_a_path_already_open_refuses_another_model_rather_than_ignore_it(tmp_path: Path) -> None:
    """The path's system embeds with its own model: another one given would never be called."""
    one = open_system(tmp_path / "data", embedder=HashEmbedder(64))
    try:
        same = open_system(tmp_path / "data", embedder=HashEmbedder(64))  # the same model: shared
        assert same.system is one.system
        same.release()
        for other in (HashEmbedder(32), _Named(64)):
            with pytest.raises(ConfigError, match=r"is already open with the model .* cannot share it"):
                open_system(tmp_path / "data", embedder=other, what="MemstrataStore target")
        assert not one.system.stopped
    finally:
        one.release()


def test_a_closed_store_or_memory_refuses_calls_whoever_shares_its_system(tmp_path: Path) -> None:
    """As a closed Agents SDK session does: what happens after close no longer depends on
    another adapter holding the same path's system."""
    from memstrata.errors import SystemStoppedError
    from memstrata.integrations.autogen import MemstrataMemory, MemstrataMemoryConfig
    from memstrata.integrations.langgraph import MemstrataStore

    path = str(tmp_path / "data")
    keeper = MemstrataStore(path, embedder=HashEmbedder())
    store = MemstrataStore(path, embedder=HashEmbedder())
    store.put(("a",), "k", {"v": 1})
    store.close()
    with pytest.raises(SystemStoppedError, match="this MemstrataStore is closed"):
        store.get(("a",), "k")
    assert keeper.get(("a",), "k") is not None  # the shared system runs on for the others

    async def memory_after_close() -> None:
        memory = MemstrataMemory(MemstrataMemoryConfig(persistence_path=path), embedder=HashEmbedder())
        await memory.close()
        with pytest.raises(SystemStoppedError, match="this MemstrataMemory is closed"):
            await memory.query("anything")

    asyncio.run(memory_after_close())
    keeper.close()


class _Named(HashEmbedder):
    @property
    def model_id(self) -> str:
        return "another-model"


def test_memory_systems_are_temporary_and_a_file_path_gets_a_folder_beside_it(tmp_path: Path) -> None:
    temp = open_system(":memory:", embedder=HashEmbedder())
    folder = temp.system.data_dir
    assert folder.is_dir() and temp.system is not open_system(None, embedder=HashEmbedder()).system
    temp.release()
    assert not folder.exists()
    db = tmp_path / "store.db"
    db.write_bytes(b"")
    opened = open_system(db, embedder=HashEmbedder())
    assert opened.system.data_dir == (tmp_path / "store.db.memstrata").resolve()
    assert db.read_bytes() == b""  # the file is left alone
    opened.release()


def test_bad_targets_are_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="target must be a data dir path"):
        open_system(42)
    with pytest.raises(InvalidInputError, match="must be a non-empty path"):
        open_system("  ")
    with MemorySystem.start(Config(data_dir=tmp_path / "d"), embedder=HashEmbedder()) as system:
        given = open_system(system)
        assert given.system is system and not given.private
        given.release()
        assert not system.stopped  # a given system is never stopped by an adapter


def test_langgraph_on_a_system_checks_the_callers_vectors_and_ttl(tmp_path: Path) -> None:
    pytest.importorskip("langgraph.store.base", reason="the langgraph extra is not installed")
    from memstrata.integrations.langgraph import MemstrataStore

    def bad_embed(texts: list[str]) -> list[list[float]]:
        return [[math.nan, 1.0] for _ in texts]

    clock = ManualClock(_T0)
    config = Config(data_dir=tmp_path / "d")
    with MemorySystem.start(config, embedder=HashEmbedder(), clock=clock) as system:
        store = MemstrataStore(system, index={"dims": 2, "embed": bad_embed, "fields": ["t"]})
        with pytest.raises(InvalidInputError, match="NaN or infinity for text 0"):
            store.put(("a",), "k", {"t": "x"})
        assert store.get(("a",), "k") is None  # nothing of the batch was written
        store.close()
        ttl = {"default_ttl": 10, "refresh_on_read": True}
        store = MemstrataStore(system, ttl=ttl)
        store.put(("a",), "k", {"v": 1}, ttl=10)
        store.put(("a",), "j", {"v": 2}, ttl=10)
        clock.advance(9 * 60)
        assert store.get(("a",), "k") is not None  # refreshed: 10 more minutes
        clock.advance(2 * 60)
        assert store.get(("a",), "k") is not None and store.get(("a",), "j", refresh_ttl=False) is None
        assert store.sweep_ttl() == 1
        store.close()
        assert not system.stopped


def test_langgraph_filters_with_infinity_nan_and_huge_integers() -> None:
    pytest.importorskip("langgraph.store.base", reason="the langgraph extra is not installed")
    from memstrata.integrations.langgraph import MemstrataStore

    with MemstrataStore(":memory:", embedder=HashEmbedder()) as store:
        for i, price in enumerate([-5, 10, 1e300]):
            store.put(("p",), f"k{i}", {"price": price})
        store.put(("p",), "none", {"other": 1})

        def keys(flt: dict[str, object]) -> set[str]:
            return {h.key for h in store.search(("p",), filter=flt, limit=10)}

        assert keys({"price": {"$lt": math.inf}}) == {"k0", "k1", "k2"}
        assert keys({"price": {"$gt": -math.inf, "$lt": 0}}) == {"k0"}
        assert keys({"price": {"$gt": math.inf}}) == set()
        assert keys({"price": math.nan}) == set()
        assert keys({"price": {"$ne": math.inf}}) == {"k0", "k1", "k2", "none"}
        assert keys({"price": {"$lt": 10**400}}) == {"k0", "k1", "k2"}
        assert keys({"price": {"$gte": 10**20}}) == {"k2"}


def test_autogen_private_memory_on_a_folder_persists(tmp_path: Path) -> None:
    pytest.importorskip("autogen_core", reason="the autogen extra is not installed")
    from autogen_core.memory import MemoryContent, MemoryMimeType

    from memstrata.integrations.autogen import MemstrataMemory, MemstrataMemoryConfig

    config = MemstrataMemoryConfig(collection_name="c", persistence_path=str(tmp_path / "mem"), k=1)

    async def scenario() -> None:
        memory = MemstrataMemory(config, embedder=HashEmbedder())
        await memory.add(MemoryContent(content="the red door", mime_type=MemoryMimeType.TEXT))
        await memory.close()
        again = MemstrataMemory(config, embedder=HashEmbedder())
        found = (await again.query("the red door")).results
        assert [m.content for m in found] == ["the red door"]
        await again.close()

    asyncio.run(scenario())
    assert (tmp_path / "mem" / "items.sqlite").exists()
