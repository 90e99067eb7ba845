"""Blackboard state: one session's shared key-value board with key and prefix subscriptions.

Pure and synchronous: it stores values and works out *who* must be told about a change; its
actor delivers the notifications on a separate thread. Values are JSON data kept as orjson
bytes, so every reader and subscriber gets its own copy. ``snapshot``/``restore`` persist the
values (never the subscriptions) to a small SQLite file that several processes may share: a
snapshot writes only the keys this board changed, so it never drops another process's keys.
"""

from __future__ import annotations

import builtins
import datetime as _dt
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from memstrata.core.errors import InvalidInputError
from memstrata.core.validation import check_json_value, check_key, check_signal_key, check_signal_pattern
from memstrata.storage import Database, Migration, NamedMigration, apply_migrations, open_database

__all__ = ["BlackboardState", "SignalRecord"]

_SNAPSHOT_MIGRATIONS: list[Migration] = [
    "CREATE TABLE signals ("
    " key TEXT PRIMARY KEY,"
    " value BLOB NOT NULL,"
    " publisher_id TEXT,"
    " version INTEGER NOT NULL,"
    " updated_at TEXT NOT NULL)",
    # the last version of each deleted key, so a publish after a restart continues its count;
    # a Ray board's journal kept them in a table of its own, taken over here
    NamedMigration(
        "deleted-versions",
        "CREATE TABLE deleted (key TEXT PRIMARY KEY, version INTEGER NOT NULL);"
        "CREATE TABLE IF NOT EXISTS ray_deleted (key TEXT PRIMARY KEY, version INTEGER NOT NULL);"
        "INSERT INTO deleted(key, version) SELECT key, version FROM ray_deleted;"
        "DROP TABLE ray_deleted",
    ),
]


def _utcnow() -> _dt.datetime:
    return _dt.datetime.now(_dt.UTC)


@dataclass(frozen=True, slots=True)
class SignalRecord:
    """One key's current value (as JSON bytes) and who set it, when, at which version."""

    key: str
    data: bytes
    publisher_id: str | None
    version: int
    updated_at: _dt.datetime

    @property
    def value(self) -> Any:
        """A fresh copy of the value."""
        return orjson.loads(self.data)


