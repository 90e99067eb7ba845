"""Simulations replay exactly: same seed and inputs -> byte-identical memory, in other processes too."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest

from memstrata import Config, MemorySystem
from memstrata.actors import IdSource, LayerStores
from memstrata.storage import Embedder
from memstrata.testing import HashEmbedder, ManualClock

_RUN_DEMO = """
import sys
from pathlib import Path
from memstrata._demo import run_demo
from memstrata.testing import HashEmbedder, ManualClock

run_demo(Path(sys.argv[1]), out=lambda line: None, seed=int(sys.argv[3]), embedder=HashEmbedder(),
         clock=ManualClock(), export_to=Path(sys.argv[2]))
"""


def _demo_processes(tmp_path: Path, seeds: list[int]) -> list[bytes]:
    """Run the demo once per seed, each in its own process (side by side), and read the exports."""
    runs = []
    for n, seed in enumerate(seeds):
        export = tmp_path / f"export-{n}.jsonl"
        proc = subprocess.Popen(
            [sys.executable, "-c", _RUN_DEMO, str(tmp_path / f"run-{n}"), str(export), str(seed)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        runs.append((proc, export))
    outputs = []
    for proc, export in runs:
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
        outputs.append(export.read_bytes())
    return outputs


def test_the_demo_replays_byte_for_byte_in_two_processes_and_another_seed_differs(tmp_path: Path) -> None:
    first, second, other = _demo_processes(tmp_path, [11, 11, 12])
    assert first == second
    assert first != other
    records = [orjson.loads(line) for line in first.splitlines()]
    kinds = {r["kind"] for r in records}
    assert {"export", "knowledge", "episode", "signal"} <= kinds
    assert sum(1 for r in records if r["kind"] == "episode") == 20  # one per task
    assert any(r["kind"] == "knowledge" and r["owner"] == "shared" for r in records)
    # everything is dated by the simulated clock, which starts on 2025-01-01 and moves a minute per round
    assert all(r["at"].startswith("2025-01-01T00:") for r in records if r["kind"] == "episode")


def _scripted(data_dir: Path, seed: int | None, clock: ManualClock) -> bytes:
    with MemorySystem.start(
        Config(data_dir=data_dir), embedder=HashEmbedder(), clock=clock, seed=seed
    ) as system:
        agent = system.agent("a")
        agent.store_knowledge("retry charges with the same idempotency key", category="pattern")
        agent.remember("the sandbox rate-limits parallel runs")
        clock.advance(60)
        agent.begin_task("t1", "stabilise the payment tests")
        agent.fail_task("t1", "parallel runs hit the sandbox rate limit")
        agent.set_working("plan", ["serial runs"], ttl_s=600)
        system.blackboard("s").publish("agent:a:status", "idle", "a", wait=True)
        export = data_dir.with_name(f"{data_dir.name}.jsonl")  # beside the data dir, never in it
        system.export(export)
        return export.read_bytes()


def test_seed_and_clock_make_ids_and_times_reproducible(tmp_path: Path) -> None:
    start = dt.datetime(2026, 11, 20, 9, 0, tzinfo=dt.UTC)
    one = _scripted(tmp_path / "one", 5, ManualClock(start))
    two = _scripted(tmp_path / "two", 5, ManualClock(start))
    assert one == two
    records = [orjson.loads(line) for line in one.splitlines()]
    knowledge = [r for r in records if r["kind"] == "knowledge"]
    assert {r["created_at"] for r in knowledge} == {start.timestamp(), start.timestamp() + 60}
    working = next(r for r in records if r["kind"] == "working")
    assert working["expires_in_s"] == 600.0
    unseeded = _scripted(tmp_path / "three", None, ManualClock(start))
    assert unseeded != one  # random uuids without a seed
    assert [r for r in records if r["kind"] != "episode"] == [
        r for r in map(orjson.loads, unseeded.splitlines()) if r["kind"] != "episode"
    ]


def test_seeded_ids_depend_on_seed_scope_and_count_only() -> None:
    a, b = IdSource(1), IdSource(1)
    assert [a.uuid("episode:x") for _ in range(3)] == [b.uuid("episode:x") for _ in range(3)]
    assert IdSource(1).uuid("episode:y") != IdSource(1).uuid("episode:x")
    assert IdSource(2).uuid("episode:x") != IdSource(1).uuid("episode:x")
    assert IdSource().uuid("s") != IdSource().uuid("s")
    with pytest.raises(ValueError, match="seed"):
        IdSource(1.5)  # type: ignore[arg-type]


def test_a_restart_with_the_same_seed_never_reuses_an_episode_id(tmp_path: Path) -> None:
    config = Config(data_dir=tmp_path)
    for _ in range(2):
        with MemorySystem.start(config, embedder=HashEmbedder(), clock=ManualClock(), seed=9) as system:
            system.agent("a").remember("a note")  # a reused uuid would fail its UNIQUE constraint
    with MemorySystem.start(config, embedder=HashEmbedder(), clock=ManualClock(), seed=9) as system:
        assert len(system.agent("a").recall("note")) == 2


def test_a_restart_after_a_delete_with_the_same_seed_gives_a_new_episode_a_new_uuid(tmp_path: Path) -> None:
    """Deletes bring the store back to an earlier count of episodes; a uuid drawn again would
    make an import of a backup skip the backed-up episode as already there."""
    config = Config(data_dir=tmp_path / "data")
    uuids = []
    for text in ("the sandbox rate-limits parallel runs", "an unrelated later note"):
        with MemorySystem.start(config, embedder=HashEmbedder(), clock=ManualClock(), seed=42) as system:
            agent = system.agent("qa")
            episode_id = agent.remember(text)
            uuids.append(agent.get_episode(episode_id).uuid)
            if not (tmp_path / "backup.jsonl").exists():
                system.export(tmp_path / "backup.jsonl")
                assert agent.delete_episode(episode_id)
    assert uuids[0] != uuids[1]
    with MemorySystem.start(config, embedder=HashEmbedder(), clock=ManualClock(), seed=42) as system:
        assert system.import_(tmp_path / "backup.jsonl")["episode"] == 1
        assert len(system.agent("qa").list_episodes()) == 2


class _Gate:
    """A knowledge store whose searches wait until the test opens the gate."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()


