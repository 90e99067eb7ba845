"""The asyncio twin of the facade: ``AsyncMemorySystem`` and its handles.

Every method of :class:`MemorySystem`, :class:`Agent` and :class:`Blackboard` exists here as a
coroutine with the same name, parameters and result. A call runs the synchronous method on a
thread pool owned by the system, so the event loop never blocks on an actor, the model or the
disk. Cancelling an awaiting task abandons the wait, not the work: a write that was sent is
still stored (write-backs are acknowledged by the outbox, as in the synchronous API). What a
cancelled ``start`` or ``subscribe`` makes is undone, since nobody could reach it.

``stop`` is idempotent; after it, every call behaves as the synchronous one on a stopped system
(most raise ``SystemStoppedError``). Blackboard subscriptions are async iterators, which end when
the system stops::

    async with board.subscribe("agent:*") as signals:
        async for signal in signals:
            ...
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import threading
import weakref
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

from memstrata.actors import Clock, StopReport
from memstrata.core.config import Config
from memstrata.core.errors import InvalidInputError, SystemStoppedError
from memstrata.messages import Signal
from memstrata.storage import Embedder

from ._agent_handle import Agent
from ._async_calls import AsyncHandle, CallPool, SyncAttribute, submit_call, twin, undone_if_cancelled
from ._board_handle import Blackboard, Subscription
from ._items import Items
from ._system import MemorySystem

__all__ = ["AsyncAgent", "AsyncBlackboard", "AsyncItems", "AsyncMemorySystem", "AsyncSubscription"]

P = ParamSpec("P")
R = TypeVar("R")


class AsyncAgent(AsyncHandle):
    """One agent's memory, as coroutines (see :class:`memstrata.Agent`)."""

    sync: Agent
    id = SyncAttribute[str]()

    store_knowledge = twin(Agent.store_knowledge)
    query_knowledge = twin(Agent.query_knowledge)
    list_knowledge = twin(Agent.list_knowledge)
    get_knowledge = twin(Agent.get_knowledge)
    update_knowledge = twin(Agent.update_knowledge)
    delete_knowledge = twin(Agent.delete_knowledge)
    remember = twin(Agent.remember)
    recall = twin(Agent.recall)
    commit = twin(Agent.commit)
    list_episodes = twin(Agent.list_episodes)
    get_episode = twin(Agent.get_episode)
    delete_episode = twin(Agent.delete_episode)
    archive_episodes = twin(Agent.archive_episodes)
    restore_episodes = twin(Agent.restore_episodes)
    promote_episode = twin(Agent.promote_episode)
    begin_task = twin(Agent.begin_task)
    complete_task = twin(Agent.complete_task)
    fail_task = twin(Agent.fail_task)
    set_working = twin(Agent.set_working)
    get_working = twin(Agent.get_working)
    clear_working = twin(Agent.clear_working)
    tell = twin(Agent.tell)
    ask = twin(Agent.ask)


class AsyncSubscription(AsyncHandle):
    """A blackboard subscription delivering signals to an async iterator.

    The current matching values come first, then every change in publication order. Signals
    wait in an unbounded queue on the subscriber's event loop, so a slow consumer never blocks
    the session's delivery thread. Leave the ``async with`` block (or call :meth:`unsubscribe`)
    to stop deliveries; iteration then ends once the queue is drained. It also ends when the
    system stops (the signals queued before are still yielded), so a consumer never waits for
    a signal that cannot come. A bare ``async for`` starts the subscription itself; once nothing
    holds the iterator (the loop was left) or its event loop has ended, the subscription ends.
    """

    def __init__(self, board: Blackboard, key_or_prefix: str, pool: CallPool) -> None:
        super().__init__(None, pool)
        self._board = board
        self.pattern = key_or_prefix
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[Signal | None] | None = None
        self._started = False
        self._over = False  # no more signals wanted: unsubscribed, start failed, system stopped
        self._done = False  # the end was read: iteration is over for good

    async def _start(self) -> None:
        if self._started:
            return
        self._started = True
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Signal | None] = asyncio.Queue()
        self._loop, self._queue = loop, queue
        reader = weakref.ref(self)
        made: list[Subscription] = []

        def deliver(signal: Signal) -> None:
            try:
                if reader() is not None:
                    loop.call_soon_threadsafe(queue.put_nowait, signal)
                    return
            except RuntimeError:  # its event loop is closed
                pass
            # nobody can read it (an ``async for`` left, or its loop ended): deliveries stop
            if made:
                made[0].unsubscribe()

        self._pool.opened(self)
        subscribe = functools.partial(self._board.subscribe, self.pattern, deliver)
        try:
            self.sync = await undone_if_cancelled(self._pool, subscribe, Subscription.unsubscribe)
        except BaseException:
            self._pool.forget(self)
            self._end()  # nothing will be delivered: iteration ends at once
            raise
        made.append(self.sync)
        weakref.finalize(self, _let_go, self._pool, made[0])
        if self._over:  # unsubscribed, or the system stopped, while it was being made
            await self._run(self.sync.unsubscribe)

    def _end(self) -> None:
        """End the iteration after the signals already queued (from any thread)."""
        self._over = True
        if self._loop is not None and self._queue is not None:
            with contextlib.suppress(RuntimeError):  # that event loop is closed: nobody iterates
                self._loop.call_soon_threadsafe(self._queue.put_nowait, None)

    @property
    def id(self) -> int | None:
        """The subscription id (``None`` until the subscription has started)."""
        subscription: Subscription | None = self.sync
        return None if subscription is None else subscription.id

    async def unsubscribe(self) -> bool:
        """Stop deliveries; True the first time. Signals already queued can still be read."""
        self._started = True  # never start after this
        self._over = True  # a start still under way undoes what it makes
        self._pool.forget(self)
        subscription: Subscription | None = self.sync
        try:
            return False if subscription is None else await self._run(subscription.unsubscribe)
        finally:
            self._end()

    async def __aenter__(self) -> AsyncSubscription:
        await self._start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.unsubscribe()

    def __aiter__(self) -> AsyncIterator[Signal]:
        return self

    async def __anext__(self) -> Signal:
        await self._start()
        if self._done or self._queue is None:
            raise StopAsyncIteration
        signal = await self._queue.get()
        if signal is None:
            self._done = True
            self._queue.put_nowait(None)  # for another task iterating the same subscription
            raise StopAsyncIteration
        return signal

    def __repr__(self) -> str:
        return f"<AsyncSubscription {self.id} {self.pattern!r} on {self._board.session_id}>"


