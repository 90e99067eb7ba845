"""Export and import: every kind of memory as sorted JSON lines, restored by import."""

from __future__ import annotations

import datetime as dt
import logging
import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from memstrata import Agent, Config, MemorySystem
from memstrata.bridges._app import CliState
from memstrata.bridges._operations import find
from memstrata.bridges.cli import cli
from memstrata.errors import ArchiveError, ConfigError, InvalidInputError
from memstrata.testing import HashEmbedder, ManualClock

START = dt.datetime(2026, 11, 20, 9, 0, tzinfo=dt.UTC)


def _fill(system: MemorySystem, clock: ManualClock) -> None:
    planner, qa = system.agent("planner"), system.agent("qa")
    planner.store_knowledge("Money moves must be idempotent", category="pattern", tags={"source": "handbook"})
    planner.store_knowledge("Migrations run online", category="pattern", scope="/db", shared=True)
    qa.remember("an old sandbox note", title="old", at=START - dt.timedelta(days=30))
    clock.advance(120)
    qa.remember("the sandbox rate-limits parallel runs", title="sandbox", tags={"env": "staging"})
    qa.begin_task("t1", "stabilise the payment tests")
    qa.fail_task("t1", "parallel runs hit the rate limit")
    clock.advance(60)
    planner.store_knowledge("Money moves must be idempotent", category="pattern")  # refreshes updated_at
    qa.set_working("plan", {"steps": ["serial runs"]}, ttl_s=300)
    planner.set_working("draft", "launch checklist")
    board = system.blackboard("checkout")
    board.publish("agent:qa:status", "busy", "qa", wait=True)
    board.publish("agent:qa:status", "idle", "qa", wait=True)
    board.publish("task:t1", {"state": "failed"}, "qa", wait=True)


