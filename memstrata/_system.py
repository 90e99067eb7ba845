"""The Python facade: ``MemorySystem`` (start, lifecycle, handles, raw messages, export/import).

Its handles ``Agent`` (``_agent_handle``) and ``Blackboard``/``Subscription`` (``_board_handle``)
are re-exported from here; ``status()`` is assembled in ``_system_status``. The facade hides the
actor plumbing: each method builds the message (validating it in the caller's thread), sends
it to the actor that owns the agent or session, and waits for the answer within a bounded time.
Orchestrators that prefer messages use ``system.tell(msg)`` / ``system.ask(msg)``.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

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
from memstrata.core.errors import ConfigError, EmbedderUnavailableError, InvalidInputError, StorageError
from memstrata.core.validation import check_timeout
from memstrata.messages import SHARED, Message, Signal, check_agent_id, check_session_id
from memstrata.storage import Embedder, load_embedder

from ._agent_handle import Agent, _timeout
from ._board_handle import Blackboard, Subscription
from ._items import Items
from ._system_status import STATUS_TIMEOUT_S, host_model_warnings, system_status

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
        self._stop_hooks: list[Callable[[], object]] = []
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
        if embedder is not None and not isinstance(embedder, Embedder):  # a runtime-checkable protocol
            raise InvalidInputError(
                "embedder must be an Embedder (model_id, dim, embed_documents, embed_query) or None, "
                f"got {type(embedder).__name__}"
            )
        if model_loader is not None and not callable(model_loader):
            raise InvalidInputError(
                f"model_loader must be a callable or None, got {type(model_loader).__name__}"
            )
        if config is None or isinstance(config, str | Path):
            config = Config.load(config)
        if not isinstance(config, Config):
            raise InvalidInputError(f"config must be a Config, a path or None, got {type(config).__name__}")
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
        report = self._runtime.stop(check_timeout(timeout))
        _RUNNING.discard(self)
        self._run_stop_hooks()
        return report

    def stop_cluster(self, timeout: float | None = None) -> list[str]:
        """:meth:`stop`, then, on the Ray engine, every host of the namespace for good (other
        drivers' agents too: files committed, boards kept only with ``blackboard_snapshot``).
        What did not stop cleanly, one line each; the same as :meth:`stop` on the local engine."""
        limit = check_timeout(timeout)
        down = getattr(self._runtime, "stop_cluster", None)
        if down is None:
            return list(self.stop(limit).late)
        _RUNNING.discard(self)
        late = list(down(limit))
        self._run_stop_hooks()
        return late

    @property
    def stopped(self) -> bool:
        return not self._runtime.accepting

    def _when_stopped(self, hook: Callable[[], object]) -> None:
        """Call ``hook`` once this system has stopped (at once if it has): how a wrapper, such
        as the asyncio facade, learns of a stop made through this object rather than through it."""
        with self._lock:
            if not self.stopped:
                self._stop_hooks.append(hook)
                return
        hook()

    def _run_stop_hooks(self) -> None:
        with self._lock:
            hooks, self._stop_hooks = self._stop_hooks, []
        for hook in hooks:
            try:
                hook()
            except Exception:  # one wrapper's failure must not keep the others from hearing
                log.exception("a hook run when the memory system stopped failed")

    def wait_idle(self, timeout: float | None = 10.0) -> bool:
        """Block until every mailbox is empty and no write-back or callback is pending.

        True when idle; False if ``timeout`` passed first. Meant for tests and simulations.
        """
        return self._runtime.wait_idle(check_timeout(timeout))

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
        """Stop an agent's actors once its own work in flight is done and their mailboxes are
        drained (they restart on next use). Other agents' work does not hold it up; calls racing
        with it are answered, by the actors that replace the stopped ones."""
        self._runtime.check_open()
        check_agent_id(agent_id)
        # its own write-backs land first; other agents' traffic does not hold it up
        limit = check_timeout(timeout)
        if limit is None:  # 0 is a bound too: retire without waiting, as stop(0) stops
            limit = self.config.actors.stop_timeout_s
        self._runtime.wait_idle(limit, owner=agent_id)
        self._runtime.retire(agent_id, limit)

    def revive(self, agent_id: str) -> bool:
        """Clear a degraded agent's mark and restart budget; queued write-backs are replayed."""
        self._runtime.check_open()
        check_agent_id(agent_id, allow_shared=True)
        was = self._runtime.supervision.revive(agent_id)
        if agent_id != SHARED:
            from memstrata.actors._agent import Replay

            self._runtime.post(self._runtime.ref("agent", agent_id), Replay(), owner=agent_id)
        return was

    # -- export and import ---------------------------------------------------------------------

    def export(self, path: str | Path, *, timeout: float | None = None) -> int:
        """Write every store of every agent, shared knowledge, episodes (archives included),
        working memory and blackboards to ``path`` as sorted JSON lines; returns the line count.

        Waits until the system is idle first. The format is described in ``docs/simulation.md``;
        with a ``ManualClock`` and a ``seed`` two runs that did the same things write the same bytes.
        """
        from memstrata._export import export_records, export_target, write_export

        target = export_target(path, self.data_dir)  # refused before the system is asked
        records = export_records(self._runtime, timeout=_timeout(self, timeout), into=target)
        return write_export(records, target)

    def import_(self, path: str | Path, *, timeout: float | None = None) -> dict[str, int]:
        """Restore an export made by :meth:`export` into this system; returns counts by kind.

        Knowledge keeps its times, episodes their uuid and time, both their ids when their store
        was empty (an entry or episode already there is skipped and left as it is, as are
        archived episodes: restore their archive); working memory and blackboard values are set
        again. Every line is checked first, its fields by the rules of a live write: a file with
        a bad line changes nothing.
        """
        from memstrata._export import import_records, read_export

        lines = list(read_export(path))
        return import_records(self._runtime, lines, timeout=_timeout(self, timeout))

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
        return self._runtime.ask(message, timeout=check_timeout(timeout), callback=callback)

    # -- status --------------------------------------------------------------------------------

    def status(self, timeout: float | None = None) -> dict[str, Any]:
        """What runs and what is stored: drivers, vectors, model, per-agent counts, degradation
        (on the Ray engine, every host's actors and a ``cluster`` section: nodes and hosts).
        Each actor has ``timeout`` seconds (default 2) to answer; one busy longer shows
        ``{"error": "busy: ..."}`` in its place rather than hold up the report."""
        limit = check_timeout(timeout)
        limit = STATUS_TIMEOUT_S if limit is None else limit
        report = system_status(self._runtime, limit)
        cluster = getattr(self._runtime, "cluster_status", None)
        if cluster is not None and not self._runtime.stopped:
            report["cluster"] = cluster(limit)
            report["warnings"][:0] = host_model_warnings(report["cluster"])
        return report

    def __repr__(self) -> str:
        state = "stopped" if self.stopped else "running"
        return f"<MemorySystem {self.data_dir} {state}>"


def _ray_engine(model: Embedder | None) -> tuple[Callable[..., Runtime], dict[str, Any]]:
    """The Ray runtime, or a clear error when the ``memstrata[ray]`` extra is not installed."""
    try:
        from memstrata.actors._ray_runtime import RayRuntime
    except ImportError as exc:
        raise ConfigError(
            f"cluster.engine = 'ray' needs the memstrata[ray] extra (pip install 'memstrata[ray]'): {exc}"
        ) from exc
    return RayRuntime, {"model": model}
