"""The Python facade: ``MemorySystem``, ``Agent``, ``Blackboard`` and ``Subscription``.

It hides the actor plumbing: each method builds the message (validating it in the caller's
thread), sends it to the actor that owns the agent or session, and waits for the answer within a
bounded time. Orchestrators that prefer messages use ``system.tell(msg)`` / ``system.ask(msg)``.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as _dt
import logging
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from memstrata.actors import (
    BatchingEmbedder,
    Clock,
    IdSource,
    LayerStores,
    Runtime,
    StopReport,
    StoreFactory,
    SystemClock,
)
from memstrata.core.config import Config, EmbeddingConfig
from memstrata.core.errors import (
    ConfigError,
    EmbedderUnavailableError,
    InvalidInputError,
    StorageError,
    SystemStoppedError,
)
from memstrata.messages import (
    SHARED,
    ArchiveEpisodes,
    ClearWorkingMemory,
    CommitMemory,
    DeleteEpisode,
    DeleteKnowledge,
    DeleteSignal,
    EpisodesArchived,
    GetEpisode,
    GetKnowledge,
    GetWorkingMemory,
    ListEpisodes,
    ListKnowledge,
    ListSignals,
    Message,
    PublishSignal,
    QueryKnowledge,
    QuerySignal,
    RestoreEpisodes,
    SearchMemory,
    SetWorkingMemory,
    Signal,
    SignalValue,
    StoreKnowledge,
    StoreMemory,
    SubscribeSignal,
    TaskAssigned,
    TaskCompleted,
    TaskFailed,
    TaskPrompt,
    UnsubscribeSignal,
    UpdateKnowledge,
    WriteBackQueued,
    check_agent_id,
    check_session_id,
)
from memstrata.storage import Embedder, driver_info, load_embedder

from ._items import Items

if TYPE_CHECKING:
    from memstrata.layers import Episode, EpisodeHit, KnowledgeEntry, KnowledgeHit

__all__ = ["Agent", "Blackboard", "MemorySystem", "Subscription"]

log = logging.getLogger("memstrata")

_RUNNING: weakref.WeakSet[MemorySystem] = weakref.WeakSet()


@atexit.register
def _stop_at_exit() -> None:  # pragma: no cover - interpreter shutdown
    for system in list(_RUNNING):
        with contextlib.suppress(Exception):
            system.stop(timeout=10)


class MemorySystem:
    """One process's memory: supervisors, per-agent actors, blackboards, the embedding service.

    Start it with :meth:`start` (a context manager); everything persists under
    ``config.data_dir``. Thread-safe: any thread may use it and its handles.
    """

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._agents: dict[str, Agent] = {}
        self._boards: dict[str, Blackboard] = {}
        self._lock = threading.Lock()
        _RUNNING.add(self)

    @classmethod
    def start(
        cls,
        config: Config | str | Path | None = None,
        embedder: Embedder | None = None,
        *,
        clock: Clock | None = None,
        stores: StoreFactory | None = None,
        seed: int | str | None = None,
        model_loader: Callable[[EmbeddingConfig], Embedder] | None = None,
    ) -> MemorySystem:
        """Start a system.

        ``config``: a :class:`Config`, a path to a TOML file, or ``None`` for
        :meth:`Config.load` (``memstrata.toml``, then the environment). ``embedder``: any
        ``Embedder``; ``None`` loads the configured model, and if none can be loaded the system
        runs keyword-only and says so in :meth:`status`. ``clock`` stamps episodes and blackboard
        values and knowledge, drives working-memory expiry and the pre-task retrieval deadline
        (``ManualClock`` for simulations: advancing it fires the deadlines it passes). ``seed``
        makes the ids the system invents (episode uuids) reproducible: with a clock and a seed,
        two runs that do the same things export the same bytes (:meth:`export`). ``stores``
        opens the persistent layers (tests inject faults through it). ``model_loader`` loads the
        model an agent's ``[agents.<id>.embedding]`` names (default: the packaged or fastembed
        model, as for ``[embedding]``); tests pass one that makes deterministic embedders.
        Write-backs left in an outbox by a previous process are replayed at once.
        """
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int | str)):
            raise InvalidInputError(f"seed must be an integer, a string or None, got {seed!r}")
        if model_loader is not None and not callable(model_loader):
            raise InvalidInputError(
                f"model_loader must be a callable or None, got {type(model_loader).__name__}"
            )
        if config is None or isinstance(config, str | Path):
            config = Config.load(config)
        if not isinstance(config, Config):
            raise InvalidInputError(f"config must be a Config, a path or None, got {type(config).__name__}")
        if not config.storage.lock_timeout_s > 0:
            raise ConfigError(
                f"config key 'storage.lock_timeout_s' must be a positive number of seconds, "
                f"got {config.storage.lock_timeout_s!r}"
            )
        if config.storage.synchronous not in ("normal", "full"):
            raise ConfigError(
                "config key 'storage.synchronous' must be 'normal' or 'full', "
                f"got {config.storage.synchronous!r}"
            )
        note: str | None = None
        inner = embedder
        if inner is None:
            try:
                model = config.embedding.model
                inner = load_embedder(
                    None if model in ("", "default") else model,
                    dim=config.embedding.dim,
                    threads=config.embedding.threads,
                )
            except EmbedderUnavailableError as exc:
                note = f"keyword-only: no embedding model could be loaded ({exc})"
                log.warning("memstrata runs KEYWORD-ONLY: %s", exc)
        service: Embedder | None
        owns = True
        if inner is None:
            service = None
        elif isinstance(inner, BatchingEmbedder):
            service, owns = inner, False
        else:
            service = BatchingEmbedder(
                inner,
                batch_size=config.embedding.batch_size,
                max_batch_wait_ms=config.embedding.max_batch_wait_ms,
                call_timeout_s=config.actors.embed_timeout_s,
            )
        try:
            Path(config.data_dir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            if isinstance(service, BatchingEmbedder) and owns:
                service.close()
            raise StorageError(f"cannot create the data dir {config.data_dir}: {exc}") from exc
        engine: Callable[..., Runtime] = Runtime
        extra: dict[str, Any] = {}
        if config.cluster.engine == "ray":  # the memstrata[ray] extra: actors on a Ray cluster
            # an embedder given here is sent to each node's embedding service; none: the nodes
            # load the configured model themselves
            engine, extra = _ray_engine(None if isinstance(embedder, BatchingEmbedder) else embedder)
        try:
            runtime = engine(
                config,
                embedder=service,
                clock=clock or SystemClock(),
                stores=stores or LayerStores(),
                embedder_note=note,
                owns_embedder=owns,
                ids=IdSource(seed),
                model_loader=model_loader,
                **extra,
            )
        except BaseException:  # e.g. a workspace path refused: nothing may keep running
            if isinstance(service, BatchingEmbedder) and owns:
                service.close()
            raise
        system = cls(runtime)
        try:
            runtime.replay_outboxes()
            runtime.start_session_syncs()  # codebases sync in their actors, in the background
        except BaseException:
            system.stop()
            raise
        return system

    # -- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> MemorySystem:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def stop(self, timeout: float | None = None) -> StopReport:
        """Refuse new requests, drain every mailbox (write-backs included), commit and close.

        Idempotent. ``timeout`` (default ``actors.stop_timeout_s``) bounds the wait for a stuck
        actor; whatever it had not processed is still in the outbox and is replayed next start.
        """
        report = self._runtime.stop(timeout)
        _RUNNING.discard(self)
        return report

    @property
    def stopped(self) -> bool:
        return not self._runtime.accepting

    def wait_idle(self, timeout: float | None = 10.0) -> bool:
        """Block until every mailbox is empty and no write-back or callback is pending.

        True when idle; False if ``timeout`` passed first. Meant for tests and simulations.
        """
        return self._runtime.wait_idle(timeout)

    @property
    def config(self) -> Config:
        return self._runtime.config

    @property
    def data_dir(self) -> Path:
        return self._runtime.data_dir

    @property
    def clock(self) -> Clock:
        return self._runtime.clock

    @property
    def embedder(self) -> Embedder | None:
        """The shared embedding service (``None`` in keyword-only mode)."""
        return self._runtime.embedder

    def embedder_for(self, agent_id: str) -> Embedder | None:
        """The embedding service of an agent's stores: the shared one unless its
        ``[agents.<id>.embedding]`` names another (made on first use); ``None``: keyword-only.
        A store opened outside the system must use this one: opened with another model, its
        vectors are rebuilt for that model."""
        self._runtime.check_open()
        check_agent_id(agent_id, allow_shared=True)
        return self._runtime.embedder_for(agent_id)

    # -- handles -------------------------------------------------------------------------------

    def agent(self, agent_id: str) -> Agent:
        """The handle of agent ``agent_id`` (its actors are created on first use)."""
        self._runtime.check_open()
        check_agent_id(agent_id)
        with self._lock:
            handle = self._agents.get(agent_id)
            if handle is not None:
                return handle
            handle = self._agents[agent_id] = Agent(self, agent_id)
        # the agent's session starts: its workspace (if any) syncs in its actor, in the background
        self._runtime.agent_session(agent_id)
        return handle

    @property
    def items(self) -> Items:
        """The system's item store (``{data_dir}/items.sqlite``), shared by every agent."""
        self._runtime.check_open()
        return Items(self)

    def blackboard(self, session_id: str = "default") -> Blackboard:
        """The blackboard of session ``session_id``."""
        self._runtime.check_open()
        check_session_id(session_id)
        with self._lock:
            board = self._boards.get(session_id)
            if board is None:
                board = self._boards[session_id] = Blackboard(self, session_id)
            return board

    def retire(self, agent_id: str, timeout: float | None = None) -> None:
        """Stop an agent's actors after they drain their mailboxes (they restart on next use)."""
        self._runtime.check_open()
        check_agent_id(agent_id)
        self._runtime.wait_idle(timeout or self.config.actors.stop_timeout_s)
        self._runtime.retire(agent_id, timeout or self.config.actors.stop_timeout_s)

    def revive(self, agent_id: str) -> bool:
        """Clear a degraded agent's mark and restart budget; queued write-backs are replayed."""
        self._runtime.check_open()
        check_agent_id(agent_id, allow_shared=True)
        was = self._runtime.supervision.revive(agent_id)
        if agent_id != SHARED:
            from memstrata.actors._agent import Replay

            self._runtime.post(self._runtime.ref("agent", agent_id), Replay())
        return was

    # -- export and import ---------------------------------------------------------------------

    def export(self, path: str | Path, *, timeout: float | None = None) -> int:
        """Write every store of every agent, shared knowledge, episodes (archives included),
        working memory and blackboards to ``path`` as sorted JSON lines; returns the line count.

        Waits until the system is idle first. The format is described in ``docs/simulation.md``;
        with a ``ManualClock`` and a ``seed`` two runs that did the same things write the same bytes.
        """
        from memstrata._export import export_records, write_export

        records = export_records(self._runtime, timeout=_timeout(self, timeout))
        return write_export(records, path)

    def import_(self, path: str | Path, *, timeout: float | None = None) -> dict[str, int]:
        """Restore an export made by :meth:`export` into this system; returns counts by kind.

        Knowledge keeps its times (and ids when its store was empty), episodes their uuid and time
        (an episode whose uuid exists is skipped, as are archived ones: restore their archive);
        working memory and blackboard values are set again. Every line is checked first.
        """
        from memstrata._export import import_records, read_export

        records = list(read_export(path))
        return import_records(self._runtime, records, timeout=_timeout(self, timeout))

    # -- raw messages --------------------------------------------------------------------------

    def tell(self, message: Message) -> None:
        """Send a message without waiting (errors are logged by the receiving actor)."""
        if not isinstance(message, Message):
            raise InvalidInputError(f"tell() takes a memstrata message, got {type(message).__name__}")
        self._runtime.tell(message)

    def ask(
        self,
        message: Message,
        *,
        timeout: float | None = None,
        callback: Callable[[Signal], Any] | None = None,
    ) -> Any:
        """Send a message and return the answer (a reply message).

        ``TaskAssigned`` answers a :class:`TaskPrompt` (never raises for retrieval problems);
        ``QueryKnowledge(include_shared=True)`` fuses the shared store's hits; ``SubscribeSignal``
        needs ``callback``. Raises :class:`RequestTimeoutError` after ``timeout`` (default
        ``actors.ask_timeout_s``), :class:`ActorCrashedError` if the actor crashed on it.
        """
        return self._runtime.ask(message, timeout=timeout, callback=callback)

    # -- status --------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """What runs and what is stored: drivers, vectors, model, per-agent counts, degradation."""
        runtime = self._runtime
        info = driver_info()
        embedder = runtime.embedder
        embedding: dict[str, Any] = {
            "model": None if embedder is None else embedder.model_id,
            "dim": None if embedder is None else embedder.dim,
            "keyword_only": embedder is None,
            "note": runtime.embedder_note,
        }
        model_state: dict[str, Any] = {}
        if isinstance(embedder, BatchingEmbedder):
            embedding.update(embedder.stats().as_dict())
            model_state = embedder.model_status()
            embedding["state"] = model_state  # ok / stuck since ... on a call of N texts / faulty
        # the services of agents whose [agents.<id>.embedding] names another setting (made on
        # first use): which agents, which model, and how it is doing
        embedding["per_agent"] = [
            _service_status(agents, service, note)
            for agents, service, note in runtime.embedding_services()[1:]
        ]
        agents: dict[str, dict[str, Any]] = {}
        boards: dict[str, dict[str, Any]] = {}
        codebases: dict[str, dict[str, Any]] = {}
        shared: dict[str, Any] = {}
        items: dict[str, Any] = {}
        degraded = runtime.supervision.degraded()
        if not runtime.stopped:
            for (kind, key), state in runtime.actor_status().items():
                if kind == "blackboard":
                    boards[key] = state
                    continue
                if kind == "codebase":
                    codebases[key] = state
                    continue
                if kind == "items":  # the system's item store, not an agent's
                    items = state
                    continue
                if key == SHARED:
                    shared = state
                    continue
                agents.setdefault(key, {})[kind] = state
        for agent_id, kinds in agents.items():
            kinds["degraded"] = degraded.get(agent_id)
        warnings = _warnings(
            info.native_vectors, info.reason, runtime.embedder_note, agents, shared, degraded
        )
        for name, state in sorted(codebases.items()):
            if state.get("last_sync_error"):
                warnings.append(f"codebase {name}: {state['last_sync_error']}")
        for service in embedding["per_agent"]:
            who = ", ".join(service["agents"])
            state = service.get("state", {})
            if service["keyword_only"]:
                warnings.append(f"agents {who}: {service['note']}")
            elif state.get("state") == "stuck":
                warnings.append(f"agents {who}: {state['reason']}: vectors pending, searches by keywords")
            elif state.get("state") == "faulty":
                warnings.append(
                    f"agents {who}: model {state['model']!r} is faulty since {state['since']} "
                    f"(last error: {state['last_error']}): vectors are retried"
                )
        if model_state.get("state") == "stuck":
            warnings.insert(
                0,
                f"{model_state['reason']}: writes are stored with vectors pending, searches rank by keywords",
            )
        elif model_state.get("state") == "faulty":
            warnings.insert(
                0,
                f"model {model_state['model']!r} is faulty since {model_state['since']} "
                f"(last error: {model_state['last_error']}): vectors are retried",
            )
        return {
            "data_dir": str(runtime.data_dir),
            "stopped": runtime.stopped or not runtime.accepting,
            "driver": info.as_dict(),
            "vectors": "native (sqlite-vec)" if info.native_vectors else f"fallback (numpy): {info.reason}",
            "embedding": embedding,
            "agents": agents,
            "shared_knowledge": shared,
            "blackboards": boards,
            "items": items,
            "codebases": codebases,
            "degraded": degraded,
            "restarts": runtime.supervision.restarts(),
            "shared_query_errors": runtime.shared_query_errors,
            "blackboard_subscriber_errors": sum(int(b.get("subscriber_errors", 0)) for b in boards.values()),
            "in_flight": runtime.activity.in_flight,
            "warnings": warnings,
        }

    def __repr__(self) -> str:
        state = "stopped" if self.stopped else "running"
        return f"<MemorySystem {self.data_dir} {state}>"


