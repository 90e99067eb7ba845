"""Planning a sync: which files changed since the last one, by comparing a walk of the root
with the ``files`` table (nothing is read or hashed here).

A file whose ``(size, mtime_ns, mode)`` and chunker signature match its row costs nothing more,
whether it was indexed or skipped (a skipped file is read again once either changes). A
file read within :data:`RACY_NS` of its modification is planned again on the next sync, since a
second write in the same timestamp tick would not change its mtime.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from memstrata.storage import Database

from ._paths import Entry, Scan, SourceRules, scan

__all__ = ["RACY_NS", "Plan", "SyncResult", "known_files", "plan_sync"]

RACY_NS = 2_000_000_000


@dataclass(frozen=True, slots=True)
class _Known:
    size: int
    mtime_ns: int
    mode: int
    sha256: bytes | None
    skipped: str | None
    signature: str
    checked_ns: int
    chunks: int


@dataclass(slots=True)
class Plan:
    """What a sync has to do, from a walk compared with the ``files`` table (nothing read)."""

    scan: Scan
    todo: list[Entry]
    deleted: list[str]
    unchanged: int
    skipped_known: list[tuple[str, str]]
    known: dict[str, _Known]

    @property
    def dirty(self) -> bool:
        return bool(self.todo or self.deleted)


@dataclass(slots=True)
class SyncResult:
    files_processed: int = 0
    files_unchanged: int = 0
    files_deleted: int = 0
    chunks_indexed: int = 0
    chunks_deleted: int = 0
    chunks_purged: int = 0
    chunks_embedded: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)
    complete: bool = True
    seconds: float = 0.0


def known_files(db: Database) -> dict[str, _Known]:
    """What the ``files`` table holds, by path."""
    rows = db.query(
        "SELECT path, size, mtime_ns, mode, sha256, skipped, signature, checked_ns, chunks FROM files"
    )
    return {
        r[0]: _Known(r[1], r[2], r[3], None if r[4] is None else bytes(r[4]), r[5], r[6], r[7], r[8])
        for r in rows
    }


def plan_sync(db: Database, root: Path, rules: SourceRules, signature: str) -> Plan:
    """The files under ``root`` to (re)index and the indexed ones that are gone."""
    found = scan(root, rules)
    known = known_files(db)
    todo: list[Entry] = []
    skipped_known: list[tuple[str, str]] = []
    unchanged = 0
    for rel, entry in found.files.items():
        row = known.get(rel)
        if (
            row is None
            or (row.size, row.mtime_ns, row.mode) != (entry.size, entry.mtime_ns, entry.mode)
            or row.checked_ns - row.mtime_ns < RACY_NS
            or row.signature != signature  # a new chunker tries the files the old one skipped too
        ):
            todo.append(entry)
        elif row.skipped is not None:
            skipped_known.append((rel, row.skipped))
        else:
            unchanged += 1
    deleted = [rel for rel in known if rel not in found.files]
    return Plan(found, todo, deleted, unchanged, skipped_known, known)
