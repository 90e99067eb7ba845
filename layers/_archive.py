"""Episodic archives: one self-contained, portable SQLite file per archive.

An archive holds a ``metadata`` table (``format``, ``format_version``, the embedding model id
and dimension, where it came from), the ``episodes`` table with the same columns and full-text
indexes as a live store, and ``vectors`` as plain float32 blobs, so any SQLite can read it and
no extension is needed. It is written to a temporary file beside its destination, synced,
checked, and only then linked into place; an existing file is never overwritten.
"""

from __future__ import annotations

import contextlib
import os
import uuid as uuidlib
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from memstrata.core.errors import ArchiveError, MemstrataError
from memstrata.core.validation import check_category
from memstrata.storage import Database, identifier_words, open_database

from ._episode_records import (
    EPISODE_COLUMNS,
    episodes_schema,
    load_tags,
    query_in,
    to_us,
)
from ._episode_vectors import EpisodeVectors

__all__ = ["ARCHIVE_FORMAT", "ARCHIVE_VERSION", "ArchiveFile", "write_archive"]

ARCHIVE_FORMAT = "memstrata-episodic-archive"
ARCHIVE_VERSION = 1
_SQLITE_MAGIC = b"SQLite format 3\x00"

_ARCHIVE_SQL = (
    "CREATE TABLE metadata (key TEXT PRIMARY KEY, value TEXT NOT NULL);\n"
    + episodes_schema(archive=True)
    + "\nCREATE TABLE vectors (id INTEGER PRIMARY KEY REFERENCES episodes(id), embedding BLOB NOT NULL);"
)


def _fsync(path: Path, *, directory: bool = False) -> None:
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        if directory:
            return  # some platforms cannot open a directory; the file itself was synced
        raise
    try:
        os.fsync(fd)
    except OSError:
        if not directory:
            raise
    finally:
        os.close(fd)


def write_archive(
    path: Path,
    rows: Sequence[Sequence[Any]],
    vectors: Mapping[int, bytes] | None,
    *,
    model_id: str | None,
    dim: int | None,
    meta: Mapping[str, str | int],
    archive_uuid: str | None = None,
    created_at: datetime | None = None,
) -> str:
    """Write ``rows`` (selected as ``EPISODE_COLUMNS``) and their vectors to a new archive at
    ``path``; returns the archive's uuid (``archive_uuid``, random if ``None``). ``created_at``
    (default: wall time) is the store's clock, so a simulation writes the same bytes. Nothing is
    left behind if anything fails."""
    if path.exists() or path.is_symlink():
        raise ArchiveError(
            f"archive {path} already exists; an archive is never overwritten, choose a new path"
        )
    if not path.parent.is_dir():
        raise ArchiveError(f"cannot write archive {path}: folder {path.parent} does not exist")
    archive_uuid = str(uuidlib.uuid4()) if archive_uuid is None else archive_uuid
    created = datetime.now(UTC) if created_at is None else created_at.astimezone(UTC)
    tmp = path.with_name(f".{path.name}.{archive_uuid}.partial")
    try:
        db = open_database(tmp, load_vec=False)
        try:
            db.execute("PRAGMA journal_mode = DELETE")  # one file, readable anywhere
            with db.transaction():
                db.executescript(_ARCHIVE_SQL)
                info: dict[str, str | int] = {
                    **meta,
                    "format": ARCHIVE_FORMAT,
                    "format_version": ARCHIVE_VERSION,
                    "archive_uuid": archive_uuid,
                    "created_at": created.isoformat(),
                    "episodes": len(rows),
                }
                if model_id is not None and dim is not None and vectors:
                    info["embedding_model"] = model_id
                    info["embedding_dim"] = dim
                db.executemany(
                    "INSERT INTO metadata(key, value) VALUES (?, ?)", [(k, str(v)) for k, v in info.items()]
                )
                db.executemany(
                    f"INSERT INTO episodes({EPISODE_COLUMNS}, ident) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [(*r, identifier_words(f"{r[5] or ''} {r[6]}")) for r in rows],
                )
                db.execute("INSERT INTO episodes_fts(episodes_fts) VALUES ('rebuild')")
                db.execute("INSERT INTO episodes_tri(episodes_tri) VALUES ('rebuild')")
                if vectors and model_id is not None and dim is not None:
                    db.executemany(
                        "INSERT INTO vectors(id, embedding) VALUES (?, ?)",
                        [(int(r[0]), vectors[int(r[0])]) for r in rows if int(r[0]) in vectors],
                    )
        finally:
            db.close()
        _fsync(tmp)
        check = ArchiveFile(tmp, verify=True)
        try:
            if check.count != len(rows):
                raise ArchiveError(f"archive {path} was written with {check.count} of {len(rows)} episodes")
        finally:
            check.close()
        try:
            os.link(tmp, path)  # fails if ``path`` appeared meanwhile: never replace an archive
        except FileExistsError as exc:
            raise ArchiveError(f"archive {path} already exists; choose a new path") from exc
        except OSError:
            if path.exists():
                raise ArchiveError(f"archive {path} already exists; choose a new path") from None
            os.replace(tmp, path)  # a file system without hard links
        _fsync(path.parent, directory=True)
    except MemstrataError:
        raise
    except OSError as exc:
        raise ArchiveError(f"cannot write archive {path}: {exc}") from exc
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
        for suffix in ("-journal", "-wal", "-shm"):
            with contextlib.suppress(OSError):
                Path(f"{tmp}{suffix}").unlink()
    return archive_uuid


