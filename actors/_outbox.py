"""The write-back outbox: a task's outcome is committed here before the caller is answered.

``outbox/{agent}.sqlite`` holds one row per ``TaskCompleted``/``TaskFailed`` until both of its
parts (the knowledge entry and the episode) are stored; then the row is deleted. Rows left over by
a crash are replayed when the agent's actor starts again. Text is kept as UTF-8 bytes with
surrogates passed through, so any Python string survives the round trip unchanged.

It also remembers the agent's latest outcomes (task, kind and a hash of the text), in the
transaction that appends them, so that an outcome sent again (a retry of a call whose answer was
lost) is known as one however long ago, and across how many restarts, the first one came, until
the task is begun again or its outcome is no longer among the latest :data:`RECENT_OUTCOMES`.

Several processes may run the same agent on one data dir, so each row records its *owner*: the
running system that appended it (process id, process start time and a random token). A process
processes only its own rows, and claims (atomically, under the write lock) the rows of owners that
are no longer running; a row is never worked on by two live processes at once, so a replay cannot
record an episode twice.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

from memstrata.storage import Database, Migration, NamedMigration, apply_migrations, open_database

__all__ = ["RECENT_OUTCOMES", "Outbox", "OutboxRow", "new_owner", "pending_count", "release_owner"]

RECENT_OUTCOMES = 1024  # outcomes remembered to tell a retry from a new one (a few per task)
_TRIM_EVERY = 64  # outcomes past the limit before the oldest are dropped (one statement then)

_MIGRATIONS: list[Migration] = [
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
    """,
    # the running system that works on the row (NULL: anyone may claim it)
    "ALTER TABLE outbox ADD COLUMN owner TEXT",
    # rows parked as dead letters because the model returned an unusable vector (blamed on the
    # input by older versions) are delivered again: a model fault never parks a write-back
    "UPDATE outbox SET dead = 0, attempts = 0, owner = NULL WHERE dead = 1 AND ({model_fault})",
]

PARTS = ("knowledge", "episode")
# how the last_error of a row parked because of the model reads (see the third migration)
_MODEL_FAULT_SQL = " OR ".join(
    f"last_error LIKE '%{pattern}%'"
    for pattern in ("zero vector", "NaN or infinit", "EmbeddingError", "ModelFaultError", "returned shape")
)
_MIGRATIONS[-1] = str(_MIGRATIONS[-1]).replace("{model_fault}", _MODEL_FAULT_SQL)


def _digest(text: str) -> bytes:
    return hashlib.sha256(_encode(text)).digest()


_Key = tuple[str, str, bytes]  # an outcome as remembered: task id, kind, digest of its text


class _RecentOutcomes:
    """The latest :data:`RECENT_OUTCOMES` outcomes, read from the database once and then kept
    in memory beside it, so that appending a row costs its acknowledgement one more statement
    (under load each statement waits for the interpreter lock again) and no read."""

    def __init__(self, db: Database) -> None:
        rows = db.query("SELECT task_id, kind, digest, seq FROM recent_outcomes")
        self.seqs: dict[_Key, int] = {(str(t), str(k), bytes(d)): int(n) for t, k, d, n in rows}
        self.last = max(self.seqs.values(), default=0)

    def plan(self, rows: list[tuple[str, str, str]]) -> tuple[list[bool], list[tuple[_Key, int]]]:
        """For the outcomes ``(kind, task_id, text)``, in order: whether each repeats one
        remembered (an earlier one of ``rows`` too), and each one's key and new sequence number."""
        numbered: list[tuple[_Key, int]] = []
        batch: dict[_Key, int] = {}
        repeats = []
        for n, (kind, task_id, text) in enumerate(rows, 1):
            key, seq = (task_id, kind, _digest(text)), self.last + n
            held = batch.get(key, self.seqs.get(key))
            repeats.append(held is not None and held > self.last - RECENT_OUTCOMES)  # among the latest
            batch[key] = seq
            numbered.append((key, seq))
        return repeats, numbered

    def write(self, db: Database, numbered: list[tuple[_Key, int]]) -> int | None:
        """Store ``numbered`` in the current transaction; the sequence number up to which older
        outcomes were dropped (done every :data:`_TRIM_EVERY` past the limit), if any."""
        db.executemany(
            "INSERT INTO recent_outcomes(task_id, kind, digest, seq) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(task_id, kind, digest) DO UPDATE SET seq = excluded.seq",
            [(*key, seq) for key, seq in numbered],
        )
        last = numbered[-1][1] if numbered else self.last
        if len(self.seqs) + len(numbered) <= RECENT_OUTCOMES + _TRIM_EVERY:
            return None
        db.execute("DELETE FROM recent_outcomes WHERE seq <= ?", (last - RECENT_OUTCOMES,))
        return last - RECENT_OUTCOMES

    def committed(self, numbered: list[tuple[_Key, int]], cut: int | None) -> None:
        """What :meth:`write` stored is committed: the memory follows."""
        self.seqs.update(numbered)
        if numbered:  # numbered on from ``last``, in order
            self.last = numbered[-1][1]
        if cut is not None:
            self.seqs = {key: seq for key, seq in self.seqs.items() if seq > cut}

    def of_task(self, task_id: str) -> list[_Key]:
        return [key for key in self.seqs if key[0] == task_id]


