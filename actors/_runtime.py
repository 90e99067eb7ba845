"""The runtime: one system's actor tree, its shared services, and message routing.

It holds what every actor of a system shares (configuration, the embedding services, the clock,
the activity counter, the timer, the restart policy) and the four supervisors, routes each public
message to the actor that owns its agent or session (creating it on first use), and stops the
tree in an order that loses nothing: wait until every mailbox is drained (write-backs included),
then stop agents, then the stores (which commit and close), then blackboards (which snapshot).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any, cast

import pykka

from memstrata.core.config import Config
from memstrata.core.errors import (
    ConfigError,
    InvalidInputError,
    RequestTimeoutError,
    SystemStoppedError,
)
from memstrata.layers import merge_hits
from memstrata.storage import Embedder

from ._agent import describe_error
from ._base import Envelope, Status, owner_of
from ._blackboard import SubscribeWithCallback
from ._clock import Clock, IdSource
from ._concurrency import Activity, Scheduler
from ._delivery import deliver, redeliver
from ._embedding import BatchingEmbedder
from ._embedding_services import EmbeddingServices, ModelLoader, load_model
from ._episodic_actor import check_archive_dir
from ._foreground import Foreground
from ._outbox import has_pending, new_owner
from ._prompt import fallback_prompt
from ._routing import _FOLDER, _SUPERVISOR_OF, route
from ._shutdown import Shutdown
from ._store_factory import StoreFactory
from ._store_messages import BoundedSearch, Searched
from ._supervision import Supervision
from ._supervisors import (
    AgentSupervisor,
    BlackboardSupervisor,
    Children,
    FilesSupervisor,
    KnowledgeSupervisor,
    MemorySupervisor,
    Spawn,
)
from ._workspace import SyncFiles, check_tree
from .messages import (
    SHARED,
    KnowledgeResult,
    Message,
    QueryKnowledge,
    SearchMemory,
    SubscribeSignal,
    TaskAssigned,
    TaskPrompt,
    check_agent_id,
)

__all__ = ["ModelLoader", "Runtime", "load_model", "route"]


log = logging.getLogger("memstrata.actors")

# how much longer than the retrieval timeout a caller of TaskAssigned waits for the agent actor
PROMPT_MARGIN_S = 1.0


class Runtime(EmbeddingServices, Shutdown):
    """One system's actors and shared services."""

    def __init__(
        self,
        config: Config,
        *,
        embedder: Embedder | None,
        clock: Clock,
        stores: StoreFactory,
        embedder_note: str | None = None,
        owns_embedder: bool = True,
        ids: IdSource | None = None,
        model_loader: ModelLoader | None = None,
    ) -> None:
        self.config = config
        self.data_dir = Path(config.data_dir)
        self.embedder = embedder
        self.embedder_note = embedder_note
        self._owns_embedder = owns_embedder
        self._model_loader: ModelLoader = model_loader or load_model
        # per-agent embedding services, one per distinct [agents.<id>.embedding] setting:
        # service key -> (service or None, why keyword-only); made on first use, closed on stop
        self._services: dict[tuple[Any, ...], tuple[BatchingEmbedder | None, str | None]] = {}
        self._services_lock = threading.Lock()  # held while a model loads: one load per setting
        self.clock = clock
        self.ids = ids if ids is not None else IdSource()
        self.stores = stores
        self.activity = Activity()
        self.foreground = Foreground()
        actors = config.actors
        self.supervision = Supervision(
            max_restarts=actors.max_restarts, window_s=actors.restart_window_s, clock=clock.monotonic
        )
        self._refs: dict[tuple[str, str], pykka.ActorRef[Any]] = {}
        self._lock = threading.Lock()
        self.accepting = True
        self._stopped = threading.Event()
        self._stop_lock = threading.Lock()
        self.shared_query_errors = 0
        # names this running system in the outbox rows it appends (see actors/_outbox.py)
        self.instance = new_owner()
        # workspaces and codebases, checked before anything starts: a bad path names its key
        self._codebases = {
            name: check_tree(path, f"codebases.{name}", self.data_dir)
            for name, path in config.codebases.items()
        }
        for name in self._codebases:
            try:
                check_agent_id(name, "codebase name")
            except InvalidInputError as exc:
                raise ConfigError(f"config key 'codebases.{name}': {exc}") from exc
        check_archive_dir(config.episodic.archive_dir, self.data_dir)
        self._workspaces: dict[str, Path | None] = {}
        # each agent's working memory, kept here so that it outlives its actor (a crash, a retire)
        self.working_memories: dict[str, Any] = {}
        if config.agent.workspace is not None:
            check_tree(config.agent.workspace, "agent.workspace", self.data_dir)
        for agent_id in config.agents:
            self.workspace_of(agent_id, key=f"agents.{agent_id}.workspace")
            unknown = set(config.for_agent(agent_id).codebases or ()) - set(self._codebases)
            if unknown:
                raise ConfigError(
                    f"config key 'agents.{agent_id}.codebases' names {', '.join(sorted(unknown))}, "
                    "which [codebases] does not define"
                )
        self.scheduler = Scheduler(clock=clock)  # after the checks: nothing to clean up when they fail
        self.supervisors: dict[str, pykka.ActorRef[Any]] = {
            "knowledge": KnowledgeSupervisor.start(self),
            "memory": MemorySupervisor.start(self),
            "files": FilesSupervisor.start(self),
            "blackboard": BlackboardSupervisor.start(self),
            "agent": AgentSupervisor.start(self),
        }

    # -- configuration and paths ---------------------------------------------------------------

    def config_actors(self, name: str) -> Any:
        return getattr(self.config.actors, name)

    def path(self, kind: str, key: str) -> Path:
        return self.data_dir / _FOLDER[kind] / f"{key}.sqlite"

    def workspace_of(self, agent_id: str, *, key: str | None = None) -> Path | None:
        """The agent's workspace folder, or ``None`` (none configured, or access ``none``)."""
        with self._lock:
            if agent_id in self._workspaces:
                return self._workspaces[agent_id]
        settings = self.config.for_agent(agent_id)
        root = None
        if settings.workspace is not None and settings.workspace_access != "none":
            where = key or (
                f"agents.{agent_id}.workspace" if agent_id in self.config.agents else "agent.workspace"
            )
            root = check_tree(settings.workspace, where, self.data_dir)
        with self._lock:
            self._workspaces[agent_id] = root
        return root

    def codebase_root(self, name: str) -> Path:
        root = self._codebases.get(name)
        if root is None:
            raise InvalidInputError(f"codebase {name!r} is not configured in [codebases]")
        return root

    def codebases_of(self, agent_id: str) -> list[str]:
        """The codebases an agent searches before its tasks, in name order."""
        chosen = self.config.for_agent(agent_id).codebases
        return sorted(self._codebases if chosen is None else set(chosen) & set(self._codebases))

    def start_session_syncs(self) -> None:
        """Sync every codebase now (in its actor) when ``sync.on_session_start`` is set."""
        if self.config.sync.on_session_start:
            for name in sorted(self._codebases):
                self.ref("codebase", name)

    def agent_session(self, agent_id: str) -> None:
        """An agent is first used: its workspace actor starts and syncs (``sync.on_session_start``)."""
        if self.workspace_of(agent_id) is not None:
            self.ref("workspace", agent_id)

    # -- actors --------------------------------------------------------------------------------

    def existing(self, kind: str, key: str) -> pykka.ActorRef[Any] | None:
        with self._lock:
            ref = self._refs.get((kind, key))
        return ref if ref is not None and ref.is_alive() else None

    def hosted_here(self, kind: str, key: str) -> bool:
        """True: every actor of this engine runs in this process (and shares its GIL)."""
        return True

    def ref(self, kind: str, key: str) -> pykka.ActorRef[Any]:
        """The actor for ``(kind, key)``, created by its supervisor on first use."""
        ref = self.existing(kind, key)
        if ref is not None:
            return ref
        if self._stopped.is_set():
            raise SystemStoppedError("the memory system is stopped")
        supervisor = self.supervisors[_SUPERVISOR_OF[kind]]
        try:
            ref = cast(
                "pykka.ActorRef[Any]",
                supervisor.ask(Spawn(kind, key), timeout=self.config.actors.ask_timeout_s),
            )
        except pykka.ActorDeadError as exc:
            raise SystemStoppedError("the memory system is stopped") from exc
        except pykka.Timeout as exc:
            raise RequestTimeoutError(f"creating the {kind} actor for {key!r} timed out") from exc
        with self._lock:
            known = (kind, key) in self._refs
            self._refs[(kind, key)] = ref
        if not known and kind in ("workspace", "codebase"):
            view = self.config.of_agent(key) if kind == "workspace" else self.config
            if view.sync.on_session_start:
                # the session starts: bring the index up to date
                self.post(ref, SyncFiles(), owner=owner_of(kind, key))
        return ref

    def post(
        self, ref: pykka.ActorRef[Any], message: Any, reply: Future[Any] | None = None, *, owner: str
    ) -> bool:
        """Put ``message`` in ``ref``'s mailbox (counted as work in flight of ``owner``, the
        actor's: see :func:`owner_of`); False if it is gone."""
        self.activity.begin(owner)
        try:
            ref.tell(Envelope(message, reply))
        except pykka.ActorDeadError:
            self.activity.done(owner)
            if reply is not None:
                with contextlib.suppress(Exception):
                    reply.set_exception(SystemStoppedError(f"{ref} has stopped"))
            return False
        return True

    def request(self, kind: str, key: str, message: Any) -> Future[Any]:
        """Send ``message`` to the ``(kind, key)`` actor; its answer arrives on the future."""
        future: Future[Any] = Future()
        deliver(self, kind, key, message, future)  # an actor retired meanwhile is replaced
        return future

    def redeliver(self, kind: str, key: str, envelopes: list[Envelope]) -> None:
        """Requests left in a stopped actor's mailbox go to its replacement (:mod:`._delivery`)."""
        redeliver(self, kind, key, envelopes)

    # -- the public message interface ------------------------------------------------------------

    def check_open(self) -> None:
        if not self.accepting:
            raise SystemStoppedError("the memory system is stopped; start a new one")

    def tell(self, message: Message) -> None:
        """Fire and forget (errors are logged by the receiving actor)."""
        self.check_open()
        if isinstance(message, SubscribeSignal):
            raise InvalidInputError("SubscribeSignal needs a callback: use ask(message, callback=...)")
        deliver(self, *route(message), message)

    def ask(
        self,
        message: Message,
        *,
        timeout: float | None = None,
        callback: Callable[[Any], Any] | None = None,
    ) -> Any:
        """Send ``message`` and wait for the answer (at most ``timeout`` seconds)."""
        self.check_open()
        if not isinstance(message, Message):
            raise InvalidInputError(f"ask() takes a memstrata message, got {type(message).__name__}")
        if isinstance(message, TaskAssigned):
            return self.begin_task(message, timeout=timeout)
        if isinstance(message, QueryKnowledge) and message.include_shared and message.agent_id != SHARED:
            return self.query_knowledge(message, timeout=timeout)
        if isinstance(message, SubscribeSignal):
            if callback is None or not callable(callback):
                raise InvalidInputError("SubscribeSignal needs a callback: ask(message, callback=fn)")
            message = SubscribeWithCallback(message, callback)  # type: ignore[assignment]
            kind, key = "blackboard", message.request.session_id  # type: ignore[attr-defined]
        else:
            kind, key = route(message)
        return self.wait(
            self.request(kind, key, message), timeout, f"{type(message).__name__} to {kind} {key!r}"
        )

    def wait(self, future: Future[Any], timeout: float | None, what: str) -> Any:
        limit = self.config.actors.ask_timeout_s if timeout is None else timeout
        try:
            return future.result(timeout=limit)
        except FutureTimeout as exc:
            future.cancel()
            raise RequestTimeoutError(f"{what} got no answer within {limit:g} s") from exc

    def query_knowledge(self, message: QueryKnowledge, *, timeout: float | None = None) -> KnowledgeResult:
        """The agent's hits fused with the shared store's (see :func:`merge_hits`)."""
        return self.search_knowledge(message, timeout=timeout).result  # type: ignore[no-any-return]

    def search_knowledge(self, message: QueryKnowledge, *, timeout: float | None = None) -> Searched:
        """:meth:`query_knowledge`, saying when the hits were ranked by keywords only because the
        model was late or faulty. The query embedding's bound is below the caller's ``timeout``."""
        own_query = dataclasses.replace(message, include_shared=False)
        if message.agent_id == SHARED or not message.include_shared:
            return self._search_one(
                "knowledge", own_query, timeout, f"QueryKnowledge to {message.agent_id!r}"
            )
        limit, embed_s = self._search_bounds(timeout)
        own = self.request("knowledge", message.agent_id, BoundedSearch(own_query, embed_s))
        shared: Future[Any] | None = None
        if self.existing("knowledge", SHARED) is not None or self.path("knowledge", SHARED).exists():
            shared = self.request(
                "knowledge", SHARED, BoundedSearch(dataclasses.replace(own_query, agent_id=SHARED), embed_s)
            )
        deadline = time.monotonic() + limit
        own_found = self.wait(
            own, max(0.0, deadline - time.monotonic()), f"QueryKnowledge to {message.agent_id!r}"
        )
        own_result, degraded = own_found.result, own_found.degraded
        shared_hits: tuple[Any, ...] = ()
        if shared is not None:
            try:
                shared_found = self.wait(
                    shared, max(0.0, deadline - time.monotonic()), "shared QueryKnowledge"
                )
                shared_hits = shared_found.result.hits
                degraded = degraded or shared_found.degraded
            except Exception as exc:  # the shared store is a supplement: the agent's own hits still count
                with self._lock:
                    self.shared_query_errors += 1
                log.warning(
                    "shared knowledge query failed; answering with %s's own hits: %s", message.agent_id, exc
                )
        merged = merge_hits(
            own_result.hits,
            shared_hits,
            message.top_k,
            query=message.query,
            search=self.config.search,
            one_model=self.one_model(message.agent_id, SHARED),
        )
        return Searched(KnowledgeResult(message.agent_id, tuple(merged)), degraded)

    def search_memory(self, message: SearchMemory, *, timeout: float | None = None) -> Searched:
        """An episode search, saying when it ranked by keywords only (see :meth:`search_knowledge`)."""
        return self._search_one(
            "episodic", message, timeout, f"SearchMemory to episodic {message.agent_id!r}"
        )

    def _search_bounds(self, timeout: float | None) -> tuple[float, float]:
        """The search's bound and, below it, its query embedding's."""
        limit = self.config.actors.ask_timeout_s if timeout is None else timeout
        return limit, min(self.config.actors.query_embed_timeout_s, limit / 2)

    def _search_one(
        self, kind: str, message: QueryKnowledge | SearchMemory, timeout: float | None, what: str
    ) -> Searched:
        """One store's bounded search, answered as :class:`Searched`."""
        limit, embed_s = self._search_bounds(timeout)
        found = self.wait(self.request(kind, message.agent_id, BoundedSearch(message, embed_s)), limit, what)
        return found if isinstance(found, Searched) else Searched(found)

    def begin_task(self, message: TaskAssigned, *, timeout: float | None = None) -> TaskPrompt:
        """The prompt for a task, within the agent's retrieval timeout plus a small margin."""
        if message.agent_id is None:
            route(message)  # raises the clear error
        agent_id = str(message.agent_id)
        retrieval = self.config.for_agent(agent_id).retrieval_timeout_s
        limit = retrieval + PROMPT_MARGIN_S if timeout is None else timeout
        try:
            future = self.request("agent", agent_id, message)
            return self.wait(future, limit, f"TaskAssigned to agent {agent_id!r}")  # type: ignore[no-any-return]
        except (InvalidInputError, SystemStoppedError):
            raise
        except RequestTimeoutError:
            reason = f"timeout: agent {agent_id} did not answer within {limit:g} s"
        except Exception as exc:
            reason = f"error: {describe_error(exc)}"
        return TaskPrompt(fallback_prompt(message.description), (), True, reason, agent_id, message.task_id)

    # -- agents (idle and stop: see Shutdown) ----------------------------------------------------

    def replay_outboxes(self) -> list[str]:
        """Start the agent actor of every agent whose outbox still holds write-backs."""
        started: list[str] = []
        folder = self.data_dir / _FOLDER["agent"]
        if not folder.is_dir():
            return started
        for path in sorted(folder.glob("*.sqlite")):
            try:
                check_agent_id(path.stem)
                if has_pending(path):
                    self.ref("agent", path.stem)
                    started.append(path.stem)
            except Exception as exc:
                log.error("cannot replay outbox %s: %s", path, exc)
        return started

    # -- status --------------------------------------------------------------------------------

    def children(self) -> list[tuple[str, str, pykka.ActorRef[Any]]]:
        found: list[tuple[str, str, pykka.ActorRef[Any]]] = []
        for supervisor in self.supervisors.values():
            with contextlib.suppress(Exception):
                found += cast(
                    "list[tuple[str, str, pykka.ActorRef[Any]]]", supervisor.ask(Children(), timeout=5)
                )
        return found

    def running(self) -> list[tuple[str, str]]:
        """``(kind, key)`` of every running memory actor of the system (what an export reads);
        an engine whose actors run in other processes adds theirs."""
        return [(kind, key) for kind, key, _ in self.children()]

    def actor_status(self, timeout: float) -> dict[tuple[str, str], dict[str, Any]]:
        """Each live actor's status (``{"error": ...}`` for one that does not answer in time)."""
        pending = []
        for kind, key, ref in self.children():
            future: Future[Any] = Future()
            if self.post(ref, Status(), future, owner=owner_of(kind, key)):
                pending.append(((kind, key), future))
        deadline = time.monotonic() + timeout
        result: dict[tuple[str, str], dict[str, Any]] = {}
        for ident, future in pending:
            try:
                result[ident] = future.result(timeout=max(0.0, deadline - time.monotonic()))
            except FutureTimeout:
                result[ident] = {"error": "busy: no answer within the status timeout"}
            except Exception as exc:
                result[ident] = {"error": describe_error(exc)}
        return result
