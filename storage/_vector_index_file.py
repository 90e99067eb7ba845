"""The index file of a vector mirror: written beside the database, mapped by the next process.

A new process does not rebuild its mirror from SQLite when an index file is beside the database
(:mod:`._index_files`): the file is mapped, validated against the database (its token, the change
log position it reflects and that entry's random stamp, a spot check of rows) and caught up from
the log like a live mirror. The token and the position alone cannot tell a database restored from
a backup, whose later writes reach the file's position with the same rowids, from the one the
file was written for; the stamp, drawn anew for every entry, can.
Apart from :mod:`._vector_sync`, which decides when the file is written and read.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ._distinct import distinct
from ._index_files import (
    MIRROR_UNCHECKED,
    DamagedFile,
    IndexFile,
    database_token,
    ensure_token,
    index_path,
    mirror_arrays,
    mirror_from_arrays,
    persist_at_close,
    read_index,
    write_index,
)
from ._migrations import get_meta
from ._vec0_chunks import snapshot
from ._vector_freshness import _OP_RESET, _rollbacks
from ._vector_mirror import STATE_VERSION, Mirror
from ._vector_rows import MirrorRows

__all__ = ["MirrorFiles"]

_SPOT_CHECK_ROWS = 6  # rows of a mapped index file compared with the database at open (plus the
# first and the last), each from the first slot of a vec0 chunk (see _chunk_starts)
_FILE_SPARE = 0.1  # spare rows in an index file (a hole: no disk), as a share of its rows

log = logging.getLogger("memstrata.storage")


class MirrorFiles(MirrorRows):
    """Saving, validating and adopting the mirror's index file."""

    # the index file (class defaults: the subclass's constructor need not know about them)
    files_loaded = 0  # mirrors taken from the index file instead of SQLite
    files_saved = 0
    files_rejected = 0  # index files found but not used (stale, damaged, of another table)
    files_note: str | None = None  # why the index file was last not used
    last_files_seconds = 0.0
    _files_seq = -1  # change-log position of the index file this process last read or wrote
    _files_due = False  # the mirror was built here: write the file once it settles
    _files_hooked = False
    _log_stamped = False  # the change log has its ``stamp`` column (see ``_vector_sync``)

    @property
    def _files_path(self) -> Path | None:
        return index_path(self.db, f"vectors-{self.name}")

    def files_status(self) -> dict[str, Any]:
        """The index file: how often it was used, written and refused (and why, last)."""
        return {
            "path": None if self._files_path is None else str(self._files_path),
            "loaded": self.files_loaded,
            "saved": self.files_saved,
            "rejected": self.files_rejected,
            "note": self.files_note,
            "lag": self._files_lag(),
            "last_load_seconds": round(self.last_files_seconds, 4),
        }

    def _files_lag(self) -> int:
        """Change-log entries the index file is behind this mirror (0 when none is known)."""
        return 0 if self._files_seq < 0 else self._log_seq - self._files_seq

    def _hook_close(self) -> None:
        """Refresh the index file when the connection closes (weakly: a dropped index is not kept)."""
        if self._files_hooked:
            return
        self._files_hooked = True
        persist_at_close(self.db, self.persist)

    def persist(self) -> None:
        """Write the index file if this process's mirror is ahead of it by more than a next
        process would like to catch up (called at close; best effort, never raises)."""
        mirror = self._mirror
        if mirror is None or not self._has_log or self.db.read_only or self.db.in_transaction:
            return
        try:
            if not self._is_current():  # another connection wrote since: its owner refreshes the file
                return
            lag = self._files_lag()
            if self._files_due or self._files_seq < 0 or lag >= max(1_000, mirror.live // 100):
                self._save_files()  # as it is: a list build is left to the next search
        except Exception as exc:  # a cache: the next process rebuilds
            log.debug("index file of %s not refreshed: %s", self.table, exc)

    def _save_files(self) -> None:
        """Write the mirror (current, compacted) to its index file, atomically. Only for mirrors
        worth it (``_index_files.MIN_ROWS``), outside transactions, in a writable folder."""
        from . import _index_files

        self._files_due = False
        mirror, path = self._mirror, self._files_path
        if (
            mirror is None
            or path is None
            or not self._has_log
            or self.db.read_only
            or self.db.in_transaction
            or self.db.conn.in_transaction
            or mirror.live < _index_files.MIN_ROWS
            or not self._is_current()
        ):
            return
        token = ensure_token(self.db)
        if token is None:
            return
        fields, arrays = mirror_arrays(mirror)
        meta = {
            "kind": "vectors",
            "table": self.table,
            "token": token,
            "seq": self._log_seq,
            "last": self._log_entry(self._log_seq),
            "mirror": fields,
        }
        room = max(1024, int(mirror.size * _FILE_SPARE))
        spare: dict[str, int] = {name: room for name in ("int8", "matrix") if name in arrays}
        if write_index(path, meta, arrays, spare=spare, unchecked=MIRROR_UNCHECKED):
            self.files_saved += 1
            self._files_seq = self._log_seq

    def _load_files(self) -> bool:
        """Adopt the index file as the mirror if the database vouches for it (see
        :meth:`_check_file`), then catch up from the change log. False: load from SQLite."""
        path = self._files_path
        if path is None:
            return False
        started = time.perf_counter()
        generation = self._generation()
        rollbacks = _rollbacks(self.db, self.table).total
        version = self.db.data_version()
        try:
            found = read_index(path)
        except DamagedFile as exc:
            self._reject(f"index file {path} is damaged ({exc}); rebuilding it from the database", True)
            return False
        if found is None:
            return False
        with snapshot(self.db):  # the log, the rows checked and the rows re-read must agree
            stored_dim = get_meta(self.db, f"vector_dim:{self.name}")
            if stored_dim is not None and int(stored_dim) != self.dim:  # reset by another connection
                self.dim = int(stored_dim)
                self.backend = get_meta(self.db, f"vector_backend:{self.name}") or self.backend
            verdict = self._check_file(found)
            if isinstance(verdict, str):
                return False
            mirror, seq, newest, changed = verdict
            if mirror.partition is not None:
                mirror.partitions_restored += 1  # taken as saved, not built here
            if mirror.codes_missing:  # a file without them (an earlier version): write it again
                self._files_due = True
            self._mirror = mirror
            if changed:
                try:
                    self._apply_rows(changed)
                except BaseException:
                    self._mirror = None
                    raise
        self._log_seq = max(seq, newest)
        self._data_version, self._seen_generation, self._rollbacks_seen = version, generation, rollbacks
        self._files_seq = seq
        self.files_loaded += 1
        self.files_note = None
        self.last_files_seconds = time.perf_counter() - started
        self._hook_close()
        return True

    def _check_file(self, found: IndexFile) -> tuple[Mirror, int, int, list[int]] | str:
        """The file's mirror, its log position, the newest position and the rows changed since,
        or why it cannot be used (a stale file quietly, a file that contradicts the database
        with a warning)."""
        meta, path = found.meta, found.path
        token = database_token(self.db)
        if meta.get("kind") != "vectors" or meta.get("table") != self.table:
            return self._reject(f"index file {path} belongs to another table; rebuilding it", True)
        if token is None or meta.get("token") != token:
            return self._reject(f"index file {path} was written for another database", False)
        try:
            seq = int(meta["seq"])
            fields = dict(meta["mirror"])
            last = meta.get("last")
        except (KeyError, TypeError, ValueError):
            return self._reject(f"index file {path} has an unreadable header; rebuilding it", True)
        oldest, newest = self.db.query(
            f"SELECT (SELECT min(seq) FROM {self.log_table}), (SELECT max(seq) FROM {self.log_table})"
        )[0]
        oldest, newest = int(oldest or 0), int(newest or 0)
        if newest < seq:
            return self._reject(f"index file {path} is ahead of the database (restored?)", False)
        if seq > 0:
            at = self._log_entry(seq)
            if at is None or not isinstance(last, list):
                return self._reject(f"index file {path} is older than the change log reaches", False)
            if at != [*last, None][:3]:  # a file from before the stamps recorded [item, op]
                return self._reject(
                    f"index file {path} saw another history than the database's change log "
                    "(a database restored from a backup?)",
                    False,
                )
        elif newest and oldest > 1:
            return self._reject(f"index file {path} is older than the change log reaches", False)
        entries = self.db.query(f"SELECT item, op FROM {self.log_table} WHERE seq > ?", (seq,))
        if any(op == _OP_RESET for _, op in entries):
            return self._reject(f"index file {path} predates a reset of the vectors", False)
        if int(fields.get("dim", -1)) != self.dim or list(fields.get("columns", ())) != list(self.metadata):
            return self._reject(
                f"index file {path} holds {fields.get('dim')}-dimensional vectors with columns "
                f"{fields.get('columns')}, not {self.dim} with {list(self.metadata)}; rebuilding it",
                True,
            )
        if fields.get("version") != STATE_VERSION:  # another row order: not damaged, only out of date
            return self._reject(
                f"index file {path} holds a mirror of layout version {fields.get('version')!r}, "
                f"not {STATE_VERSION}; rebuilding it",
                False,
            )
        try:
            mirror = mirror_from_arrays(fields, found.arrays, found.rows("matrix"))
        except DamagedFile as exc:
            return self._reject(f"index file {path} is damaged ({exc}); rebuilding it", True)
        changed = sorted({int(item) for item, _ in entries})
        if len(changed) > max(50_000, mirror.live // 2):
            return self._reject(f"index file {path} is too far behind; rebuilding it", False)
        problem = self._spot_check(mirror, set(changed))
        if problem is not None:
            return self._reject(f"index file {path} {problem}; rebuilding it", True)
        return mirror, seq, newest, changed

    def _log_entry(self, seq: int) -> list[int | None] | None:
        """The change-log entry at ``seq`` as an index file records it: item, op and stamp (None
        for an entry from before the stamps); ``None`` when there is none."""
        stamp = "stamp" if self._log_stamped else "NULL"
        found = self.db.query(f"SELECT item, op, {stamp} FROM {self.log_table} WHERE seq = ?", (seq,))
        if not found:
            return None
        item, op, value = found[0]
        return [int(item), int(op), None if value is None else int(value)]

    def _spot_check(self, mirror: Mirror, changed: set[int]) -> str | None:
        """Compare a sample of the file's rows (not changed since) with the database: vector
        and metadata. Catches a file of other data or a damaged matrix, without reading it all."""
        size = mirror.size
        if size == 0:
            return None
        # spread evenly, first and last included (random picks would import numpy.random: ~12 ms
        # of a fresh process's first search)
        spread = np.linspace(0, 1, _SPOT_CHECK_ROWS + 2)
        picks = distinct((spread * (size - 1)).round().astype(np.int64))
        picks = picks[mirror.alive[picks]]  # a dead row may hold anything
        if self.backend == "vec0":
            picks = self._chunk_starts(mirror, spread, picks)
        wanted = [int(mirror.rowids[p]) for p in picks if int(mirror.rowids[p]) not in changed]
        if not wanted:
            return None
        rows = self._read(sorted(wanted))
        got = {int(r): i for i, r in enumerate(rows.rowids.tolist())}
        columns = list(self.metadata)
        decode = {c: {code: value for value, code in mirror.vocab[c].items()} for c in columns}
        for p in picks:
            rowid = int(mirror.rowids[p])
            if rowid in changed:
                continue
            i = got.get(rowid)
            if i is None:
                return f"holds row {rowid}, which the database does not"
            stored = rows.storage[i].astype(np.float64)
            norm = float(np.sqrt(stored @ stored))
            expected = stored / norm if norm > 0 else stored
            if float(np.max(np.abs(mirror.matrix[p] - expected))) > 1e-5:
                return f"disagrees with the database on the vector of row {rowid}"
            for c in columns:
                if decode[c].get(int(mirror.codes[c][p])) != rows.metas[c][i]:
                    return f"disagrees with the database on {c} of row {rowid}"
        return None

    def _chunk_starts(
        self, mirror: Mirror, spread: npt.NDArray[np.float64], picks: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.int64]:
        """Mirror positions of the rows in the first slot of vec0 chunks spread evenly over the
        table (else ``picks``): a row deep in a chunk is read by walking the chunk's overflow
        pages up to it (~2-15 ms at 1M rows), the first one from its first page (~0.1 ms)."""
        chunks = f"{self.table}_chunks"
        low, high = self.db.query(f"SELECT min(chunk_id), max(chunk_id) FROM {chunks}")[0]
        if low is None or high - low + 1 < len(spread):  # few chunks: each pick is cheap
            return picks
        ids = sorted({round(low + f * (high - low)) for f in spread.tolist()})
        rows = self.db.query(
            f"SELECT substr(rowids, 1, 8), substr(validity, 1, 1) FROM {chunks} "
            "WHERE chunk_id IN (SELECT value FROM json_each(?))",
            (json.dumps(ids),),
        )
        firsts = [
            int.from_bytes(rowid, "little", signed=True)
            for rowid, valid in rows
            if isinstance(rowid, bytes) and len(rowid) == 8 and isinstance(valid, bytes) and valid[:1]
            and valid[0] & 1  # the slot holds a live row
        ]  # fmt: skip
        # looked up in the file's row index without settling it (its whole check costs ~40 ms at
        # 1M rows, and a search never needs it): a wrong entry only picks another row to compare
        # (each row is compared under its own id), and the index is checked whole at first use
        keys, values = mirror.index.keys, mirror.index.values
        wanted = np.asarray(firsts, dtype=np.int64)
        at = np.minimum(np.searchsorted(keys, wanted), max(len(keys) - 1, 0))
        hit = (keys[at] == wanted) if len(keys) else np.zeros(len(wanted), dtype=bool)
        found = values[at[hit]]
        found = found[(found >= 0) & (found < mirror.size)]
        found = found[mirror.alive[found]]
        return distinct(found) if len(found) else picks

    def _reject(self, note: str, warn: bool) -> str:
        self.files_rejected += 1
        self.files_note = note
        self._files_due = self._has_log  # replaced by a good one after the rebuild
        if warn:
            log.warning("%s", note)
        return note