def _recent_outcomes(db: Database) -> None:
    """The latest outcomes, remembered across restarts (those of the rows an older version
    left among them). Idempotent: an older version's schema number may be set back."""
    db.execute(
        "CREATE TABLE IF NOT EXISTS recent_outcomes (task_id TEXT NOT NULL, kind TEXT NOT NULL, "
        "digest BLOB NOT NULL, seq INTEGER NOT NULL, PRIMARY KEY (task_id, kind, digest)) WITHOUT ROWID"
    )
    db.execute("CREATE INDEX IF NOT EXISTS recent_outcomes_seq ON recent_outcomes(seq)")
    rows = db.query("SELECT kind, task_id, text FROM outbox ORDER BY id")
    recent = _RecentOutcomes(db)
    _, numbered = recent.plan(
        [(str(k), str(t), bytes(x).decode("utf-8", "surrogatepass")) for k, t, x in rows]
    )
    recent.write(db, numbered)


_MIGRATIONS.append(NamedMigration("recent-outcomes", _recent_outcomes))


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


# -- owners: which running system works on a row ---------------------------------------------------

_LIVE_OWNERS: set[str] = set()  # owners of this process whose system is running
_OWNERS_LOCK = threading.Lock()


def _start_time(pid: int) -> str | None:
    """When process ``pid`` started (Linux clock ticks since boot), ``None`` if unknown or a zombie.

    Together with the pid it names one process: a pid reused by a later process has another
    start time.
    """
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            fields = handle.read().rpartition(")")[2].split()
    except OSError:
        return None
    if not fields or fields[0] in ("Z", "X"):  # killed, not yet reaped: it will never run again
        return None
    return fields[19] if len(fields) > 19 else None


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return "-"


def new_owner() -> str:
    """A fresh owner name for a system starting in this process (live until :func:`release_owner`)."""
    pid = os.getpid()
    owner = f"{pid}:{_start_time(pid) or '-'}:{_boot_id()}:{uuid.uuid4().hex}"
    with _OWNERS_LOCK:
        _LIVE_OWNERS.add(owner)
    return owner


def release_owner(owner: str) -> None:
    """The system stopped: rows it left become claimable by the next system that starts."""
    with _OWNERS_LOCK:
        _LIVE_OWNERS.discard(owner)


def owner_alive(owner: str) -> bool:
    """Whether the system named ``owner`` may still be running (when unsure: yes)."""
    with _OWNERS_LOCK:
        if owner in _LIVE_OWNERS:
            return True
    try:
        pid_text, started, boot, _ = owner.split(":", 3)
        pid = int(pid_text)
    except ValueError:
        return False  # not a name this module writes
    if pid == os.getpid() or boot != _boot_id():
        return False  # a stopped system of this process, or a process from before a reboot
    if started == "-":  # no /proc here: fall back to asking whether the pid exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except OSError:
            return True
        return True
    return _start_time(pid) == started


