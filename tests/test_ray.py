"""The Ray engine on a real two-node Ray cluster on loopback (``ray.cluster_utils.Cluster``).

One cluster for the module (starting one takes ~8 s on the 2-core machine); agents are pinned to
the nodes by custom resources, so where each actor runs is known, not left to chance.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memstrata import Config, ConfigError, MemorySystem
from memstrata.testing import HashEmbedder

ray = pytest.importorskip("ray", reason="the memstrata[ray] extra is not installed")

from tests._ray_support import BOUND_S, ray_cluster, ray_config, where  # noqa: E402

NAMESPACE = "memstrata-test"
AGENTS = ("a0", "a1", "a2", "a3")
PINS = tuple(f"{a}=resource:node_{'ab'[i % 2]}" for i, a in enumerate(AGENTS))


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with ray_cluster(NAMESPACE) as made:
        yield made


def _config(data_dir: Path, address: str, namespace: str = NAMESPACE, **more: Any) -> Config:
    return ray_config(
        data_dir,
        address,
        namespace,
        cluster__pins=list(PINS),
        cluster__placement="resource:node_b",  # blackboards and the shared store: the second node
        actors__ask_timeout_s=BOUND_S,  # headroom: a loaded 2-core machine runs the whole cluster
        **more,
    )


def _where(name: str) -> tuple[str, int]:
    return where(name, NAMESPACE)


def test_cluster_config_is_checked_and_read_from_the_environment() -> None:
    config = Config.load(env={"MEMSTRATA_CLUSTER__ENGINE": "ray", "MEMSTRATA_CLUSTER__PINS": "a=resource:n"})
    assert config.cluster.engine == "ray"
    assert config.cluster.placement_of("a") == "resource:n"
    assert config.cluster.placement_of("b") == "spread"
    for env, key in (
        ({"MEMSTRATA_CLUSTER__ENGINE": "spark"}, "cluster.engine"),
        ({"MEMSTRATA_CLUSTER__ADDRESS": "nowhere"}, "cluster.address"),
        ({"MEMSTRATA_CLUSTER__PLACEMENT": "resource:"}, "cluster.placement"),
        ({"MEMSTRATA_CLUSTER__PINS": "a1"}, "cluster.pins"),
        ({"MEMSTRATA_CLUSTER__GROUP": "node"}, "cluster.group"),
    ):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as caught:
            Config.load(env=env)
        assert "\n" not in str(caught.value)


def test_agents_on_two_nodes_share_memory_with_a_second_driver(cluster: Any, data_dir: Path) -> None:
    config = _config(data_dir, cluster.address)
    system = MemorySystem.start(config, embedder=HashEmbedder())
    try:
        agents = [system.agent(a) for a in AGENTS]
        for agent in agents:
            agent.store_knowledge(
                f"the deploy key of {agent.id} lives in vault {agent.id}-v", category="fact"
            )
        system.agent("a0").store_knowledge("every agent deploys on fridays", shared=True)
        # each agent's actors run where its pin says: both nodes are used
        nodes = {a: _where(f"agent:{a}")[0] for a in AGENTS}
        assert nodes["a0"] == nodes["a2"] != nodes["a1"] == nodes["a3"]
        for agent in agents:
            hits = agent.query_knowledge("deploy key vault")
            contents = [h.entry.content for h in hits]
            assert f"the deploy key of {agent.id} lives in vault {agent.id}-v" in contents
            assert "every agent deploys on fridays" in contents  # the shared store, one named actor
        prompt = system.agent("a1").begin_task("t1", "rotate the deploy key in the vault")
        assert not prompt.fallback, prompt.reason
        assert "a1-v" in prompt.text
        queued = system.agent("a1").complete_task("t1", "rotated the key in vault a1-v")
        assert queued.outbox_id > 0
        assert system.wait_idle(120)
        assert system.wait_idle(0)  # idle: the hosts' answer is waited for, however short the timeout
        assert [e.task_run_id for e in system.agent("a1").list_episodes()] == ["t1"]
        pid = _where("agent:a1")[1]

        # a second driver process joins the cluster and reaches the same actors (no second copy)
        script = (
            "import json, sys\n"
            "from memstrata import Config, MemorySystem\n"
            "from memstrata.testing import HashEmbedder\n"
            "import ray\n"
            f"config = Config.load(env={{}}, data_dir={str(data_dir)!r}, cluster__engine='ray', "
            f"cluster__address={cluster.address!r}, cluster__namespace={NAMESPACE!r}, "
            f"cluster__pins={list(PINS)!r}, cluster__placement='resource:node_b', "
            "actors__ask_timeout_s=120)\n"
            "with MemorySystem.start(config, embedder=HashEmbedder()) as system:\n"
            "    hits = system.agent('a1').query_knowledge('deploy key vault', include_shared=False)\n"
            "    episodes = system.agent('a1').list_episodes()\n"
            "    system.blackboard('s1').publish('build.status', 'green', 'a3', wait=True)\n"
            "    node, pid = ray.get(ray.get_actor('agent:a1', namespace=%r).where.remote())\n"
            "    print(json.dumps({'hits': [h.entry.content for h in hits], "
            "'episodes': [e.task_run_id for e in episodes], 'pid': pid}))\n" % NAMESPACE
        )
        board = system.blackboard("s1")
        got: list[Any] = []
        arrived = threading.Event()

        def on_signal(signal: Any) -> None:
            got.append(signal)
            arrived.set()

        subscription = board.subscribe("build.*", on_signal)
        board_node = _where("blackboard:s1")[0]
        assert board_node != ray.get_runtime_context().get_node_id()  # the board is on the other node
        done = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=240,
            cwd=data_dir,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        seen = json.loads(done.stdout.strip().splitlines()[-1])
        # the other driver sees what this one stored, and the task's write-back
        assert set(seen["hits"]) == {
            "the deploy key of a1 lives in vault a1-v",
            "rotated the key in vault a1-v",
        }
        assert seen["episodes"] == ["t1"]
        assert seen["pid"] == pid
        # the signal published by the other driver reaches this process's subscriber
        assert arrived.wait(120)
        assert [(s.key, s.value) for s in got] == [("build.status", "green")]
        assert subscription.unsubscribe()
        assert system.status(BOUND_S)["embedding"]["keyword_only"] is False  # status answers with Ray too
    finally:
        report = system.stop(30)
    assert report.drained


def test_one_senders_messages_keep_their_order_through_ray(cluster: Any, data_dir: Path) -> None:
    """Ray may run a threaded actor's calls out of order; the host restores each sender's order."""
    with MemorySystem.start(_config(data_dir, cluster.address), embedder=HashEmbedder()) as system:
        board = system.blackboard("order")
        for i in range(300):
            board.publish("counter", i)  # fire and forget: nothing waits between them
        assert board.publish("counter", 300, wait=True) == 301
        assert board.get("counter") == 300


def test_a_missing_ray_extra_is_a_clear_config_error(monkeypatch: pytest.MonkeyPatch, data_dir: Path) -> None:
    monkeypatch.setitem(sys.modules, "memstrata.actors._ray_runtime", None)
    with pytest.raises(ConfigError, match=r"memstrata\[ray\]"):
        MemorySystem.start(_config(data_dir, "auto"), embedder=HashEmbedder())


def test_items_and_status_reach_every_host_from_any_driver(cluster: Any, data_dir: Path) -> None:
    """The item store is one named host; a driver's status() shows the hosts other drivers use."""
    config = _config(data_dir, cluster.address)
    first = MemorySystem.start(config, embedder=HashEmbedder())
    second = MemorySystem.start(config, embedder=HashEmbedder())
    try:
        first.items.put(("users", "u1"), "prefs", {"note": "prefers the dark theme"}, index=["note"])
        got = second.items.get(("users", "u1"), "prefs")
        assert got is not None and got.value == {"note": "prefers the dark theme"}
        assert [i.key for i in second.items.search(("users",), query="dark theme")] == ["prefs"]
        items_node, items_pid = _where("items")
        assert items_pid != os.getpid()  # the store runs in its host, not in a driver

        first.agent("st0").store_knowledge("the status page lives at /health", category="fact")
        status = second.status(BOUND_S)  # the second driver never used st0
        state = status["agents"]["st0"]["knowledge"]
        node, pid = _where("agent:st0")
        assert (state["host"], state["node"], state["pid"]) == ("agent:st0", node, pid)
        assert state["store"]["dim"] == HashEmbedder().dim  # the host's store, opened with the node's model
        assert (status["items"]["host"], status["items"]["pid"]) == ("items", items_pid)
        cluster_state = status["cluster"]
        assert sum(n["alive"] for n in cluster_state["nodes"]) == 2
        assert cluster_state["hosts"]["agent:st0"]["node"] == node
        assert "knowledge:st0" in cluster_state["hosts"]["agent:st0"]["actors"]
        assert cluster_state["hosts"]["items"]["node"] == items_node
    finally:
        first.stop(30)
        second.stop(30)


