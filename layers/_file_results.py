"""What file index searches and syncs return: :class:`FileHit`, :class:`FileHits` (a
:class:`SearchHits` list, as the registry's hits across roots are) and :class:`SyncStats`.

Plain frozen records, apart from the index classes so callers can name them without the index.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ._search_hits import SearchHits
from ._sync_plan import SyncResult

__all__ = ["FileHit", "FileHits", "SyncStats"]


@dataclass(frozen=True, slots=True)
class FileHit:
    """One search result: a chunk of a file, its 1-based inclusive line range and a snippet."""

    path: str  # relative to the root, with "/" separators
    start_line: int
    end_line: int
    score: float  # fused rank score, 0..1
    snippet: str  # at most ``search.snippet_chars`` characters, centred on the query's terms
    match_type: str  # "semantic", "keyword" or "hybrid"
    language: str | None = None
    similarity: float | None = None  # cosine similarity with the query, when known

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class FileHits(SearchHits[FileHit]):
    """One index's search hits. ``complete`` is False when files may be left unindexed: the sync
    before the search ran out of its budget (``files.lazy_sync_wait_s``), another sync was still
    running, or, with no sync before searches (a budget of 0), changes are known to be pending;
    ``warnings`` names what was skipped (e.g. a missing root). ``degraded`` says in one line why
    the hits were ranked by keywords only although a hybrid search was asked for (the query
    embedding failed), else ``None``: a keyword-only index or a keyword search is not degraded."""


@dataclass(frozen=True, slots=True)
class SyncStats:
    """What a sync did. ``skipped`` lists ``(path, reason)`` for source files not indexed."""

    files_processed: int = 0  # files whose chunks were (re)built
    files_unchanged: int = 0
    files_deleted: int = 0
    chunks_indexed: int = 0
    chunks_deleted: int = 0  # chunks of changed, deleted or now-skipped files
    chunks_purged: int = 0  # chunks rebuilt because the chunker or the model changed
    files_skipped: int = 0
    skipped: tuple[tuple[str, str], ...] = ()
    chunks_embedded: int = 0  # texts sent to the model (the rest came from the cache)
    complete: bool = True  # False when a bounded (lazy) sync left work for the next one
    seconds: float = 0.0

    @classmethod
    def _from(cls, result: SyncResult) -> SyncStats:
        return cls(
            files_processed=result.files_processed,
            files_unchanged=result.files_unchanged,
            files_deleted=result.files_deleted,
            chunks_indexed=result.chunks_indexed,
            chunks_deleted=result.chunks_deleted,
            chunks_purged=result.chunks_purged,
            files_skipped=len(result.skipped),
            skipped=tuple(result.skipped),
            chunks_embedded=result.chunks_embedded,
            complete=result.complete,
            seconds=result.seconds,
        )

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["skipped"] = [list(s) for s in self.skipped]
        return data