def _records(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_export_holds_every_kind_sorted_and_import_restores_it(tmp_path: Path) -> None:
    clock = ManualClock(START)
    config = Config.from_mapping(
        {
            "data_dir": str(tmp_path / "a"),
            "episodic": {"retention_max_age_s": 7 * 86400, "archive_dir": str(tmp_path / "archives")},
        }
    )
    with MemorySystem.start(config, embedder=HashEmbedder(), clock=clock, seed=3) as system:
        _fill(system, clock)
        system.agent("qa").commit()  # the 30-day-old episode moves to an archive
        lines = system.export(tmp_path / "a.jsonl")
    records = _records(tmp_path / "a.jsonl")
    assert len(records) == lines
    assert records[0] == {"format": "memstrata-export", "kind": "export", "version": 1, "records": lines - 1}
    kinds = [r["kind"] for r in records]
    assert kinds == sorted(kinds, key=["export", "knowledge", "episode", "working", "signal"].index)
    knowledge = [r for r in records if r["kind"] == "knowledge"]
    assert [(r["owner"], r["id"]) for r in knowledge] == [
        ("planner", 1),
        ("qa", 1),
        ("shared", 1),
    ]
    refreshed = knowledge[0]
    assert refreshed["created_at"] == START.timestamp() and refreshed["updated_at"] == START.timestamp() + 180
    assert refreshed["tags"] == {"source": "handbook"}
    assert knowledge[2]["scope"] == "/db" and knowledge[2]["author"] == "planner"
    episodes = [r for r in records if r["kind"] == "episode"]
    archived = [r for r in episodes if r["archive"]]
    assert [r["content"] for r in archived] == ["an old sandbox note"]
    assert {r["title"] for r in episodes if not r["archive"]} == {"sandbox", "Task t1 failed"}
    working = [r for r in records if r["kind"] == "working"]
    assert [(r["agent"], r["key"], r["expires_in_s"]) for r in working] == [
        ("planner", "draft", None),
        ("qa", "plan", 300.0),
    ]
    signals = [r for r in records if r["kind"] == "signal"]
    assert [(r["key"], r["value"], r["version"]) for r in signals] == [
        ("agent:qa:status", "idle", 2),
        ("task:t1", {"state": "failed"}, 1),
    ]

    again = ManualClock(START + dt.timedelta(days=1))
    target = Config(data_dir=tmp_path / "b")
    with MemorySystem.start(target, embedder=HashEmbedder(), clock=again, seed=4) as system:
        counts = system.import_(tmp_path / "a.jsonl")
        assert counts == {"knowledge": 3, "episode": 2, "working": 2, "signal": 2, "item": 0, "skipped": 1}
        assert system.import_(tmp_path / "a.jsonl")["episode"] == 0  # episodes are matched by uuid
        system.export(tmp_path / "b.jsonl")
        hits = system.agent("qa").query_knowledge("parallel runs rate limit")
        assert hits and hits[0].entry.category == "pitfall"
    restored = _records(tmp_path / "b.jsonl")

    def comparable(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for row in rows:
            if row["kind"] == "episode" and row["archive"]:
                continue  # restored from its archive file, not by import
            if row["kind"] == "signal":
                row = {k: v for k, v in row.items() if k not in ("version", "updated_at")}
            if row["kind"] == "export":
                row = {k: v for k, v in row.items() if k != "records"}  # the archived one is not here
            out.append(row)
        return out

    assert comparable(restored) == comparable(records)


def test_import_refuses_what_is_not_an_export_and_names_the_line(tmp_path: Path) -> None:
    with MemorySystem.start(Config(data_dir=tmp_path / "d"), embedder=HashEmbedder()) as system:
        bad = tmp_path / "bad.jsonl"
        bad.write_text('{"kind": "knowledge"}\n')
        with pytest.raises(InvalidInputError, match="not a memstrata export"):
            system.import_(bad)
        bad.write_text('{"format": "memstrata-export", "kind": "export", "version": 1}\n{oops\n')
        with pytest.raises(InvalidInputError, match="line 2 is not valid JSON"):
            system.import_(bad)
        bad.write_text(
            '{"format": "memstrata-export", "kind": "export", "version": 1}\n'
            '{"kind": "working", "agent": "a", "key": "k", "value": 123456789012345678901234567890}\n'
        )
        with pytest.raises(
            InvalidInputError, match=r"line 2 is refused: integer 1234567890\d+ at 'value' is outside"
        ):
            system.import_(bad)  # read exactly, not as a float
        bad.write_text('{"format": "memstrata-export", "kind": "export", "version": 1}\n{"kind": "x"}\n')
        with pytest.raises(InvalidInputError, match="line 2 has unknown kind 'x'"):
            system.import_(bad)
        bad.write_text(
            '{"format": "memstrata-export", "kind": "export", "version": 1}\n'
            '{"kind": "working", "agent": "../etc", "key": "k", "value": 1}\n'
        )
        with pytest.raises(InvalidInputError, match="agent"):
            system.import_(bad)
        with pytest.raises(InvalidInputError, match="cannot read the export"):
            system.import_(tmp_path / "missing.jsonl")
        with pytest.raises(InvalidInputError, match="not a regular file"):
            system.import_("/dev/zero")  # would stream forever
        with pytest.raises(InvalidInputError, match="not a regular file"):
            system.export("/dev/null")  # never replaced
        with pytest.raises(InvalidInputError, match="not a regular file"):
            system.export(tmp_path)
        with pytest.raises(InvalidInputError, match="does not exist"):
            system.export(tmp_path / "no" / "such" / "dir.jsonl")
        assert not (tmp_path / "no").exists()
        assert system.status()["agents"] == {}  # nothing was half-imported


def test_an_import_with_a_bad_field_anywhere_changes_nothing_and_names_the_line_and_field(
    tmp_path: Path,
) -> None:
    with MemorySystem.start(
        Config(data_dir=tmp_path / "src"), embedder=HashEmbedder(), clock=ManualClock(START)
    ) as system:
        _fill(system, ManualClock(START))
        system.items.put(("docs",), "roof", {"t": "solar"}, vectors={"t": [1.0, 0.0]})
        system.export(tmp_path / "good.jsonl")
    good = _records(tmp_path / "good.jsonl")
    kinds = [r["kind"] for r in good]
    first = {kind: kinds.index(kind) for kind in ("knowledge", "episode", "working", "signal", "item")}
    spoiled = [
        ("knowledge", {"created_at": "yesterday"}, r"\(knowledge\): created_at must be a number"),
        ("knowledge", {"category": "Pitfall"}, r"\(knowledge\): category is not valid"),
        ("knowledge", {"owner": "../etc"}, r"\(knowledge\): owner "),
        ("knowledge", {"content": None}, r"\(knowledge\): content must be a string"),
        ("knowledge", {"id": "x"}, r"\(knowledge\): id "),
        ("episode", {"at": "nope"}, r"\(episode\): at must be an ISO 8601 time, got 'nope'"),
        ("episode", {"at": "2026-01-01T00:00:00"}, r"\(episode\): at "),  # no zone: named as in the file
        ("episode", {"episode_kind": "Bad Kind"}, r"\(episode\): episode_kind is not valid"),
        ("working", {"expires_in_s": "soon"}, r"\(working\): expires_in_s must be a positive number"),
        ("signal", {"session": "my session"}, r"\(signal\): session "),
        ("item", {"vectors": {"t": [1e308, 0.0]}}, r"\(item\): vectors\['t'\] must hold only finite numbers"),
        ("item", {"updated_at": None}, r"\(item\): updated_at must be a number"),
    ]
    for case, (kind, change, message) in enumerate(spoiled):
        records = [dict(r) for r in good]
        records[first[kind]] |= change
        bad = tmp_path / "bad.jsonl"
        bad.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
        target = tmp_path / f"dst-{case}"
        with MemorySystem.start(Config(data_dir=target), embedder=HashEmbedder()) as system:
            with pytest.raises(InvalidInputError, match=rf"bad.jsonl line {first[kind] + 1} {message}"):
                system.import_(bad)
            assert system.status()["agents"] == {}, change  # no record of any kind was applied
            assert system.items.search(("docs",)) == []
            assert system.import_(tmp_path / "good.jsonl")["knowledge"] > 0  # the file itself is fine


def test_item_vectors_of_another_dimension_change_nothing(tmp_path: Path) -> None:
    """The one check that needs the store (its item vectors' length) runs before anything of the
    file is applied; vectors of two lengths within the file are refused naming both lines."""
    with MemorySystem.start(
        Config(data_dir=tmp_path / "src"), embedder=HashEmbedder(), clock=ManualClock(START)
    ) as system:
        _fill(system, ManualClock(START))
        system.items.put(("docs",), "roof", {"t": "solar"}, vectors={"t": [1.0, 0.0, 0.0]})
        system.items.put(("docs",), "wall", {"t": "brick"}, vectors={"t": [0.0, 1.0, 0.0]})
        system.export(tmp_path / "three.jsonl")
    records = _records(tmp_path / "three.jsonl")
    with MemorySystem.start(Config(data_dir=tmp_path / "dst"), embedder=HashEmbedder()) as system:
        system.items.put(("other",), "held", {"t": "x"}, vectors={"t": [1.0, 0.0]})
        with pytest.raises(
            InvalidInputError, match=r"three.jsonl: item vectors must all have one dimension: "
        ):
            system.import_(tmp_path / "three.jsonl")
        assert system.status()["agents"] == {}  # knowledge, episodes, working memory: none applied
        assert system.blackboard("checkout").list() == []
        assert [item.key for item in system.items.search(("docs",))] == []
    lines = [i for i, r in enumerate(records) if r["kind"] == "item"]
    records[lines[1]]["vectors"]["t"] = [0.0, 1.0]
    (tmp_path / "mixed.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    with MemorySystem.start(Config(data_dir=tmp_path / "dst2"), embedder=HashEmbedder()) as system:
        with pytest.raises(
            InvalidInputError,
            match=rf"mixed.jsonl line {lines[1] + 1} \(item\): vector 't' has 2 dimensions, "
            rf"the one at .*mixed.jsonl line {lines[0] + 1} has 3",
        ):
            system.import_(tmp_path / "mixed.jsonl")
        assert system.status()["agents"] == {}


def test_a_file_cut_short_empty_or_without_its_header_first_is_refused(tmp_path: Path) -> None:
    with MemorySystem.start(
        Config(data_dir=tmp_path / "src"), embedder=HashEmbedder(), clock=ManualClock(START)
    ) as system:
        _fill(system, ManualClock(START))
        system.export(tmp_path / "whole.jsonl")
    lines = (tmp_path / "whole.jsonl").read_bytes().splitlines(keepends=True)
    cases = {
        "cut.jsonl": (
            b"".join(lines[:4]),
            rf"holds 3 records where its header says {len(lines) - 1}: cut short",
        ),
        "more.jsonl": (b"".join([*lines, lines[-1]]), rf"holds {len(lines)} records .* added to"),
        "empty.jsonl": (b"", "is empty: not a memstrata export"),
        "blank.jsonl": (b"\n" + b"".join(lines[1:]), "is not a memstrata export"),
    }
    with MemorySystem.start(Config(data_dir=tmp_path / "dst"), embedder=HashEmbedder()) as system:
        for name, (data, message) in cases.items():
            (tmp_path / name).write_bytes(data)
            with pytest.raises(InvalidInputError, match=message):
                system.import_(tmp_path / name)
            assert system.status()["agents"] == {}, name  # nothing applied
        headless = [orjson.loads(lines[0]), *map(orjson.loads, lines[1:4])]
        del headless[0]["records"]  # a file from before the count: read as it is
        (tmp_path / "old.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in headless))
        assert sum(system.import_(tmp_path / "old.jsonl").values()) == 3


def test_a_saved_blackboard_is_exported_by_a_later_process(tmp_path: Path) -> None:
    """With snapshots, a board saved by an earlier run is memory too: the export of a process
    that has not touched the session (memstrata export, a backup job) holds it."""
    import dataclasses

    config = Config(data_dir=tmp_path / "d")
    config = dataclasses.replace(config, actors=dataclasses.replace(config.actors, blackboard_snapshot=True))
    with MemorySystem.start(config, embedder=HashEmbedder()) as system:
        system.blackboard("release").publish("status", "green", "ci", wait=True)
    with MemorySystem.start(config, embedder=HashEmbedder()) as system:
        system.export(tmp_path / "later.jsonl")
    signals = [r for r in _records(tmp_path / "later.jsonl") if r["kind"] == "signal"]
    assert [(r["session"], r["key"], r["value"], r["publisher"]) for r in signals] == [
        ("release", "status", "green", "ci")
    ]


def test_knowledge_keeps_its_ids_gaps_included_when_imported_into_an_empty_store(tmp_path: Path) -> None:
    with MemorySystem.start(Config(data_dir=tmp_path / "src"), embedder=HashEmbedder()) as system:
        agent = system.agent("a1")
        ids = [agent.store_knowledge(f"fact {n}", category="pattern") for n in range(5)]
        agent.delete_knowledge(ids[0])
        agent.delete_knowledge(ids[2])
        system.export(tmp_path / "gaps.jsonl")
        kept = {e.id: e.content for e in agent.list_knowledge()}
    with MemorySystem.start(Config(data_dir=tmp_path / "dst"), embedder=HashEmbedder()) as system:
        system.import_(tmp_path / "gaps.jsonl")
        agent = system.agent("a1")
        assert {e.id: e.content for e in agent.list_knowledge()} == kept  # ids 2, 4 and 5
        assert agent.store_knowledge("a new fact", category="pattern") == max(kept) + 1


def test_a_moved_data_dir_keeps_its_archives_and_a_missing_archive_is_a_warning(tmp_path: Path) -> None:
    """Archives are recorded by path; after the data dir moved, those in its own archives folder
    are found in their new place (before, their episodes left exports without a word)."""
    import shutil

    with MemorySystem.start(Config(data_dir=tmp_path / "old"), embedder=HashEmbedder()) as system:
        agent = system.agent("a1")
        agent.remember("the first deploy failed", at=START - dt.timedelta(days=400))
        agent.remember("the second deploy worked", at=START)
        archived = agent.archive_episodes(before=START - dt.timedelta(days=1))
        assert archived.archived == 1
        lines = system.export(tmp_path / "before.jsonl")
    shutil.move(tmp_path / "old", tmp_path / "new")
    with MemorySystem.start(Config(data_dir=tmp_path / "new"), embedder=HashEmbedder()) as system:
        assert system.export(tmp_path / "after.jsonl") == lines
        assert _records(tmp_path / "after.jsonl") == _records(tmp_path / "before.jsonl")
        assert system.status()["warnings"] == []
        moved = Path(archived.path.replace(str(tmp_path / "old"), str(tmp_path / "new")))
        moved.unlink()
    with MemorySystem.start(Config(data_dir=tmp_path / "new"), embedder=HashEmbedder()) as system:
        system.agent("a1").list_episodes()
        assert f"a1 episodic: archive {moved}: the file is missing" in system.status()["warnings"]


def test_a_restored_episode_is_exported_once(tmp_path: Path) -> None:
    """Restoring leaves the archive file as it is (archives never change); its copy of an episode
    that is live again is not exported beside the live one, as no search returns it twice."""
    with MemorySystem.start(Config(data_dir=tmp_path / "d"), embedder=HashEmbedder()) as system:
        agent = system.agent("a1")
        agent.remember("episode one", at=START - dt.timedelta(days=2))
        agent.remember("episode two", at=START - dt.timedelta(days=1))
        archived = agent.archive_episodes(before=START)
        assert archived.archived == 2 and agent.restore_episodes(archived.path) == 2
        system.export(tmp_path / "once.jsonl")
    episodes = [r for r in _records(tmp_path / "once.jsonl") if r["kind"] == "episode"]
    assert sorted((r["content"], r["archive"]) for r in episodes) == [
        ("episode one", None),
        ("episode two", None),
    ]


def test_export_and_archives_never_write_among_the_data_dirs_own_files(tmp_path: Path) -> None:
    data = tmp_path / "d"
    with MemorySystem.start(Config(data_dir=data), embedder=HashEmbedder()) as system:
        agent = system.agent("a")
        agent.store_knowledge("Charges need idempotency keys", category="pitfall")
        system.items.put(("n",), "k", {"precious": True})
        agent.remember("the sandbox rate-limits parallel runs")
        (tmp_path / "into-data").symlink_to(data)
        for path in (
            data / "items.sqlite",  # a live database: the export would be renamed over it
            data / "knowledge" / "a.sqlite",
            data / "export.jsonl",
            tmp_path / "into-data" / "items.sqlite",  # through a symlink to the data dir
        ):
            with pytest.raises(
                InvalidInputError, match=r"inside memstrata's data dir .* write the export elsewhere"
            ):
                system.export(path)
        for path in (data / "knowledge", data / "episodic" / "a.sqlite", data / "archive.sqlite"):
            with pytest.raises(
                InvalidInputError, match=r"inside memstrata's data dir .*\(other than .*episodic/archives\)"
            ):
                agent.archive_episodes(path)
        assert not (data / "archive.sqlite").exists()
        assert agent.list_episodes() and system.items.get(("n",), "k").value == {"precious": True}
        assert agent.archive_episodes(data / "episodic" / "archives" / "mine.sqlite").archived == 1
        assert system.export(tmp_path / "out.jsonl") > 0
    with MemorySystem.start(Config(data_dir=data), embedder=HashEmbedder()) as system:  # nothing replaced
        assert [e.content for e in system.agent("a").list_knowledge()] == ["Charges need idempotency keys"]
        assert system.items.get(("n",), "k").value == {"precious": True}


def test_an_archive_path_that_cannot_be_made_is_an_error_of_the_call_not_a_crash(tmp_path: Path) -> None:
    """A folder that cannot be made (under a file, or a path the system forbids) answers with a
    one-line ArchiveError: the store did not crash, so no number of such calls degrades the agent."""
    (tmp_path / "a-file").write_text("x", encoding="utf-8")
    with MemorySystem.start(Config(data_dir=tmp_path / "d"), embedder=HashEmbedder()) as system:
        agent = system.agent("a")
        agent.remember("the sandbox rate-limits parallel runs")
        for _ in range(6):  # more than the restarts a crashing store is allowed before degrading
            with pytest.raises(ArchiveError, match=r"^cannot write archive .*a-file/sub/x\.sqlite: "):
                agent.archive_episodes(tmp_path / "a-file" / "sub" / "x.sqlite")
        assert system.status()["degraded"] == {}
        assert [e.content for e in agent.list_episodes()] == ["the sandbox rate-limits parallel runs"]
        assert agent.store_knowledge("still writable", category="note") > 0


def test_a_configured_archive_dir_inside_the_data_dir_is_refused_at_start(tmp_path: Path) -> None:
    """Retention's archives among the stores would be taken for a store of an agent named after
    them: the key is refused when the system starts, as an archive path is when asked."""
    data = tmp_path / "d"
    for folder in (str(data / "episodic"), str(data), "../knowledge", str(tmp_path / "into-data" / "x")):
        (tmp_path / "into-data").unlink(missing_ok=True)
        (tmp_path / "into-data").symlink_to(data, target_is_directory=True)
        config = Config.load(
            data_dir=str(data), episodic__retention_max_count=1, episodic__archive_dir=folder
        )
        with pytest.raises(
            ConfigError, match=r"config key 'episodic.archive_dir': .* inside memstrata's data dir"
        ):
            MemorySystem.start(config, embedder=HashEmbedder())
    allowed = {  # the data dir's archives folder (relative or not), or anywhere outside the data dir
        "archives": "episodic/archives",
        str(tmp_path / "d1" / "episodic" / "archives" / "old"): "episodic/archives/old",
        str(tmp_path / "kept"): "../kept",
    }
    for n, (folder, where) in enumerate(allowed.items()):
        data = tmp_path / f"d{n}"
        config = Config.load(
            data_dir=str(data), episodic__retention_max_count=1, episodic__archive_dir=folder
        )
        with MemorySystem.start(config, embedder=HashEmbedder()) as system:
            agent = system.agent("a")
            agent.remember("the first note")
            agent.remember("the second note")
            agent.commit()  # retention keeps one: the first goes to an archive in the folder
        assert [p.name for p in (data / "episodic").glob("*.sqlite")] == ["a.sqlite"], folder
        assert len(list((data / where).glob("a-retired-*.sqlite"))) == 1, folder


def test_export_and_import_are_operations_and_cli_commands(tmp_path: Path) -> None:
    assert find("export").group == "system" and find("export").read_only
    assert find("import").group == "system" and not find("import").read_only
    runner = CliRunner()
    state = CliState(embedder=HashEmbedder())
    base = ["--data-dir", str(tmp_path / "one")]
    stored = runner.invoke(cli, [*base, "store", "Charges need keys", "-a", "x", "-c", "pitfall"], obj=state)
    assert stored.exit_code == 0, stored.output
    exported = runner.invoke(cli, [*base, "export", str(tmp_path / "e.jsonl"), "--json"], obj=state)
    assert exported.exit_code == 0, exported.output
    assert orjson.loads(exported.output)["lines"] == 2
    other = ["--data-dir", str(tmp_path / "two")]
    imported = runner.invoke(
        cli, [*other, "import", str(tmp_path / "e.jsonl")], obj=CliState(embedder=HashEmbedder())
    )
    assert imported.exit_code == 0, imported.output
    assert "1 knowledge" in imported.output
    assert "lasted only" not in imported.stderr  # knowledge is on disk: nothing to warn of
    with_values = tmp_path / "values.jsonl"
    records = _records(tmp_path / "e.jsonl")
    records[0]["records"] += 2
    records += [
        {"kind": "working", "agent": "x", "key": "k", "value": 1},
        {"kind": "signal", "session": "s1", "key": "k", "value": 2, "publisher": None, "version": 1},
    ]
    with_values.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    warned = runner.invoke(cli, [*other, "import", str(with_values)], obj=CliState(embedder=HashEmbedder()))
    assert warned.exit_code == 0, warned.output
    assert (
        "memstrata: warning: 1 working-memory value(s) and 1 blackboard value(s) "
        "(actors.blackboard_snapshot keeps boards) lasted only while this command ran" in warned.stderr
    )
    missing = runner.invoke(cli, [*other, "import", str(tmp_path / "nope.jsonl")], obj=state)
    assert missing.exit_code == 2


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path


def test_episodes_keep_their_ids_into_an_empty_store_and_a_promoted_entry_follows_its_episode(
    tmp_path: Path,
) -> None:
    """A promoted entry's episode_id tag names its episode after an import: into an empty store
    episodes keep their ids (gaps included), into one with episodes the tag takes the new id."""
    with MemorySystem.start(Config(data_dir=tmp_path / "src"), embedder=HashEmbedder()) as system:
        agent = system.agent("a1")
        first = agent.remember("deploy failed: missing migration", task_run_id="r1", at=START)
        agent.remember("tests were flaky", at=START - dt.timedelta(hours=5))  # recorded later, dated earlier
        agent.delete_episode(agent.remember("scratch note", at=START))
        last = agent.remember("rollout succeeded", task_run_id="r2", at=START + dt.timedelta(minutes=1))
        agent.promote_episode(first, category="pitfall")
        agent.promote_episode(last, category="outcome", store="shared")
        kept = {e.id: e.content for e in agent.list_episodes()}
        system.export(tmp_path / "m.jsonl")
    assert sorted(kept) == [1, 2, 4]

    def named(agent: Any) -> dict[str, str | None]:
        entries = [*agent.list_knowledge(), *agent.list_knowledge(store="shared")]
        episodes = {e.content: agent.get_episode(int(e.tags["episode_id"])) for e in entries}
        return {content: None if ep is None else ep.content for content, ep in episodes.items()}

    promoted = {"deploy failed: missing migration": "deploy failed: missing migration"}
    promoted["rollout succeeded"] = "rollout succeeded"
    with MemorySystem.start(Config(data_dir=tmp_path / "empty"), embedder=HashEmbedder()) as system:
        system.import_(tmp_path / "m.jsonl")
        agent = system.agent("a1")
        assert {e.id: e.content for e in agent.list_episodes()} == kept
        assert named(agent) == promoted
        assert agent.remember("a new episode") == 5
    with MemorySystem.start(Config(data_dir=tmp_path / "used"), embedder=HashEmbedder()) as system:
        agent = system.agent("a1")
        for n in range(3):
            agent.remember(f"held before the import {n}")
        assert system.import_(tmp_path / "m.jsonl")["episode"] == 3
        assert named(agent) == promoted  # renumbered episodes, tags rewritten to their new ids


def test_an_import_leaves_an_entry_already_there_as_it_is(tmp_path: Path) -> None:
    """An older export imported into the live system skips an entry it holds (same content,
    category and scope): its newer tags and updated_at are not reverted."""
    clock = ManualClock(START)
    with MemorySystem.start(Config(data_dir=tmp_path / "d"), embedder=HashEmbedder(), clock=clock) as system:
        agent = system.agent("a1")
        entry = agent.store_knowledge("Rotate keys monthly", category="pattern", tags={"status": "draft"})
        system.export(tmp_path / "old.jsonl")
        clock.advance(60)
        agent.update_knowledge(entry, tags={"status": "approved"})
        before = agent.get_knowledge(entry)
        counts = system.import_(tmp_path / "old.jsonl")
        assert (counts["knowledge"], counts["skipped"]) == (0, 1)
        assert agent.get_knowledge(entry) == before
        assert before is not None and before.tags == {"status": "approved"}


@pytest.mark.parametrize(
    ("kind", "change", "message"),
    [
        ("signal", {"session": None}, r"\(signal\): session is missing"),
        ("signal", {"value": None}, r"\(signal\): value is missing"),
        ("working", {"value": None}, r"\(working\): value is missing"),
        ("knowledge", {"id": 2**63 - 1}, r"\(knowledge\): id must be an integer from 1 to 9007199254740991"),
        ("episode", {"id": 0}, r"\(episode\): id must be an integer from 1 to 9007199254740991, got 0"),
        ("item", {"created_at": 1e300}, r"\(item\): created_at must be a number of UNIX seconds within"),
        ("knowledge", {"updated_at": -1e18}, r"\(knowledge\): updated_at must be a number of UNIX seconds"),
        ("episode", {"uuid": 12345}, r"\(episode\): uuid must be a non-empty string .*, got 12345"),
        ("episode", {"uuid": {"a": 1}}, r"\(episode\): uuid must be a non-empty string"),
    ],
    ids=[
        "signal-without-session",
        "signal-without-value",
        "working-without-value",
        "id-past-what-json-holds",
        "id-zero",
        "item-time-past-a-datetime",
        "knowledge-time-before-a-datetime",
        "uuid-a-number",
        "uuid-an-object",
    ],
)
def test_an_import_refuses_up_front_what_no_live_write_could_store(
    tmp_path: Path, kind: str, change: dict[str, Any], message: str
) -> None:
    """A field the import reads as given is there; ids are integers every JSON client holds
    exactly (past them SQLite's sequence runs out); times are what a datetime holds (past them
    each door crashes showing the date); a uuid is text. Refused naming the line and the field,
    before anything is applied (items and knowledge were written before a signal line crashed)."""
    with MemorySystem.start(
        Config(data_dir=tmp_path / "src"), embedder=HashEmbedder(), clock=ManualClock(START)
    ) as system:
        _fill(system, ManualClock(START))
        system.items.put(("docs",), "roof", {"t": "solar"})
        system.export(tmp_path / "good.jsonl")
    records = _records(tmp_path / "good.jsonl")
    line = next(n for n, r in enumerate(records) if r["kind"] == kind)
    changed = {**records[line], **change}  # None in a change: the field is left out
    records[line] = {k: v for k, v in changed.items() if v is not None or k not in change}
    _write(tmp_path / "bad.jsonl", records)
    with MemorySystem.start(Config(data_dir=tmp_path / "dst"), embedder=HashEmbedder()) as system:
        with pytest.raises(InvalidInputError, match=rf"^\S*bad.jsonl line {line + 1} {message}"):
            system.import_(tmp_path / "bad.jsonl")
        assert system.status()["agents"] == {}
        assert system.items.search(("docs",)) == []
        assert system.blackboard("checkout").list() == []


def test_the_largest_id_every_json_client_holds_is_kept_and_the_store_goes_on(tmp_path: Path) -> None:
    header = {"format": "memstrata-export", "kind": "export", "version": 1, "records": 1}
    entry = {"kind": "knowledge", "owner": "a1", "id": 2**53 - 1, "content": "fact", "category": "pattern"}
    _write(tmp_path / "top.jsonl", [header, entry])
    with MemorySystem.start(Config(data_dir=tmp_path / "d"), embedder=HashEmbedder()) as system:
        assert system.import_(tmp_path / "top.jsonl")["knowledge"] == 1
        assert system.agent("a1").store_knowledge("another fact", category="pattern") == 2**53


MONTH_AGO = START - dt.timedelta(days=30)


def _old_and_new(system: MemorySystem) -> Agent:
    """Agent a1 with an episode of 40 days ago (one an archive of what is older than a month
    takes) and one of today."""
    agent = system.agent("a1")
    agent.remember("old incident", at=START - dt.timedelta(days=40))
    agent.remember("today", at=START)
    return agent


def test_an_export_over_an_episode_archive_is_refused_and_the_archive_kept(tmp_path: Path) -> None:
    """An archive may live outside the data dir: an export to its path (or through a symlink to
    it) would replace it and its episodes would be gone for good."""
    with MemorySystem.start(Config(data_dir=tmp_path / "d"), embedder=HashEmbedder()) as system:
        agent = _old_and_new(system)
        archive = tmp_path / "backup.sqlite"
        assert agent.archive_episodes(archive, before=MONTH_AGO).archived == 1
        (tmp_path / "via").symlink_to(tmp_path, target_is_directory=True)
        refused = f"export path '{archive}' is an episode archive of agent 'a1': write the export elsewhere"
        for path in (archive, tmp_path / "via" / "backup.sqlite"):
            with pytest.raises(InvalidInputError, match=f"^{re.escape(refused)}$"):
                system.export(path)
        assert agent.restore_episodes(archive) == 1  # the archive is whole
        assert system.export(tmp_path / "elsewhere.jsonl") > 0


def test_an_episode_archived_again_after_a_restore_is_exported_once(tmp_path: Path) -> None:
    """Archive, restore, archive again: two archive files hold the episode; the export holds it once."""
    with MemorySystem.start(Config(data_dir=tmp_path / "d"), embedder=HashEmbedder()) as system:
        agent = _old_and_new(system)
        first = agent.archive_episodes(before=MONTH_AGO)
        assert agent.restore_episodes(first.path) == 1
        assert agent.archive_episodes(before=MONTH_AGO).archived == 1
        system.export(tmp_path / "x.jsonl")
    episodes = [r for r in _records(tmp_path / "x.jsonl") if r["kind"] == "episode"]
    assert sorted((r["content"], r["archive"]) for r in episodes) == [
        ("old incident", Path(first.path).name),
        ("today", None),
    ]


def test_a_damaged_archive_is_reported_and_the_export_goes_on_without_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A tracked archive replaced by another file: status says so at once (not only after a
    search), and an export still holds everything else, saying what it left out."""
    with MemorySystem.start(Config(data_dir=tmp_path / "d"), embedder=HashEmbedder()) as system:
        agent = _old_and_new(system)
        archive = tmp_path / "old.sqlite"
        assert agent.archive_episodes(archive, before=MONTH_AGO).archived == 1
        archive.write_bytes(b"not an archive at all")
        warnings = system.status()["warnings"]
        assert any(str(archive) in w and "not an SQLite file" in w for w in warnings), warnings
        with caplog.at_level(logging.WARNING, logger="memstrata.actors"):
            system.export(tmp_path / "x.jsonl")
    episodes = [r["content"] for r in _records(tmp_path / "x.jsonl") if r["kind"] == "episode"]
    assert episodes == ["today"]
    assert any(str(archive) in r.getMessage() and "left out" in r.getMessage() for r in caplog.records)
