"""Bulk reads of a sqlite-vec ``vec0`` table straight from its shadow tables.

Reading through the virtual table costs 10-40 us a row: every value of every row opens its own
blob handle, and a vector near the end of a 1024-row chunk walks a long overflow-page chain
first. The shadow tables hold the same data in per-chunk blobs that read in one go: ``_rowids``
(rowid -> chunk, offset), ``_chunks`` (validity bitmap and rowid of each slot),
``_vector_chunks00`` (float32 vectors), ``_metadatachunksNN`` (one blob of values per metadata
column: int64, float64, a bitmap for booleans, 16-byte views for text whose longer values live
in ``_metadatatextNN``).

That layout belongs to sqlite-vec, not to us, so every read is checked: each row's slot must be
valid and name that row, every blob must have the size its chunk implies, and a sample of rows
is compared with what the virtual table returns. Any surprise returns ``None`` and the caller
reads through the virtual table instead, so this can only be faster, never wrong.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from memstrata.core.errors import StorageError

from ._array_types import FloatArray
from ._connection import Database

__all__ = ["Rows", "read_rows", "snapshot", "spare_rows"]

_TEXT_VIEW = 16  # bytes per text value in a metadata chunk: int32 length + the first 12 bytes
_TEXT_INLINE = 12
_CHECK_ROWS = 8  # rows compared with the virtual table on every read
_DENSE_CHUNK = 16  # fewer wanted rows than this in a chunk: read those rows one by one instead


@dataclass
class Rows:
    """Rows of a vector table: ``vectors[i]`` and ``metas[c][i]`` belong to ``rowids[i]``.

    ``storage`` is the allocation ``vectors`` is the start of, with any spare rows asked for.
    """

    rowids: npt.NDArray[np.int64]
    vectors: FloatArray
    metas: dict[str, list[Any]]
    storage: FloatArray


def spare_rows(count: int, room: float) -> int:
    return 0 if room <= 0 else max(1024, int(count * room))


class _Surprise(Exception):
    """The shadow tables do not look as expected: read through the virtual table."""


def _json_ids(ids: Sequence[int] | npt.NDArray[np.int64]) -> str:
    return json.dumps([int(i) for i in ids])


@contextlib.contextmanager
def snapshot(db: Database) -> Iterator[None]:
    """Run several reads on one snapshot of the database (a deferred read transaction).

    Inside a write transaction the reads already share its snapshot, so nothing is opened.
    """
    if db.in_transaction or db.conn.in_transaction:
        yield
        return
    db.execute("BEGIN")
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            db.conn.execute("COMMIT")


def read_rows(
    db: Database,
    table: str,
    dim: int,
    columns: Sequence[tuple[str, str]],
    rowids: Sequence[int] | None = None,
    *,
    room: float = 0.0,
) -> Rows | None:
    """All rows of vec0 ``table`` (``rowids=None``) or those of ``rowids`` that exist.

    ``columns`` are the metadata columns in declaration order as ``(name, declared type)``;
    partition-key columns are read through the virtual table. ``room``: spare rows to allocate
    beyond the data, as a share of it (space to grow without copying; untouched pages cost no
    memory). Returns ``None`` when the shadow tables cannot be trusted.
    """
    try:
        with snapshot(db):
            return _read(db, table, dim, list(columns), rowids, room)
    except (_Surprise, StorageError, ValueError, TypeError, UnicodeDecodeError, OverflowError):
        return None


def _read(
    db: Database,
    table: str,
    dim: int,
    columns: list[tuple[str, str]],
    wanted: Sequence[int] | None,
    room: float,
) -> Rows:
    names = [name for name, _ in columns]
    if wanted is None:
        cursor = db.execute(f"SELECT rowid, chunk_id, chunk_offset FROM {table}_rowids")
    else:
        cursor = db.execute(
            f"SELECT rowid, chunk_id, chunk_offset FROM {table}_rowids "
            "WHERE rowid IN (SELECT value FROM json_each(?))",
            (_json_ids(wanted),),
        )
    place = _int_table(cursor)
    if not len(place):
        storage = np.zeros((spare_rows(0, room), dim), dtype=np.float32)
        return Rows(np.zeros(0, dtype=np.int64), storage[:0], {c: [] for c in names}, storage)
    order = np.lexsort((place[:, 2], place[:, 1]))  # by chunk, then offset: sequential reads
    place = place[order]
    chunk_ids = place[:, 1]
    starts = np.flatnonzero(np.r_[True, chunk_ids[1:] != chunk_ids[:-1]])
    ends = np.r_[starts[1:], len(place)]

    dense = [
        (int(a), int(b)) for a, b in zip(starts, ends, strict=True) if wanted is None or b - a >= _DENSE_CHUNK
    ]
    sparse_rows = (
        []
        if wanted is None
        else [
            int(r) for a, b in zip(starts, ends, strict=True) if b - a < _DENSE_CHUNK for r in place[a:b, 0]
        ]
    )
    dense_index = np.concatenate([np.arange(a, b) for a, b in dense]) if dense else np.zeros(0, np.int64)
    count = len(dense_index) + len(sparse_rows)
    rowids = np.empty(count, dtype=np.int64)
    rowids[: len(dense_index)] = place[dense_index, 0]
    rowids[len(dense_index) :] = sparse_rows
    storage = np.empty((count + spare_rows(count, room), dim), dtype=np.float32)
    vectors = storage[:count]
    metas: dict[str, list[Any]] = {c: [] for c in names}
    if dense:
        _read_dense(db, table, dim, columns, place, dense, vectors, metas, full=wanted is None)
    if sparse_rows:
        _read_points(db, table, dim, names, sparse_rows, vectors, len(dense_index), metas)
    rows = Rows(rowids, vectors, metas, storage)
    _check(db, table, names, rows)
    return rows


def _int_table(cursor: Any) -> npt.NDArray[np.int64]:
    """``(rowid, chunk_id, chunk_offset)`` rows as an (n, 3) array, converted a batch at a time
    (a million Python tuples at once would cost ~150 MB)."""
    parts = []
    while True:
        batch = cursor.fetchmany(8192)
        if not batch:
            break
        try:  # a row not (yet) placed in a chunk has NULLs, which numpy refuses as int64
            part = np.array(batch, dtype=np.int64)
        except (TypeError, ValueError) as exc:
            raise _Surprise("a row is not placed in a chunk") from exc
        if part.ndim != 2 or part.shape[1] != 3:
            raise _Surprise("unexpected _rowids shape")
        parts.append(part)
    return np.concatenate(parts) if parts else np.zeros((0, 3), dtype=np.int64)


def _chunk_blobs(
    db: Database, sql_table: str, column: str, chunk_ids: list[int], full: bool
) -> Iterator[tuple[int, bytes]]:
    """``(chunk id, blob)`` for each of ``chunk_ids``, one at a time, in any order."""
    if full:
        cursor = db.execute(f"SELECT rowid, {column} FROM {sql_table}")
    else:
        cursor = db.execute(
            f"SELECT rowid, {column} FROM {sql_table} WHERE rowid IN (SELECT value FROM json_each(?))",
            (_json_ids(chunk_ids),),
        )
    wanted = set(chunk_ids)
    seen = 0
    while (row := cursor.fetchone()) is not None:  # one 1.5 MB blob in memory at a time
        chunk_id, blob = row
        if chunk_id in wanted:
            if not isinstance(blob, bytes):
                raise _Surprise(f"{sql_table}.{column} holds no blob")
            seen += 1
            yield int(chunk_id), blob
    if seen != len(wanted):
        raise _Surprise(f"{sql_table} lacks a chunk")


def _read_dense(
    db: Database,
    table: str,
    dim: int,
    columns: list[tuple[str, str]],
    place: npt.NDArray[np.int64],
    dense: list[tuple[int, int]],
    vectors: FloatArray,
    metas: dict[str, list[Any]],
    *,
    full: bool,
) -> None:
    """Rows of whole chunks, in ``place`` order, into ``vectors[:n]`` and ``metas``."""
    chunk_list = [int(place[a, 1]) for a, _ in dense]
    info = {
        int(r[0]): (int(r[1]), r[2], r[3])
        for r in db.query(
            f"SELECT chunk_id, size, validity, rowids FROM {table}_chunks "
            "WHERE chunk_id IN (SELECT value FROM json_each(?))",
            (_json_ids(chunk_list),),
        )
    }
    if len(info) != len(chunk_list):
        raise _Surprise("a row points at a chunk that does not exist")
    spans: list[tuple[int, npt.NDArray[np.int64], int]] = []  # chunk id, offsets, chunk size
    for (a, b), chunk_id in zip(dense, chunk_list, strict=True):
        size, validity, slot_rowids = info[chunk_id]
        offsets = place[a:b, 2]
        if not isinstance(validity, bytes) or not isinstance(slot_rowids, bytes) or size <= 0:
            raise _Surprise("chunk bookkeeping is not blobs")
        if len(validity) * 8 < size or len(slot_rowids) != size * 8:
            raise _Surprise("chunk bookkeeping has an unexpected size")
        if offsets.min() < 0 or offsets.max() >= size:
            raise _Surprise("a row's offset lies outside its chunk")
        valid = np.unpackbits(np.frombuffer(validity, dtype=np.uint8), bitorder="little")[offsets]
        named = np.frombuffer(slot_rowids, dtype="<i8")[offsets]
        if not valid.all() or not np.array_equal(named, place[a:b, 0]):
            raise _Surprise("a chunk slot does not hold the row that points at it")
        spans.append((chunk_id, offsets, size))
    row_bytes = dim * 4
    target: dict[int, tuple[int, npt.NDArray[np.int64], int]] = {}
    at = 0
    for chunk_id, offsets, size in spans:
        target[chunk_id] = (at, offsets, size)
        at += len(offsets)
    for chunk_id, blob in _chunk_blobs(db, f"{table}_vector_chunks00", "vectors", chunk_list, full):
        at, offsets, size = target[chunk_id]
        if len(blob) != size * row_bytes:
            raise _Surprise("a vector chunk has an unexpected size")
        block = np.frombuffer(blob, dtype=np.float32).reshape(size, dim)
        first, last = int(offsets[0]), int(offsets[-1])
        if last - first == len(offsets) - 1:  # consecutive slots (the usual case): one copy
            vectors[at : at + len(offsets)] = block[first : last + 1]
        else:  # "clip" is unbuffered: no temporary (the offsets were checked above)
            np.take(block, offsets, axis=0, out=vectors[at : at + len(offsets)], mode="clip")
    metadata_index = 0
    for name, declared in columns:
        words = declared.lower().split()
        if "partition" in words:
            values = _virtual_values(db, table, name, [int(r) for r in _rows_of(place, dense)])
        else:
            values = _metadata_values(db, table, metadata_index, words[0], place, dense, spans, full)
            metadata_index += 1
        metas[name].extend(values)


def _rows_of(place: npt.NDArray[np.int64], dense: list[tuple[int, int]]) -> npt.NDArray[np.int64]:
    return np.concatenate([place[a:b, 0] for a, b in dense])


def _metadata_values(
    db: Database,
    table: str,
    index: int,
    kind: str,
    place: npt.NDArray[np.int64],
    dense: list[tuple[int, int]],
    spans: list[tuple[int, npt.NDArray[np.int64], int]],
    full: bool,
) -> list[Any]:
    chunk_list = [chunk_id for chunk_id, _, _ in spans]
    blobs = dict(_chunk_blobs(db, f"{table}_metadatachunks{index:02d}", "data", chunk_list, full))
    parts: list[Any] = []
    for chunk_id, offsets, size in spans:
        blob = blobs[chunk_id]
        if kind in ("integer", "float"):
            if len(blob) != size * 8:
                raise _Surprise("a metadata chunk has an unexpected size")
            parts.append(np.frombuffer(blob, dtype="<i8" if kind == "integer" else "<f8")[offsets])
        elif kind == "boolean":
            if len(blob) * 8 < size:
                raise _Surprise("a metadata chunk has an unexpected size")
            parts.append(np.unpackbits(np.frombuffer(blob, dtype=np.uint8), bitorder="little")[offsets])
        elif kind == "text":
            if len(blob) != size * _TEXT_VIEW:
                raise _Surprise("a metadata chunk has an unexpected size")
            parts.append(np.frombuffer(blob, dtype=f"V{_TEXT_VIEW}")[offsets])
        else:
            raise _Surprise(f"metadata type {kind!r}")
    joined = np.concatenate(parts)
    if kind != "text":
        return list(joined.tolist())
    # text: decode each distinct 16-byte view once; values longer than 12 bytes live elsewhere
    views, inverse = np.unique(joined, return_inverse=True)
    decoded: list[str | None] = []
    for view in views.tolist():
        raw = bytes(view)
        length = int.from_bytes(raw[:4], "little", signed=True)
        if length < 0:
            raise _Surprise("a text view has a negative length")
        decoded.append(raw[4 : 4 + length].decode("utf-8") if length <= _TEXT_INLINE else None)
    values: list[Any] = [decoded[i] for i in inverse.reshape(-1).tolist()]
    long_rows = [i for i, v in enumerate(values) if v is None]
    if long_rows:
        rows = _rows_of(place, dense)
        ids = [int(rows[i]) for i in long_rows]
        texts = {
            int(r): t
            for r, t in db.query(
                f"SELECT rowid, data FROM {table}_metadatatext{index:02d} "
                "WHERE rowid IN (SELECT value FROM json_each(?))",
                (_json_ids(ids),),
            )
        }
        for i, rowid in zip(long_rows, ids, strict=True):
            text = texts.get(rowid)
            if not isinstance(text, str):
                raise _Surprise("a long text value is missing")
            values[i] = text
    return values


def _virtual_values(db: Database, table: str, column: str, rowids: list[int]) -> list[Any]:
    found = {
        int(r): v
        for r, v in db.query(
            f"SELECT t.rowid, t.{column} FROM json_each(?) j JOIN {table} t ON t.rowid = j.value",
            (_json_ids(rowids),),
        )
    }
    if len(found) != len(set(rowids)):
        raise _Surprise("a row vanished while reading")
    return [found[r] for r in rowids]


def _read_points(
    db: Database,
    table: str,
    dim: int,
    names: list[str],
    rowids: list[int],
    vectors: FloatArray,
    at: int,
    metas: dict[str, list[Any]],
) -> None:
    """A few rows through the virtual table (cheaper than whole chunks for them)."""
    cols = "".join(f", t.{c}" for c in names)
    found = {
        int(r[0]): r[1:]
        for r in db.query(
            f"SELECT t.rowid, t.embedding{cols} FROM json_each(?) j JOIN {table} t ON t.rowid = j.value",
            (_json_ids(rowids),),
        )
    }
    if len(found) != len(set(rowids)):
        raise _Surprise("a row vanished while reading")
    for i, rowid in enumerate(rowids):
        blob, *values = found[rowid]
        if not isinstance(blob, bytes) or len(blob) != dim * 4:
            raise _Surprise("a vector has an unexpected size")
        vectors[at + i] = np.frombuffer(blob, dtype=np.float32)
        for name, value in zip(names, values, strict=True):
            metas[name].append(value)


def _check(db: Database, table: str, names: list[str], rows: Rows) -> None:
    """Compare a spread of rows with what the virtual table returns for them."""
    n = len(rows.rowids)
    if n == 0:
        return
    picks = sorted({int(i) for i in np.linspace(0, n - 1, num=min(n, _CHECK_ROWS))})
    cols = "".join(f", {c}" for c in names)
    for i in picks:
        row = db.query(f"SELECT embedding{cols} FROM {table} WHERE rowid = ?", (int(rows.rowids[i]),))
        if not row:
            continue  # deleted since the bulk read: the caller's change log replays it
        blob, *values = row[0]
        if blob != rows.vectors[i].tobytes():
            raise _Surprise("a vector read from its chunk differs from vec0's")
        for name, value in zip(names, values, strict=True):
            if rows.metas[name][i] != value:
                raise _Surprise(f"metadata {name!r} read from its chunk differs from vec0's")
