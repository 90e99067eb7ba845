"""When long work reports its progress: every few files, and whenever a pause has gone by.

The command line prints each report as a line on stderr; the JSON-RPC server pushes it to the
client that asked (``index`` with ``progress``). The same files give the same reports, so a
test sees the same lines each run; a slow file still shows, after a pause, that work goes on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["PROGRESS_SECONDS", "Progress"]

PROGRESS_SECONDS = 2.0
"""At most this long between two reports while work goes on (when the work reports)."""


class Progress:
    """A sync's ``progress(done, total, path)`` passed on to ``report`` every ``every`` files, on
    the last one, and when ``seconds`` passed since the last report (the only way a call with
    the count of the last report passes: the sync repeats it while one file is embedded)."""

    def __init__(
        self,
        report: Callable[[int, int, str], None],
        *,
        every: int = 100,
        seconds: float = PROGRESS_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._report = report
        self._every = max(1, every)
        self._seconds = seconds
        self._clock = clock
        self._last = clock()
        self._done = -1  # the count of the last report
        self.reports = 0

    def __call__(self, done: int, total: int, path: str = "", *args: Any, **kwargs: Any) -> None:
        now = self._clock()
        counted = done != self._done and (done % self._every == 0 or done == total)
        if not counted and now - self._last < self._seconds:
            return
        self._last, self._done = now, done
        self.reports += 1
        self._report(done, total, path)