class _GatedStores(LayerStores):
    def __init__(self, gate: _Gate) -> None:
        self.gate = gate

    def open_knowledge(self, path: Path, embedder: Embedder | None, config: Config) -> Any:
        layer = super().open_knowledge(path, embedder, config)
        search, gate = layer.search, self.gate

        def gated(*args: Any, **kwargs: Any) -> Any:
            gate.entered.set()
            gate.release.wait(30)
            return search(*args, **kwargs)

        layer.search = gated
        return layer


def test_advancing_the_clock_past_the_budget_ends_a_pending_retrieval(tmp_path: Path) -> None:
    gate = _Gate()
    clock = ManualClock()
    with MemorySystem.start(
        Config(data_dir=tmp_path), embedder=HashEmbedder(), clock=clock, stores=_GatedStores(gate)
    ) as system:
        agent = system.agent("a")
        agent.store_knowledge("charges need idempotency keys", category="pitfall")
        answers: list[Any] = []
        caller = threading.Thread(target=lambda: answers.append(agent.begin_task("t1", "charge cards")))
        caller.start()
        assert gate.entered.wait(10)  # the retrieval is pending in the store
        clock.advance(4.9)
        assert not answers  # not due yet: the store still holds the search
        clock.advance(0.2)  # past the 5 s budget on the simulated clock
        caller.join(10)
        gate.release.set()
        assert answers, "begin_task did not return"
        prompt = answers[0]
        assert prompt.fallback
        # the agent's own deadline (on the clock) answered, not the caller's real-time bound
        assert prompt.reason.startswith("timeout: knowledge query took longer than 5 s"), prompt.reason


def test_retrieval_deadlines_still_run_on_real_time_with_the_system_clock(tmp_path: Path) -> None:
    gate = _Gate()
    config = Config.from_mapping({"data_dir": str(tmp_path), "agent": {"retrieval_timeout_s": 0.2}})
    with MemorySystem.start(config, embedder=HashEmbedder(), stores=_GatedStores(gate)) as system:
        agent = system.agent("a")
        agent.store_knowledge("charges need idempotency keys", category="pitfall")
        try:
            prompt = agent.begin_task("t1", "charge cards")
        finally:
            gate.release.set()
        assert prompt.fallback and prompt.reason.startswith("timeout: knowledge query took longer")
