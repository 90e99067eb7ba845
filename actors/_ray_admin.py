"""The whole Ray deployment of one namespace: what runs where (status) and taking it down.

Hosts are detached: they outlive the drivers that made them, because another driver (a second
orchestrator process, ``memstrata serve``) may use the same agents at any time, and no driver
can know it is the last. So a driver's ``stop()`` leaves them running, and ending them is an
explicit act: :func:`cluster_down` asks every host of the namespace to stop its actors (mailboxes
drained, files committed, boards saved or discarded as ``actors.blackboard_snapshot`` says), then
kills the hosts and the node embedders so Ray does not restart them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from typing import Any

import ray

from memstrata.core.config import Config

from ._embedding import BatchingEmbedder
from ._outbox import has_pending
from ._ray_restarts import RestartLog
from ._supervision import Supervision

__all__ = [
    "ClusterSupervision",
    "HostLifecycle",
    "actor_states",
    "ask_hosts",
    "cluster_down",
    "cluster_report",
    "cluster_summary",
    "end_cluster",
    "host_kind",
    "host_names",
    "host_reports",
    "memstrata_actors",
    "nodes",
    "round_trip_s",
    "take_down",
]

log = logging.getLogger("memstrata.actors")

_LAYERS = ("knowledge", "episodic", "working")


def host_kind(name: str) -> tuple[str, str] | None:
    """``(kind, key)`` an actor name stands for (``("embedder", node)`` for a node's embedder),
    or ``None`` for a name memstrata does not give."""
    if name == "items":
        return "items", ":items"
    kind, sep, key = name.partition(":")
    if not sep or not key:
        return None
    if kind in ("agent", "blackboard", "embedder", *_LAYERS):
        return kind, key
    return None


def memstrata_actors(namespace: str) -> list[str]:
    """The names of memstrata's actors in ``namespace``, sorted."""
    found = ray.util.list_named_actors(all_namespaces=True)
    return sorted(
        str(item["name"])
        for item in found
        if item.get("namespace") == namespace and host_kind(str(item["name"])) is not None
    )


def host_names(namespace: str) -> list[str]:
    """The names of the hosts in ``namespace`` (its actors but the node embedders), sorted."""
    return [name for name in memstrata_actors(namespace) if not name.startswith("embedder:")]


def ask_hosts(
    names: list[str], namespace: str, call: Callable[[Any], Any], bound_s: float | None
) -> list[Any]:
    """``call(handle)`` on every named host at once; the answers that came within ``bound_s``
    (a host that is gone or fails is left out)."""
    pending = []
    for name in names:
        with contextlib.suppress(Exception):  # not there (yet): nothing of it to report
            pending.append(call(ray.get_actor(name, namespace=namespace)))
    if not pending:
        return []
    ready, _ = ray.wait(pending, num_returns=len(pending), timeout=bound_s)
    answers = []
    for ref in ready:
        with contextlib.suppress(Exception):
            answers.append(ray.get(ref))
    return answers


def _model_status(embedder: Any) -> dict[str, Any] | None:
    """How a host's model is doing (ok, stuck, faulty), as its batching service saw it."""
    return embedder.model_status() if isinstance(embedder, BatchingEmbedder) else None


def host_reports(namespace: str, timeout: float, round_trip_s: float) -> dict[str, dict[str, Any]]:
    """Every host's report (its node, process, actors' status, restarts and degraded agents),
    asked of all hosts at once; ``{"error": ...}`` for one that does not answer within
    ``timeout`` plus ``round_trip_s``."""
    pending: dict[Any, str] = {}
    reports: dict[str, dict[str, Any]] = {}
    for name in host_names(namespace):
        try:
            handle = ray.get_actor(name, namespace=namespace)
            pending[handle.report.remote(timeout)] = name
        except Exception as exc:
            reports[name] = {"error": f"unreachable: {type(exc).__name__}: {exc}"}
    if pending:
        bound = timeout + round_trip_s
        ready, late = ray.wait(list(pending), num_returns=len(pending), timeout=bound)
        for ref in ready:
            try:
                reports[pending[ref]] = ray.get(ref)
            except Exception as exc:
                reports[pending[ref]] = {"error": f"{type(exc).__name__}: {exc}"}
        for ref in late:
            reports[pending[ref]] = {"error": f"busy: no answer within {bound:g} s"}
    return dict(sorted(reports.items()))


def actor_states(reports: dict[str, dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """Each hosted actor's status with the host, node and process it runs in (an unreachable
    host's actors as one ``{"error": ...}`` under the kind and key its name stands for)."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for name, report in reports.items():
        if "error" in report:
            ident = host_kind(name)
            if ident is not None:
                found[ident] = {"error": report["error"], "host": name}
            continue
        where = {"host": name, "node": report["node"], "pid": report["pid"]}
        for ident, state in report["actors"].items():
            found[ident] = {**state, **where}
    return found


def cluster_summary(namespace: str, reports: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The ``cluster`` part of ``status()``: the nodes, each host's node, process, actors,
    restarts and degraded agents, and each node embedder's node."""
    hosts = {
        name: report
        if "error" in report
        else {
            "node": report["node"],
            "pid": report["pid"],
            "actors": sorted(f"{kind}:{key}" for kind, key in report["actors"]),
            "restarts": report["restarts"],
            "degraded": report["degraded"],
            "model": report.get("model"),
        }
        for name, report in reports.items()
    }
    embedders = {
        name: name.split(":")[1] for name in memstrata_actors(namespace) if name.startswith("embedder:")
    }
    return {"namespace": namespace, "nodes": nodes(), "hosts": hosts, "embedders": embedders}


def nodes() -> list[dict[str, Any]]:
    """The cluster's nodes: id, whether alive, address, resources and labels."""
    return [
        {
            "node_id": node.get("NodeID"),
            "alive": bool(node.get("Alive")),
            "address": node.get("NodeManagerAddress"),
            "resources": dict(node.get("Resources") or {}),
            "labels": dict(node.get("Labels") or {}),
        }
        for node in ray.nodes()  # type: ignore[no-untyped-call]
    ]


def cluster_down(namespace: str, timeout: float) -> list[str]:
    """Stop every host and node embedder of ``namespace`` for good; what did not stop cleanly
    (a host that did not answer is killed all the same: what it acknowledged is on disk)."""
    return take_down(namespace, timeout)[1]


def take_down(namespace: str, timeout: float) -> tuple[list[str], list[str]]:
    """:func:`cluster_down`, with the names of the actors it ended first."""
    names = memstrata_actors(namespace)
    handles: dict[str, Any] = {}
    for name in names:
        with contextlib.suppress(Exception):
            handles[name] = ray.get_actor(name, namespace=namespace)
    closing = {
        handle.close.remote(timeout): name
        for name, handle in handles.items()
        if not name.startswith("embedder:")
    }
    problems: list[str] = []
    if closing:
        ready, late = ray.wait(list(closing), num_returns=len(closing), timeout=timeout + 10)
        for ref in ready:
            try:
                problems += [f"{closing[ref]}: {item}" for item in ray.get(ref)]
            except Exception as exc:
                problems.append(f"{closing[ref]}: {type(exc).__name__}: {exc}")
        problems += [f"{closing[ref]}: did not stop within {timeout + 10:g} s" for ref in late]
    ended = []
    for name, handle in handles.items():
        try:
            ray.kill(handle, no_restart=True)
        except Exception as exc:
            problems.append(f"{name}: {type(exc).__name__}: {exc}")
        else:
            ended.append(name)
    return ended, problems


def cluster_report(config: Config, timeout: float) -> dict[str, Any]:
    """What ``status()["cluster"]`` says, asked by a process that holds no memory actor (see
    ``memstrata cluster status``); call it within :func:`._ray_connect.joined`."""
    namespace = config.cluster.namespace
    reports = host_reports(namespace, timeout, round_trip_s(config))
    return {"engine": "ray", "address": config.cluster.address, **cluster_summary(namespace, reports)}


def end_cluster(config: Config, timeout: float) -> tuple[list[str], list[str]]:
    """Every host and node embedder of the configured namespace ended for good (see
    :func:`cluster_down`): the names ended, and what did not stop cleanly."""
    return take_down(config.cluster.namespace, timeout)


def round_trip_s(config: Config) -> float:
    """How much longer than a status timeout a driver waits for the hosts' reports (a loaded
    machine delays Ray's hops, not the hosts' own bound)."""
    return min(float(config.actors.ask_timeout_s), 30.0)


class ClusterSupervision(Supervision):
    """A driver's supervision: its own (the file actors it runs) joined with every host's.

    Restart budgets and degraded marks are kept where the actors run, in their hosts; a driver
    reads them from all hosts at once and clears an agent's in the hosts that run it, so
    ``status()`` and ``revive()`` mean on Ray what they mean in the local engine.
    """

    def __init__(
        self, namespace: str, hosts_of: Callable[[str], list[str]], bound_s: float, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self._namespace = namespace
        self._hosts_of = hosts_of  # an owner -> the names of the hosts that run its actors
        self._bound_s = bound_s

    def _ask(self, names: list[str], call: Callable[[Any], Any]) -> list[Any]:
        return ask_hosts(names, self._namespace, call, self._bound_s)

    def _hosts(self) -> list[str]:
        return host_names(self._namespace)

    def degraded(self) -> dict[str, str]:
        found = super().degraded()
        for degraded, _ in self._ask(self._hosts(), lambda h: h.supervision.remote()):
            found.update(degraded)
        return found

    def restarts(self) -> dict[str, int]:
        found = super().restarts()
        for _, restarts in self._ask(self._hosts(), lambda h: h.supervision.remote()):
            found.update(restarts)
        return found

    def revive(self, owner: str) -> bool:
        was = super().revive(owner)
        return any([was, *self._ask(self._hosts_of(owner), lambda h: h.revive.remote(owner))])


class HostLifecycle:
    """How a host starts, what it answers about itself and how it ends (mixed into the Ray host)."""

    key: str
    node: str
    runtime: Any
    hosts_board: bool
    _keep_board: bool
    _queues: dict[str, asyncio.Queue[Any]]
    _restarts: RestartLog

    async def _ready(self) -> None:
        raise NotImplementedError

    def _started(self, name: str, owner: str, restarted: bool, has_agent: bool) -> None:
        """A restart by Ray counted against ``owner``'s budget (see ``_ray_restarts``), then the
        task actor started when the outbox holds what a crash left (it replays it). An outbox
        that cannot be read is logged, as the local engine's start does: the agent's other
        actors still serve, and its task calls get the outbox's error."""
        self._restarts = RestartLog(self.runtime.data_dir, name, owner)
        self._restarts.start(self.runtime.supervision, restarted)  # before anything is served
        if not has_agent:
            return
        try:
            if has_pending(self.runtime.path("outbox", self.key)):
                self.runtime.ref("agent", self.key)
        except Exception as exc:
            log.error("cannot replay outbox of %s: %s", self.key, exc)

    async def supervision(self) -> tuple[dict[str, str], dict[str, int]]:
        """This host's degraded agents and restart counts."""
        return self.runtime.supervision.degraded(), self.runtime.supervision.restarts()

    async def revive(self, owner: str) -> bool:
        """Clear an agent's degraded mark and restart budget here (see ``MemorySystem.revive``),
        and in the log a later restart replays."""
        if owner == self._restarts.owner:
            self._restarts.revived()
        return bool(self.runtime.supervision.revive(owner))

    async def running(self) -> list[tuple[str, str]]:
        """``(kind, key)`` of the memory actors running in this host (what an export reads)."""
        await self._ready()
        return list(self.runtime.running())

    async def report(self, timeout: float) -> dict[str, Any]:
        """Where this host runs and how its actors are (for a driver's ``status()``)."""
        await self._ready()
        runtime = self.runtime
        actors = await asyncio.to_thread(runtime.actor_status, timeout)
        return {
            "node": self.node,
            "pid": os.getpid(),
            "actors": actors,
            "restarts": runtime.supervision.restarts(),
            "degraded": runtime.supervision.degraded(),
            "model": _model_status(runtime.embedder),
        }

    async def close(self, timeout: float) -> list[str]:
        """Stop every actor of this host for good (mailboxes drained, files committed); a board
        is kept on disk only with ``actors.blackboard_snapshot``, as a stopped local engine's."""
        for relay in list(self._queues.values()):
            relay.put_nowait(None)  # the subscribers' threads end
        stopped = await asyncio.to_thread(self.runtime.stop, timeout)
        self._restarts.remove()  # ended for good: a host started later has its whole budget
        if self.hosts_board:
            self._end_board()
        return [*stopped.late, *([] if stopped.drained else ["requests were still in flight"])]

    def _end_board(self) -> None:
        """The session's board ends: its file goes unless boards are kept (``blackboard_snapshot``)."""
        if self._keep_board:
            return
        path = self.runtime.path("blackboard", self.key)
        for leftover in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
