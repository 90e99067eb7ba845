"""The operations every door needs, end to end through the facade and the registry: updating
knowledge by (id, store), the episode timeline and its management, working memory per task,
and file search that survives a missing root and says when it is partial."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memstrata import AsyncMemorySystem, Config, MemorySystem
from memstrata._workspaces import Workspaces
from memstrata.actors import ManualClock
from memstrata.bridges import tools
from memstrata.bridges._operations import Context, find
from memstrata.config import FilesConfig, StorageConfig
from memstrata.errors import DatabaseBusyError, InvalidInputError
from memstrata.layers import Codebase, MemoryFiles
from memstrata.layers._archive import ArchiveFile
from memstrata.storage import open_database
from tests._support import write_tree
from tests.fakes import FakeEmbedder

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


@pytest.fixture
def ctx(data_dir: Path) -> Iterator[Context]:
    fake = FakeEmbedder()
    with (
        MemorySystem.start(Config(data_dir=data_dir), embedder=fake, clock=ManualClock(T0)) as system,
        Workspaces(data_dir, config=system.config, embedder=fake) as workspaces,
    ):
        yield Context(system, workspaces)


def run(ctx: Context, name: str, **params: Any) -> Any:
    return find(name).run(ctx, params)


# -- knowledge: every entry and hit names its store ----------------------------------------------


def test_merged_hits_with_the_same_id_say_which_store_they_are_in(ctx: Context) -> None:
    agent = ctx.system.agent("a1")
    own = agent.store_knowledge("retry the flaky payment gateway call", category="pattern")
    shared = agent.store_knowledge("retry the flaky payment gateway twice", category="pattern", shared=True)
    assert own == shared == 1  # ids are per store: this is the collision the store field resolves
    hits = agent.query_knowledge("retry payment gateway", include_shared=True)
    assert sorted((h.entry.id, h.store) for h in hits) == [(1, "a1"), (1, "shared")]
    for hit in hits:  # get by (id, store) returns exactly the hit's entry
        assert agent.get_knowledge(hit.entry.id, store=hit.store) == hit.entry
    prompt = agent.begin_task("t1", "retry the payment gateway")
    assert sorted(h.store for h in prompt.hits) == ["a1", "shared"]
    wire = run(ctx, "query_knowledge", agent_id="a1", query="retry payment gateway", include_shared=True)
    hits_out = wire["hits"] if isinstance(wire, dict) else wire
    assert sorted((h["id"], h["store"]) for h in hits_out) == [(1, "a1"), (1, "shared")]
    assert [e.store for e in agent.list_knowledge(store="shared")] == ["shared"]
    assert agent.delete_knowledge(1, store="shared") is True
    assert agent.get_knowledge(1, store="shared") is None
    assert agent.get_knowledge(1) is not None


def test_store_param_is_checked_and_agrees_with_shared(ctx: Context) -> None:
    agent = ctx.system.agent("a1")
    agent.store_knowledge("a fact", shared=True)
    assert agent.get_knowledge(1, shared=True) == agent.get_knowledge(1, store="shared")  # old form works
    with pytest.raises(InvalidInputError, match=r"store must be .a1.*got .a2."):
        agent.get_knowledge(1, store="a2")
    with pytest.raises(InvalidInputError, match="contradicts shared=True"):
        agent.delete_knowledge(1, store="a1", shared=True)
    assert agent.get_knowledge(1, store="shared") is not None  # nothing was deleted


def test_update_knowledge_keeps_the_id_and_re_embeds(ctx: Context) -> None:
    agent = ctx.system.agent("a1")
    ident = agent.store_knowledge("cache the invoice totals", category="pattern", tags={"area": "billing"})
    before = agent.get_knowledge(ident)
    assert before is not None
    ctx.system.clock.advance(5)  # type: ignore[attr-defined]
    after = agent.update_knowledge(ident, content="memoise the shipping quotes", scope="/shipping")
    assert after is not None and after.id == ident and after.store == "a1"
    assert (after.content, after.scope, after.category, after.tags) == (
        "memoise the shipping quotes",
        "/shipping",
        "pattern",
        {"area": "billing"},  # tags not given: kept
    )
    assert after.created_at == before.created_at and after.updated_at > before.updated_at
    vector_hits = agent.query_knowledge("memoise shipping quotes", mode="vector", top_k=1)
    assert [(h.entry.id, h.entry.content) for h in vector_hits] == [(ident, "memoise the shipping quotes")]
    assert agent.query_knowledge("invoice", mode="keyword") == []  # the old text is gone from the index
    cleared = agent.update_knowledge(ident, tags={})
    assert cleared is not None and cleared.tags == {}
    assert agent.update_knowledge(999, content="x") is None


def test_an_update_that_would_duplicate_another_entry_is_refused(ctx: Context) -> None:
    agent = ctx.system.agent("a1")
    first = agent.store_knowledge("use the read replica", category="pattern")
    second = agent.store_knowledge("use the primary", category="pattern")
    with pytest.raises(InvalidInputError, match=f"would duplicate entry {first}"):
        agent.update_knowledge(second, content="use the read replica")
    kept = agent.get_knowledge(second)
    assert kept is not None and kept.content == "use the primary"  # nothing changed
    moved = agent.update_knowledge(second, content="use the read replica", category="pitfall")
    assert moved is not None and moved.id == second  # another category is not a duplicate


def test_update_knowledge_operation(ctx: Context) -> None:
    op = find("update_knowledge")
    assert (op.read_only, op.destructive, op.idempotent) == (False, True, True)
    shared = run(ctx, "store_knowledge", agent_id="a1", content="old shared text", shared=True)
    out = run(
        ctx,
        "update_knowledge",
        agent_id="a1",
        entry_id=shared["id"],
        store="shared",
        content="new shared text",
        tags={"k": "v"},
    )
    assert (out["id"], out["store"], out["content"], out["tags"]) == (
        shared["id"],
        "shared",
        "new shared text",
        {"k": "v"},
    )
    assert run(ctx, "update_knowledge", agent_id="a1", entry_id=77, content="x") is None
    with pytest.raises(InvalidInputError, match="store must be"):
        run(ctx, "update_knowledge", agent_id="a1", entry_id=1, store="other", content="x")


# -- episodes: timeline, get, delete, archive, restore, promote ----------------------------------


def _episodes(ctx: Context) -> list[int]:
    agent = ctx.system.agent("a1")
    ids = []
    for n in range(6):
        run_id = "run-a" if n % 2 == 0 else "run-b"
        ids.append(
            agent.remember(f"step {n} of the migration", task_run_id=run_id, at=T0 + dt.timedelta(hours=n))
        )
    return ids


def test_timeline_orders_filters_and_pages(ctx: Context) -> None:
    agent = ctx.system.agent("a1")
    ids = _episodes(ctx)
    assert [e.id for e in agent.list_episodes()] == ids[::-1]  # newest first by default
    assert [e.id for e in agent.list_episodes(newest_first=False)] == ids
    assert [e.id for e in agent.list_episodes(task_run_id="run-a", newest_first=False)] == ids[0::2]
    window = agent.list_episodes(since=T0 + dt.timedelta(hours=1), until=T0 + dt.timedelta(hours=4))
    assert [e.id for e in window] == [ids[3], ids[2], ids[1]]
    assert [e.id for e in agent.list_episodes(limit=2, offset=1)] == [ids[4], ids[3]]
    wire = run(ctx, "list_episodes", agent_id="a1", newest_first=False, limit=2, since="2026-03-01T13:00:00Z")
    assert [e["id"] for e in wire] == ids[1:3]
    episode = agent.get_episode(ids[0])
    assert episode is not None and episode.content == "step 0 of the migration"
    assert run(ctx, "get_episode", agent_id="a1", episode_id=ids[0])["content"] == episode.content
    assert agent.get_episode(9999) is None and run(ctx, "get_episode", agent_id="a1", episode_id=9999) is None


def test_deleted_episode_is_found_by_no_search_and_no_later_archive(ctx: Context, tmp_path: Path) -> None:
    agent = ctx.system.agent("a1")
    keep = agent.remember("the deploy went fine", task_run_id="r1", at=T0)
    gone = agent.remember(
        "leaked the zebracorn token in a log", task_run_id="r1", at=T0 + dt.timedelta(minutes=1)
    )
    after = agent.remember("rotated credentials", task_run_id="r1", at=T0 + dt.timedelta(minutes=2))
    before = agent.recall("zebracorn")
    assert [h.episode.id for h in before][:1] == [gone]
    assert {h.episode.id for h in before if h.keyword_rank is not None} > {gone}  # via the context
    assert run(ctx, "delete_episode", agent_id="a1", episode_id=gone) == {"deleted": True}
    assert agent.delete_episode(gone) is False
    assert agent.get_episode(gone) is None
    assert all("zebracorn" not in h.episode.content for h in agent.recall("zebracorn token"))
    # its words left its neighbours' conversation context too: no keyword match remains
    assert all(h.keyword_rank is None for h in agent.recall("zebracorn"))
    archive = tmp_path / "all.sqlite"
    done = agent.archive_episodes(archive)
    assert done.archived == 2
    opened = ArchiveFile(archive, verify=True)
    try:
        assert sorted(int(r[0]) for r in opened.rows()) == [keep, after]
    finally:
        opened.close()
    assert agent.restore_episodes(archive) == 2
    assert agent.get_episode(gone) is None
    op = find("delete_episode")
    assert (op.read_only, op.destructive, op.idempotent) == (False, True, True)


def test_archive_before_a_time_then_restore(ctx: Context, data_dir: Path) -> None:
    agent = ctx.system.agent("a1")
    ids = _episodes(ctx)
    out = run(ctx, "archive_episodes", agent_id="a1", before="2026-03-01T15:00:00Z")
    path = Path(out["path"])
    assert out["archived"] == 3 and path.is_file() and path.is_relative_to(data_dir)
    assert [e.id for e in agent.list_episodes(newest_first=False)] == ids[3:]
    archived_hits = agent.recall("step 1 of the migration", top_k=10)
    assert {h.episode.id for h in archived_hits} >= set(ids[3:])
    assert run(ctx, "restore_episodes", agent_id="a1", path=str(path)) == {"restored": 3}
    assert run(ctx, "restore_episodes", agent_id="a1", path=str(path)) == {"restored": 0}  # idempotent
    assert [e.id for e in agent.list_episodes(newest_first=False)] == ids  # original ids back
    assert agent.archive_episodes(before=T0 - dt.timedelta(days=1)).archived == 0


def test_promote_episode_into_knowledge(ctx: Context) -> None:
    agent = ctx.system.agent("a1")
    ident = agent.remember("pin the numpy version in CI", task_run_id="t9", tags={"team": "infra"})
    entry = agent.promote_episode(ident)
    assert (entry.content, entry.category, entry.store) == ("pin the numpy version in CI", "outcome", "a1")
    assert entry.tags == {"team": "infra", "episode_id": str(ident), "task_run_id": "t9"}
    assert agent.promote_episode(ident).id == entry.id  # promoting twice: the same entry
    wire = run(ctx, "promote_episode", agent_id="a1", episode_id=ident, store="shared", category="pattern")
    assert (wire["store"], wire["category"]) == ("shared", "pattern")
    assert agent.get_knowledge(wire["id"], store="shared") is not None
    with pytest.raises(InvalidInputError, match="no live episode 4242"):
        agent.promote_episode(4242)


# -- working memory: one space per task, plus the agent-wide one ---------------------------------


def test_completing_t3_keeps_the_keys_of_concurrent_t4(ctx: Context) -> None:
    system = ctx.system
    agent = system.agent("a1")
    agent.begin_task("t3", "first task")
    agent.begin_task("t4", "second task")
    agent.set_working("cursor", 3, task_id="t3")
    agent.set_working("cursor", 4, task_id="t4")
    agent.set_working("cursor", "agent-wide")
    assert [agent.get_working("cursor", task_id=t) for t in ("t3", "t4", None)] == [3, 4, "agent-wide"]
    agent.complete_task("t3", "first done")
    assert system.wait_idle(10)
    assert agent.get_working("cursor", "gone", task_id="t3") == "gone"
    assert agent.get_working("cursor", task_id="t4") == 4  # the issue: t3's end wiped this
    assert agent.get_working("cursor") == "agent-wide"
    agent.fail_task("t4", "second broke")
    assert system.wait_idle(10)
    assert agent.get_working("cursor", "gone", task_id="t4") == "gone"
    assert agent.get_working("cursor") == "agent-wide"


def test_working_operations_take_a_task_id(ctx: Context) -> None:
    assert run(ctx, "set_working", agent_id="a1", key="k", value=[1], task_id="t1") == {
        "key": "k",
        "stored": True,
    }
    run(ctx, "set_working", agent_id="a1", key="k", value="wide")
    assert run(ctx, "get_working", agent_id="a1", key="k", task_id="t1") == {
        "key": "k",
        "found": True,
        "value": [1],
    }
    assert run(ctx, "get_working", agent_id="a1", key="k", task_id="t2")["found"] is False
    assert run(ctx, "clear_working", agent_id="a1", task_id="t1") == {"removed": 1}
    assert run(ctx, "get_working", agent_id="a1", key="k")["value"] == "wide"
    for name in ("set_working", "get_working", "clear_working"):
        assert find(name).param("task_id").description


# -- files: a missing root is skipped and reported; a partial search says so ---------------------


def test_a_deleted_root_is_skipped_with_a_warning(ctx: Context, tmp_path: Path) -> None:
    kept = write_tree(
        tmp_path / "kept", {"MEMORY.md": "# Notes\nThe walrus deploy key lives in the vault.\n"}
    )
    gone = write_tree(tmp_path / "gone", {"MEMORY.md": "# Old\nThe walrus runbook is outdated.\n"})
    ctx.workspaces.index(kept, kind="memory")
    ctx.workspaces.index(gone, kind="memory")
    assert {h.root for h in ctx.workspaces.search("walrus")} == {kept.resolve(), gone.resolve()}
    shutil.rmtree(gone)
    found = ctx.workspaces.search("walrus")
    assert {h.root for h in found} == {kept.resolve()}
    assert len(found.warnings) == 1 and str(gone.resolve()) in found.warnings[0]
    assert "missing" in found.warnings[0]
    wire = run(ctx, "search_files", query="walrus")
    assert {Path(h["root"]) for h in wire["hits"]} == {kept.resolve()}
    assert any(str(gone.resolve()) in w for w in wire["warnings"])
    tool = tools.dispatch(
        "memory_search", {"query": "walrus"}, ctx.system, agent_id="a1", workspaces=ctx.workspaces
    )
    assert [h["path"] for h in tool["hits"]] == [str(kept.resolve() / "MEMORY.md")]
    assert any(str(gone.resolve()) in w for w in tool["warnings"])
    status = {Path(s["root"]): s for s in ctx.workspaces.status()}
    assert status[gone.resolve()]["missing"] is True and "missing" in status[gone.resolve()]["warning"]
    assert status[kept.resolve()]["missing"] is False


def test_search_says_incomplete_while_the_sync_is_past_its_budget(data_dir: Path, tmp_path: Path) -> None:
    tree = write_tree(
        tmp_path / "src", {f"mod{n:02d}.py": f"def handler_{n}():\n    return 'otter'\n" for n in range(12)}
    )
    hour_ago = time.time() - 3600  # older than the sync's racy-mtime window: read once is done
    for n, path in enumerate(sorted(tree.iterdir())):
        os.utime(path, (hour_ago + n, hour_ago + n))
    config = dataclasses.replace(Config(data_dir=data_dir), files=FilesConfig(lazy_sync_wait_s=0.0))
    with Codebase.open(tree, embedder=FakeEmbedder(), config=config) as code:
        first = code.search("otter", top_k=50)
        assert first == [] and first.complete is False  # a zero budget syncs nothing before a search
        assert code.sync().files_processed == 12
        found = code.search("otter", top_k=50)
        assert len(found) == 12 and found.complete is True
    with Workspaces(data_dir, config=config, embedder=FakeEmbedder()) as registry:
        registry.index(tree, kind="code")  # an explicit sync has no budget: complete
        assert registry.search("otter").complete is True
        for n, path in enumerate(sorted(tree.iterdir())):  # every file changes
            path.write_text(f"def handler_{n}():\n    return 'beaver'\n", encoding="utf-8")
            os.utime(path, (hour_ago + 100 + n, hour_ago + 100 + n))
        assert registry.search("beaver").complete is False
        wire = find("search_files").run(Context(None, registry), {"query": "beaver"})
        assert wire["complete"] is False  # answered from the index as it was: no beaver yet
        assert wire["hits"] and all("otter" in hit["snippet"] for hit in wire["hits"])


def test_an_index_told_to_stop_starts_no_file_and_a_bad_stop_check_is_refused(
    data_dir: Path, tmp_path: Path
) -> None:
    tree = tmp_path / "notes"
    (tree / "memory").mkdir(parents=True)
    for n in range(5):
        (tree / "memory" / f"{n}.md").write_text(f"note {n} about otters\n", encoding="utf-8")
    with Workspaces(data_dir, embedder=FakeEmbedder()) as registry:
        with pytest.raises(InvalidInputError, match="should_stop must be a callable"):
            registry.index(tree, kind="memory", should_stop=True)  # type: ignore[arg-type]
        assert registry.roots() == []  # refused before anything was registered
        _, stopped = registry.index(tree, kind="memory", should_stop=lambda: True)
        assert stopped.complete is False and stopped.files_processed == 0
        _, rest = registry.index(tree, kind="memory", should_stop=lambda: False)
        assert rest.complete is True and rest.files_processed == 5


def test_python_entry_points_honour_config_load(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    elsewhere = tmp_path / "from-env"
    monkeypatch.setenv("MEMSTRATA_DATA_DIR", str(elsewhere))
    monkeypatch.chdir(tmp_path)  # no memstrata.toml here
    notes = write_tree(tmp_path / "notes", {"MEMORY.md": "# hello\n"})
    with MemoryFiles.open(notes, embedder=FakeEmbedder()) as files:
        assert files.db_path.is_relative_to(elsewhere) and files.config.data_dir == elsewhere
    with Codebase.open(notes, embedder=FakeEmbedder()) as code:
        assert code.db_path.is_relative_to(elsewhere)
    (tmp_path / "memstrata.toml").write_text("[search]\ntop_k = 7\n", encoding="utf-8")
    with Workspaces(tmp_path / "reg", embedder=FakeEmbedder()) as registry:
        assert registry.config.search.top_k == 7 and registry.config.data_dir == tmp_path / "reg"


# -- the asyncio twins ---------------------------------------------------------------------------


def test_async_twins_of_the_new_operations(data_dir: Path) -> None:
    import asyncio

    async def main() -> None:
        async with AsyncMemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system:
            agent = system.agent("a1")
            ident = await agent.store_knowledge("async fact")
            updated = await agent.update_knowledge(ident, content="async fact, updated")
            assert updated is not None and updated.content == "async fact, updated"
            episode = await agent.remember("an async episode", task_run_id="t1")
            assert [e.id for e in await agent.list_episodes()] == [episode]
            assert (await agent.promote_episode(episode)).store == "a1"
            await agent.set_working("k", 1, task_id="t1")
            assert await agent.get_working("k", task_id="t1") == 1
            assert await agent.clear_working(task_id="t1") == 1
            assert await agent.delete_episode(episode) is True

    asyncio.run(main())


def test_a_deleted_episode_stays_gone_from_older_archives(tmp_path: Path) -> None:
    from memstrata.layers import EpisodicMemory

    with EpisodicMemory.open(tmp_path / "ep.sqlite", FakeEmbedder()) as ep:
        keep = ep.record("the quokka deploy went fine", at=T0)
        gone = ep.record("the quokka token leaked", at=T0 + dt.timedelta(minutes=1))
        copy = tmp_path / "copy.sqlite"
        assert ep.archive(copy, remove=False) == 2  # a copy: both stay live too
        assert ep.delete(gone) is True and ep.delete(gone) is False
        found = ep.search("quokka token leaked", include_archives=True, top_k=10)
        assert gone not in {h.episode.id for h in found} and keep in {h.episode.id for h in found}
        moved = tmp_path / "moved.sqlite"
        assert ep.archive(moved) == 1  # only the live one
        assert ep.restore(copy) == 1 and ep.restore(moved) == 0  # keep came back; gone never does
        assert [e.id for e in ep.timeline()] == [keep]


def test_export_and_import_keep_working_memory_spaces(tmp_path: Path) -> None:
    path = tmp_path / "export.jsonl"
    with MemorySystem.start(Config(data_dir=tmp_path / "one"), embedder=FakeEmbedder()) as system:
        agent = system.agent("a1")
        agent.set_working("k", "wide")
        agent.set_working("k", "in t1", task_id="t1")
        system.export(path)
    with MemorySystem.start(Config(data_dir=tmp_path / "two"), embedder=FakeEmbedder()) as system:
        assert system.import_(path)["working"] == 2
        agent = system.agent("a1")
        assert (agent.get_working("k"), agent.get_working("k", task_id="t1")) == ("wide", "in t1")


def test_every_operation_declares_one_effect_and_its_hints_follow_from_it() -> None:
    from memstrata.bridges._operation import Effect
    from memstrata.bridges._operations import OPERATIONS

    assert len({e.value for e in Effect}) == len(Effect)  # one name per combination of hints
    for effect in Effect:
        read_only, destructive, idempotent = effect.value
        assert not (read_only and destructive), effect
        assert idempotent or not read_only, effect  # a read repeated changes nothing
    seen = {op.effect for op in OPERATIONS}
    assert seen == set(Effect)  # every effect is used, and nothing else is
    for op in OPERATIONS:
        assert (op.read_only, op.destructive, op.idempotent) == op.effect.value, op.name
    assert find("query_knowledge").effect is Effect.READS
    assert find("remember").effect is Effect.ADDS
    assert find("set_working").effect is Effect.SETS
    assert find("delete_episode").effect.words == "destructive, idempotent"


def test_the_workspace_registry_opens_its_indexes_with_the_configured_lock_bound(tmp_path: Path) -> None:
    """As the actors do: a sync that meets another process's write lock gives up after
    ``[storage] lock_timeout_s``, not after the layers' own default."""
    tree = write_tree(tmp_path / "notes", {"MEMORY.md": "# otters\n\nOtters hold hands.\n"})
    config = Config(data_dir=tmp_path / "data", storage=StorageConfig(lock_timeout_s=0.5))
    with Workspaces(config.data_dir, config=config, embedder=FakeEmbedder()) as registry:
        workspace, _ = registry.index(tree, kind="memory")
    (tree / "MEMORY.md").write_text("# otters\n\nOtters sleep holding hands.\n", encoding="utf-8")
    other = open_database(workspace.db_path)  # another writer (memstrata's SQLite, as a process's would be)
    try:
        other.execute("BEGIN IMMEDIATE")
        with (
            Workspaces(config.data_dir, config=config, embedder=FakeEmbedder()) as registry,
            pytest.raises(DatabaseBusyError, match=r"more than 0\.5 s"),
        ):
            registry.index(tree, kind="memory")
    finally:
        other.close()
