"""The Ray engine: the same actor tree, with each agent's actors hosted on a Ray cluster.

``[cluster] engine = "ray"`` swaps :class:`Runtime` for :class:`RayRuntime`. The actors and their
logic do not change: a *host* (a named, detached Ray actor, ``agent:{id}``, ``blackboard:{session}``,
``items``, or ``{layer}:{id}`` with ``group = "layer"``) runs a :class:`RayRuntime` of its own in
which the pykka actors of its agent or session are local, while every other actor is reached
through Ray.
So the task actor's requests to its agent's stores stay in process, a request to the shared store
(``agent:shared``) crosses to wherever that host runs, and a driver holds no memory actor at all.

Names are get-or-create in one namespace, so every driver and worker of the cluster reaches the
same host, never two copies. Ray restarts a host whose process died, however often: it reopens its
files, replays its agent's outbox, and the restart counts against its agent's budget (see
:mod:`._ray_restarts`). A call in flight when its host dies fails at once
(``max_task_retries = 0``) with :class:`ActorCrashedError`; a host that does not answer is bounded
by the caller's timeout like any actor (a task's prompt then falls back). Files and code-base
actors stay local to the process that uses them.

Joining the cluster is :mod:`._ray_connect`'s, the whole deployment's status and teardown
:mod:`._ray_admin`'s; their ``connect``, ``joined``, ``cluster_report`` and ``end_cluster`` are
named here too, the engine's entry points for the facade and the command line.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import threading
import time
import uuid
import weakref
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import ray

from memstrata.core.config import Config, EmbeddingConfig
from memstrata.core.errors import (
    ActorCrashedError,
    InvalidInputError,
    RequestTimeoutError,
    SystemStoppedError,
)
from memstrata.storage import Embedder

from ._base import owner_of, set_exception, set_result
from ._blackboard import SubscribeWithCallback
from ._clock import IdSource, SystemClock
from ._embedding import BatchingEmbedder
from ._embedding_services import ModelLoader, _model_key
from ._ray_admin import (
    ClusterSupervision,
    HostLifecycle,
    actor_states,
    ask_hosts,
    cluster_down,
    cluster_report,
    cluster_summary,
    end_cluster,
    host_names,
    host_reports,
    round_trip_s,
)
from ._ray_board import JournaledBoardSupervisor
from ._ray_connect import carried, connect, joined, one_line
from ._ray_embedding import node_embedder
from ._ray_order import SenderOrder
from ._ray_placement import host_name, placement_options, unplaceable
from ._ray_relays import RelayEndpoint, run_relay
from ._runtime import Runtime
from ._shutdown import StopReport
from ._store_factory import LayerStores

__all__ = ["RayRuntime", "cluster_report", "connect", "end_cluster", "joined"]

log = logging.getLogger("memstrata.actors")

_AGENT_KINDS = ("knowledge", "episodic", "working", "agent")
_HOSTED = (*_AGENT_KINDS, "blackboard", "items")  # every kind but the files' (local to their user)
_HOST_CONCURRENCY = 1000  # calls a host serves at once (its pykka actors still take one at a time)


class _RayRef:
    """What ``Runtime.ref`` returns for an actor hosted elsewhere: its host's handle."""

    __slots__ = ("handle", "key", "kind", "name")

    def __init__(self, handle: Any, kind: str, key: str, name: str) -> None:
        self.handle, self.kind, self.key, self.name = handle, kind, key, name

    def __str__(self) -> str:
        return f"ray actor {self.name}"

    def is_alive(self) -> bool:
        return True


