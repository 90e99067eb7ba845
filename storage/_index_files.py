"""Persisted index files: the in-memory search structures of a store, kept beside its database.

A fresh process would otherwise rebuild its vector mirror and its keyword document lengths from
SQLite at the first search (about a second at 100k entries, 15-23 s at 1M). Instead, the owner of
a structure writes it here after building it and refreshes it at close; the next process
memory-maps the file (copy-on-write: pages are read when touched, and changed pages stay private)
and answers its first query in milliseconds.

The files are caches, never the truth, and are never trusted blindly:

* one file per structure, ``<database>.index/<name>``, written to a temporary file, flushed with
  ``fsync`` and renamed over the old one (a reader sees the old file or the new one, whole);
* a fixed prefix (magic, header length, header CRC) and a JSON header describing each array
  (dtype, shape, offset, checksum of the small ones: of the rows written, when spare rows follow
  them); the file must be exactly as long as the header says. A file that fails any check is
  *damaged*: the caller rebuilds from SQLite and warns;
* the header records which state of the database the file reflects (the database's index token,
  see :func:`database_token`, and a position the caller can check: the vector change log's
  sequence number and its entry's stamp, FTS5's records and the database's stamp for them,
  :mod:`._bm25_stamp`). The caller validates it against the database and
  catches up or rebuilds; the vector matrix is also spot-checked against SQLite by its caller
  (the only check of one too large to checksum at open).

Nothing here knows a mirror's semantics beyond :func:`mirror_arrays` and :func:`mirror_from_arrays`,
the one adapter between a :class:`~._vector_mirror.Mirror` and its arrays.
"""

from __future__ import annotations

import contextlib
import json
import logging
import mmap
import os
import secrets
import struct
import time
import weakref
import zlib
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import numpy as np
import numpy.typing as npt

from ._connection import Database
from ._file_rows import FileRows, OpenFile
from ._migrations import get_meta, set_meta
from ._vector_mirror import Mirror

__all__ = [
    "FORMAT",
    "MIN_ROWS",
    "MIRROR_UNCHECKED",
    "DamagedFile",
    "IndexFile",
    "Pieces",
    "checksum",
    "database_token",
    "ensure_token",
    "index_path",
    "mirror_arrays",
    "mirror_from_arrays",
    "persist_at_close",
    "read_index",
    "recorded_token",
    "write_index",
    "write_unwaited",
]

log = logging.getLogger("memstrata.storage")
_T = TypeVar("_T")

FORMAT = 1
MIN_ROWS = 4_096  # smaller structures load from SQLite in a few ms: no file for them. From this
# size a mirror keeps its rows grouped by category (``_mirror_layout.GROUP_FROM``), and a process
# without the file read them from SQLite and sorted them again: the first hybrid query of a fresh
# process at 19k entries took 66-91 ms, against 8.7 ms with the file (and 23 ms at 100k)
TOKEN_KEY = "index_files_token"
_MAGIC = b"MEMSTRATA-INDEX\x00"
_PREFIX = struct.Struct("<16sQI4x")  # magic, header length, header CRC32
_ALIGN = 64
_CHECKSUM_LIMIT = 64 << 20  # arrays up to this size get a checksum (checked at every open)
_READ_BYTES = 1 << 20  # read at a time when checksumming an array with spare rows (a multiple of 8)
_ROW = 1024  # words a row when :func:`checksum` sums them by rows and columns
_MASK64 = (1 << 64) - 1
_WRITE_BYTES = 64 << 10  # written at a time: the page cache then holds the file in small pages, and a
# reader maps ~64 KB per row it touches; after one large write, a touch mapped megabytes of huge
# pages (1M rows, one search: 1.45 GB of the file resident, against 0.26 GB; after 50 queries the
# searches have touched most pages either way, ~1.7 GB of clean, shared, reclaimable page cache)
_STALE_TEMP_S = 600.0  # temporary files older than this are leftovers of a crashed writer


