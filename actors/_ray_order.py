"""Each sender's order kept in a Ray host: its messages reach the mailboxes in the order sent.

Ray may run a host's concurrent calls in any order, so a sender numbers its messages to a host
(``RayRuntime.post``) and the host puts message ``seq`` into its actor's mailbox only after that
sender's message ``seq - 1``.
"""

from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import Future
from typing import Any

__all__ = ["SenderOrder"]

# A predecessor that was submitted arrives (a busy machine can delay it by seconds); this bound
# only keeps a host from waiting forever on one that never will.
_ORDER_WAIT_S = 60.0


class SenderOrder:
    """The order half of a Ray host (mixed into it): each caller's messages in the caller's order."""

    runtime: Any

    def _order_init(self, restarted: bool) -> None:
        """``restarted``: this host was restarted by Ray and does not know how far each caller had
        counted, so it takes the number of the first message it gets from a caller as that
        caller's start."""
        self._turn: asyncio.Condition | None = None  # made in the actor's event loop
        self._next: dict[str, int] = {}  # caller -> the number of its next message
        self._restarted = restarted

    async def _enqueue(self, kind: str, key: str, message: Any, caller: str, seq: int) -> Future[Any]:
        """Put ``message`` in its actor's mailbox once the caller's message ``seq - 1`` is there."""
        if self._turn is None:
            self._turn = asyncio.Condition()
        turn = self._turn
        async with turn:
            if seq > self._next.setdefault(caller, seq if self._restarted else 0):  # one is on its way
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        turn.wait_for(lambda: self._next[caller] >= seq), timeout=_ORDER_WAIT_S
                    )
            try:
                future: Future[Any] = self.runtime.request(kind, key, message)
                return future
            finally:
                self._next[caller] = max(self._next[caller], seq + 1)
                turn.notify_all()