class RayRuntime(Runtime):
    """A :class:`Runtime` whose agent and session actors live in hosts on a Ray cluster.

    ``local``: the ``(kind, key)`` pairs whose pykka actors run in this process (a host's own);
    empty in a driver. ``model``: the embedder the node embedders use (``None``: the configured
    model, loaded once per node). ``node``: the node a host runs on (its embedders are there).
    """

    def __init__(
        self,
        config: Config,
        *,
        local: frozenset[tuple[str, str]] = frozenset(),
        model: Embedder | None = None,
        node: str | None = None,
        **kwargs: Any,
    ) -> None:
        connect(config)
        # hosts run in other working directories, maybe on other machines: an absolute data dir
        config = dataclasses.replace(config, data_dir=Path(config.data_dir).expanduser().absolute())
        super().__init__(config, **kwargs)
        self._local = local
        self._model = model
        self._node = node
        self._loader: ModelLoader | None = kwargs.get("model_loader")
        self._cluster_seen: dict[str, dict[str, Any]] = {}
        if not local:  # a driver: restart budgets and degraded marks are the hosts'
            self.supervision = ClusterSupervision(
                config.cluster.namespace,
                self._hosts_of,
                2.0 + self._round_trip_s(),
                max_restarts=config.actors.max_restarts,
                window_s=config.actors.restart_window_s,
                clock=self.clock.monotonic,
            )
        if any(kind == "blackboard" for kind, _ in local):
            # a host's board writes each change to disk before answering (see _ray_board)
            plain, self.supervisors["blackboard"] = (
                self.supervisors["blackboard"],
                JournaledBoardSupervisor.start(self),
            )
            plain.stop()
        self._hosts: dict[str, Any] = {}  # host name -> Ray actor handle
        self._placements: dict[str, str] = {}  # host name -> its placement
        self._asked: weakref.WeakKeyDictionary[Future[Any], str] = weakref.WeakKeyDictionary()
        self._relays: dict[str, threading.Event] = {}
        self._caller = uuid.uuid4().hex  # this runtime, as a sender whose order hosts keep
        self._sequence: dict[str, int] = {}  # host name -> the number of the next message to it
        self._submit = threading.Lock()

    # -- routing ---------------------------------------------------------------------------------

    def _remote(self, kind: str, key: str) -> bool:
        return kind in _HOSTED and (kind, key) not in self._local

    def hosted_here(self, kind: str, key: str) -> bool:
        """False for an actor on a host of its own (another process, most likely)."""
        return not self._remote(kind, key)

    def existing(self, kind: str, key: str) -> Any:
        if not self._remote(kind, key):
            return super().existing(kind, key)
        name = host_name(self.config, kind, key)
        with self._lock:
            handle = self._hosts.get(name)
        return None if handle is None else _RayRef(handle, kind, key, name)

    def ref(self, kind: str, key: str) -> Any:
        if not self._remote(kind, key):
            return super().ref(kind, key)
        if self.stopped:
            raise SystemStoppedError("the memory system is stopped")
        found = self.existing(kind, key)
        if found is not None:
            return found
        name = host_name(self.config, kind, key)
        group = kind if kind in ("blackboard", "items") or self.config.cluster.group != "agent" else "agent"
        where = (
            self.config.cluster.placement
            if kind in ("blackboard", "items")
            else self.config.cluster.placement_of(key)
        )
        try:
            handle = Host.options(  # type: ignore[attr-defined]
                name=name,
                namespace=self.config.cluster.namespace,
                get_if_exists=True,
                lifetime="detached",
                max_restarts=-1,  # always: past actors.max_restarts its agent is degraded instead
                max_task_retries=0,
                max_concurrency=_HOST_CONCURRENCY,
                num_cpus=0,
                **placement_options(where),
            ).remote(self.config, group, key, self._model, self._loader, self.ids.seed)
        except Exception as exc:  # Ray refused its options or is gone: not a late answer
            raise ActorCrashedError(
                f"cannot start the Ray actor {name!r} (placement {where!r}): {one_line(exc)}"
            ) from exc
        with self._lock:
            self._hosts.setdefault(name, handle)
            self._placements[name] = where
        return _RayRef(handle, kind, key, name)

    def wait(self, future: Future[Any], timeout: float | None, what: str) -> Any:
        """:meth:`Runtime.wait`; a request to a host that no node can take (its placement names a
        resource or label no alive node has: a typo, or its node is gone) fails saying so, one
        line naming the placement, instead of as a late answer."""
        try:
            return super().wait(future, timeout, what)
        except RequestTimeoutError as exc:
            with self._lock:
                name = self._asked.get(future)
                where = None if name is None else self._placements.get(name)
            why = None if where is None else unplaceable(where)
            if why is None:
                raise
            raise ActorCrashedError(
                f"{what}: the Ray actor {name!r} cannot be placed: {why} (placement {where!r})"
            ) from exc

    def post(self, ref: Any, message: Any, reply: Future[Any] | None = None, *, owner: str) -> bool:
        if not isinstance(ref, _RayRef):
            return super().post(ref, message, reply, owner=owner)
        self.activity.begin(owner)
        try:
            with self._submit:  # numbered and submitted together: the numbers follow the order
                seq = self._sequence.get(ref.name, 0)
                relay = uuid.uuid4().hex if isinstance(message, SubscribeWithCallback) else None
                if relay is not None:
                    pending = ref.handle.subscribe.remote(ref.key, message.request, relay, self._caller, seq)
                else:
                    pending = ref.handle.call.remote(ref.kind, ref.key, message, self._caller, seq)
                self._sequence[ref.name] = seq + 1  # only a submitted message uses its number
            if relay is not None:
                self._start_relay(ref, relay, message.callback)
            if reply is not None:
                with self._lock:
                    self._asked[reply] = ref.name  # for wait(): which host a late answer is from
        except Exception as exc:
            self.activity.done(owner)
            if reply is not None:
                set_exception(reply, SystemStoppedError(f"{ref} cannot be reached: {exc}"))
            return False

        def arrived(done: Future[Any]) -> None:
            try:
                value = done.result()
            except BaseException as exc:
                error = self._error(ref, exc)
                if reply is not None:
                    set_exception(reply, error)
                elif not isinstance(error, InvalidInputError):
                    log.warning("%s: %s", ref, error)
            else:
                if reply is not None:
                    set_result(reply, value)
            finally:
                self.activity.done(owner)

        pending.future().add_done_callback(arrived)
        return True

    def _error(self, ref: _RayRef, exc: BaseException) -> BaseException:
        """A Ray failure as the error the local engine would raise (one line, as its are)."""
        cause = carried(exc)
        if cause is not None:
            return cause
        if isinstance(exc, ray.exceptions.RayActorError | ray.exceptions.ActorUnavailableError):
            with self._lock:
                self._hosts.pop(ref.name, None)  # the next request looks the actor up again
            with self._submit:
                self._sequence.pop(ref.name, None)  # and numbers from 0 for the restarted host
            return ActorCrashedError(f"{ref} died or its node is gone: {one_line(exc)}")
        return ActorCrashedError(f"{ref}: {one_line(exc)}")

    # -- blackboard subscriptions across nodes ----------------------------------------------------

    def _start_relay(self, ref: _RayRef, relay: str, callback: Any) -> None:
        """Signals for a subscriber in this process: a thread asks the host for them."""
        closed = threading.Event()
        with self._lock:
            self._relays[relay] = closed

        def run() -> None:
            try:
                run_relay(ref.handle, relay, callback, closed, lambda: self.stopped)
            finally:
                with self._lock:
                    self._relays.pop(relay, None)

        threading.Thread(target=run, name=f"memstrata-relay-{ref.key}", daemon=True).start()

    # -- embedding: one service per node per distinct model --------------------------------------

    def _new_service(self, settings: EmbeddingConfig) -> tuple[BatchingEmbedder | None, str | None]:
        """In a host, an agent's own model is its node's embedder for that model, not a copy."""
        if self._node is None or _model_key(settings) == _model_key(self.config.embedding):
            return super()._new_service(settings)
        service, note = node_embedder(self.config, self._node, settings, None, self._loader)
        if service is None:
            return None, f"keyword-only: embedding model {settings.model!r} could not be loaded ({note})"
        return service, None

    # -- status of the whole deployment ----------------------------------------------------------

    def actor_status(self, timeout: float) -> dict[tuple[str, str], dict[str, Any]]:
        """In a driver: this process's actors and every host's in the namespace, each with the
        host, node and process it runs in (other drivers' agents included)."""
        found = super().actor_status(timeout)
        if self._local:
            return found
        self._cluster_seen = host_reports(self.config.cluster.namespace, timeout, self._round_trip_s())
        return {**found, **actor_states(self._cluster_seen)}

    def running(self) -> list[tuple[str, str]]:
        """In a driver: this process's actors and those of every host of the namespace (other
        drivers' agents included), so an export reads what the local engine's would."""
        found = set(super().running())
        if not self._local:
            namespace = self.config.cluster.namespace
            bound = self._round_trip_s()
            for answer in ask_hosts(host_names(namespace), namespace, lambda h: h.running.remote(), bound):
                found.update((str(kind), str(key)) for kind, key in answer)
        return sorted(found)

    def wait_idle(self, timeout: float | None = None, owner: str | None = None) -> bool:
        """In a driver: this process's requests, then the hosts it sent them to idle too (a
        write-back runs in its agent's host after the driver was answered); ``owner`` (an
        agent): only the requests to that agent's actors and its hosts. The hosts' answers are
        waited for at least a round trip, however little time is left: ``wait_idle(0)`` asks."""
        started = time.monotonic()
        if not super().wait_idle(timeout, owner):
            return False
        with self._lock:
            names = sorted(self._hosts)
        if owner is not None:
            names = [name for name in names if name in self._hosts_of(owner)]
        if self._local or not names:
            return True
        left = None if timeout is None else max(0.0, timeout - (time.monotonic() - started))
        bound = None if left is None else max(left, self._round_trip_s())
        drained = ask_hosts(names, self.config.cluster.namespace, lambda h: h.drain.remote(left), bound)
        return len(drained) == len(names) and all(drained)

    def _hosts_of(self, owner: str) -> list[str]:
        """The names of the hosts that run an agent's actors."""
        return sorted({host_name(self.config, kind, owner) for kind in _AGENT_KINDS})

    def _round_trip_s(self) -> float:
        return round_trip_s(self.config)

    def cluster_status(self, timeout: float) -> dict[str, Any]:
        """The nodes, each host (where it runs, what it holds, its restarts and degraded agents,
        from the last :meth:`actor_status`, else asked now) and the node embedders."""
        if not self._cluster_seen:
            return cluster_report(self.config, timeout)
        summary = cluster_summary(self.config.cluster.namespace, self._cluster_seen)
        return {"engine": "ray", "address": self.config.cluster.address, **summary}

    def stop_cluster(self, timeout: float | None = None) -> list[str]:
        """Stop this driver, then every host and node embedder of the namespace (see
        ``_ray_admin.cluster_down``): what did not stop cleanly."""
        limit = self.config.actors.stop_timeout_s if timeout is None else timeout
        report = self.stop(limit)
        return [*report.late, *cluster_down(self.config.cluster.namespace, limit)]

    # -- the life of a driver -------------------------------------------------------------------

    def replay_outboxes(self) -> list[str]:
        return [] if self._local else super().replay_outboxes()

    def retire(self, owner: str, timeout: float) -> list[str]:
        """Stop the owner's actors in their hosts too (files closed; reopened on the next use)."""
        late = super().retire(owner, timeout)
        if self._local:
            return late
        if owner.startswith("session:"):
            names = [f"blackboard:{owner.removeprefix('session:')}"]
        else:
            names = self._hosts_of(owner)
        for name in names:
            with self._lock:
                handle = self._hosts.pop(name, None)
            try:
                if handle is None:
                    handle = ray.get_actor(name, namespace=self.config.cluster.namespace)
                late += ray.get(handle.retire.remote(owner, timeout), timeout=timeout + 5)
            except ValueError:  # no such host: nothing of the owner runs there
                continue
            except Exception as exc:
                late.append(f"{name}: {exc}")
        return late

    def stop(self, timeout: float | None = None) -> StopReport:
        """Drain this process's requests and the hosts it used; the hosts keep running for the
        cluster's other drivers (their files stay open and committed)."""
        limit = self.config.actors.stop_timeout_s if timeout is None else timeout
        self.accepting = False
        self.activity.wait_idle(limit)
        with self._lock:
            hosts = list(self._hosts.values())
            relays = list(self._relays.values())
        for relay in relays:
            relay.set()
        waits = []
        for handle in hosts:
            with contextlib.suppress(Exception):
                waits.append(handle.drain.remote(limit))
        with contextlib.suppress(Exception):
            ray.wait(waits, num_returns=len(waits), timeout=limit)
        return super().stop(timeout)