def _let_go(pool: CallPool, subscription: Subscription) -> None:
    """End a subscription nobody iterates any more (its :class:`AsyncSubscription` is gone, as
    after leaving an ``async for``), on the pool: the event loop that let it go never waits."""
    with contextlib.suppress(RuntimeError):  # the pool is shut down: the system has stopped
        if not pool.closed and subscription.active:
            pool.submit(_quietly_unsubscribe, subscription)


def _quietly_unsubscribe(subscription: Subscription) -> None:
    with contextlib.suppress(SystemStoppedError):
        subscription.unsubscribe()


class AsyncBlackboard(AsyncHandle):
    """A session's blackboard, as coroutines (see :class:`memstrata.Blackboard`)."""

    sync: Blackboard
    session_id = SyncAttribute[str]()

    publish = twin(Blackboard.publish)
    get = twin(Blackboard.get)
    signal = twin(Blackboard.signal)
    list = twin(Blackboard.list)
    delete = twin(Blackboard.delete)

    def subscribe(self, key_or_prefix: str) -> AsyncSubscription:
        """Signals of ``key_or_prefix`` (a key, or ``prefix*``) as an async iterator."""
        if not isinstance(key_or_prefix, str):
            raise InvalidInputError(f"key_or_prefix must be a string, got {type(key_or_prefix).__name__}")
        return AsyncSubscription(self.sync, key_or_prefix, self._pool)


class AsyncItems(AsyncHandle):
    """The system's item store, as coroutines (see :class:`memstrata._items.Items`)."""

    sync: Items

    put = twin(Items.put)
    write = twin(Items.write)
    get = twin(Items.get)
    search = twin(Items.search)
    delete = twin(Items.delete)
    tail = twin(Items.tail)
    pop_last = twin(Items.pop_last)
    clear = twin(Items.clear)
    list_namespaces = twin(Items.list_namespaces)
    sweep = twin(Items.sweep)


def _starter(start: Callable[P, MemorySystem]) -> Callable[P, _Starting]:
    """``AsyncMemorySystem.start``: the parameters of ``MemorySystem.start``, which it runs off
    the event loop."""

    def begin(*args: P.args, **kwargs: P.kwargs) -> _Starting:
        return _Starting(functools.partial(start, *args, **kwargs))

    functools.update_wrapper(begin, start)
    begin.__doc__ = "Start a system (same parameters as :meth:`MemorySystem.start`)."
    signature = inspect.signature(start).replace(return_annotation=_Starting)
    begin.__signature__ = signature  # type: ignore[attr-defined]
    return begin


class _Starting:
    """What :meth:`AsyncMemorySystem.start` returns: await it, or use it with ``async with``."""

    def __init__(self, start: Callable[[], MemorySystem]) -> None:
        self._start = start
        self._system: AsyncMemorySystem | None = None

    async def _open(self) -> AsyncMemorySystem:
        pool = CallPool()
        try:
            # a cancelled start (a wait_for timeout, say) stops the system it started
            system = await undone_if_cancelled(pool, self._start, MemorySystem.stop)
        except BaseException:
            pool.close()  # an undo already queued still runs
            raise
        self._system = AsyncMemorySystem(system, pool)
        return self._system

    def __await__(self) -> Any:
        return self._open().__await__()

    async def __aenter__(self) -> AsyncMemorySystem:
        return await self._open()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._system is not None:
            await self._system.stop()