class ArchiveFile:
    """An archive opened read-only. Any problem with the file is an :class:`ArchiveError`.

    ``verify=True`` also checks page integrity and that every row is well formed (restore);
    searches use the cheaper checks only.
    """

    def __init__(self, path: Path, *, verify: bool) -> None:
        self.path = path
        self._check_header()
        try:
            self.db: Database = open_database(path, read_only=True, load_vec=False)
        except MemstrataError as exc:
            raise ArchiveError(f"{path} is not a readable episodic archive: {_reason(exc)}") from exc
        try:
            self.meta = self._read_meta()
            self.count = self._scalar("SELECT count(*) FROM episodes")
            if verify:
                self._verify()
        except BaseException:
            self.db.close()
            raise
        self.archive_uuid = self.meta.get("archive_uuid", "")
        self.source_store_uuid = self.meta.get("source_store_uuid")
        model = self.meta.get("embedding_model")
        dim_text = self.meta.get("embedding_dim", "")
        self.model_id: str | None = model
        self.dim: int | None = int(dim_text) if dim_text.isdigit() and int(dim_text) > 0 else None

    def _check_header(self) -> None:
        path = self.path
        if not path.exists():
            raise ArchiveError(f"archive {path} does not exist")
        if not path.is_file():
            raise ArchiveError(f"archive {path} is not a file")
        try:
            size = path.stat().st_size
            with path.open("rb") as handle:
                header = handle.read(100)
        except OSError as exc:
            raise ArchiveError(f"cannot read archive {path}: {exc}") from exc
        if not header.startswith(_SQLITE_MAGIC):
            raise ArchiveError(f"{path} is not an episodic archive (not an SQLite file)")
        if len(header) < 100:
            raise ArchiveError(f"archive {path} is truncated ({size} bytes)")
        page_size = int.from_bytes(header[16:18], "big")
        page_size = 65536 if page_size == 1 else page_size
        pages = int.from_bytes(header[28:32], "big")
        valid_for = int.from_bytes(header[92:96], "big")
        change_counter = int.from_bytes(header[24:28], "big")
        if page_size and pages and valid_for == change_counter and size < page_size * pages:
            raise ArchiveError(
                f"archive {path} is truncated: {size} bytes, its header says {page_size * pages}"
            )

    def _scalar(self, sql: str, params: Sequence[Any] = ()) -> int:
        try:
            return int(self.db.scalar(sql, params) or 0)
        except MemstrataError as exc:
            raise ArchiveError(f"archive {self.path} is damaged: {_reason(exc)}") from exc

    def _read_meta(self) -> dict[str, str]:
        try:
            tables = {str(r[0]) for r in self.db.query("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "metadata" not in tables:
                raise ArchiveError(f"{self.path} is not an episodic archive (it has no metadata table)")
            meta = {str(k): str(v) for k, v in self.db.query("SELECT key, value FROM metadata")}
        except MemstrataError as exc:
            if isinstance(exc, ArchiveError):
                raise
            raise ArchiveError(f"archive {self.path} is damaged: {_reason(exc)}") from exc
        fmt = meta.get("format")
        if fmt != ARCHIVE_FORMAT:
            if fmt is None and meta.get("schema_kind"):
                raise ArchiveError(
                    f"{self.path} is not an episodic archive (it is a live {meta['schema_kind']!r} store)"
                )
            raise ArchiveError(f"{self.path} has unknown format {fmt!r}; expected {ARCHIVE_FORMAT!r}")
        version = meta.get("format_version", "")
        if not version.isdigit() or int(version) < 1:
            raise ArchiveError(f"archive {self.path} has an invalid format_version {version!r}")
        if int(version) > ARCHIVE_VERSION:
            raise ArchiveError(
                f"archive {self.path} has format_version {version}, newer than this memstrata reads "
                f"({ARCHIVE_VERSION}); upgrade memstrata"
            )
        missing = {"episodes", "vectors", "episodes_fts", "episodes_tri"} - tables
        if missing:
            raise ArchiveError(f"archive {self.path} lacks table(s) {', '.join(sorted(missing))}")
        return meta

    def _verify(self) -> None:
        try:
            problems = [str(r[0]) for r in self.db.query("PRAGMA quick_check")]
        except MemstrataError as exc:
            raise ArchiveError(f"archive {self.path} is damaged or truncated: {_reason(exc)}") from exc
        if problems != ["ok"]:
            raise ArchiveError(f"archive {self.path} is damaged or truncated: {problems[0]}")
        declared = self.meta.get("episodes", "")
        if declared.isdigit() and int(declared) != self.count:
            raise ArchiveError(
                f"archive {self.path} holds {self.count} episodes but its metadata says {declared}"
            )

    # -- contents ------------------------------------------------------------------------------

    def rows(self) -> list[tuple[Any, ...]]:
        """Every episode as a checked ``EPISODE_COLUMNS`` tuple, oldest first."""
        try:
            raw = self.db.query(f"SELECT {EPISODE_COLUMNS} FROM episodes ORDER BY at_us, id")
        except MemstrataError as exc:
            raise ArchiveError(f"archive {self.path} is damaged: {_reason(exc)}") from exc
        return [self._checked(n, r) for n, r in enumerate(raw)]

    def _checked(self, n: int, row: Sequence[Any]) -> tuple[Any, ...]:
        ident, uuid, at_us, kind, run, title, content, tags, recorded = row
        try:
            ok = (
                isinstance(ident, int)
                and isinstance(uuid, str)
                and bool(uuid)
                and isinstance(at_us, int)
                and isinstance(recorded, int)
                and isinstance(content, str)
                and bool(content)
                and (run is None or isinstance(run, str))
                and (title is None or isinstance(title, str))
                and isinstance(tags, str)
            )
            if ok:
                check_category(kind, "kind")
                load_tags(tags)
        except (MemstrataError, ValueError):
            ok = False
        if not ok:
            raise ArchiveError(f"archive {self.path}: episode row {n + 1} (id {ident!r}) is malformed")
        return tuple(row)

    def vectors(self) -> dict[int, bytes]:
        """Stored vectors by episode id (empty when the archive has none or no model is recorded)."""
        if self.dim is None or self.model_id is None:
            return {}
        try:
            rows = self.db.query("SELECT id, embedding FROM vectors")
        except MemstrataError as exc:
            raise ArchiveError(f"archive {self.path} is damaged: {_reason(exc)}") from exc
        size = self.dim * 4
        out: dict[int, bytes] = {}
        for ident, blob in rows:
            if not isinstance(blob, bytes) or len(blob) != size:
                raise ArchiveError(
                    f"archive {self.path}: the vector of episode {ident} is not {self.dim} floats"
                )
            out[int(ident)] = blob
        return out

    def matrix(self) -> EpisodeVectors | None:
        """The archive's vectors with times and task runs, for exact search."""
        if self.dim is None or self.model_id is None:
            return None
        try:
            rows = self.db.query(
                "SELECT e.id, e.at_us, e.task_run_id, v.embedding "
                "FROM vectors v JOIN episodes e ON e.id = v.id"
            )
        except MemstrataError as exc:
            raise ArchiveError(f"archive {self.path} is damaged: {_reason(exc)}") from exc
        size = self.dim * 4
        rows = [r for r in rows if isinstance(r[3], bytes) and len(r[3]) == size]
        matrix = EpisodeVectors(self.dim)
        if rows:
            vectors = np.frombuffer(b"".join(r[3] for r in rows), dtype=np.float32).reshape(
                len(rows), self.dim
            )
            matrix.add([int(r[0]) for r in rows], vectors, [int(r[1]) for r in rows], [r[2] for r in rows])
        return matrix

    def uuids(self, ids: Sequence[int]) -> dict[int, str]:
        rows = query_in(self.db, "SELECT id, uuid FROM episodes WHERE id IN", ids)
        return {int(i): str(u) for i, u in rows}

    def close(self) -> None:
        self.db.close()


def _reason(exc: BaseException) -> str:
    cause = exc.__cause__
    return str(cause) if cause is not None else str(exc)


def describe_filter(before: datetime | None, task_run_id: str | None) -> dict[str, str | int]:
    """Archive metadata saying which episodes were selected."""
    meta: dict[str, str | int] = {}
    if before is not None:
        meta["selected_before_us"] = to_us(before)
    if task_run_id is not None:
        meta["selected_task_run_id"] = task_run_id
    return meta