def _degrade(host: Any, owner: str) -> None:
    """Crash an actor of ``owner`` in its host's supervision until the owner is marked degraded."""

    def crash(self: Any) -> None:
        supervision = self.runtime.supervision
        while supervision.child_failed("knowledge", owner, owner, RuntimeError("disk on fire")):
            pass

    ray.get(host.__ray_call__.remote(crash), timeout=120)


def test_degraded_marks_live_in_the_hosts_and_revive_clears_them(cluster: Any, data_dir: Path) -> None:
    with MemorySystem.start(_config(data_dir, cluster.address), embedder=HashEmbedder()) as system:
        system.agent("dg0").store_knowledge("the runbook is in the wiki", category="fact")
        _degrade(ray.get_actor("agent:dg0", namespace=NAMESPACE), "dg0")
        status = system.status(BOUND_S)
        assert "knowledge actor crashed" in status["degraded"]["dg0"]
        assert any(w.startswith("dg0 is degraded") for w in status["warnings"])
        assert "dg0" in status["cluster"]["hosts"]["agent:dg0"]["degraded"]
        assert system.revive("dg0") is True  # cleared in the host that runs dg0
        assert "dg0" not in system.status(BOUND_S)["degraded"]
        assert system.revive("dg0") is False


def test_stop_cluster_on_the_local_engine_is_stop(data_dir: Path) -> None:
    system = MemorySystem.start(Config(data_dir=data_dir), embedder=HashEmbedder())
    system.agent("l1").store_knowledge("kept on disk", category="fact")
    assert system.stop_cluster(10) == []
    assert system.stopped
    with MemorySystem.start(Config(data_dir=data_dir), embedder=HashEmbedder()) as again:
        assert [h.entry.content for h in again.agent("l1").query_knowledge("kept on disk")] == [
            "kept on disk"
        ]


