"""The watchdog of the embedding service's futures: fail them when the model gets stuck.

Nobody waits on :meth:`~._embedding.BatchingEmbedder.submit_documents`' futures with a timeout, so
a background thread checks them at their due time; apart from the batching, which hands them here.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from concurrent.futures import Future

from memstrata.core.errors import EmbeddingError, ModelFaultError
from memstrata.storage import FloatArray

from ._embedding_health import ModelHealth, _fail

__all__ = ["FutureWatchdog"]


class FutureWatchdog(ModelHealth):
    """Futures by due time, failed by one thread when a stuck model leaves them unanswered."""

    _watched: list[tuple[float, int, Future[FloatArray]]]
    _watch_seq: itertools.count[int]
    _watch_cond: threading.Condition
    _watch_thread: threading.Thread | None
    _watch_stop: bool

    def _watch(self, future: Future[FloatArray], texts: int) -> None:
        """Fail ``future`` if the model gets stuck before answering it (checked once ``texts``
        texts' bound has passed: a backlog the model works through is waited for)."""
        with self._watch_cond:
            if self._watch_stop:  # closed meanwhile: nothing would answer it
                _fail(future, EmbeddingError("the embedding service is closed"))
                return
            due = time.monotonic() + self._bound(texts)
            heapq.heappush(self._watched, (due, next(self._watch_seq), future))
            if self._watch_thread is None:
                self._watch_thread = threading.Thread(
                    target=self._run_watch, name="memstrata-embedder-watch", daemon=True
                )
                self._watch_thread.start()
            elif self._watched[0][2] is future:  # due before the others: wake the watchdog sooner
                self._watch_cond.notify()

    def _run_watch(self) -> None:
        """The watchdog of :meth:`submit_documents`' futures (nobody waits on them with a
        timeout): at a future's due time, a stuck model fails every future still waiting; a
        model that is only busy is checked again when its running call would become stuck."""
        while True:
            with self._watch_cond:
                while True:
                    while self._watched and self._watched[0][2].done():
                        heapq.heappop(self._watched)
                    if self._watch_stop:
                        return
                    now = time.monotonic()
                    if self._watched and self._watched[0][0] <= now:
                        break
                    self._watch_cond.wait(None if not self._watched else self._watched[0][0] - now)
                with self._lock:
                    stuck = self._stuck_call("documents")
                    running = [c.started + c.bound for c in self._calls.values() if not c.abandoned]
                if stuck is None:  # busy, not stuck: look again when the running call's bound ends
                    _, seq, future = heapq.heappop(self._watched)
                    again = min(running) if running else now + self._bound(1)
                    heapq.heappush(self._watched, (max(again, now + 0.01), seq, future))
                    continue
                waiting, self._watched = self._watched, []
            error = ModelFaultError(self._stuck_text(stuck))
            for _, _, future in waiting:
                _fail(future, error)
