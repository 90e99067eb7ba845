"""The Ray engine under failure, on a real three-node Ray cluster on loopback (``slow``).

A host process killed with SIGKILL during a write-back flood loses no acknowledged write-back
(each was in the agent's outbox on disk before the caller was answered) and retrieval works again
once Ray has restarted it; a node removed from the cluster makes its agents' tasks fall back
within the pre-task budget instead of hanging.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memstrata import Config, MemorySystem
from memstrata.errors import MemstrataError
from memstrata.testing import HashEmbedder

ray = pytest.importorskip("ray", reason="the memstrata[ray] extra is not installed")

from tests._ray_support import BOUND_S, ray_cluster, ray_config, where  # noqa: E402

pytestmark = pytest.mark.slow

NAMESPACE = "memstrata-faults"
RETRIEVAL_S = 5.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with ray_cluster(NAMESPACE, labels={"zone": "b"}) as made:
        yield made


def _config(data_dir: Path, address: str, pins: list[str]) -> Config:
    return ray_config(
        data_dir,
        address,
        NAMESPACE,
        cluster__pins=pins,
        cluster__placement="resource:node_a",
        agent__retrieval_timeout_s=RETRIEVAL_S,
    )


def _where(name: str) -> tuple[str, int]:
    return where(name, NAMESPACE)


def test_sixteen_agents_spread_over_the_nodes(cluster: Any, tmp_path: Path) -> None:
    config = ray_config(
        tmp_path / "spread",
        cluster.address,
        NAMESPACE,
        cluster__placement="spread",
        actors__ask_timeout_s=BOUND_S,  # sixteen hosts start on a 2-core machine
    )
    names = [f"s{i:02d}" for i in range(16)]
    with MemorySystem.start(config, embedder=HashEmbedder()) as system:
        for name in names:
            system.agent(name).store_knowledge(f"{name} owns the queue of team {name}", category="fact")
        for name in names:
            hits = system.agent(name).query_knowledge("queue of team", include_shared=False)
            assert [h.entry.content for h in hits] == [f"{name} owns the queue of team {name}"]
        nodes = {_where(f"agent:{name}")[0] for name in names}
        assert len(nodes) >= 2, "the agents' actors all landed on one node"


def test_one_host_per_layer_pinned_by_label_serves_the_same_task_lifecycle(
    cluster: Any, tmp_path: Path
) -> None:
    config = ray_config(
        tmp_path / "layers",
        cluster.address,
        NAMESPACE,
        cluster__group="layer",
        cluster__pins=["l0=label:zone=b"],
        # the first prompt starts the agent's hosts on the pinned node, which a busy machine
        # may take longer than the default budget to do: the lifecycle is checked here, not the
        # budget (test_a_removed_node_makes_its_agents_fall_back_within_the_budget checks that)
        agent__retrieval_timeout_s=BOUND_S,
        actors__ask_timeout_s=BOUND_S,
    )
    with MemorySystem.start(config, embedder=HashEmbedder()) as system:
        agent = system.agent("l0")
        agent.store_knowledge("the staging database is restored nightly", category="fact")
        prompt = agent.begin_task("t1", "when is the staging database restored")
        assert not prompt.fallback, prompt.reason
        assert "restored nightly" in prompt.text
        agent.complete_task("t1", "checked the nightly restore of staging")
        assert system.wait_idle(30)
        assert [e.task_run_id for e in agent.list_episodes()] == ["t1"]
        pids = {_where(f"{layer}:l0")[1] for layer in ("knowledge", "episodic", "agent")}
        assert len(pids) == 3  # each layer in its own process
        driver_node = ray.get_runtime_context().get_node_id()
        assert all(_where(f"{layer}:l0")[0] != driver_node for layer in ("knowledge", "agent"))  # zone b
        system.retire("l0")  # its actors stop in their hosts, files closed; the next use reopens them
        contents = [h.entry.content for h in agent.query_knowledge("staging restored")]
        assert "the staging database is restored nightly" in contents


def test_sigkill_during_a_write_back_flood_loses_no_acknowledged_write_back(
    cluster: Any, data_dir: Path
) -> None:
    system = MemorySystem.start(
        _config(data_dir, cluster.address, ["w0=resource:node_b"]), embedder=HashEmbedder()
    )
    try:
        agent = system.agent("w0")
        agent.store_knowledge("the release checklist lives in docs/release.md", category="fact")
        _, pid = _where("agent:w0")
        acked: list[str] = []
        failed: list[str] = []
        lock = threading.Lock()
        enough = threading.Event()
        tasks = [f"t{i}" for i in range(400)]

        def flood(mine: list[str]) -> None:
            for task in mine:
                try:
                    agent.complete_task(task, f"released build {task} following the release checklist")
                except MemstrataError:
                    with lock:
                        failed.append(task)
                    continue
                with lock:
                    acked.append(task)
                    if len(acked) >= 60:
                        enough.set()

        threads = [threading.Thread(target=flood, args=(tasks[i::4],)) for i in range(4)]
        for thread in threads:
            thread.start()
        assert enough.wait(120), "the flood did not start"
        os.kill(pid, signal.SIGKILL)  # the host process of w0's actors, mid-flood
        for thread in threads:
            thread.join(180)
        assert not any(t.is_alive() for t in threads)
        assert failed, "the kill should have failed some in-flight write-backs"

        # retrieval works again once Ray has restarted the host (a bounded wait for the restart)
        deadline = time.monotonic() + 120
        prompt = None
        while time.monotonic() < deadline:
            prompt = agent.begin_task("after", "where is the release checklist")
            if not prompt.fallback:
                break
        assert prompt is not None and not prompt.fallback, prompt and prompt.reason
        assert "docs/release.md" in prompt.text
        assert _where("agent:w0")[1] != pid

        # every acknowledged write-back becomes an episode (replayed from the outbox on restart)
        deadline = time.monotonic() + 120
        missing = set(acked)
        while missing and time.monotonic() < deadline:
            system.wait_idle(5)
            stored = {e.task_run_id for e in agent.list_episodes(limit=1000)}
            missing = set(acked) - stored
        assert not missing, f"{len(missing)} acknowledged write-backs lost of {len(acked)}"
    finally:
        system.stop(30)


def test_a_removed_node_makes_its_agents_fall_back_within_the_budget(cluster: Any, data_dir: Path) -> None:
    doomed = cluster.add_node(num_cpus=1, resources={"node_c": 1})
    cluster.wait_for_nodes()
    system = MemorySystem.start(
        _config(data_dir, cluster.address, ["gone=resource:node_c", "kept=resource:node_a"]),
        embedder=HashEmbedder(),
    )
    try:
        for name in ("gone", "kept"):
            system.agent(name).store_knowledge(f"{name} keeps the deploy notes", category="fact")
        assert not system.agent("gone").begin_task("t0", "deploy notes").fallback
        cluster.remove_node(doomed)
        started = time.monotonic()
        prompt = system.agent("gone").begin_task("t1", "where are the deploy notes")
        elapsed = time.monotonic() - started
        assert prompt.fallback
        assert elapsed < RETRIEVAL_S + 2.0, f"the fallback took {elapsed:.1f} s"
        # the agents on the nodes still up are not affected
        assert not system.agent("kept").begin_task("t2", "deploy notes").fallback
    finally:
        system.stop(10)
