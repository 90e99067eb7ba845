"""A larger SQLite page cache while many rows are written or deleted at once (vec0 chunks, FTS5 merges)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ._connection import Database

__all__ = ["bulk_cache"]

_BULK_DELETE = 64  # from this many vec0 deletes, sort them by chunk and raise the page cache
_BULK_CACHE_KIB = 65_536
_BULK_WAL_PAGES = 16_384  # checkpoint the WAL from 64 MB during bulk writes (default 4 MB)


@contextlib.contextmanager
def bulk_cache(db: Database, rows: int) -> Iterator[None]:
    """A larger page cache while ``rows`` (from 64) are written or deleted, then the old size.

    vec0 writes a row into a 1.5 MB chunk blob by walking its overflow pages, and FTS5 merges
    segments page by page: with SQLite's default 2 MB cache both re-read the same pages from
    the file for every row (a 100k-row load ran 3-5x slower). The pages beyond the old size are
    released when it is restored.
    """
    if rows < _BULK_DELETE or db.read_only:
        yield
        return
    previous = int(db.scalar("PRAGMA cache_size"))
    if previous < 0 and -previous >= _BULK_CACHE_KIB:
        yield
        return
    checkpoint = int(db.scalar("PRAGMA wal_autocheckpoint"))
    db.execute(f"PRAGMA cache_size = -{_BULK_CACHE_KIB}")
    if _BULK_WAL_PAGES and 0 < checkpoint < _BULK_WAL_PAGES:
        db.execute(f"PRAGMA wal_autocheckpoint = {_BULK_WAL_PAGES}")
    try:
        yield
    finally:
        db.execute(f"PRAGMA cache_size = {previous}")
        db.execute(f"PRAGMA wal_autocheckpoint = {checkpoint}")
