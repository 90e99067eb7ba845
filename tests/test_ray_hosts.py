"""Ray hosts over their whole life, on a real two-node Ray cluster on loopback (``slow``).

A blackboard host killed with SIGKILL comes back with its values, its version counts and the
subscriptions of subscribers in other processes; each restart of a killed agent host counts
against the agent's restart budget, past which the agent is degraded until revived; the
embedders are one per node per distinct model, shared by the node's hosts (per-agent models
included); ``stop_cluster`` ends every host for good while the data stays for the next start.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memstrata import Config, MemorySystem
from memstrata.config import EmbeddingConfig
from memstrata.errors import AgentDegradedError
from memstrata.testing import HashEmbedder

ray = pytest.importorskip("ray", reason="the memstrata[ray] extra is not installed")

from tests._ray_support import BOUND_S, ray_cluster, restarted, until, where  # noqa: E402

pytestmark = pytest.mark.slow

NAMESPACE = "memstrata-hosts"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with ray_cluster(NAMESPACE) as made:
        # the model loader below is defined here: Ray's workers get it by value, not by import
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        yield made


def _config(data_dir: Path, address: str, namespace: str = NAMESPACE, **more: Any) -> Config:
    return Config.from_mapping(
        {
            "data_dir": str(data_dir),
            "cluster": {
                "engine": "ray",
                "address": address,
                "namespace": namespace,
                "placement": "resource:node_b",
                "pins": [
                    "e0=resource:node_a",
                    "e1=resource:node_b",
                    "e2=resource:node_a",
                    "e3=resource:node_b",
                ],
            },
            "actors": {"ask_timeout_s": BOUND_S},
            **more,
        }
    )


def _where(name: str) -> tuple[str, int]:
    return where(name, NAMESPACE)


def hash_loader(settings: EmbeddingConfig) -> HashEmbedder:
    """Stands in for loading the model an ``[agents.<id>.embedding]`` section names."""
    return HashEmbedder(dim=settings.dim or 32)


def test_a_killed_board_host_comes_back_with_values_versions_and_subscriptions(
    cluster: Any, data_dir: Path
) -> None:
    system = MemorySystem.start(_config(data_dir, cluster.address), embedder=HashEmbedder(dim=64))
    try:
        board = system.blackboard("rs")
        assert board.publish("plan.step", "build", "p1", wait=True) == 1
        assert board.publish("plan.gone", "x", wait=True) == 1
        assert board.delete("plan.gone")  # version 2: a deletion
        got: list[Any] = []
        changed = threading.Condition()

        def on_signal(item: Any) -> None:
            with changed:
                got.append(item)
                changed.notify_all()

        def seen(key: str, value: Any) -> bool:
            with changed:
                return changed.wait_for(
                    lambda: any((s.key, s.value) == (key, value) for s in got), timeout=BOUND_S
                )

        subscription = board.subscribe("plan.*", on_signal)
        assert seen("plan.step", "build")
        _, pid = _where("blackboard:rs")
        os.kill(pid, signal.SIGKILL)

        # the board comes back from its file, in a new process
        assert until(lambda: board.get("plan.step") == "build", "the board's value after the restart")
        assert _where("blackboard:rs")[1] != pid
        assert board.list("plan.") == ["plan.step"]
        # a key deleted before the crash continues its version count
        assert board.publish("plan.gone", "back", wait=True) == 3
        # the subscriber in this process still receives, through the same subscription
        assert seen("plan.gone", "back")
        with changed:
            after = [(s.key, s.value, s.version) for s in got]
        assert ("plan.gone", "back", 3) in after
        status = system.status(BOUND_S)["blackboards"]["rs"]
        assert status["subscribers"] == 1 and status["keys"] == 2
        # the id the subscriber held from before the crash still unsubscribes
        assert subscription.unsubscribe()
        assert system.status(BOUND_S)["blackboards"]["rs"]["subscribers"] == 0
    finally:
        system.stop(30)


def test_each_restart_of_a_host_counts_against_its_agent_s_budget(cluster: Any, data_dir: Path) -> None:
    """As an actor's crashes on the local engine: each process death Ray restarts the host after
    counts, in the host's next processes too; ``status()`` shows the restarts, past
    ``actors.max_restarts`` the agent is degraded, and ``revive`` gives it its budget again."""
    namespace = f"{NAMESPACE}-restarts"
    actors = {"ask_timeout_s": BOUND_S, "max_restarts": 1, "restart_window_s": math.inf}
    system = MemorySystem.start(
        _config(data_dir, cluster.address, namespace, actors=actors), embedder=HashEmbedder(dim=64)
    )
    try:
        agent = system.agent("hr0")
        agent.store_knowledge("the pager rota is in the wiki", category="fact")
        stored = ["the pager rota is in the wiki"]

        def kill() -> None:
            _, pid = where("agent:hr0", namespace)
            os.kill(pid, signal.SIGKILL)
            restarted("agent:hr0", namespace, pid)

        kill()  # within the budget
        status = system.status(BOUND_S)
        assert status["restarts"] == {"host:agent:hr0": 1}
        assert status["cluster"]["hosts"]["agent:hr0"]["restarts"] == {"host:agent:hr0": 1}
        assert status["degraded"] == {}
        assert [e.content for e in agent.list_knowledge()] == stored

        kill()  # past it: a new process, which knows of the first restart
        status = system.status(BOUND_S)
        reason = status["degraded"]["hr0"]
        assert reason.startswith("host actor crashed 2 times since it started (last: ActorCrashedError: ")
        assert "the Ray host 'agent:hr0' died" in reason
        assert f"hr0 is degraded: {reason}" in status["warnings"]
        with pytest.raises(AgentDegradedError):
            agent.list_knowledge()
        assert system.revive("hr0") is True
        assert [e.content for e in agent.list_knowledge()] == stored

        kill()  # the revive holds in the next process: a whole budget again
        status = system.status(BOUND_S)
        assert status["restarts"] == {"host:agent:hr0": 2}
        assert status["degraded"] == {}
    finally:
        assert system.stop_cluster(60) == []
    assert list((data_dir / "hosts").iterdir()) == []  # ended for good: a later start's budget is whole


def test_one_embedder_per_node_per_model_shared_by_the_nodes_hosts(cluster: Any, data_dir: Path) -> None:
    other = {"embedding": {"model": "hash-96", "dim": 96}}
    config = _config(data_dir, cluster.address, agents={"e2": other, "e3": other})
    with MemorySystem.start(config, embedder=HashEmbedder(dim=64), model_loader=hash_loader) as system:
        for agent_id in ("e0", "e1", "e2", "e3"):
            system.agent(agent_id).store_knowledge(f"{agent_id} rotates the signing keys", category="fact")
        for agent_id in ("e0", "e1", "e2", "e3"):
            hits = system.agent(agent_id).query_knowledge("signing keys", include_shared=False)
            assert [h.entry.content for h in hits] == [f"{agent_id} rotates the signing keys"]
        state = system.status(BOUND_S)["agents"]
        dims = {
            agent_id: state[agent_id]["knowledge"]["store"]["dim"] for agent_id in ("e0", "e1", "e2", "e3")
        }
        assert dims == {"e0": 64, "e1": 64, "e2": 96, "e3": 96}  # each agent's own model
    names = [
        str(item["name"])
        for item in ray.util.list_named_actors(all_namespaces=True)
        if item["namespace"] == NAMESPACE and str(item["name"]).startswith("embedder:")
    ]
    node_a, node_b = _where("agent:e0")[0], _where("agent:e1")[0]
    assert node_a != node_b
    # two nodes, two models: four embedders, whatever the number of agents on each node
    by_node = {node: sorted(n for n in names if n.split(":")[1] == node) for node in (node_a, node_b)}
    assert {node: len(found) for node, found in by_node.items()} == {node_a: 2, node_b: 2}
    assert sorted(names) == sorted(by_node[node_a] + by_node[node_b])
    for node, found in by_node.items():
        for name in found:  # each runs on its node, in a process of its own
            on, pid = where(name, NAMESPACE)
            assert on == node and pid not in (_where("agent:e0")[1], _where("agent:e1")[1])


def test_stop_cluster_ends_every_host_and_keeps_the_data(cluster: Any, data_dir: Path) -> None:
    from memstrata.actors._ray_admin import memstrata_actors

    namespace = f"{NAMESPACE}-down"  # its own: what the other tests left running is not its concern
    config = _config(data_dir, cluster.address, namespace)
    system = MemorySystem.start(config, embedder=HashEmbedder())
    system.agent("k0").store_knowledge("the backups run at 02:00", category="fact")
    system.blackboard("down").publish("phase", "one", wait=True)
    system.items.put(("teams",), "ops", {"lead": "ana"})
    assert {"agent:k0", "blackboard:down", "items"} <= set(memstrata_actors(namespace))
    assert system.stop_cluster(60) == []
    assert system.stopped
    assert memstrata_actors(namespace) == []  # nothing left for Ray to restart
    # a board is not kept (blackboard_snapshot is off, as a stopped local engine's); stores are
    assert not (data_dir / "blackboard" / "down.sqlite").exists()
    with MemorySystem.start(config, embedder=HashEmbedder()) as again:
        hits = again.agent("k0").query_knowledge("when do backups run", include_shared=False)
        assert [h.entry.content for h in hits] == ["the backups run at 02:00"]
        assert again.items.get(("teams",), "ops") is not None
        assert again.blackboard("down").get("phase") is None
