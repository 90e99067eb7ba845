"""Stopping the runtime: retire one owner's actors, wait until idle, stop the whole tree.

The part of :class:`Runtime` that ends things, apart from the part that starts and routes them.
Its order loses nothing: refuse new requests, wait until every mailbox is drained (write-backs
included), then stop agents, then the stores (which commit and close), then blackboards (which
snapshot); what the outboxes still hold is reported, durable there for the next start.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from pathlib import Path
from typing import Any, cast

import pykka

from memstrata.core.config import Config
from memstrata.core.errors import MemstrataError
from memstrata.storage import Embedder

from ._base import owner_of
from ._blackboard import on_delivery_thread
from ._concurrency import Activity, Scheduler
from ._embedding import BatchingEmbedder
from ._foreground import Foreground
from ._outbox import pending_count, release_owner
from ._routing import _FOLDER
from ._supervisors import StopChildren

__all__ = ["Shutdown", "StopReport"]

log = logging.getLogger("memstrata.actors")

_STOP_ORDER = ("agent", "knowledge", "memory", "files", "blackboard")
_STOP_STAGE_MIN_S = 0.2  # each stop stage gets at least this, so stop(timeout) ends by ~timeout + 1.2 s


@dataclasses.dataclass(frozen=True, slots=True)
class StopReport:
    drained: bool  # every mailbox was empty before the actors stopped
    late: tuple[str, ...]  # actors that did not stop within the timeout
    seconds: float
    # what is left for the next start, kept durable: "agent a1: 2 write-back(s) in the outbox"
    left: tuple[str, ...] = ()


class Shutdown:
    """The stopping part of :class:`Runtime`: retiring an owner, waiting until idle, stopping."""

    config: Config
    data_dir: Path
    embedder: Embedder | None
    instance: str
    accepting: bool
    activity: Activity
    foreground: Foreground
    scheduler: Scheduler
    supervisors: dict[str, pykka.ActorRef[Any]]
    _refs: dict[tuple[str, str], pykka.ActorRef[Any]]
    _lock: threading.Lock
    _stop_lock: threading.Lock
    _stopped: threading.Event
    _owns_embedder: bool
    _services: dict[tuple[Any, ...], tuple[BatchingEmbedder | None, str | None]]
    _services_lock: threading.Lock

    def retire(self, owner: str, timeout: float) -> list[str]:
        """Stop every actor of one agent (or ``session:{id}``), draining their mailboxes first."""
        late: list[str] = []
        for name in _STOP_ORDER:
            late += cast(
                "list[str]", self.supervisors[name].ask(StopChildren(timeout, owner), timeout=timeout + 5)
            )
        with self._lock:
            for k in [k for k in self._refs if owner_of(*k) == owner]:
                del self._refs[k]
        return late

    def wait_idle(self, timeout: float | None = None, owner: str | None = None) -> bool:
        """Whether nothing is in flight (``owner``: for that agent's, session's or codebase's
        actors) within ``timeout``."""
        _not_from_a_callback("wait_idle")
        return self.activity.wait_idle(timeout, owner)

    def stop(self, timeout: float | None = None) -> StopReport:
        """Refuse new requests, drain every mailbox, then stop the actors in order and close."""
        limit = self.config.actors.stop_timeout_s if timeout is None else timeout
        _not_from_a_callback("stop")
        with self._stop_lock:
            if self._stopped.is_set():
                return StopReport(True, (), 0.0)
            started = time.monotonic()
            self.accepting = False
            self.foreground.close()  # write-back steps stop stepping aside: they drain now
            drained = self.activity.wait_idle(limit)
            if not drained:
                log.error("stop: %d requests still in flight after %g s", self.activity.in_flight, limit)
            late: list[str] = []
            for name in _STOP_ORDER:
                # a hard bound: a stage whose time is used up still asks its actors to stop, briefly
                remaining = max(_STOP_STAGE_MIN_S, limit - (time.monotonic() - started))
                try:
                    stopped = self.supervisors[name].ask(
                        StopChildren(remaining), timeout=remaining + _STOP_STAGE_MIN_S
                    )
                    late += cast("list[str]", stopped)
                except Exception as exc:
                    late.append(f"{name} supervisor: {exc}")
                with contextlib.suppress(Exception):
                    self.supervisors[name].stop(
                        block=True, timeout=max(_STOP_STAGE_MIN_S, limit - (time.monotonic() - started))
                    )
            self._stopped.set()
            release_owner(self.instance)
            with self._services_lock:
                services = [service for service, _ in self._services.values() if service is not None]
            if self._owns_embedder and isinstance(self.embedder, BatchingEmbedder):
                services.insert(0, self.embedder)
            for service in services:
                # a stuck model call is left to its daemon thread: stop() does not wait for it
                service.close(timeout=max(0.0, limit - (time.monotonic() - started)))
            self.scheduler.close()
            return StopReport(drained, tuple(late), time.monotonic() - started, self._left())

    def _left(self) -> tuple[str, ...]:
        """Write-backs left in the outboxes, durable there: replayed by the next start."""
        folder = self.data_dir / _FOLDER["agent"]
        left: list[str] = []
        if folder.is_dir():
            for path in sorted(folder.glob("*.sqlite")):
                try:
                    count = pending_count(path)
                except Exception as exc:
                    left.append(f"agent {path.stem}: outbox unreadable ({exc})")
                    continue
                if count:
                    left.append(f"agent {path.stem}: {count} write-back(s) in the outbox")
        return tuple(left)

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()


def _not_from_a_callback(call: str) -> None:
    """Refuse ``call`` from a subscriber's callback: the callback is work it would wait for."""
    if on_delivery_thread():
        raise MemstrataError(
            f"{call}() cannot be called from a blackboard subscriber's callback: it waits for that "
            "callback to return; call it from another thread"
        )
