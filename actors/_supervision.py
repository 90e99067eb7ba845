"""The restart budget: when a crashed actor is restarted, and when its owner is degraded instead.

Kept apart from the actor base because it is policy, not plumbing: one :class:`Supervision` is
shared by a system's supervisors, and a failing child consults it synchronously from its own
thread; the Ray engine's driver extends it to read and clear the marks its hosts keep, and a Ray
host replays into it the restarts of its earlier processes (see ``_ray_restarts``).
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Supervision"]


@dataclass(slots=True)
class _Owner:
    owner: str = ""
    restarts: deque[float] = field(default_factory=deque)
    total_restarts: int = 0
    crashes: int = 0
    last_error: str | None = None
    degraded: bool = False


class Supervision:
    """Restart budget and degraded owners, shared by a system's supervisors (thread-safe).

    A child that crashes asks :meth:`child_failed` whether to restart. More than
    ``max_restarts`` restarts of one child within ``window_s`` marks its owner degraded (an
    infinite window counts every restart since the start).
    """

    def __init__(self, *, max_restarts: int, window_s: float, clock: Callable[[], float]) -> None:
        self.max_restarts = max_restarts
        self.window_s = window_s
        self._clock = clock
        self._lock = threading.Lock()
        self._children: dict[tuple[str, str], _Owner] = {}
        self._degraded: dict[str, str] = {}  # owner -> reason

    def child_failed(
        self, kind: str, key: str, owner: str, error: BaseException, *, ago: float = 0.0
    ) -> bool:
        """Record a crash of child ``(kind, key)``; True to restart it, False when now degraded.
        ``ago``: how long before now it crashed (a crash recorded late, as a Ray host's restarts
        replayed from its log are; recorded in the order they happened)."""
        now = self._clock() - ago
        with self._lock:
            state = self._children.setdefault((kind, key), _Owner(owner))
            state.crashes += 1
            state.last_error = f"{type(error).__name__}: {error}"
            while state.restarts and now - state.restarts[0] > self.window_s:
                state.restarts.popleft()
            if len(state.restarts) >= self.max_restarts:
                state.degraded = True
                within = f"within {self.window_s:g} s" if math.isfinite(self.window_s) else "since it started"
                self._degraded[owner] = (
                    f"{kind} actor crashed {len(state.restarts) + 1} times {within} "
                    f"(last: {state.last_error})"
                )
                return False
            state.restarts.append(now)
            state.total_restarts += 1
            return True

    def degraded_reason(self, owner: str) -> str | None:
        with self._lock:
            return self._degraded.get(owner)

    def degraded(self) -> dict[str, str]:
        with self._lock:
            return dict(self._degraded)

    def revive(self, owner: str) -> bool:
        """Clear ``owner``'s degraded mark and restart budgets; True if it was degraded."""
        with self._lock:
            was = self._degraded.pop(owner, None) is not None
            for state in self._children.values():
                if state.owner != owner:
                    continue
                state.restarts.clear()
                state.degraded = False
            return was

    def restarts(self) -> dict[str, int]:
        with self._lock:
            return {f"{k}:{key}": s.total_restarts for (k, key), s in self._children.items() if s.crashes}