def _same_writes(system: MemorySystem) -> None:
    """Knowledge (own and shared), episodes (direct and by write-back), working memory of both
    spaces, a blackboard and items: one of everything an export holds."""
    for agent_id in ("x0", "x1"):
        agent = system.agent(agent_id)
        agent.store_knowledge(f"{agent_id} keeps the runbook in the wiki", category="fact", tags=["ops"])
        agent.remember(f"{agent_id} paged the on-call", title="page", task_run_id="r1")
        agent.set_working("plan", {"step": 1, "who": agent_id})
        agent.set_working("scratch", [1, 2], task_id="t9")
        agent.complete_task("t1", f"{agent_id} rotated the signing keys")
    system.agent("x0").store_knowledge("everyone deploys on fridays", category="fact", shared=True)
    board = system.blackboard("xs")
    board.publish("build.status", "green", "x0", wait=True)
    board.publish("build.status", "red", "x1", wait=True)
    board.publish("phase", {"n": 2}, wait=True)
    system.items.put(("users", "u1"), "prefs", {"note": "dark theme"}, index=["note"])
    system.items.put(("users",), "u2", {"note": "light"})


def _exported(system: MemorySystem, path: Path) -> list[str]:
    """The export's records without what legitimately differs between two runs (ids, uuids and
    times), as sorted JSON."""
    system.export(path)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    drop = ("id", "uuid", "at", "created_at", "updated_at")
    return sorted(json.dumps({k: v for k, v in r.items() if k not in drop}, sort_keys=True) for r in records)


