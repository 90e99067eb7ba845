"""Agents use their memory files and the codebases: config, sync triggers, prompts, access modes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from memstrata import Config, MemorySystem
from memstrata.errors import ConfigError
from memstrata.testing import HashEmbedder, ManualClock


@pytest.fixture
def trees(tmp_path: Path) -> dict[str, Path]:
    workspace = tmp_path / "ws"
    (workspace / "memory").mkdir(parents=True)
    (workspace / "MEMORY.md").write_text("# Notes\n\nThe payment gateway <needs> idempotency & retries.\n")
    (workspace / "memory" / "2026-11-20.md").write_text(
        "# 2026-11-20\n\nRefunds from the gateway are slow.\n"
    )
    code = tmp_path / "shop"
    code.mkdir()
    (code / "pay.py").write_text(
        'def charge_payment(amount):\n    """Charge once: reuse the idempotency key."""\n    return amount\n'
    )
    return {"workspace": workspace, "code": code, "data": tmp_path / "data"}


def _config(trees: dict[str, Path], **agent: Any) -> Config:
    settings: dict[str, Any] = {"workspace": str(trees["workspace"]), **agent}
    return Config.from_mapping(
        {
            "data_dir": str(trees["data"]),
            "codebases": {"shop": str(trees["code"])},
            "agents": {"a": settings},
        }
    )


def _snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _start(config: Config) -> MemorySystem:
    return MemorySystem.start(config, embedder=HashEmbedder(), clock=ManualClock(), seed=1)


def test_the_prompt_carries_file_and_code_entries_escaped(trees: dict[str, Path]) -> None:
    with _start(_config(trees)) as system:
        agent = system.agent("a")
        agent.store_knowledge("Charges need an idempotency key", category="pitfall")
        prompt = agent.begin_task("t1", "make payment charges idempotent")
    assert not prompt.fallback, prompt.reason
    text = prompt.text
    assert text.startswith('<knowledge-context>\n<entry category="pitfall"')
    assert '<entry source="file" path="MEMORY.md" lines="1-3" relevance="' in text
    assert "The payment gateway &lt;needs&gt; idempotency &amp; retries." in text
    assert '<entry source="code" path="pay.py" lines="1-3" relevance="' in text
    assert 'codebase="shop" language="python">' in text
    assert text.endswith("<task>make payment charges idempotent</task>")
    sources = [f.source for f in prompt.files]
    assert "file" in sources and "code" in sources
    assert sources == sorted(sources, key=lambda s: s != "file")  # memory files, then code


def test_file_hits_alone_make_a_context_and_each_source_is_bounded(trees: dict[str, Path]) -> None:
    for n in range(6):
        (trees["code"] / f"gateway_{n}.py").write_text(
            f"def gateway_{n}():\n    return 'payment gateway {n}'\n"
        )
    with _start(_config(trees, code_in_prompt=2, files_in_prompt=1)) as system:
        prompt = system.agent("a").begin_task("t1", "payment gateway")
    assert not prompt.fallback
    assert [f.source for f in prompt.files].count("file") == 1
    assert [f.source for f in prompt.files].count("code") == 2


def test_a_session_start_syncs_the_workspace_and_the_codebases(trees: dict[str, Path]) -> None:
    with _start(_config(trees)) as system:
        system.agent("a")  # the agent's session starts
        assert system.wait_idle(30)
        status = system.status()
    workspace = status["agents"]["a"]["workspace"]
    assert workspace["syncs"] == 1 and workspace["files"] == 2 and workspace["searches"] == 0
    assert status["codebases"]["shop"]["syncs"] == 1 and status["codebases"]["shop"]["files"] == 1


def test_a_file_name_that_is_not_utf8_leaves_the_rest_of_a_codebase_in_the_prompts(
    trees: dict[str, Path],
) -> None:
    (trees["code"] / os.fsdecode(b"caf\xe9.py")).write_text("def charge_twice(): pass\n")
    with _start(_config(trees)) as system:
        agent = system.agent("a")
        assert system.wait_idle(30)
        shop = system.status()["codebases"]["shop"]
        prompt = agent.begin_task("t1", "make payment charges idempotent")
    assert shop["last_sync_error"] is None and shop["syncs"] == 1 and shop["files"] == 1
    assert [f.path for f in prompt.files if f.source == "code"] == ["pay.py"]


def test_a_search_syncs_lazily_what_changed(trees: dict[str, Path]) -> None:
    config = Config.from_mapping(
        {
            "data_dir": str(trees["data"]),
            "agents": {"a": {"workspace": str(trees["workspace"]), "sync": {"watch": False}}},
        }
    )
    with _start(config) as system:
        agent = system.agent("a")
        assert system.wait_idle(30)
        (trees["workspace"] / "memory" / "2026-11-21.md").write_text("Zanzibar tokens expire hourly.\n")
        prompt = agent.begin_task("t1", "zanzibar tokens")
        assert system.status()["agents"]["a"]["workspace"]["watcher"] == {"running": False}
    assert any(f.path == "memory/2026-11-21.md" for f in prompt.files), prompt.text


def test_a_read_write_workspace_gets_each_outcome_in_its_daily_file(trees: dict[str, Path]) -> None:
    with _start(_config(trees)) as system:
        agent = system.agent("a")
        agent.complete_task("t1", "Charged with the idempotency key")
        agent.fail_task("t2", "The refund webhook timed out")
        assert system.wait_idle(30)
    daily = (trees["workspace"] / "memory" / "2025-01-01.md").read_text()
    assert "## 00:00:00 task t1 completed\n\nCharged with the idempotency key\n" in daily
    assert "task t2 failed" in daily


def test_a_retried_outcome_is_written_once_everywhere(trees: dict[str, Path]) -> None:
    """An orchestrator whose ask timed out after the outbox committed sends the same outcome
    again: one knowledge entry, one episode, one daily note; a new outcome of the task is news."""
    with _start(_config(trees)) as system:
        agent = system.agent("a")
        for _ in range(3):
            agent.complete_task("t1", "Charged with the idempotency key")
        agent.complete_task("t1", "Charged again after the refund")
        assert system.wait_idle(30)
        episodes = [(e.task_run_id, e.content) for e in agent.list_episodes(limit=10)]
        knowledge = sorted(e.content for e in agent.list_knowledge())
    assert sorted(episodes) == [
        ("t1", "Charged again after the refund"),
        ("t1", "Charged with the idempotency key"),
    ]
    assert knowledge == ["Charged again after the refund", "Charged with the idempotency key"]
    daily = (trees["workspace"] / "memory" / "2025-01-01.md").read_text()
    assert daily.count("Charged with the idempotency key") == 1 and daily.count("Charged again") == 1


def test_an_outcome_is_shown_once_though_its_daily_note_repeats_it(trees: dict[str, Path]) -> None:
    """The outcome entry and the daily note the system wrote of it say the same: the prompt
    shows it once, as the entry."""
    summary = "Payment gateway moved behind an interface; the adapter owns retries"
    with _start(_config(trees)) as system:
        agent = system.agent("a")
        agent.complete_task("t1", summary)
        assert system.wait_idle(30)
        prompt = agent.begin_task("t2", "payment gateway adapter retries")
    assert prompt.text.count(summary) == 1
    assert [h.entry.content for h in prompt.hits if h.entry.content == summary] == [summary]
    assert not any(summary in f.text for f in prompt.files)


def test_a_read_only_workspace_is_indexed_and_never_written(trees: dict[str, Path]) -> None:
    before = _snapshot(trees["workspace"])
    with _start(_config(trees, workspace_access="ro")) as system:
        agent = system.agent("a")
        prompt = agent.begin_task("t1", "payment gateway retries")
        agent.complete_task("t1", "retries added")
        assert system.wait_idle(30)
    assert any(f.source == "file" for f in prompt.files)
    assert _snapshot(trees["workspace"]) == before


def test_workspace_access_none_disables_it(trees: dict[str, Path]) -> None:
    before = _snapshot(trees["workspace"])
    with _start(_config(trees, workspace_access="none", codebases=[])) as system:
        agent = system.agent("a")
        prompt = agent.begin_task("t1", "payment gateway retries")
        agent.complete_task("t1", "retries added")
        assert system.wait_idle(30)
        assert "workspace" not in system.status()["agents"]["a"]
    assert prompt.fallback and prompt.files == ()
    assert _snapshot(trees["workspace"]) == before


def test_the_daily_note_never_follows_a_symlink_out_of_the_workspace(
    trees: dict[str, Path], tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    memory = trees["workspace"] / "memory"
    for child in memory.iterdir():
        child.unlink()
    memory.rmdir()
    memory.symlink_to(outside, target_is_directory=True)
    with _start(_config(trees)) as system:
        system.agent("a").complete_task("t1", "done")
        assert system.wait_idle(30)
        status = system.status()
        state = status["agents"]["a"]["workspace"]
    assert any("a workspace" in w and "symlink" in w for w in status["warnings"]), status["warnings"]
    assert list(outside.iterdir()) == []
    assert state["notes_written"] == 0 and "symlink" in state["last_note_error"]


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("missing", "does not exist"),
        ("file.txt", "is not a directory"),
        ("/", "filesystem root"),
        ("data", "data dir"),
        ("data/inside", "data dir"),
        ("bad\x00name", "NUL"),
        ("", "must be a non-empty path"),
    ],
)
def test_hostile_workspace_paths_are_refused_naming_the_key(
    trees: dict[str, Path], tmp_path: Path, path: str, message: str
) -> None:
    (tmp_path / "file.txt").write_text("x")
    (trees["data"] / "inside").mkdir(parents=True)
    target = path if path in ("/", "") or "\x00" in path else str(tmp_path / path)
    config = Config.from_mapping({"data_dir": str(trees["data"]), "agents": {"a": {"workspace": target}}})
    with pytest.raises(ConfigError, match=message) as caught:
        _start(config)
    assert "agents.a.workspace" in str(caught.value)


def test_bad_codebase_entries_are_refused_naming_the_key(trees: dict[str, Path]) -> None:
    def start(data: dict[str, Any]) -> None:
        _start(Config.from_mapping({"data_dir": str(trees["data"]), **data})).stop()

    with pytest.raises(ConfigError, match=r"codebases\.\.\./x"):
        start({"codebases": {"../x": str(trees["code"])}})
    with pytest.raises(ConfigError, match=r"codebases\.shop"):
        start({"codebases": {"shop": str(trees["data"] / "nowhere")}})
    with pytest.raises(ConfigError, match=r"agents\.a\.codebases.*nope"):
        start({"codebases": {"shop": str(trees["code"])}, "agents": {"a": {"codebases": ["nope"]}}})
    with pytest.raises(ConfigError, match=r"agents\.a\.workspace_access"):
        Config.from_mapping({"agents": {"a": {"workspace_access": "write"}}})


def test_a_symlinked_workspace_resolves_to_its_target(trees: dict[str, Path], tmp_path: Path) -> None:
    link = tmp_path / "link"
    os.symlink(trees["workspace"], link)
    config = Config.from_mapping({"data_dir": str(trees["data"]), "agents": {"a": {"workspace": str(link)}}})
    with _start(config) as system:
        system.agent("a")
        assert system.wait_idle(30)
        assert system.status()["agents"]["a"]["workspace"]["root"] == str(trees["workspace"].resolve())


def test_agent_sections_override_embedding_sync_and_files(trees: dict[str, Path]) -> None:
    config = Config.from_mapping(
        {
            "data_dir": str(trees["data"]),
            "sync": {"watch": False},
            "agents": {
                "a": {"workspace": str(trees["workspace"]), "sync": {"watch": True}},
                "b": {"workspace": str(trees["workspace"]), "files": {"exclude": ["MEMORY.md"]}},
            },
        }
    )
    assert config.of_agent("a").sync.watch and not config.of_agent("b").sync.watch
    assert config.of_agent("b").files.exclude == ("MEMORY.md",)
    assert config.of_agent("c").sync == config.sync
    with pytest.raises(ConfigError, match=r"agents\.a\.embedding\.bogus"):
        Config.from_mapping({"agents": {"a": {"embedding": {"bogus": 1}}}})
    with _start(config) as system:
        system.agent("a"), system.agent("b")
        assert system.wait_idle(30)
        agents = system.status()["agents"]
        b_prompt = system.agent("b").begin_task("t1", "payment gateway idempotency")
    assert agents["a"]["workspace"]["watcher"]["running"] is True
    assert agents["b"]["workspace"]["watcher"] == {"running": False}
    assert agents["b"]["workspace"]["files"] == 1  # MEMORY.md excluded for b only
    assert all(f.path != "MEMORY.md" for f in b_prompt.files)


def test_a_file_search_that_misses_the_deadline_is_left_out_and_named(
    trees: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from memstrata.actors._base import Status
    from memstrata.layers import Codebase, MemoryFiles

    entered, release = threading.Event(), threading.Event()
    search = MemoryFiles.search

    def stuck(self: MemoryFiles, *args: Any, **kwargs: Any) -> Any:
        entered.set()
        release.wait(30)
        return search(self, *args, **kwargs)

    code_searched = threading.Event()
    code_search = Codebase.search

    def traced(self: Codebase, *args: Any, **kwargs: Any) -> Any:
        code_searched.set()
        return code_search(self, *args, **kwargs)

    monkeypatch.setattr(MemoryFiles, "search", stuck)
    monkeypatch.setattr(Codebase, "search", traced)
    clock = ManualClock()
    answers: list[Any] = []
    with MemorySystem.start(_config(trees), embedder=HashEmbedder(), clock=clock) as system:
        agent = system.agent("a")
        agent.store_knowledge("Charges need an idempotency key", category="pitfall")
        caller = threading.Thread(target=lambda: answers.append(agent.begin_task("t1", "payment charges")))
        caller.start()
        try:
            assert entered.wait(10)  # the workspace's search is under way and will not finish
            assert code_searched.wait(10)
            # the codebase actor answers this after the search it is running: by then the search's
            # reply is in the agent's mailbox, ahead of the deadline the clock is about to post
            runtime = system._runtime
            runtime.wait(runtime.request("codebase", "shop", Status()), 10, "codebase status")
            clock.advance(5.5)  # past the budget on the simulated clock: nobody waits for it
            caller.join(10)
        finally:
            release.set()
    assert answers, "begin_task did not return"
    prompt = answers[0]
    assert not prompt.fallback
    assert [f.source for f in prompt.files] == ["code"], prompt.reason  # the code search made it
    assert '<entry category="pitfall"' in prompt.text and 'source="file"' not in prompt.text
    assert "memory file search timed out after 5 s" in prompt.reason


def test_workspace_settings_load_from_toml_and_the_environment(tmp_path: Path) -> None:
    toml = tmp_path / "memstrata.toml"
    toml.write_text(
        '[codebases]\nshop = "~/src/shop"\n\n'
        '[agents.architect]\nworkspace = "~/agents/architect"\nworkspace_access = "ro"\n\n'
        "[agents.architect.sync]\nwatch = false\n"
    )
    env = {"MEMSTRATA_AGENTS__ARCHITECT__SYNC__LAZY": "false", "MEMSTRATA_SYNC__ON_SESSION_START": "no"}
    config = Config.load(toml, env=env)
    assert config.codebases == {"shop": "~/src/shop"}
    architect = config.of_agent("architect")
    assert architect.agent.workspace == "~/agents/architect" and architect.agent.workspace_access == "ro"
    assert (architect.sync.watch, architect.sync.lazy, architect.sync.on_session_start) == (
        False,
        False,
        False,
    )
    assert config.of_agent("other").sync.watch is True
    bad = {"MEMSTRATA_AGENTS__ARCHITECT__SYNC__WATCH": "maybe"}
    with pytest.raises(ConfigError, match="MEMSTRATA_AGENTS__ARCHITECT__SYNC__WATCH"):
        Config.load(toml, env=bad)


def test_the_workspace_actor_starts_a_watcher_by_default(trees: dict[str, Path]) -> None:
    """The watch trigger: the actor that owns the workspace runs the debounced watcher of the layer
    (its event-to-sync behaviour is tested on the layer, tests/test_files_watch.py)."""
    with _start(_config(trees)) as system:
        system.agent("a")
        assert system.wait_idle(30)
        watcher = system.status()["agents"]["a"]["workspace"]["watcher"]
    assert watcher["running"] is True and watcher["healthy"] is True, watcher
    assert watcher["debounce_s"] == 1.5


def test_a_fifo_at_the_daily_note_is_refused_and_blocks_nothing(trees: dict[str, Path]) -> None:
    fifo = trees["workspace"] / "memory" / "2025-01-01.md"  # the ManualClock's day
    os.mkfifo(fifo)
    try:
        with _start(_config(trees)) as system:
            agent = system.agent("a")
            agent.complete_task("t1", "Charged with the idempotency key")
            assert system.wait_idle(30), "the workspace actor is stuck on the FIFO"
            state = system.status()["agents"]["a"]["workspace"]
            prompt = agent.begin_task("t2", "payment gateway retries")
            report = system.stop(timeout=30)
        assert state["notes_written"] == 0
        assert state["last_note_error"] == "memory/2025-01-01.md is not a regular file (a FIFO): not written"
        assert any(f.source == "file" for f in prompt.files), prompt.reason
        assert report.drained and report.late == ()
    finally:  # without the fix a writer waits in open(): a reader lets it go
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        os.close(fd)