def checksum(array: npt.NDArray[Any]) -> int:
    """A 64-bit checksum of ``array``'s bytes: the sum of its little-endian 8-byte words (the
    last one zero-padded), word ``i`` weighted by ``2i + 1``, modulo 2**64. Odd weights make any
    single flipped bit, and any two words swapped, change it. ~8x faster than ``zlib.crc32``,
    which a fresh process at 1M rows pays at its first search. The words are summed as rows of
    :data:`_ROW`: with ``i = r * _ROW + c``, the weighted sum is ``2 * (_ROW * sum(r * row_sum)
    + sum(c * column_sum)) + sum(words)``, two passes of plain sums and no array of weights
    (whose making was half the time of a fresh process's checksums: 8.2 -> 4.3 ms for the
    16 MB of a 1M-entry BM25 file)."""
    return _sums(np.ascontiguousarray(array).reshape(-1).view(np.uint8))[0]


def _sums(data: npt.NDArray[np.uint8]) -> tuple[int, int]:
    """:func:`checksum` of ``data`` and the plain sum of its words, both modulo 2**64: the
    plain sum lets :func:`_file_checksum` weigh a block as if it started further in."""
    tail = len(data) % 8
    if tail:
        data = np.concatenate([data, np.zeros(8 - tail, dtype=np.uint8)])
    words = data.view("<u8")
    whole = len(words) - len(words) % _ROW
    total = plain = 0
    if whole:  # uint64 sums and products wrap modulo 2**64, as the checksum does
        rows = words[:whole].reshape(-1, _ROW)
        row_sums = rows.sum(axis=1, dtype=np.uint64)
        column_sums = rows.sum(axis=0, dtype=np.uint64)
        by_row = int(np.dot(np.arange(len(row_sums), dtype=np.uint64), row_sums))
        by_column = int(np.dot(np.arange(_ROW, dtype=np.uint64), column_sums))
        plain = int(row_sums.sum(dtype=np.uint64))
        total = 2 * (_ROW * by_row + by_column) + plain
    if whole < len(words):
        weights = np.arange(whole, len(words), dtype=np.uint64) * np.uint64(2) + np.uint64(1)
        total += int(np.dot(weights, words[whole:]))
        plain += int(words[whole:].sum(dtype=np.uint64))
    return total & _MASK64, plain & _MASK64


