"""The Ray engine's failures read as the local engine's, on a real one-node Ray cluster on loopback.

A damaged outbox, a failing model, a subscriber that raises and a host no node can take are
reported as the local engine reports them: one line each, without Ray's remote traceback and its
terminal colour codes, and the rest of the agent keeps working. A start retried while the first
still runs (as after a timed-out ``AsyncMemorySystem.start``) joins Ray once and leaves no Ray
process behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memstrata import MemorySystem
from memstrata.errors import ActorCrashedError, StorageError
from memstrata.testing import HashEmbedder

ray = pytest.importorskip("ray", reason="the memstrata[ray] extra is not installed")

from tests._ray_support import BOUND_S, ray_cluster, ray_config, where  # noqa: E402

NAMESPACE = "memstrata-errors"


def _one_line(text: str | None) -> str:
    """``text``, checked to be one line without terminal codes (as the local engine's are)."""
    assert text, "no text"
    assert "\n" not in text and "\x1b" not in text, text
    assert "RayTaskError" not in text and "Traceback" not in text, text
    return text


_RETRIED_START = """
import asyncio, json, os, sys
import ray
from memstrata import AsyncMemorySystem, Config
from memstrata.testing import HashEmbedder

config = Config.load(env={}, data_dir=sys.argv[1], cluster__engine="ray", cluster__address="local",
                     cluster__namespace="retried", actors__ask_timeout_s=120)

def descendants():
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [os.getpid()]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found

async def main():
    try:  # gives up long before Ray has started: the start goes on in its thread
        await asyncio.wait_for(AsyncMemorySystem.start(config, HashEmbedder()), 0.001)
    except TimeoutError:
        pass
    system = await AsyncMemorySystem.start(config, HashEmbedder())
    await system.agent("r1").store_knowledge("the retried start joined", category="fact")
    print(json.dumps({"ray": ray.get_runtime_context().gcs_address, "pids": descendants()}), flush=True)
    sys.stdin.readline()
    print(json.dumps(await system.stop_cluster(60)), flush=True)

asyncio.run(main())
"""


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="waits for processes through pidfds (Linux)")
def test_a_start_retried_while_the_first_runs_joins_once_and_leaves_no_ray_process(
    cluster: Any, tmp_path: Path
) -> None:
    """A private Ray (``address = "local"``) started from a start's worker thread: the retry
    works, and once the process has ended, every process of its Ray has ended too. It is
    private even where ``RAY_ADDRESS`` names another Ray (the module's cluster), and none of its
    processes reports usage statistics (Ray turns them off for a Ray that ``ray.init`` starts;
    memstrata sends nothing anywhere at run time, so a Ray that changed this would be seen)."""
    child = subprocess.Popen(
        [sys.executable, "-c", _RETRIED_START, str(tmp_path / "data")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env={
            **{k: v for k, v in os.environ.items() if k != "RAY_USAGE_STATS_ENABLED"},
            "RAY_ADDRESS": cluster.address,
        },
    )
    watchdog = threading.Timer(4 * BOUND_S, child.kill)
    watchdog.start()
    waits: dict[int, int] = {}  # pidfd -> pid: each of the child's Ray processes
    try:
        assert child.stdout is not None and child.stdin is not None
        line = child.stdout.readline()
        assert line, child.communicate()[1][-3000:]
        started = json.loads(line)
        assert started["ray"] != cluster.address, "address = 'local' joined the Ray RAY_ADDRESS names"
        # the private Ray's processes and whether usage statistics are off in their environment;
        # processes titled "ray::..." are left out: the title overwrites what /proc shows of it
        usage_off: dict[str, bool] = {}
        for pid in started["pids"]:
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                command = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
                waits[os.pidfd_open(pid)] = pid
            except (ProcessLookupError, FileNotFoundError):  # ended already
                continue
            argv = command.split("\0")
            program = argv[1] if Path(argv[0]).name.startswith("python") and len(argv) > 1 else argv[0]
            if not program.startswith("ray::"):
                usage_off[program] = b"RAY_USAGE_STATS_ENABLED=0" in environ
        assert waits, "the child started no Ray process"
        # the dashboard's head reports usage statistics: it and the other processes have them off
        assert any(name.endswith("dashboard/dashboard.py") for name in usage_off), usage_off
        reporting = [name for name, off in usage_off.items() if not off]
        assert not reporting, f"Ray processes with usage statistics on: {reporting}"
        out, err = child.communicate("\n", timeout=2 * BOUND_S)
        assert child.returncode == 0, err[-3000:]
        assert json.loads(out.strip().splitlines()[-1]) == []
        deadline = time.monotonic() + BOUND_S
        while waits and time.monotonic() < deadline:  # each pidfd turns readable when its process ends
            ended, _, _ = select.select(list(waits), [], [], deadline - time.monotonic())
            for fd in ended:
                waits.pop(fd)
                os.close(fd)
        left = []
        for pid in waits.values():
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            left.append(f"{pid}: {command.decode(errors='replace')}")
        assert not left, f"Ray processes left running after the process ended: {left}"
    finally:
        watchdog.cancel()
        if child.poll() is None:
            child.kill()
            child.wait()
        for fd in waits:  # only the processes this test's child started
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            os.close(fd)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with ray_cluster(NAMESPACE, nodes=1) as made:
        yield made


def _config(data_dir: Path, address: str, namespace: str = NAMESPACE, **more: Any) -> Any:
    return ray_config(data_dir, address, namespace, actors__ask_timeout_s=BOUND_S, **more)


def test_a_damaged_outbox_fails_only_the_task_calls_in_one_line(cluster: Any, data_dir: Path) -> None:
    """As on the local engine: the host starts, the agent's stores serve, and only the calls that
    need the outbox fail, with the outbox's one-line StorageError."""
    (data_dir / "outbox").mkdir()
    (data_dir / "outbox" / "ob1.sqlite").write_bytes(b"not a database " * 1000)
    with MemorySystem.start(_config(data_dir, cluster.address), embedder=HashEmbedder()) as system:
        agent = system.agent("ob1")
        agent.store_knowledge("the runbook is in the wiki", category="fact")
        pid = where("agent:ob1", NAMESPACE)[1]
        hits = agent.query_knowledge("runbook wiki", include_shared=False)
        assert [h.entry.content for h in hits] == ["the runbook is in the wiki"]
        agent.set_working("scratch", [1, 2], task_id="t0")
        assert agent.get_working("scratch", task_id="t0") == [1, 2]
        with pytest.raises(StorageError) as caught:
            agent.complete_task("t1", "done")
        assert "ob1.sqlite" in _one_line(str(caught.value))
        prompt = agent.begin_task("t2", "where is the runbook")
        assert prompt.fallback and "StorageError" in _one_line(prompt.reason)
        agent.store_knowledge("the pager rota is in the wiki too", category="fact")
        assert where("agent:ob1", NAMESPACE)[1] == pid  # the same host process all along


def test_a_failing_model_is_reported_in_one_line(cluster: Any, data_dir: Path) -> None:
    """The node embedder's failure reaches the host as the model's error, not as Ray's wrapper:
    warnings, a search's ``degraded`` and a prompt's ``reason`` read as on the local engine."""

    class Exploding(HashEmbedder):  # defined here: Ray sends it to the node embedder by value
        def embed_documents(self, texts: Any) -> Any:
            raise RuntimeError("model exploded")

        def embed_query(self, text: str) -> Any:
            raise RuntimeError("model exploded")

    namespace = f"{NAMESPACE}-model"  # node embedders of their own, with the failing model
    system = MemorySystem.start(_config(data_dir, cluster.address, namespace), embedder=Exploding())
    try:
        agent = system.agent("m1")
        agent.store_knowledge("the payment module retries twice", category="fact")
        assert system.wait_idle(BOUND_S)
        hits = agent.query_knowledge("payment module", include_shared=False)
        assert [h.entry.content for h in hits] == ["the payment module retries twice"]
        assert "model exploded" in _one_line(hits.degraded)
        prompt = agent.begin_task("t1", "payment module")
        assert "model exploded" in _one_line(prompt.reason)
        status = system.status(BOUND_S)
        warnings = status["warnings"]
        assert any("model exploded" in _one_line(w) for w in warnings), warnings
        for warning in warnings:
            _one_line(warning)
        # the local engine's first line, from the host that reached the node's model
        assert warnings[0].startswith(f"model {HashEmbedder().model_id!r} is faulty since "), warnings
        assert "(last error: " in warnings[0] and "model exploded" in warnings[0], warnings
        assert warnings[0].endswith(": vectors are retried (hosts agent:m1)"), warnings
        assert sum("is faulty since" in w for w in warnings) == 1, warnings
        (host,) = [name for name in status["cluster"]["hosts"] if name == "agent:m1"]
        assert status["cluster"]["hosts"][host]["model"]["state"] == "faulty"
    finally:
        assert system.stop_cluster(60) == []


def test_a_subscriber_that_raises_is_counted_as_on_the_local_engine(cluster: Any, data_dir: Path) -> None:
    with MemorySystem.start(_config(data_dir, cluster.address), embedder=HashEmbedder()) as system:
        board = system.blackboard("raising")
        called = threading.Event()

        def boom(change: Any) -> None:
            called.set()
            raise RuntimeError("callback boom")

        subscription = board.subscribe("k*", boom)
        relay = [t for t in threading.enumerate() if t.name == "memstrata-relay-raising"]
        board.publish("k1", 1, wait=True)
        assert called.wait(BOUND_S)
        for thread in relay:  # it ends once the board has counted the error and unsubscribed
            thread.join(BOUND_S)
            assert not thread.is_alive()
        status = system.status(BOUND_S)
        assert status["blackboards"]["raising"]["subscriber_errors"] == 1
        assert "callback boom" in _one_line(status["blackboards"]["raising"]["last_subscriber_error"])
        assert status["blackboard_subscriber_errors"] == 1
        assert not subscription.active


def test_a_host_no_node_can_take_is_reported_with_its_placement(cluster: Any, data_dir: Path) -> None:
    """A placement on a resource no node declares: the calls fail saying the host cannot be
    placed and why, one line naming the placement, not as a late answer."""
    namespace = f"{NAMESPACE}-unplaced"
    config = ray_config(
        data_dir,
        cluster.address,
        namespace,
        cluster__placement="resource:nowhere",
        actors__ask_timeout_s=4,
        actors__embed_timeout_s=2,
        storage__lock_timeout_s=2,
    )
    system = MemorySystem.start(config, embedder=HashEmbedder())
    try:
        with pytest.raises(ActorCrashedError) as caught:
            system.agent("u1").store_knowledge("never stored", category="fact")
        message = _one_line(str(caught.value))
        assert "'agent:u1' cannot be placed" in message and "'resource:nowhere'" in message, message
        prompt = system.agent("u1").begin_task("t1", "anything")
        assert prompt.fallback
        reason = _one_line(prompt.reason)
        assert reason.startswith("error:") and "cannot be placed" in reason, reason
    finally:
        system.stop(1)
        ray.kill(ray.get_actor("agent:u1", namespace=namespace))  # still waiting for a node


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="waits for a process through a pidfd (Linux)")
def test_a_call_to_a_host_that_was_ended_fails_in_one_line(cluster: Any, data_dir: Path) -> None:
    """Ray describes a dead actor in many lines; the caller's ActorCrashedError is one, and the
    call after it starts the host anew."""
    with MemorySystem.start(_config(data_dir, cluster.address), embedder=HashEmbedder()) as system:
        agent = system.agent("k1")
        agent.store_knowledge("the runbook is in the wiki", category="fact")
        pid = where("agent:k1", NAMESPACE)[1]
        ended = os.pidfd_open(pid)
        try:
            ray.kill(ray.get_actor("agent:k1", namespace=NAMESPACE), no_restart=True)
            assert select.select([ended], [], [], BOUND_S)[0], "the host's process did not end"
        finally:
            os.close(ended)
        with pytest.raises(ActorCrashedError) as caught:
            agent.store_knowledge("sent to the ended host", category="fact")
        assert "agent:k1" in _one_line(str(caught.value))
        hits = agent.query_knowledge("runbook", include_shared=False)  # a new host, the same files
        assert [h.entry.content for h in hits] == ["the runbook is in the wiki"]
        assert where("agent:k1", NAMESPACE)[1] != pid