class Hits(list[Any]):
    """Search hits, best first; ``degraded`` says why they were ranked by keywords only when the
    model was late or faulty (``"keyword-only: model 'm' did not answer within 2 s"``), else ``None``."""

    def __init__(self, hits: Any = (), *, degraded: str | None = None) -> None:
        super().__init__(hits)
        self.degraded = degraded


def _service_status(agents: Sequence[str], service: Embedder | None, note: str | None) -> dict[str, Any]:
    """One per-agent embedding service in :meth:`MemorySystem.status`."""
    state: dict[str, Any] = {
        "agents": list(agents),
        "model": None if service is None else service.model_id,
        "dim": None if service is None else service.dim,
        "keyword_only": service is None,
        "note": note,
    }
    if isinstance(service, BatchingEmbedder):
        state.update(service.stats().as_dict())
        state["state"] = service.model_status()
    return state


def _warnings(
    native_vectors: bool,
    vec_reason: str | None,
    embedder_note: str | None,
    agents: Mapping[str, Mapping[str, Any]],
    shared: Mapping[str, Any],
    degraded: Mapping[str, str],
) -> list[str]:
    """What is degraded right now, one line each: nothing here means nothing is."""
    out: list[str] = []
    if not native_vectors:
        out.append(f"sqlite-vec is not loaded ({vec_reason}): new vector tables use the exact numpy scan")
    if embedder_note:
        out.append(embedder_note)
    owners: list[tuple[str, Mapping[str, Any]]] = list(agents.items())
    if shared:
        owners.append(("shared", {"knowledge": shared}))
    for owner, kinds in owners:
        for kind, state in kinds.items():
            if not isinstance(state, Mapping):
                continue
            where = f"{owner} {kind}"
            if "error" in state:
                out.append(f"{where}: no status ({state['error']})")
            store = state.get("store")
            if isinstance(store, Mapping):
                if store.get("mode") == "keyword-only":
                    reason = store.get("reason") or store.get("keyword_only_reason")
                    out.append(f"{where}: keyword-only ({reason})")
                if store.get("pending_vectors"):
                    out.append(
                        f"{where}: {store['pending_vectors']} item(s) wait for their vectors and are "
                        f"found by keywords until then (last embedder error: {store.get('last_error')})"
                    )
                check = store.get("consistency")
                if isinstance(check, Mapping) and check.get("problems"):
                    out.append(f"{where}: repaired on open: {'; '.join(map(str, check['problems']))}")
            for problem in ("last_sync_error", "last_note_error"):  # workspaces
                if state.get(problem):
                    out.append(f"{where}: {state[problem]}")
            if state.get("storage_errors"):
                out.append(
                    f"{where}: {state['storage_errors']} write(s) failed in the database, "
                    f"last: {state.get('last_storage_error')}"
                )
            waiting = int(state.get("outbox_pending") or 0) - int(state.get("writebacks_in_flight") or 0)
            if waiting > 0:
                out.append(f"{where}: {waiting} acknowledged write-back(s) wait in the outbox for a retry")
            if state.get("outbox_dead"):
                out.append(
                    f"{where}: {state['outbox_dead']} write-back(s) were refused and are kept in the outbox"
                )
    for owner, reason in sorted(degraded.items()):
        out.append(f"{owner} is degraded: {reason}")
    return out