class Outbox:
    """One agent's outbox (thread-confined, like every layer)."""

    def __init__(self, path: Path, owner: str | None = None) -> None:
        """``owner``: the running system's name (:func:`new_owner`); ``None`` works on every row."""
        self.path = path
        self.owner = owner
        self._repeats: set[int] = set()  # rows appended here that repeat a remembered outcome
        self.db = open_database(path, load_vec=False)
        try:
            apply_migrations(self.db, "outbox", _MIGRATIONS)
            self._recent = _RecentOutcomes(self.db)
        except BaseException:
            self.db.close()
            raise

    def append(self, kind: str, task_id: str, text: str, at: _dt.datetime) -> int:
        """Commit a new row and return its id: from here on the write-back survives a crash."""
        return self._append([(kind, task_id, text, at)])[0]

    def append_many(self, rows: list[tuple[str, str, str, _dt.datetime]]) -> list[int]:
        """Commit several rows ``(kind, task_id, text, at)`` in one transaction (group commit);
        their ids, in order. Durable together when this returns."""
        if not rows:
            return []
        return self._append(rows)

    def _append(self, rows: list[tuple[str, str, str, _dt.datetime]]) -> list[int]:
        """Insert the rows and remember their outcomes in one transaction; their ids."""
        repeated, numbered = self._recent.plan([(kind, task_id, text) for kind, task_id, text, _ in rows])
        ids: list[int] = []
        with self.db.transaction():
            for kind, task_id, text, at in rows:
                cursor = self.db.execute(
                    "INSERT INTO outbox(kind, task_id, text, at, owner) VALUES (?, ?, ?, ?, ?)",
                    (kind, task_id, _encode(text), at.isoformat(), self.owner),
                )
                ids.append(int(cursor.lastrowid))
            cut = self._recent.write(self.db, numbered)
        self._recent.committed(numbered, cut)
        self._repeats.update(row_id for row_id, repeat in zip(ids, repeated, strict=True) if repeat)
        return ids

    def take_repeats(self, row_ids: list[int]) -> set[int]:
        """Which of the rows ``row_ids``, just appended here, repeat an outcome appended before
        (the same task, kind and text among the latest :data:`RECENT_OUTCOMES`, the task not
        begun again since): a retry of a call whose answer was lost, which adds nothing new.
        Answered once per row, from memory: nothing is read after the commit."""
        found = self._repeats.intersection(row_ids)
        self._repeats.difference_update(found)
        return found

    def forget_task(self, task_id: str) -> bool:
        """A new run of ``task_id`` begins: its outcomes so far no longer make a later one a
        retry. Whether any was remembered (only then is anything written)."""
        known = self._recent.of_task(task_id)
        if not known:
            return False
        with self.db.transaction():
            self.db.execute("DELETE FROM recent_outcomes WHERE task_id = ?", (task_id,))
        for key in known:
            del self._recent.seqs[key]
        return True

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

    def claim(self) -> int:
        """Take over the rows of systems that stopped or died; returns how many were taken."""
        if self.owner is None:
            return 0
        owners = [r[0] for r in self.db.query("SELECT DISTINCT owner FROM outbox WHERE dead = 0")]
        gone = [o for o in owners if o != self.owner and (o is None or not owner_alive(str(o)))]
        if not gone:
            return 0
        taken = 0
        with self.db.transaction():  # under the write lock: two claimants cannot both take a row
            for owner in gone:
                cursor = self.db.execute(
                    "UPDATE outbox SET owner = ? WHERE dead = 0 AND owner IS ?", (self.owner, owner)
                )
                taken += int(cursor.rowcount)
        return taken

    def pending(self) -> list[OutboxRow]:
        """Rows still to process (not dead letters) that this system owns, after claiming the rows
        of systems no longer running; oldest first."""
        if self.owner is None:
            rows = self.db.query(f"SELECT {self._COLUMNS} FROM outbox WHERE dead = 0 ORDER BY id")
        else:
            self.claim()
            rows = self.db.query(
                f"SELECT {self._COLUMNS} FROM outbox WHERE dead = 0 AND owner = ? ORDER BY id", (self.owner,)
            )
        return [self._row(tuple(r)) for r in rows]

    def mark_done_many(self, parts: list[tuple[int, str]]) -> list[int]:
        """Record that each ``(row_id, part)`` is stored, in one transaction; a row whose two parts
        are stored is deleted. Returns the ids of the rows deleted."""
        if not parts:
            return []
        by_column: dict[str, list[int]] = {}
        for row_id, part in parts:
            column = {"knowledge": "knowledge_done", "episode": "episode_done"}[part]
            by_column.setdefault(column, []).append(row_id)
        ids = sorted({row_id for row_id, _ in parts})
        deleted: list[int] = []
        with self.db.transaction():
            for column, rows in by_column.items():
                self.db.executemany(f"UPDATE outbox SET {column} = 1 WHERE id = ?", [(r,) for r in rows])
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                marks = ",".join("?" * len(chunk))
                complete = f"id IN ({marks}) AND knowledge_done = 1 AND episode_done = 1"
                done = [int(r[0]) for r in self.db.query(f"SELECT id FROM outbox WHERE {complete}", chunk)]
                if done:
                    marks = ",".join("?" * len(done))
                    self.db.execute(f"DELETE FROM outbox WHERE id IN ({marks})", done)
                    deleted += done
        return deleted

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
    """Whether the outbox at ``path`` holds unprocessed rows (cheap; used at system start), counting
    rows an older version parked because of a model fault (opening the outbox revives them)."""
    if not path.is_file():
        return False
    db = open_database(path, load_vec=False)
    try:
        exists = db.scalar("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'outbox'")
        return bool(exists) and bool(
            db.scalar(f"SELECT 1 FROM outbox WHERE dead = 0 OR ({_MODEL_FAULT_SQL}) LIMIT 1")
        )
    finally:
        db.close()


def pending_count(path: Path) -> int:
    """Rows of the outbox at ``path`` still to be delivered (dead letters not counted)."""
    if not path.is_file():
        return 0
    db = open_database(path, load_vec=False)
    try:
        exists = db.scalar("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'outbox'")
        return int(db.scalar("SELECT count(*) FROM outbox WHERE dead = 0") or 0) if exists else 0
    finally:
        db.close()
