"""Startup consistency check: content rows, full-text indexes and vectors must agree.

Every logical write changes a store's content table, its FTS5 indexes (through triggers) and its
vectors in one transaction, so a crash cannot leave them disagreeing. This check is the safety
net for everything else (a store written by an older version, by a process that had no
sqlite-vec or no embedding model, a hand edit, a bug): a layer calls :func:`check_consistency`
when it opens a store and reports the returned :class:`ConsistencyReport` in its ``status()``.

What it compares and repairs:

* **full text**: the number of content rows an FTS5 index should hold equals the number of rows
  in its ``_docsize`` table (when not, two anti-joins on integer keys count the rows it lacks and
  the rows whose content is gone). A difference, or (with ``full=True``) a failing FTS5
  ``integrity-check``, which re-tokenises every row and so is not run on every open, rebuilds
  that index from the content table with FTS5's ``'rebuild'`` command.
* **vectors**: the ids of the rows that should have a vector and the ids the vector table holds
  are compared by an order-free checksum of each set (count, sum and sum of squares of the ids,
  over residues modulo a prime when the sums would not fit 64 bits), computed in SQL from
  integer keys at every open: no stored mark is trusted, so a store changed behind our back is
  still caught, and a consistent store costs ~15 ms per 100k rows (a large store sums its
  vector ids on a second connection meanwhile). Only when the checksums differ are both sets
  read: a vector whose content row is gone is deleted; a row that should have a vector but has
  none is handed to the layer's ``repair_missing`` callback (which embeds it, or marks it
  pending), or counted if there is none.

The counts and checksums are first read on one snapshot, without the write lock, so a store that
agrees (the usual case) opens while another process writes. Only when something differs (or for
a full check) are detection and the cheap repairs run again in one write transaction, so another
process writing at the same time is never mistaken for an inconsistency.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Required, TypedDict, Unpack

from memstrata.core.errors import InvalidInputError, StorageError

from ._bm25_stamp import forget_stamp
from ._connection import Database, open_database
from ._vec0_chunks import snapshot
from ._vectors import VectorIndex

__all__ = ["CheckSpec", "CheckTarget", "ConsistencyReport", "check_consistency", "examine_consistency"]

log = logging.getLogger("memstrata.storage")

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(slots=True)
class ConsistencyReport:
    """What one check found and did (``status()`` shows :meth:`as_dict`)."""

    store: str
    full: bool
    rows: int = 0
    vectors: int | None = None  # None: the store has no usable vector table
    fts_rebuilt: list[str] = field(default_factory=list)
    orphan_vectors_removed: int = 0
    missing_vectors: int = 0  # rows that should have a vector and had none
    vectors_repaired: int = 0  # of those, how many the layer's callback repaired now
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def consistent(self) -> bool:
        """True when nothing disagreed (nothing had to be repaired)."""
        return not self.problems

    @property
    def repaired(self) -> bool:
        return bool(self.fts_rebuilt or self.orphan_vectors_removed or self.vectors_repaired)

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"consistent": self.consistent, **dataclasses.asdict(self)}
        del data["store"]  # the caller's key
        data["seconds"] = round(self.seconds, 4)
        return data


def _name(value: str, what: str) -> str:
    if not isinstance(value, str) or not _IDENTIFIER.fullmatch(value):
        raise InvalidInputError(f"{what} must be an SQL identifier, got {value!r}")
    return value


def _fts_differences(
    db: Database, table: str, key: str, fts: str, condition: str | None, rows: int
) -> int | None:
    """Rows the index lacks plus index rows without content (``rows``: the table's count);
    ``None`` if it cannot be counted."""
    docsize = f"{fts}_docsize"
    if db.scalar("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (docsize,)) is None:
        return None  # columnsize=0: only the full check can tell
    where = f" AND ({condition})" if condition else ""
    expected = db.scalar(f"SELECT count(*) FROM {table} c WHERE ({condition})") if condition else rows
    if expected == db.scalar(f"SELECT count(*) FROM {docsize}"):
        return 0  # equal counts: a lost insert and a lost delete at once is the only blind spot
    missing = db.scalar(
        f"SELECT count(*) FROM {table} c WHERE NOT EXISTS "
        f"(SELECT 1 FROM {docsize} d WHERE d.id = c.{key}){where}"
    )
    orphans = db.scalar(
        f"SELECT count(*) FROM {docsize} d WHERE NOT EXISTS (SELECT 1 FROM {table} c WHERE c.{key} = d.id)"
    )
    return int(missing) + int(orphans)


def _fts_intact(db: Database, fts: str, *, against_content: bool = True) -> bool:
    """FTS5's own check of the index, against the content table (re-tokenising every row) or, for
    an index of only some rows (which that comparison would always fail), of its structure."""
    try:
        db.execute(f"INSERT INTO {fts}({fts}, rank) VALUES ('integrity-check', ?)", (int(against_content),))
    except StorageError as exc:
        if "malformed" in str(exc) or "damaged" in str(exc) or "corrupt" in str(exc):
            return False
        raise
    return True


def _rebuild(db: Database, table: str, key: str, fts: str, condition: str | None) -> None:
    """Rebuild ``fts`` from ``table``: all rows (FTS5's ``'rebuild'``) or the rows it indexes.
    The rebuilt index starts FTS5's count of segments afresh: its index file's stamp goes."""
    forget_stamp(db, fts)
    if condition is None:
        db.execute(f"INSERT INTO {fts}({fts}) VALUES ('rebuild')")
        return
    columns = [str(r[1]) for r in db.query(f"PRAGMA table_info({fts})")]
    names = ", ".join(columns)
    db.execute(f"INSERT INTO {fts}({fts}) VALUES ('delete-all')")
    db.execute(f"INSERT INTO {fts}(rowid, {names}) SELECT {key}, {names} FROM {table} WHERE {condition}")


# a prime below 2**31: an id's residue squared stays within SQLite's 64-bit integers
_MODULUS = 2_147_483_647
# from this size on, the vector ids are fingerprinted on a second connection (about 100k rows)
_BESIDE_FROM_BYTES = 64 * 1024 * 1024


def _fingerprint(db: Database, column: str, source: str) -> tuple[int, int, int, bool]:
    """An order-free checksum of the integer ids in ``column`` of ``source`` (``table [WHERE
    ...]``): their count, their sum and the sum of their squares. Two sets with equal
    fingerprints are the same set unless a difference was built to cancel out in both sums at
    once. Reading only integer keys (an index or a shadow table), it costs ~60-80 ms per million
    ids, where building both sets in Python cost ~0.5 s per 100k at every open. Sums that would
    leave SQLite's 64-bit integers (ids past ~3 million) are taken over residues modulo a prime,
    which costs half as much again (the last field says which)."""
    k = column
    plain = f"SELECT count(*), coalesce(sum({k}), 0), coalesce(sum({k} * {k}), 0) FROM {source}"
    try:
        row = db.query(plain)[0]
    except StorageError as exc:
        if "overflow" not in str(exc):
            raise
        row = (None, None, None)
    if not all(isinstance(v, int) for v in row):  # overflowed: to an error, or a square to a REAL
        r = f"({k} % {_MODULUS})"
        row = db.query(
            f"SELECT count(*), coalesce(sum({r}), 0), coalesce(sum({r} * {r} % {_MODULUS}), 0) FROM {source}"
        )[0]
        return int(row[0]), int(row[1]), int(row[2]), True
    return int(row[0]), int(row[1]), int(row[2]), False


def _beside(db: Database, column: str, source: str) -> Callable[[], tuple[int, int, int, bool]]:
    """The fingerprint of ``source``, taken on a second connection in a thread for a large
    database, so that it runs beside the checks of the caller's own connection (SQLite lets go
    of the interpreter while it steps): 134 -> 77 ms at 1M rows on two cores. Under the caller's
    write lock the reader sees what the caller sees; without it, the reader may see another
    process's later commit, which changes rows and vectors together and so can only make the
    fingerprints differ (the check then runs again under the lock). Returns the call that waits
    for it (a small or in-memory database is fingerprinted when that call is made)."""
    if str(db.path) == ":memory:" or db.path.stat().st_size < _BESIDE_FROM_BYTES:
        return lambda: _fingerprint(db, column, source)
    reader = open_database(db.path, read_only=True, load_vec=False)
    result: list[tuple[int, int, int, bool]] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            result.append(_fingerprint(reader, column, source))
        except BaseException as exc:  # handed to the caller, raised in its thread
            failed.append(exc)
        finally:
            reader.close()

    thread = threading.Thread(target=run, name="memstrata-fingerprint", daemon=True)
    thread.start()

    def wait() -> tuple[int, int, int, bool]:
        thread.join()
        if failed:
            raise failed[0]
        return result[0]

    return wait


def _vector_ids(db: Database, table: str, backend: str) -> str:
    """The ids the vector table holds, read from sqlite-vec's own id table when it has one
    (ten times faster than asking the virtual table for its rowids)."""
    shadow = f"{table}_rowids"
    if backend == "vec0" and db.scalar(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (shadow,)
    ):
        return shadow
    return table


def _compare_vectors(
    db: Database, report: ConsistencyReport, vectors: VectorIndex, table: str, key: str, wanted: str
) -> list[int]:
    """The fingerprints differ: find which ids, delete vectors without a row, return the rows
    that lack one (the caller repairs them after the transaction)."""
    have = vectors.rowids()
    ids = {int(r[0]) for r in db.query(f"SELECT {key} FROM {table}")}
    needed = {int(r[0]) for r in db.query(f"SELECT {key} FROM {wanted}")}
    orphans = sorted(have - ids)
    missing = sorted(needed - have)
    if orphans and db.read_only:
        report.problems.append(f"{len(orphans)} vector(s) without a row; kept (read-only)")
    elif orphans:
        vectors.delete_many(orphans)
        report.orphan_vectors_removed = len(orphans)
        report.problems.append(f"{len(orphans)} vector(s) without a row; deleted")
    report.missing_vectors = len(missing)
    report.vectors = len(have) - len(orphans)
    return missing


class CheckTarget(TypedDict, total=False):
    """What a store's check compares, as its layer names it: ``table`` (integer key ``key``,
    default ``"id"``), its FTS5 indexes ``fts`` (each with the condition on the rows it indexes,
    ``None``: every row), its ``vectors`` (skipped when ``None`` or unusable without sqlite-vec)
    and ``vector_rows``, the condition on rows that must have a vector (``None``: every row)."""

    table: Required[str]
    key: str
    fts: Mapping[str, str | None] | None
    vectors: VectorIndex | None
    vector_rows: str | None


@dataclass(frozen=True, slots=True)
class CheckSpec:
    """What a store's check compares: ``table`` (integer key ``key``), its FTS5 indexes (each
    with the condition on the rows it indexes, ``None``: every row), and, when the store has a
    usable vector table, that table's id source and the condition on rows that must have a vector
    (see :func:`check_consistency`). Plain names only: a check on another connection uses it."""

    table: str
    key: str = "id"
    indexes: Mapping[str, str | None] = field(default_factory=dict)
    vector_ids: str | None = None  # the table holding the vectors' ids; None: no vector side
    vector_rows: str | None = None

    @classmethod
    def of(cls, db: Database, **target: Unpack[CheckTarget]) -> CheckSpec:
        vectors = target.get("vectors")
        usable = vectors is not None and vectors.available
        return cls(
            _name(target["table"], "table"),
            _name(target.get("key", "id"), "key"),
            {_name(name, "fts table"): condition for name, condition in (target.get("fts") or {}).items()},
            _vector_ids(db, vectors.table, vectors.backend) if usable and vectors is not None else None,
            target.get("vector_rows"),
        )

    @property
    def rows_with_vectors(self) -> str:
        """The rows that must have a vector, as SQL after ``FROM``."""
        return self.table + (f" WHERE {self.vector_rows}" if self.vector_rows else "")


@dataclass(slots=True)
class _Findings:
    """What comparing the counts and fingerprints found (nothing repaired yet)."""

    rows: int
    fts: dict[str, int | None]  # differences per index; None: only its integrity check can tell
    vectors: int | None = None  # the vector count when the vector side agrees
    vectors_differ: bool = False


def _examine(db: Database, spec: CheckSpec, *, beside: bool) -> _Findings:
    """Counts and fingerprints, inside the caller's transaction (one state of the database).
    ``beside``: a large database's vector ids are fingerprinted on a second connection meanwhile
    (see :func:`_beside`)."""
    table, key = spec.table, spec.key
    if spec.vector_ids is not None:
        vector_side = _beside(db, "rowid", spec.vector_ids) if beside else None
        every_row = _fingerprint(db, key, table)  # its count is the number of rows
        found = _Findings(every_row[0], {})
    else:
        found = _Findings(int(db.scalar(f"SELECT count(*) FROM {table}")), {})
    for index, condition in spec.indexes.items():
        found.fts[index] = _fts_differences(db, table, key, index, condition, found.rows)
    if spec.vector_ids is not None:
        have = vector_side() if vector_side is not None else _fingerprint(db, "rowid", spec.vector_ids)
        # every row has its vector (the common case; the ids alone are read from the smallest
        # index), or exactly the rows that should have one do: nothing lacks, nothing is left over
        if have == every_row or (spec.vector_rows and have == _fingerprint(db, key, spec.rows_with_vectors)):
            found.vectors = have[0]
        else:
            found.vectors_differ = True
    return found


def examine_consistency(db: Database, spec: CheckSpec, *, beside: bool = False) -> ConsistencyReport | None:
    """The check without its repairs, on one snapshot of ``db`` (any connection, read-only
    included): a report when everything agrees, ``None`` when something differs or only FTS5's
    own integrity check could tell (then :func:`check_consistency` is what to run). ``beside``:
    see :func:`_beside`."""
    started = time.perf_counter()
    with snapshot(db):
        found = _examine(db, spec, beside=beside)
    if found.vectors_differ or any(differences != 0 for differences in found.fts.values()):
        return None
    report = ConsistencyReport(str(db.path), False, rows=found.rows, vectors=found.vectors)
    report.seconds = time.perf_counter() - started
    return report


def check_consistency(
    db: Database,
    *,
    repair_missing: Callable[[list[int]], int] | None = None,
    full: bool = False,
    **target: Unpack[CheckTarget],
) -> ConsistencyReport:
    """Compare a table with its FTS5 indexes and vectors (``target``, :class:`CheckTarget`);
    repair what disagrees.

    An index of some rows (a condition in ``fts``) is rebuilt from just those rows, and its full
    check verifies its structure only. ``repair_missing(ids)`` is called after the check's
    transaction with the ids of rows lacking a vector (e.g. with ``vector_rows="vector_pending =
    0"``) and returns how many it repaired. ``full=True`` also runs FTS5's ``integrity-check`` on
    every index.
    """
    started = time.perf_counter()
    spec = CheckSpec.of(db, **target)
    if not full:  # read first: a store that agrees is not locked, so opening it never waits
        agreed = examine_consistency(db, spec, beside=True)
        if agreed is not None:
            return agreed
    vectors = target.get("vectors")
    report = ConsistencyReport(str(db.path), full)
    missing: list[int] = []
    with db.transaction():  # the write lock: a concurrent writer cannot look like a difference
        found = _examine(db, spec, beside=True)
        report.rows = found.rows
        for index, differences in found.fts.items():
            condition = spec.indexes[index]
            if differences or (
                (differences is None or full)
                and not _fts_intact(db, index, against_content=condition is None)
            ):
                what = f"{differences} row(s) differ" if differences else "its integrity check failed"
                if db.read_only:
                    report.problems.append(f"full-text index {index}: {what}; not rebuilt (read-only)")
                    continue
                report.problems.append(f"full-text index {index}: {what}; rebuilt")
                _rebuild(db, spec.table, spec.key, index, condition)
                report.fts_rebuilt.append(index)
        report.vectors = found.vectors
        if found.vectors_differ and vectors is not None:
            missing = _compare_vectors(db, report, vectors, spec.table, spec.key, spec.rows_with_vectors)
    if missing:
        if repair_missing is not None and not db.read_only:
            report.vectors_repaired = int(repair_missing(missing))
            report.vectors = (report.vectors or 0) + report.vectors_repaired
        report.problems.append(
            f"{len(missing)} row(s) without a vector; {report.vectors_repaired} embedded now"
        )
    for index in report.fts_rebuilt:  # a rebuild that did not take would be a silent wrong answer
        if not _fts_intact(db, index, against_content=spec.indexes[index] is None):
            raise StorageError(f"database {db.path}: full-text index {index} is damaged even after a rebuild")
    report.seconds = time.perf_counter() - started
    if report.problems:
        log.warning("consistency check of %s: %s", db.path, "; ".join(report.problems))
    return report
