"""The write-back outbox: a task's outcome is committed here before the caller is answered.

``outbox/{agent}.sqlite`` holds one row per ``TaskCompleted``/``TaskFailed`` until both of its
parts (the knowledge entry and the episode) are stored; then the row is deleted. Rows left over by
a crash are replayed when the agent's actor starts again. Text is kept as UTF-8 bytes with
surrogates passed through, so any Python string survives the round trip unchanged.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from pathlib import Path

from memstrata.storage import apply_migrations, open_database

__all__ = ["Outbox", "OutboxRow"]

_MIGRATIONS = [
    """
    CREATE TABLE outbox (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        kind TEXT NOT NULL CHECK (kind IN ('completed', 'failed')),
        task_id TEXT NOT NULL,
        text BLOB NOT NULL,
        at TEXT NOT NULL,
        knowledge_done INTEGER NOT NULL DEFAULT 0,
        episode_done INTEGER NOT NULL DEFAULT 0,
        attempts INTEGER NOT NULL DEFAULT 0,
        dead INTEGER NOT NULL DEFAULT 0,
        last_error TEXT
    )
    """
]

PARTS = ("knowledge", "episode")


@dataclass(frozen=True, slots=True)
class OutboxRow:
    id: int
    kind: str  # "completed" | "failed"
    task_id: str
    text: str
    at: _dt.datetime
    knowledge_done: bool
    episode_done: bool
    attempts: int

    def pending_parts(self) -> list[str]:
        return [
            p for p, done in zip(PARTS, (self.knowledge_done, self.episode_done), strict=True) if not done
        ]


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


class Outbox:
    """One agent's outbox (thread-confined, like every layer)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.db = open_database(path, load_vec=False)
        try:
            apply_migrations(self.db, "outbox", _MIGRATIONS)
        except BaseException:
            self.db.close()
            raise

    def append(self, kind: str, task_id: str, text: str, at: _dt.datetime) -> int:
        """Commit a new row and return its id: from here on the write-back survives a crash."""
        with self.db.transaction():
            cursor = self.db.execute(
                "INSERT INTO outbox(kind, task_id, text, at) VALUES (?, ?, ?, ?)",
                (kind, task_id, _encode(text), at.isoformat()),
            )
            return int(cursor.lastrowid)

    def _row(self, values: tuple[object, ...]) -> OutboxRow:
        rid, kind, task_id, text, at, k_done, e_done, attempts = values
        return OutboxRow(
            int(rid),  # type: ignore[call-overload]
            str(kind),
            str(task_id),
            bytes(text).decode("utf-8", "surrogatepass"),  # type: ignore[call-overload]
            _dt.datetime.fromisoformat(str(at)),
            bool(k_done),
            bool(e_done),
            int(attempts),  # type: ignore[call-overload]
        )

    _COLUMNS = "id, kind, task_id, text, at, knowledge_done, episode_done, attempts"

    def get(self, row_id: int) -> OutboxRow | None:
        rows = self.db.query(f"SELECT {self._COLUMNS} FROM outbox WHERE id = ?", (row_id,))
        return self._row(tuple(rows[0])) if rows else None

    def pending(self) -> list[OutboxRow]:
        """Rows still to process (not dead letters), oldest first."""
        rows = self.db.query(f"SELECT {self._COLUMNS} FROM outbox WHERE dead = 0 ORDER BY id")
        return [self._row(tuple(r)) for r in rows]

    def mark_done(self, row_id: int, part: str) -> bool:
        """Record that ``part`` is stored; deletes the row (and returns True) once both are."""
        column = {"knowledge": "knowledge_done", "episode": "episode_done"}[part]
        with self.db.transaction():
            self.db.execute(f"UPDATE outbox SET {column} = 1 WHERE id = ?", (row_id,))
            cursor = self.db.execute(
                "DELETE FROM outbox WHERE id = ? AND knowledge_done = 1 AND episode_done = 1", (row_id,)
            )
            return int(cursor.rowcount) > 0

    def record_failure(self, row_id: int, error: str, *, dead: bool = False) -> None:
        """Count a failed attempt; ``dead`` parks the row (it is kept, reported, never retried)."""
        with self.db.transaction():
            self.db.execute(
                "UPDATE outbox SET attempts = attempts + 1, last_error = ?, dead = MAX(dead, ?) WHERE id = ?",
                (error[:2000], int(dead), row_id),
            )

    def counts(self) -> dict[str, int]:
        pending = int(self.db.scalar("SELECT count(*) FROM outbox WHERE dead = 0") or 0)
        dead = int(self.db.scalar("SELECT count(*) FROM outbox WHERE dead = 1") or 0)
        return {"pending": pending, "dead": dead}

    def close(self) -> None:
        self.db.close()


def has_pending(path: Path) -> bool:
    """Whether the outbox at ``path`` holds unprocessed rows (cheap; used at system start)."""
    if not path.is_file():
        return False
    db = open_database(path, load_vec=False)
    try:
        exists = db.scalar("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'outbox'")
        return bool(exists) and bool(db.scalar("SELECT 1 FROM outbox WHERE dead = 0 LIMIT 1"))
    finally:
        db.close()