_POOLS: weakref.WeakKeyDictionary[MemorySystem, CallPool] = weakref.WeakKeyDictionary()
_POOLS_LOCK = threading.Lock()


def _pool_of(system: MemorySystem, given: CallPool | None) -> CallPool:
    """The system's one call pool (``given`` becomes it, if it has none yet). A stop through the
    synchronous object also ends the subscriptions and releases it."""
    with _POOLS_LOCK:
        pool = _POOLS.get(system)
        if pool is None or pool.closed:
            pool = given or CallPool()
            _POOLS[system] = pool
            system._when_stopped(pool.close)
        elif given is not None and given is not pool:
            given.close()
    return pool


class AsyncMemorySystem(AsyncHandle):
    """The asyncio twin of :class:`memstrata.MemorySystem`.

    ``async with AsyncMemorySystem.start(config) as system:`` starts it (the model loads off the
    event loop) and stops it on exit; ``system = await AsyncMemorySystem.start(...)`` works too,
    then ``await system.stop()``. ``system.sync`` is the underlying :class:`MemorySystem`, for
    code that mixes both styles.
    """

    sync: MemorySystem

    def __init__(self, system: MemorySystem, pool: CallPool | None = None) -> None:
        """Wrap a running :class:`MemorySystem` (its owner still stops it, through either object).
        Every wrapper of one system shares one thread pool, however many are made."""
        super().__init__(system, _pool_of(system, pool))
        self._agents: dict[str, AsyncAgent] = {}
        self._boards: dict[str, AsyncBlackboard] = {}

    start = staticmethod(_starter(MemorySystem.start))

    async def __aenter__(self) -> AsyncMemorySystem:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def stop(self, timeout: float | None = None) -> StopReport:
        """Stop the system (see :meth:`MemorySystem.stop`; idempotent too), end the iteration
        of its subscriptions and release the thread pool."""
        return await self._stopping(functools.partial(self.sync.stop, timeout))

    async def stop_cluster(self, timeout: float | None = None) -> list[str]:
        """Stop the system and, on the Ray engine, every host of its namespace for good (see
        :meth:`MemorySystem.stop_cluster`); ends subscriptions and releases the pool as
        :meth:`stop` does."""
        return await self._stopping(functools.partial(self.sync.stop_cluster, timeout))

    async def _stopping(self, stop: Callable[[], R]) -> R:
        call = submit_call(self._pool, stop)
        # on the call itself, not after the await: a cancelled stop still ends and releases
        call.add_done_callback(lambda _: self._pool.close())
        return await asyncio.shield(call)

    stopped = SyncAttribute[bool]()
    config = SyncAttribute[Config]()
    data_dir = SyncAttribute[Path]()
    clock = SyncAttribute[Clock]()
    embedder = SyncAttribute[Embedder | None]()

    def agent(self, agent_id: str) -> AsyncAgent:
        """The handle of agent ``agent_id`` (validated at once; its actors start on first use)."""
        sync = self.sync.agent(agent_id)
        handle = self._agents.get(agent_id)
        if handle is None:
            handle = self._agents.setdefault(agent_id, AsyncAgent(sync, self._pool))
        return handle

    def blackboard(self, session_id: str = "default") -> AsyncBlackboard:
        """The blackboard of session ``session_id``."""
        sync = self.sync.blackboard(session_id)
        board = self._boards.get(session_id)
        if board is None:
            board = self._boards.setdefault(session_id, AsyncBlackboard(sync, self._pool))
        return board

    @property
    def items(self) -> AsyncItems:
        """The system's item store (see :attr:`memstrata.MemorySystem.items`)."""
        return AsyncItems(self.sync.items, self._pool)

    async def wait_idle(self, timeout: float | None = 10.0) -> bool:
        """Like :meth:`MemorySystem.wait_idle`, after the calls still running in the pool (a
        cancelled await's call included) have reached the actors."""
        running = self._pool.running()
        if running:
            _, late = await asyncio.wait([asyncio.wrap_future(f) for f in running], timeout=timeout)
            if late:
                return False
        return await self._run(functools.partial(self.sync.wait_idle, timeout))

    embedder_for = twin(MemorySystem.embedder_for)
    retire = twin(MemorySystem.retire)
    revive = twin(MemorySystem.revive)
    ask = twin(MemorySystem.ask)
    status = twin(MemorySystem.status)
    export = twin(MemorySystem.export)
    import_ = twin(MemorySystem.import_)

    async def tell(self, message: Any) -> None:
        """Send a message without waiting for its answer (validated in the caller's task)."""
        self.sync.tell(message)