def _file_checksum(fd: int, offset: int, size: int) -> int:
    """:func:`checksum` of the ``size`` bytes at ``offset`` of the file, read in blocks rather
    than through its map: checking a matrix at open then leaves none of its pages mapped (a
    sieved mirror's searches touch its int8 copy, not the float32 rows). A block that starts
    at word ``k`` adds its own checksum plus ``2 * k`` times the sum of its words."""
    total = 0
    for at in range(0, size, _READ_BYTES):
        length = min(_READ_BYTES, size - at)
        try:
            block = os.pread(fd, length, offset + at)
        except OSError as exc:
            raise DamagedFile(f"cannot read: {exc}") from exc
        if len(block) != length:
            raise DamagedFile(f"{len(block)} bytes read at {offset + at}, expected {length}")
        weighted, plain = _sums(np.frombuffer(block, dtype=np.uint8))
        total += weighted + 2 * (at // 8) * plain
    return total & _MASK64


@dataclass(frozen=True, slots=True)
class Pieces:
    """A 1-D array of ``length`` items of ``dtype`` that :func:`write_index` writes as ``chunks()``
    yields them, so it is never held whole (the postings of a 1M-entry index, written again at a
    close: 320 MB). It gets no checksum: its reader checks it by other means."""

    dtype: np.dtype[Any]
    length: int
    chunks: Callable[[], Iterator[npt.NDArray[Any]]]


class DamagedFile(Exception):
    """An index file that cannot be read as written (truncated, garbage, wrong checksum)."""


@dataclass
class IndexFile:
    """A file read back: its ``meta`` header fields and its arrays (copy-on-write maps)."""

    path: Path
    meta: dict[str, Any]
    arrays: dict[str, npt.NDArray[Any]]
    offsets: dict[str, int] = field(default_factory=dict)  # where each array starts in the file
    file: OpenFile | None = None  # the file the arrays were mapped from, for :meth:`rows`

    def rows(self, name: str) -> FileRows | None:
        """The 2-D array ``name``, read row by row from the file instead of through its map."""
        array = self.arrays.get(name)
        if self.file is None or array is None or array.ndim != 2:
            return None
        return FileRows(self.file, self.offsets[name], array.dtype, array.shape[1], len(array))


def index_path(db: Database, name: str) -> Path | None:
    """Where the index file ``name`` of ``db`` lives (``None`` for an in-memory database)."""
    if str(db.path) == ":memory:":
        return None
    return db.path.with_name(db.path.name + ".index") / name


def database_token(db: Database) -> str | None:
    """The random token that tells this database from any other (a recreated or restored one),
    recorded once in its metadata; ``None`` until an index file was first written."""
    try:
        return get_meta(db, TOKEN_KEY)
    except Exception:  # no metadata table readable: no file can be trusted
        return None


def ensure_token(db: Database) -> str | None:
    """The database's token, recorded now if it has none. Best effort, never waiting for the
    write lock: ``None`` when it cannot be written (read-only, busy)."""
    token = database_token(db)
    if token is not None or db.read_only:
        return token
    return write_unwaited(db, lambda: recorded_token(db))


def recorded_token(db: Database) -> str:
    """The database's token, recorded in the caller's write transaction if it has none."""
    token = database_token(db)
    if token is None:
        token = secrets.token_hex(16)
        set_meta(db, TOKEN_KEY, token)
    return token


def write_unwaited(db: Database, write: Callable[[], _T]) -> _T | None:
    """``write()`` in a write transaction of its own that does not wait for the write lock: what
    a cache beside the database records there (its token, a stamp) is never worth a wait.
    ``None`` when it cannot run (read-only, busy, inside a transaction, disk full)."""
    if db.read_only or db.in_transaction or db.conn.in_transaction:
        return None
    conn = db.conn
    timeout = conn.execute("PRAGMA busy_timeout").fetchone()[0]
    try:
        conn.execute("PRAGMA busy_timeout = 0")
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = write()
            conn.execute("COMMIT")
        except Exception:
            conn.execute("ROLLBACK")
            raise
    except Exception:  # busy, read-only file, disk full: the files are only a cache
        return None
    finally:
        conn.execute(f"PRAGMA busy_timeout = {int(timeout)}")
    return result


def persist_at_close(db: Database, persist: Callable[[], None]) -> None:
    """Call the bound method ``persist`` when ``db`` closes, holding it weakly (an index that
    was dropped is not kept alive by its connection)."""
    method = weakref.WeakMethod(persist)

    def hook() -> None:
        alive = method()
        if alive is not None:
            alive()

    db.on_close(hook)


# -- the file format -----------------------------------------------------------------------------


def _aligned(offset: int) -> int:
    return (offset + _ALIGN - 1) // _ALIGN * _ALIGN


def write_index(
    path: Path,
    meta: Mapping[str, Any],
    arrays: Mapping[str, npt.NDArray[Any] | Pieces],
    *,
    spare: Mapping[str, int] | None = None,
    unchecked: Collection[str] = (),
) -> bool:
    """Write ``arrays`` and ``meta`` (JSON-able) to ``path`` atomically; False when the folder
    cannot be written (read-only data dir, disk full): the next process rebuilds instead.

    ``spare`` gives arrays extra rows that are not written: the file has a hole there, so room
    to grow costs no disk and reads back as zeros. Such an array's checksum covers the rows
    written (``sum_rows``): a reader grows into the spare rows of its copy-on-write map, never
    into the file, which stays as written until the next :func:`write_index` replaces it whole.
    ``unchecked`` arrays get no checksum: those the reader verifies completely by other means.
    """
    names = list(arrays)
    extra = dict(spare or {})
    described: list[dict[str, Any]] = []
    offset = end = 0  # relative to the start of the data
    for name in names:
        array = arrays[name]
        rows = extra.get(name, 0)
        if isinstance(array, Pieces):
            shape = [array.length + rows]
        else:
            shape = [int(array.shape[0]) + rows, *map(int, array.shape[1:])] if array.ndim else []
        entry: dict[str, Any] = {
            "name": name,
            "dtype": array.dtype.str,
            "shape": shape,
            "offset": offset,
        }
        if not isinstance(array, Pieces) and array.nbytes <= _CHECKSUM_LIMIT and name not in unchecked:
            entry["sum64"] = checksum(array)
            if rows:
                entry["sum_rows"] = int(array.shape[0])
        described.append(entry)
        end = offset + int(np.prod(shape, dtype=np.int64)) * array.dtype.itemsize
        offset = _aligned(end)
    header = json.dumps(
        {"format": FORMAT, "meta": dict(meta), "arrays": described, "data_bytes": end},
        separators=(",", ":"),
    ).encode()
    start = _aligned(_PREFIX.size + len(header))
    folder = path.parent
    temp = folder / f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _remove_leftovers(folder)
        with open(temp, "wb") as f:
            f.write(_PREFIX.pack(_MAGIC, len(header), zlib.crc32(header)))
            f.write(header)
            for entry, name in zip(described, names, strict=True):
                f.seek(start + entry["offset"])
                array = arrays[name]
                if isinstance(array, Pieces):
                    _write_pieces(f, name, array)
                else:
                    _write_array(f, array)
            f.truncate(start + end)  # the last array's spare rows: a hole (others' are skipped by seek)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
        _sync_folder(folder)
    except (OSError, _PiecesMismatch) as exc:
        with contextlib.suppress(OSError):
            temp.unlink()
        log.log(
            logging.WARNING if isinstance(exc, _PiecesMismatch) else logging.DEBUG,
            "index file %s not written: %s",
            path,
            exc,
        )
        return False
    return True


class _PiecesMismatch(Exception):
    """The chunks of a :class:`Pieces` did not add up to what its header said."""


def _write_array(f: BinaryIO, array: npt.NDArray[Any]) -> None:
    data = np.ascontiguousarray(array).data.cast("B")
    for at in range(0, len(data), _WRITE_BYTES):
        f.write(data[at : at + _WRITE_BYTES])


def _write_pieces(f: BinaryIO, name: str, pieces: Pieces) -> None:
    written = 0
    for chunk in pieces.chunks():
        if chunk.dtype != pieces.dtype or chunk.ndim != 1:
            raise _PiecesMismatch(f"array {name}: a chunk of {chunk.dtype} {chunk.shape}, not {pieces.dtype}")
        written += len(chunk)
        if written > pieces.length:
            break
        _write_array(f, chunk)
    if written != pieces.length:
        raise _PiecesMismatch(f"array {name}: {written} items written, {pieces.length} announced")


def _sync_folder(folder: Path) -> None:
    """Make the rename itself durable (where the platform lets a folder be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _remove_leftovers(folder: Path) -> None:
    now = time.time()
    for leftover in folder.glob(".*.tmp-*"):
        with contextlib.suppress(OSError):
            if now - leftover.stat().st_mtime > _STALE_TEMP_S:
                leftover.unlink()


def read_index(path: Path) -> IndexFile | None:
    """The file at ``path`` mapped copy-on-write, or ``None`` if there is none.

    Raises :class:`DamagedFile` when it is not exactly what a writer wrote. Arrays with a checksum are
    checked here; the large ones (a large vector matrix) are left to the caller's spot checks.
    """
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below, once mapped
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise DamagedFile(f"cannot open: {exc}") from exc
    with f:
        prefix = f.read(_PREFIX.size)
        if len(prefix) != _PREFIX.size:
            raise DamagedFile("shorter than its prefix")
        magic, header_len, header_crc = _PREFIX.unpack(prefix)
        if magic != _MAGIC:
            raise DamagedFile("not an index file (bad magic)")
        if header_len > 64 << 20:
            raise DamagedFile("header length out of range")
        header = f.read(header_len)
        if len(header) != header_len or zlib.crc32(header) != header_crc:
            raise DamagedFile("header checksum mismatch")
        try:
            parsed = json.loads(header)
            described = list(parsed["arrays"])
            data_bytes = int(parsed["data_bytes"])
            meta = dict(parsed["meta"])
            version = int(parsed["format"])
        except (ValueError, KeyError, TypeError) as exc:
            raise DamagedFile(f"unreadable header: {exc}") from exc
        if version != FORMAT:
            raise DamagedFile(f"format {version}, expected {FORMAT}")
        start = _aligned(_PREFIX.size + header_len)
        size = os.fstat(f.fileno()).st_size
        if size != start + data_bytes:
            raise DamagedFile(f"{size} bytes, expected {start + data_bytes} (truncated or extended)")
        arrays: dict[str, npt.NDArray[Any]] = {}
        if size == 0:
            return IndexFile(path, meta, arrays)
        try:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
            opened = OpenFile(f.fileno())
        except (OSError, ValueError) as exc:
            raise DamagedFile(f"cannot map: {exc}") from exc
    offsets: dict[str, int] = {}
    try:
        for entry in described:
            dtype = np.dtype(entry["dtype"])
            shape = tuple(int(n) for n in entry["shape"])
            count = int(np.prod(shape, dtype=np.int64))
            offset = start + int(entry["offset"])
            if count < 0 or offset + count * dtype.itemsize > size or dtype.hasobject:
                raise DamagedFile(f"array {entry['name']} lies outside the file")
            array = np.frombuffer(mapped, dtype=dtype, count=count, offset=offset).reshape(shape)
            if "sum64" in entry and _array_checksum(array, entry, opened.fd, offset) != int(entry["sum64"]):
                raise DamagedFile(f"array {entry['name']} checksum mismatch")
            if "crc" in entry and zlib.crc32(np.ascontiguousarray(array).data.cast("B")) != int(entry["crc"]):
                raise DamagedFile(f"array {entry['name']} checksum mismatch")  # a file of an earlier writer
            arrays[str(entry["name"])] = array
            offsets[str(entry["name"])] = offset
    except (KeyError, TypeError, ValueError) as exc:
        raise DamagedFile(f"bad array description: {exc}") from exc
    return IndexFile(path, meta, arrays, offsets, opened)


def _array_checksum(array: npt.NDArray[Any], entry: Mapping[str, Any], fd: int, offset: int) -> int:
    """The checksum of what ``entry`` says its checksum covers: the whole array, or its first
    ``sum_rows`` rows (those written; the spare rows after them are a hole), read from the file."""
    if "sum_rows" not in entry:
        return checksum(array)
    rows = int(entry["sum_rows"])
    if array.ndim == 0 or not 0 <= rows <= len(array):
        raise DamagedFile(f"array {entry['name']}: checksum of {rows} rows, it has {array.shape}")
    row_bytes = int(np.prod(array.shape[1:], dtype=np.int64)) * array.dtype.itemsize
    return _file_checksum(fd, offset, rows * row_bytes)


# -- the mirror's arrays ---------------------------------------------------------------------------


def mirror_arrays(mirror: Mirror) -> tuple[dict[str, Any], dict[str, npt.NDArray[Any]]]:
    """``mirror``'s JSON-able state and its arrays, the matrix last (the file's spare rows extend
    it): the one place that asks a mirror for what to save."""
    arrays = dict(mirror.arrays())
    matrix = arrays.pop("matrix")
    arrays["matrix"] = matrix
    return mirror.state(), arrays


# the row index is checked whole when mapped back (sorted keys, ``rowids[values] == keys``) and
# rebuilt from the checksummed rowids when it fails: a checksum would only cost time (16 MB at 1M);
# the sign codes and int8 rows are spot-checked against the matrix, as the matrix is against the
# database (a wrong code can only cost a search a candidate: hits are scored in float32); the
# sign codes' checksum was 11 of the 24 ms of mapping the file at 1M
MIRROR_UNCHECKED = ("index_keys", "index_values", "signs", "int8")


def mirror_from_arrays(
    fields: Mapping[str, Any], arrays: Mapping[str, npt.NDArray[Any]], file: FileRows | None = None
) -> Mirror:
    """The mirror :func:`mirror_arrays` described, over the mapped arrays (the matrix stays
    mapped, copy-on-write; ``file`` reads its rows without the map). Raises
    :class:`DamagedFile` when the arrays do not fit together."""
    try:
        return Mirror.from_arrays(arrays, fields, file)
    except (ValueError, TypeError, KeyError) as exc:
        raise DamagedFile(str(exc)) from exc
