"""The file index's tables: ``files`` (one row per source file, with what a sync compares),
``chunks`` (their text and keyword words) and the full-text indexes over ``chunks``.

Kept apart so that planning, writing and searching read one definition of the layout.
"""

from __future__ import annotations

import re

from memstrata.storage import fts_schema, identifier_words

__all__ = ["COLUMNS", "COLUMN_WEIGHTS", "MIGRATIONS", "TABLE", "path_words"]

TABLE = "chunks"
COLUMNS = ["text", "words"]
# the split identifiers, defined names and path words count as much as the text itself: keyword
# MRR@10 +0.01 to +0.04 on code in four languages against 0.5 (docs/performance.md)
COLUMN_WEIGHTS = [1.0, 1.0]

_SCHEMA = """
CREATE TABLE files (
    path TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    mode INTEGER NOT NULL,
    sha256 BLOB,
    skipped TEXT,
    language TEXT NOT NULL DEFAULT '',
    signature TEXT NOT NULL DEFAULT '',
    chunks INTEGER NOT NULL DEFAULT 0,
    checked_ns INTEGER NOT NULL,
    indexed_at REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE chunks (
    id INTEGER PRIMARY KEY,
    path TEXT NOT NULL,
    start_line INTEGER NOT NULL,
    end_line INTEGER NOT NULL,
    language TEXT NOT NULL,
    hash BLOB NOT NULL,
    text TEXT NOT NULL,
    words TEXT NOT NULL
);
CREATE INDEX chunks_by_path ON chunks(path, start_line);
CREATE INDEX chunks_by_language ON chunks(language);
CREATE INDEX chunks_by_hash ON chunks(hash);
""" + fts_schema(TABLE, COLUMNS)

MIGRATIONS: list[str] = [_SCHEMA]


def path_words(rel: str) -> str:
    """Words of a path (``src/authHandler.py`` -> ``src auth handler authhandler py``) for keywords."""
    pieces = [p for p in re.split(r"[^0-9A-Za-z]+", rel) if p]
    extra = identifier_words(" ".join(pieces)).split()
    return " ".join(dict.fromkeys([p.lower() for p in pieces] + extra))