@ray.remote
class Host(SenderOrder, RelayEndpoint, HostLifecycle):
    """One agent's (or one session's, or the item store's) pykka actors in a Ray worker process.

    An asyncio actor: a call waiting for its answer, or for a sender's earlier message, holds no
    thread, so however many calls wait, the one they wait for still runs. :class:`SenderOrder`
    comes first among the bases: its ``_enqueue`` is the one the relay calls use too.
    """

    def __init__(
        self,
        config: Config,
        group: str,
        key: str,
        model: Embedder | None,
        loader: ModelLoader | None,
        seed: int | str | None,
    ) -> None:
        kinds = _AGENT_KINDS if group == "agent" else (group,)
        self.key = key
        self.node = ray.get_runtime_context().get_node_id()
        restarted = bool(ray.get_runtime_context().was_current_actor_reconstructed)
        self.hosts_board = group == "blackboard"
        self._keep_board = bool(config.actors.blackboard_snapshot)
        if self.hosts_board:  # the board is reloaded from its file after a restart (see _ray_board)
            config = dataclasses.replace(
                config, actors=dataclasses.replace(config.actors, blackboard_snapshot=True)
            )
        more: dict[str, Any] = {} if loader is None else {"model_loader": loader}
        embedder, why = node_embedder(config, self.node, config.embedding, model, loader)
        self.runtime: RayRuntime = RayRuntime(
            config,
            local=frozenset((kind, key) for kind in kinds),
            model=model,
            node=self.node,
            embedder=embedder,
            embedder_note=None if embedder is not None else f"keyword-only on this node: {why}",
            clock=SystemClock(),
            stores=LayerStores(),
            ids=IdSource(seed),  # the creating driver's seed: seeded runs name episodes alike
            **more,
        )
        self._relays_init()
        self._order_init(restarted)
        self._started(host_name(config, group, key), owner_of(group, key), restarted, "agent" in kinds)

    async def call(self, kind: str, key: str, message: Any, caller: str, seq: int) -> Any:
        """Handle ``message`` in the local actor (after the caller's earlier messages); answered
        when the actor has answered."""
        await self._ready()
        return await self._answer(message, await self._enqueue(kind, key, message, caller, seq))

    async def _answer(self, message: Any, future: Future[Any]) -> Any:
        bound = self.runtime.config.actors.ask_timeout_s * 2
        try:
            answer = await asyncio.wait_for(asyncio.wrap_future(future), bound)
        except TimeoutError as exc:
            future.cancel()
            raise RequestTimeoutError(
                f"{type(message).__name__} to {self.key!r} got no answer within {bound:g} s"
            ) from exc
        self._unsubscribed(message, answer)
        return answer

    async def retire(self, owner: str, timeout: float) -> list[str]:
        late = await asyncio.to_thread(self.runtime.retire, owner, timeout)
        if self.hosts_board and owner == f"session:{self.key}":
            self._end_board()
        return late

    async def drain(self, timeout: float | None) -> bool:
        return await asyncio.to_thread(self.runtime.wait_idle, timeout)

    async def where(self) -> tuple[str, int]:
        """The node id and process id of this host (placement, and the tests that kill it)."""
        return self.node, os.getpid()
