"""How the asyncio twin runs a synchronous call: off the event loop, on the system's call pool.

The plumbing under the handles of :mod:`memstrata._async`: the pool, which knows the calls
still running and the subscriptions still open; the submission, which falls back to the loop's
default executor once the system has stopped; and the two descriptors that turn a synchronous
handle's methods into coroutines and its read-only attributes into plain reads. A cancelled
await abandons the wait, not the work: the call goes on, and what a cancelled call made (a
started system, a subscription) is undone, since nobody else could reach it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import weakref
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar, overload

if TYPE_CHECKING:
    from ._async import AsyncSubscription

__all__ = ["AsyncHandle", "CallPool", "SyncAttribute", "submit_call", "twin", "undone_if_cancelled"]

log = logging.getLogger("memstrata")

P = ParamSpec("P")
R = TypeVar("R")

# Threads mostly wait on actor replies; enough of them that many concurrent agents never queue.
_POOL_THREADS = 64


def twin(method: Callable[Concatenate[Any, P], R]) -> Callable[Concatenate[Any, P], Coroutine[Any, Any, R]]:
    """The coroutine version of a synchronous handle method (same name, params and docstring)."""
    name = method.__name__

    async def call(handle: AsyncHandle, /, *args: P.args, **kwargs: P.kwargs) -> R:
        bound: Callable[P, R] = getattr(handle.sync, name)
        return await handle._run(functools.partial(bound, *args, **kwargs))

    functools.update_wrapper(call, method)
    return call


class CallPool(ThreadPoolExecutor):
    """The system's call pool. It knows which calls are still running, so ``wait_idle`` also
    waits for a call whose awaiting task was cancelled (the call goes on, see the module doc),
    and which subscriptions are open, so that their iterations end when the system stops."""

    def __init__(self) -> None:
        super().__init__(max_workers=_POOL_THREADS, thread_name_prefix="memstrata-async")
        self._running: set[Future[Any]] = set()
        # weakly: a subscription nobody iterates any more (an ``async for`` left) is let go
        self._subscriptions: weakref.WeakSet[AsyncSubscription] = weakref.WeakSet()
        self._lock = threading.Lock()
        self.closed = False

    def submit(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> Future[R]:
        future = super().submit(fn, *args, **kwargs)
        with self._lock:
            self._running.add(future)
        future.add_done_callback(self._finished)
        return future

    def _finished(self, future: Future[Any]) -> None:
        with self._lock:
            self._running.discard(future)

    def running(self) -> list[Future[Any]]:
        with self._lock:
            return list(self._running)

    def opened(self, subscription: AsyncSubscription) -> None:
        with self._lock:
            if not self.closed:
                self._subscriptions.add(subscription)

    def forget(self, subscription: AsyncSubscription) -> None:
        with self._lock:
            self._subscriptions.discard(subscription)

    def close(self) -> None:
        """The system has stopped: end the open subscriptions' iterations and release the
        threads (a call still running finishes). Later calls go to the loop's default executor."""
        with self._lock:
            self.closed = True
            subscriptions = list(self._subscriptions)
            self._subscriptions.clear()
        for subscription in subscriptions:
            subscription._end()
        self.shutdown(wait=False)


def submit_call(pool: CallPool, call: Callable[[], R]) -> asyncio.Future[R]:
    """``call`` off the event loop: on the system's pool or, once the system has stopped and
    released it, on the loop's default executor, so a late call gets the stopped system's own
    answer (``SystemStoppedError`` for most, as in the synchronous API)."""
    return asyncio.get_running_loop().run_in_executor(None if pool.closed else pool, call)


async def undone_if_cancelled(pool: CallPool, make: Callable[[], R], undo: Callable[[R], object]) -> R:
    """``make()`` off the event loop for a task that may be cancelled before the result arrives.
    What a cancelled task's call makes (a started system, a subscription) is then passed to
    ``undo``, on the pool: nobody else holds it, so nobody else could."""
    lock = threading.Lock()
    made: list[R] = []
    cancelled = False

    def call() -> R:
        result = make()
        with lock:
            if not cancelled:
                made.append(result)
                return result
        _quietly(undo, result)
        return result

    try:
        return await asyncio.shield(submit_call(pool, call))
    except asyncio.CancelledError:
        with lock:
            cancelled = True
            handed = list(made)  # made just before the cancel, not yet received
        for result in handed:
            submit_call(pool, functools.partial(_quietly, undo, result))
        raise


def _quietly(undo: Callable[[R], object], result: R) -> None:
    """Undo for a task that has gone: there is nobody to raise to, so a failure is logged."""
    try:
        undo(result)
    except Exception:
        log.warning("could not undo what a cancelled call made (%r)", result, exc_info=True)


class AsyncHandle:
    """Shared plumbing: the synchronous object and the pool its calls run on."""

    sync: Any

    def __init__(self, sync: Any, pool: CallPool) -> None:
        self.sync = sync
        self._pool = pool

    async def _run(self, call: Callable[[], R]) -> R:
        # shielded: a cancelled caller stops waiting, but a call already sent still runs
        return await asyncio.shield(submit_call(self._pool, call))

    def __repr__(self) -> str:
        return f"<Async{repr(self.sync)[1:]}"


class SyncAttribute(Generic[R]):
    """A read-only attribute of a handle: the synchronous object's attribute of the same name
    (``id = SyncAttribute[str]()``), answered at once, not on the pool."""

    def __init__(self) -> None:
        self._name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, handle: None, owner: type) -> SyncAttribute[R]: ...

    @overload
    def __get__(self, handle: AsyncHandle, owner: type | None = None) -> R: ...

    def __get__(self, handle: AsyncHandle | None, owner: type | None = None) -> R | SyncAttribute[R]:
        if handle is None:
            return self
        value: R = getattr(handle.sync, self._name)
        return value