class BlackboardState:
    """Values by key plus subscriptions to a key or to a prefix (a pattern ending in ``*``).

    ``max_value_bytes`` bounds one value's JSON, as it bounds a working-memory value: a value is
    copied for every subscriber and written to the snapshot.
    """

    def __init__(
        self, *, clock: Callable[[], _dt.datetime] = _utcnow, max_value_bytes: int | None = None
    ) -> None:
        self._clock = clock
        self._max_value_bytes = max_value_bytes
        self._values: dict[str, SignalRecord] = {}
        self._deleted: dict[str, int] = {}  # last version of deleted keys, so versions keep growing
        self._changed: set[str] = set()  # keys published or deleted since the last snapshot
        self._exact: dict[str, set[int]] = {}
        self._prefixes: dict[int, str] = {}
        self._patterns: dict[int, str] = {}
        self._ids = itertools.count(1)

    # -- values --------------------------------------------------------------------------------

    def publish(
        self, key: str, value: Any, publisher_id: str | None = None
    ) -> tuple[SignalRecord, builtins.list[int]]:
        """Set ``key``; returns the new record and the subscription ids to notify (in order)."""
        check_signal_key(key, "blackboard key")
        if publisher_id is not None:
            check_key(publisher_id, "blackboard publisher id")
        data = check_json_value(value, f"blackboard value for key {key!r}")
        if self._max_value_bytes is not None and len(data) > self._max_value_bytes:
            raise InvalidInputError(
                f"blackboard value for {key!r} is {len(data)} bytes, more than the limit of "
                f"{self._max_value_bytes}"
            )
        previous = self._values.get(key)
        last = previous.version if previous else self._deleted.pop(key, 0)
        record = SignalRecord(key, data, publisher_id, last + 1, self._clock())
        self._values[key] = record
        self._changed.add(key)
        return record, self.subscribers_of(key)

    def delete(self, key: str) -> tuple[SignalRecord | None, builtins.list[int]]:
        """Remove ``key``; returns the deletion as a record (value null, next version) and the
        subscription ids to tell, or ``(None, [])`` when the key was not set. A later publish
        continues the key's version count, so subscribers can order what they see."""
        check_key(key, "blackboard key")
        previous = self._values.pop(key, None)
        if previous is None:
            return None, []
        record = SignalRecord(key, b"null", None, previous.version + 1, self._clock())
        self._deleted[key] = record.version
        self._changed.add(key)
        return record, self.subscribers_of(key)

    def get(self, key: str) -> SignalRecord | None:
        check_key(key, "blackboard key")
        return self._values.get(key)

    def list(self, prefix: str | None = None) -> builtins.list[str]:
        """Keys, sorted; only those starting with ``prefix`` when it is given. A trailing ``*`` is
        read as a subscription reads it (``"agent:*"`` is ``"agent:"``, ``"*"`` every key): keys
        hold no ``*``, so the prefix means the same with or without it."""
        if prefix:
            start = self._prefix_of(prefix, "blackboard prefix")
            return sorted(k for k in self._values if k.startswith(prefix if start is None else start))
        return sorted(self._values)

    def records(self, keys: Iterable[str]) -> builtins.list[SignalRecord]:
        return [self._values[k] for k in keys if k in self._values]

    def __len__(self) -> int:
        return len(self._values)

    # -- subscriptions -------------------------------------------------------------------------

    def subscribe(self, pattern: str) -> tuple[int, builtins.list[SignalRecord]]:
        """Register a subscription; returns its id and the current matching records (sorted)."""
        prefix = self._prefix_of(pattern)
        sub_id = next(self._ids)
        self._patterns[sub_id] = pattern
        if prefix is None:
            self._exact.setdefault(pattern, set()).add(sub_id)
            current = [self._values[pattern]] if pattern in self._values else []
        else:
            self._prefixes[sub_id] = prefix
            current = self.records(self.list(prefix or None))
        return sub_id, current

    @staticmethod
    def _prefix_of(pattern: str, name: str = "blackboard subscription pattern") -> str | None:
        """``None`` for an exact key; the prefix (possibly ``""``) for ``prefix*``."""
        if pattern == "*":
            return ""
        check_signal_pattern(pattern, name)
        return pattern[:-1] if pattern.endswith("*") else None

    def unsubscribe(self, sub_id: int) -> bool:
        pattern = self._patterns.pop(sub_id, None)
        if pattern is None:
            return False
        if self._prefixes.pop(sub_id, None) is None:
            ids = self._exact.get(pattern)
            if ids is not None:
                ids.discard(sub_id)
                if not ids:
                    del self._exact[pattern]
        return True

    def subscribers_of(self, key: str) -> builtins.list[int]:
        """Subscription ids interested in ``key``, oldest subscription first."""
        ids = set(self._exact.get(key, ()))
        ids.update(s for s, prefix in self._prefixes.items() if key.startswith(prefix))
        return sorted(ids)

    def pattern_of(self, sub_id: int) -> str | None:
        return self._patterns.get(sub_id)

    @property
    def subscriber_count(self) -> int:
        return len(self._patterns)

    # -- persistence ---------------------------------------------------------------------------

    def snapshot(self, path: str | Path) -> int:
        """Save the keys published or deleted since the last snapshot to the snapshot at ``path``
        (one write transaction); returns how many values the snapshot then holds.

        Several processes may share the file, so only this board's changes are written: a key it
        did not change keeps what the file holds (another process's publish or delete). For a key
        the file holds at a higher version (another process changed it more often since this
        board loaded it), the file's state wins and this board's change is not written; at an
        equal or lower version this board's state (its value, or its deletion and version)
        replaces the file's. So a key's saved version never goes down, and of two changes with
        the same version the one saved last wins.
        """
        changed = sorted(self._changed)
        db = open_database(path, load_vec=False)
        try:
            apply_migrations(db, "blackboard", _SNAPSHOT_MIGRATIONS)
            with db.transaction():  # BEGIN IMMEDIATE: no other snapshot runs between read and write
                values, deleted = self._unsaved(db, changed)
                if values:
                    db.executemany(
                        "INSERT OR REPLACE INTO signals(key, value, publisher_id, version, updated_at) "
                        "VALUES (?, ?, ?, ?, ?)",
                        [
                            (r.key, r.data, r.publisher_id, r.version, r.updated_at.isoformat())
                            for r in values
                        ],
                    )
                    db.executemany("DELETE FROM deleted WHERE key = ?", [(r.key,) for r in values])
                if deleted:
                    db.executemany("DELETE FROM signals WHERE key = ?", [(key,) for key, _ in deleted])
                    db.executemany("INSERT OR REPLACE INTO deleted(key, version) VALUES (?, ?)", deleted)
                total = int(db.query("SELECT count(*) FROM signals")[0][0])
        finally:
            db.close()
        self._changed.difference_update(changed)
        return total

    def _unsaved(
        self, db: Database, keys: builtins.list[str]
    ) -> tuple[builtins.list[SignalRecord], builtins.list[tuple[str, int]]]:
        """Of the changed ``keys``, the values and the deletions that win over the file's state."""
        values: builtins.list[SignalRecord] = []
        deleted: builtins.list[tuple[str, int]] = []
        for key in keys:
            record = self._values.get(key)
            mine = record.version if record is not None else self._deleted.get(key)
            if mine is None:
                continue
            saved = db.query(
                "SELECT max(version) FROM (SELECT version FROM signals WHERE key = ?"
                " UNION ALL SELECT version FROM deleted WHERE key = ?)",
                (key, key),
            )[0][0]
            if saved is not None and int(saved) > mine:
                continue  # another process saved a later change of this key
            if record is not None:
                values.append(record)
            else:
                deleted.append((key, mine))
        return values, deleted

    def restore(self, path: str | Path) -> int:
        """Load the values saved at ``path``, and go on from the saved versions of deleted keys (a
        missing file restores nothing); returns how many values."""
        if not Path(path).is_file():
            return 0
        db = open_database(path, load_vec=False)
        try:
            apply_migrations(db, "blackboard", _SNAPSHOT_MIGRATIONS)
            rows = db.query("SELECT key, value, publisher_id, version, updated_at FROM signals")
            deleted = db.query("SELECT key, version FROM deleted")
        finally:
            db.close()
        for key, data, publisher, version, updated in rows:
            self._values[key] = SignalRecord(
                key, bytes(data), publisher, int(version), _dt.datetime.fromisoformat(updated)
            )
        self._deleted.update((str(key), int(version)) for key, version in deleted if key not in self._values)
        return len(rows)