def _timeout(system: MemorySystem, timeout: float | None) -> float:
    return system.config.actors.ask_timeout_s if timeout is None else timeout


class Agent:
    """One agent's memory: knowledge, episodes, working memory and the task lifecycle."""

    def __init__(self, system: MemorySystem, agent_id: str) -> None:
        self._system = system
        self.id = agent_id

    def __repr__(self) -> str:
        return f"<Agent {self.id}>"

    def _ask(self, message: Message, timeout: float | None = None) -> Any:
        return self._system.ask(message, timeout=_timeout(self._system, timeout))

    # -- long-term knowledge -------------------------------------------------------------------

    def store_knowledge(
        self,
        content: str,
        *,
        category: str = "pattern",
        tags: Mapping[str, str] | Sequence[str] | None = None,
        scope: str = "/",
        shared: bool = False,
        timeout: float | None = None,
    ) -> int:
        """Add an entry to this agent's store (or, with ``shared=True``, the shared store, with
        this agent as its author); returns its id. Same content, category and scope -> same id."""
        target = SHARED if shared else self.id
        message = StoreKnowledge(target, content, category, tags, scope, author=self.id)  # type: ignore[arg-type]
        return int(self._ask(message, timeout).entry_id)

    def query_knowledge(
        self,
        query: str,
        *,
        top_k: int | None = None,
        category: str | None = None,
        tags: Mapping[str, str] | Sequence[str] | None = None,
        scope: str | None = None,
        include_shared: bool | None = None,
        mode: str = "hybrid",
        min_score: float | None = None,
        timeout: float | None = None,
    ) -> list[KnowledgeHit]:
        """Hybrid search, best first: the same ``KnowledgeHit`` objects as ``KnowledgeStore.search``,
        in a list whose ``degraded`` says when the model was late or faulty and keywords ranked alone.

        ``include_shared`` (default: the agent's ``include_shared`` setting) merges the shared
        store's hits by score.
        """
        if include_shared is None:
            include_shared = self._system.config.for_agent(self.id).include_shared
        message = QueryKnowledge(
            self.id,
            query,
            category=category,
            top_k=top_k or self._system.config.search.top_k,
            tags=tags,  # type: ignore[arg-type]
            scope=scope,
            include_shared=include_shared,
            mode=mode,
            min_score=min_score,
        )
        runtime = self._system._runtime
        runtime.check_open()
        found = runtime.search_knowledge(message, timeout=_timeout(self._system, timeout))
        return Hits(found.result.hits, degraded=found.degraded)

    def _store(self, store: str | None, shared: bool) -> str:
        """The store an entry id refers to: ``store`` (this agent's id or ``"shared"``) or, for
        callers of the older form, ``shared=True``; both given must agree."""
        if store is None:
            return SHARED if shared else self.id
        if store not in (self.id, SHARED):
            raise InvalidInputError(
                f"store must be {self.id!r} (this agent) or 'shared', got {str(store)[:64]!r}"
            )
        if shared and store != SHARED:
            raise InvalidInputError(f"store={store!r} contradicts shared=True")
        return store

    def list_knowledge(
        self,
        *,
        category: str | None = None,
        tags: Mapping[str, str] | Sequence[str] | None = None,
        scope: str | None = None,
        limit: int = 50,
        offset: int = 0,
        shared: bool = False,
        store: str | None = None,
        timeout: float | None = None,
    ) -> list[KnowledgeEntry]:
        """Entries of one store, newest first (``scope``: that scope and its descendants); each
        says its ``store``. ``store``: this agent's id (default) or ``"shared"``."""
        target = self._store(store, shared)
        message = ListKnowledge(target, category, tags, scope, limit, offset)  # type: ignore[arg-type]
        return list(self._ask(message, timeout).entries)

    def get_knowledge(
        self,
        entry_id: int,
        *,
        store: str | None = None,
        shared: bool = False,
        timeout: float | None = None,
    ) -> KnowledgeEntry | None:
        """The entry with this id in ``store`` (this agent's id, the default, or ``"shared"``:
        ids are per store, so take it from the hit's ``store``), or ``None``."""
        target = self._store(store, shared)
        return self._ask(GetKnowledge(target, entry_id), timeout).entry  # type: ignore[no-any-return]

    def update_knowledge(
        self,
        entry_id: int,
        *,
        store: str | None = None,
        content: str | None = None,
        category: str | None = None,
        tags: Mapping[str, str] | Sequence[str] | None = None,
        scope: str | None = None,
        shared: bool = False,
        timeout: float | None = None,
    ) -> KnowledgeEntry | None:
        """Change the given fields of an entry, keeping its id; returns it as it now is, or
        ``None`` when there is no such id. ``None`` leaves a field as it is; ``tags`` replaces
        every tag (``{}`` clears them); new content is embedded again. A change that would make
        it a duplicate of another entry of the store (same content, category and scope) raises
        :class:`InvalidInputError` naming that entry, and changes nothing."""
        target = self._store(store, shared)
        message = UpdateKnowledge(target, entry_id, content, category, tags, scope)  # type: ignore[arg-type]
        return self._ask(message, timeout).entry  # type: ignore[no-any-return]

    def delete_knowledge(
        self,
        entry_id: int,
        *,
        store: str | None = None,
        shared: bool = False,
        timeout: float | None = None,
    ) -> bool:
        """Delete the entry with this id in ``store`` (this agent's id or ``"shared"``); True if
        it existed."""
        target = self._store(store, shared)
        return bool(self._ask(DeleteKnowledge(target, entry_id), timeout).deleted)

    # -- episodic memory -----------------------------------------------------------------------

    def remember(
        self,
        content: str,
        *,
        title: str | None = None,
        task_run_id: str | None = None,
        tags: Mapping[str, str] | None = None,
        kind: str = "note",
        at: _dt.datetime | None = None,
        timeout: float | None = None,
    ) -> int:
        """Record an episode (``at`` defaults to the system clock); returns its id once committed."""
        message = StoreMemory(self.id, task_run_id, content, title, tags, kind, at)  # type: ignore[arg-type]
        return int(self._ask(message, timeout).episode_id)

    def recall(
        self,
        query: str,
        *,
        top_k: int | None = None,
        task_run_id: str | None = None,
        since: _dt.datetime | None = None,
        until: _dt.datetime | None = None,
        timeout: float | None = None,
    ) -> list[EpisodeHit]:
        """Search this agent's episodes (hybrid), optionally within a task run or time range.
        The list's ``degraded`` says when the model was late or faulty and keywords ranked alone."""
        message = SearchMemory(
            self.id, query, task_run_id, top_k or self._system.config.search.top_k, since, until
        )
        runtime = self._system._runtime
        runtime.check_open()
        found = runtime.search_memory(message, timeout=_timeout(self._system, timeout))
        return Hits(found.result.hits, degraded=found.degraded)

    def commit(self, timeout: float | None = None) -> None:
        """Apply the episodic retention policy and checkpoint its database."""
        self._ask(CommitMemory(self.id), timeout)

    def list_episodes(
        self,
        *,
        task_run_id: str | None = None,
        since: _dt.datetime | None = None,
        until: _dt.datetime | None = None,
        limit: int = 100,
        offset: int = 0,
        newest_first: bool = True,
        timeout: float | None = None,
    ) -> list[Episode]:
        """The timeline of live episodes, newest first (``newest_first=False``: oldest first),
        within a task run and/or a time range (``since`` inclusive, ``until`` exclusive)."""
        message = ListEpisodes(self.id, task_run_id, since, until, limit, offset, newest_first)
        return list(self._ask(message, timeout).episodes)

    def get_episode(self, episode_id: int, *, timeout: float | None = None) -> Episode | None:
        """The live episode with this id, or ``None``."""
        return self._ask(GetEpisode(self.id, episode_id), timeout).episode  # type: ignore[no-any-return]

    def delete_episode(self, episode_id: int, *, timeout: float | None = None) -> bool:
        """Delete a live episode for good: no search finds it and no later archive holds it
        (its vector, text index and its words in its neighbours' context go too). True if it
        existed. Archive files written before keep their copy: they never change."""
        return bool(self._ask(DeleteEpisode(self.id, episode_id), timeout).deleted)

    def archive_episodes(
        self,
        path: str | Path | None = None,
        *,
        before: _dt.datetime | None = None,
        task_run_id: str | None = None,
        timeout: float | None = None,
    ) -> EpisodesArchived:
        """Move live episodes older than ``before`` (and/or of ``task_run_id``; all when neither
        is given) into one portable archive file; its ``archived`` counts them. ``path``
        defaults to ``{data_dir}/episodic/archives/{agent}-{time}.sqlite``; nothing selected
        writes no file. Archived episodes leave the timeline and :meth:`recall`;
        :meth:`restore_episodes` brings them back."""
        if path is None:
            stamp = self._system.clock.now().astimezone(_dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
            path = self._system.data_dir / "episodic" / "archives" / f"{self.id}-{stamp}.sqlite"
        if not isinstance(path, str | Path):
            raise InvalidInputError(f"path must be a str or Path, got {type(path).__name__}")
        message = ArchiveEpisodes(self.id, str(Path(path).absolute()), before, task_run_id)
        return self._ask(message, timeout)  # type: ignore[no-any-return]

    def restore_episodes(self, path: str | Path, *, timeout: float | None = None) -> int:
        """Bring back the episodes of an archive file; returns how many were added (episodes
        already present, by uuid, are skipped, so restoring twice adds nothing)."""
        if not isinstance(path, str | Path):
            raise InvalidInputError(f"path must be a str or Path, got {type(path).__name__}")
        message = RestoreEpisodes(self.id, str(Path(path).absolute()))
        return int(self._ask(message, timeout).restored)

    def promote_episode(
        self,
        episode_id: int,
        *,
        category: str = "outcome",
        scope: str = "/",
        store: str | None = None,
        timeout: float | None = None,
    ) -> KnowledgeEntry:
        """Copy a live episode into long-term knowledge (this agent's store, or ``"shared"``);
        returns the entry. It keeps the episode's tags plus ``episode_id`` and ``task_run_id``,
        so it says where it came from; promoting twice returns the same entry."""
        from memstrata.layers._episodic import promotion_tags

        target = self._store(store, False)
        episode = self.get_episode(episode_id, timeout=timeout)
        if episode is None:
            raise InvalidInputError(f"episode_id: agent {self.id!r} has no live episode {episode_id}")
        message = StoreKnowledge(
            target, episode.content, category, promotion_tags(episode), scope, author=self.id
        )
        entry_id = int(self._ask(message, timeout).entry_id)
        entry = self.get_knowledge(entry_id, store=target, timeout=timeout)
        if entry is None:  # deleted by someone else in between
            raise InvalidInputError(f"the entry promoted from episode {episode_id} was deleted meanwhile")
        return entry

    # -- task lifecycle ------------------------------------------------------------------------

    def begin_task(
        self,
        task_id: str,
        description: str,
        *,
        query: str | None = None,
        category: str | None = None,
        tags: Mapping[str, str] | None = None,
        scope: str | None = None,
        top_k: int | None = None,
    ) -> TaskPrompt:
        """The prompt for a task, within the agent's retrieval timeout (+1 s at most).

        Knowledge found -> ``<knowledge-context>`` + ``<task>``; nothing found, an error or the
        timeout -> the fallback prompt (the task alone) with ``fallback=True`` and a ``reason``.
        """
        message = TaskAssigned(task_id, description, self.id, query, category, tags, scope, top_k)  # type: ignore[arg-type]
        return self._system._runtime.begin_task(message)

    def complete_task(self, task_id: str, summary: str, *, timeout: float | None = None) -> WriteBackQueued:
        """Record the outcome: durable when this returns; stored as knowledge and episode soon after."""
        return self._ask(TaskCompleted(task_id, summary, self.id), timeout)  # type: ignore[no-any-return]

    def fail_task(self, task_id: str, reason: str, *, timeout: float | None = None) -> WriteBackQueued:
        """Record a failure: the reason becomes a ``pitfall`` (durable when this returns)."""
        return self._ask(TaskFailed(task_id, reason, self.id), timeout)  # type: ignore[no-any-return]

    # -- working memory ------------------------------------------------------------------------

    def set_working(
        self,
        key: str,
        value: Any,
        *,
        task_id: str | None = None,
        ttl_s: float | None = None,
        timeout: float | None = None,
    ) -> None:
        """Set a working-memory key (JSON data) in the space of ``task_id`` (omitted: the
        agent-wide space); ``ttl_s`` makes it expire. Ending a task clears its space only."""
        self._ask(SetWorkingMemory(self.id, key, value, ttl_s, task_id), timeout)

    def get_working(
        self, key: str, default: Any = None, *, task_id: str | None = None, timeout: float | None = None
    ) -> Any:
        """A copy of a working-memory value of that space (``task_id`` omitted: the agent-wide
        one), or ``default``."""
        reply = self._ask(GetWorkingMemory(self.id, key, task_id), timeout)
        return reply.value if reply.found else default

    def clear_working(
        self, key: str | None = None, *, task_id: str | None = None, timeout: float | None = None
    ) -> int:
        """Remove one key, or every key, of that space (``task_id`` omitted: the agent-wide
        one); the other spaces keep theirs. Returns how many keys were removed."""
        return int(self._ask(ClearWorkingMemory(self.id, key, task_id), timeout).removed)

    # -- raw messages --------------------------------------------------------------------------

    def _own(self, message: Message) -> Message:
        current = getattr(message, "agent_id", self.id)
        if current is None and isinstance(message, TaskAssigned | TaskCompleted | TaskFailed):
            import dataclasses

            return dataclasses.replace(message, agent_id=self.id)
        if current != self.id:
            raise InvalidInputError(f"message is for agent {current!r}, not {self.id!r}")
        return message

    def tell(self, message: Message) -> None:
        self._system.tell(self._own(message))

    def ask(self, message: Message, *, timeout: float | None = None) -> Any:
        return self._system.ask(self._own(message), timeout=timeout)


def _ray_engine(model: Embedder | None) -> tuple[Callable[..., Runtime], dict[str, Any]]:
    """The Ray runtime, or a clear error when the ``memstrata[ray]`` extra is not installed."""
    try:
        from memstrata.actors._ray_runtime import RayRuntime
    except ImportError as exc:
        raise ConfigError(
            f"cluster.engine = 'ray' needs the memstrata[ray] extra (pip install 'memstrata[ray]'): {exc}"
        ) from exc
    return RayRuntime, {"model": model}


class Subscription:
    """A blackboard subscription; :meth:`unsubscribe` stops further callbacks."""

    def __init__(self, system: MemorySystem, session_id: str, subscription_id: int, pattern: str) -> None:
        self._system = system
        self.session_id = session_id
        self.id = subscription_id
        self.pattern = pattern
        self._active = True

    @property
    def active(self) -> bool:
        return self._active

    def unsubscribe(self) -> bool:
        """Stop delivering to this subscription; True the first time. No callback starts after
        this returns (one already running on the delivery thread finishes)."""
        if not self._active:
            return False
        self._active = False
        if self._system.stopped:
            return True
        reply = self._system.ask(UnsubscribeSignal(self.id, self.session_id))
        return bool(reply.removed)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(SystemStoppedError):
            self.unsubscribe()

    def __repr__(self) -> str:
        return f"<Subscription {self.id} {self.pattern!r} on {self.session_id}>"


class Blackboard:
    """A session's shared board: publish/get/list and subscriptions to a key or a ``prefix*``."""

    def __init__(self, system: MemorySystem, session_id: str) -> None:
        self._system = system
        self.session_id = session_id

    def __repr__(self) -> str:
        return f"<Blackboard {self.session_id}>"

    def publish(
        self, key: str, value: Any, publisher: str | None = None, *, wait: bool = False
    ) -> int | None:
        """Set ``key`` to ``value`` (any JSON data) and notify subscribers.

        Fire-and-forget unless ``wait`` (then returns the key's new version). Invalid keys and
        values that are not JSON-serialisable raise at once, in the caller's thread.
        """
        message = PublishSignal(key, value, publisher, self.session_id)
        if not wait:
            self._system.tell(message)
            return None
        return int(self._system.ask(message).version)

    def get(self, key: str, default: Any = None) -> Any:
        """A copy of the current value of ``key``, or ``default``."""
        reply = self.signal(key)
        return reply.value if reply.found else default

    def signal(self, key: str) -> SignalValue:
        """The current value of ``key`` with its publisher, version and time."""
        return self._system.ask(QuerySignal(key, self.session_id))  # type: ignore[no-any-return]

    def list(self, prefix: str | None = None) -> list[str]:
        """The keys, sorted; only those starting with ``prefix`` when given."""
        return list(self._system.ask(ListSignals(prefix, self.session_id)).keys)

    def delete(self, key: str) -> bool:
        """Remove ``key``; True if it was set. Subscribers receive a signal with ``deleted`` set
        (value null); a later publish continues the key's version count."""
        return bool(self._system.ask(DeleteSignal(key, self.session_id)).deleted)

    def subscribe(self, key_or_prefix: str, callback: Callable[[Signal], Any]) -> Subscription:
        """Call ``callback(signal)`` for every change of a key, or of any key under ``prefix*``.

        The current matching values are delivered at once. Callbacks run on the session's
        delivery thread, in publication order; one that raises is unsubscribed (counted in
        ``status()``) and the others carry on.
        """
        if not callable(callback):
            raise InvalidInputError(f"callback must be callable, got {type(callback).__name__}")
        reply = self._system.ask(SubscribeSignal(key_or_prefix, self.session_id), callback=callback)
        return Subscription(self._system, self.session_id, reply.subscription_id, key_or_prefix)