def _local_export(tmp_path: Path) -> list[str]:
    """The export of :func:`_same_writes` on the local engine, at ``tmp_path / "local.jsonl"``."""
    with MemorySystem.start(Config(data_dir=tmp_path / "local"), embedder=HashEmbedder()) as local:
        _same_writes(local)
        expected = _exported(local, tmp_path / "local.jsonl")
    kinds = {json.loads(r)["kind"] for r in expected}
    assert kinds == {"export", "knowledge", "episode", "working", "signal", "item"}
    return expected


def test_an_export_on_ray_holds_what_the_local_engine_s_holds(cluster: Any, tmp_path: Path) -> None:
    expected = _local_export(tmp_path)
    config = _config(tmp_path / "ray", cluster.address, f"{NAMESPACE}-export")
    system = MemorySystem.start(config, embedder=HashEmbedder())
    try:
        _same_writes(system)
        # the working memory and the board live in hosts, the write-backs finish there: all exported
        assert _exported(system, tmp_path / "ray.jsonl") == expected
    finally:
        assert system.stop_cluster(60) == []


@pytest.mark.slow  # a second set of hosts: seconds more on a loaded machine
def test_an_import_into_ray_brings_an_export_back(cluster: Any, tmp_path: Path) -> None:
    """An export imported into a Ray system comes back as it does into a local one."""
    _local_export(tmp_path)
    with MemorySystem.start(Config(data_dir=tmp_path / "local2"), embedder=HashEmbedder()) as local:
        counts = local.import_(tmp_path / "local.jsonl")
        restored = _exported(local, tmp_path / "local2.jsonl")
    config = _config(tmp_path / "ray2", cluster.address, f"{NAMESPACE}-import")
    system = MemorySystem.start(config, embedder=HashEmbedder())
    try:
        assert system.import_(tmp_path / "local.jsonl") == counts
        assert _exported(system, tmp_path / "ray2.jsonl") == restored
        hits = system.agent("x1").query_knowledge("runbook wiki", include_shared=False)
        assert "x1 keeps the runbook in the wiki" in [h.entry.content for h in hits]
        assert system.agent("x0").get_working("scratch", task_id="t9") == [1, 2]
    finally:
        assert system.stop_cluster(60) == []


def test_async_stop_cluster_ends_the_hosts(cluster: Any, data_dir: Path) -> None:
    from memstrata import AsyncMemorySystem
    from memstrata.actors._ray_admin import memstrata_actors

    namespace = f"{NAMESPACE}-async"

    async def run() -> list[str]:
        system = await AsyncMemorySystem.start(
            _config(data_dir, cluster.address, namespace), embedder=HashEmbedder()
        )
        await system.agent("as0").store_knowledge("the pager rota is in the wiki", category="fact")
        assert "agent:as0" in memstrata_actors(namespace)
        problems = await system.stop_cluster(60)
        assert system.stopped
        return problems

    assert asyncio.run(run()) == []
    assert memstrata_actors(namespace) == []
    with MemorySystem.start(Config(data_dir=data_dir), embedder=HashEmbedder()) as again:  # the data stays
        hits = again.agent("as0").query_knowledge("pager rota", include_shared=False)
        assert [h.entry.content for h in hits] == ["the pager rota is in the wiki"]


def test_async_stop_cluster_on_the_local_engine_is_stop(data_dir: Path) -> None:
    from memstrata import AsyncMemorySystem

    async def run() -> list[str]:
        system = await AsyncMemorySystem.start(Config(data_dir=data_dir), embedder=HashEmbedder())
        await system.agent("l2").store_knowledge("kept on disk", category="fact")
        problems = await system.stop_cluster(10)
        assert system.stopped
        return problems

    assert asyncio.run(run()) == []
