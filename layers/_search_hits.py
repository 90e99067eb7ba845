"""The list a search returns, with what a caller must know of how its hits were found: a file
index's hits (``FileHits``) and the registry's hits across roots alike. It imports nothing, so
naming it loads no index."""

from __future__ import annotations

from typing import Any, TypeVar

__all__ = ["SearchHits"]

Hit = TypeVar("Hit")


class SearchHits(list[Hit]):
    """Hits best first, with what a caller must know of how they were found: ``complete`` False
    when files may be left unindexed, ``warnings`` naming what was skipped, ``degraded`` saying
    in one line why the ranking is not the hybrid one asked for (else ``None``)."""

    def __init__(
        self, hits: Any = (), *, complete: bool = True, warnings: Any = (), degraded: str | None = None
    ) -> None:
        super().__init__(hits)
        self.complete = complete
        self.warnings: list[str] = list(warnings)
        self.degraded = degraded
