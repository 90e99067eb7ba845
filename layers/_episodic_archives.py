"""Episodic archives: move or copy episodes into a single-file archive (written, synced and
checked before the live rows go), and restore an archive into any store (idempotent: the same
episode is never added twice)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from memstrata.core.errors import (
    InvalidInputError,
)
from memstrata.core.validation import (
    check_aware,
    check_tags,
    check_task_id,
)
from memstrata.storage import (
    FloatArray,
    get_meta,
)

from ._archive import ArchiveFile, describe_filter, write_archive
from ._episode_records import (
    EPISODE_COLUMNS,
    dump_tags,
    load_tags,
    query_in,
    time_conditions,
    to_us,
)
from ._episodic_inputs import _Item, _path_arg, episode_digest
from ._episodic_search import EpisodicSearch
from ._episodic_state import BULK_DELETE_MIN


class EpisodicArchives(EpisodicSearch):
    """Archive and restore (see ``EpisodicMemory``)."""

    def archive(
        self,
        path: str | os.PathLike[str],
        *,
        before: datetime | None = None,
        task_run_id: str | None = None,
        remove: bool = True,
    ) -> int:
        """Move episodes into a new archive file at ``path``; returns how many were archived.

        Selects episodes older than ``before`` (exclusive) and/or of ``task_run_id`` (all if
        neither is given). The file is written, synced and checked before the episodes are
        removed from the live store, in one transaction. With ``remove=False`` they are copied.
        Nothing matched: no file is written and 0 is returned. The archive is tracked by this
        store so ``search(include_archives=True)`` finds its episodes.
        """
        db = self._open_db()
        target = _path_arg(path, "path")
        before_us = None if before is None else to_us(check_aware(before, "before"))
        run = check_task_id(task_run_id, "task_run_id", optional=True)
        if not isinstance(remove, bool):
            raise InvalidInputError(f"remove must be True or False, got {remove!r}")
        conds, params = time_conditions(None, before_us, run)
        where = " WHERE " + " AND ".join(conds) if conds else ""
        ids = [
            int(r[0]) for r in db.query(f"SELECT e.id FROM episodes e{where} ORDER BY e.at_us, e.id", params)
        ]
        selection = describe_filter(before, run)
        return self._archive_ids(target, ids, remove=remove, selection=selection)

    def _rows(self, ids: Sequence[int]) -> list[Any]:
        rows = query_in(self._db, f"SELECT {EPISODE_COLUMNS} FROM episodes WHERE id IN", ids)
        rows.sort(key=lambda r: (r[2], r[0]))
        return rows

    def _archive_ids(
        self, path: Path, ids: Sequence[int], *, remove: bool, selection: Mapping[str, str | int]
    ) -> int:
        if not ids:
            return 0
        db = self._db
        rows = self._rows(ids)
        if remove and len(ids) >= BULK_DELETE_MIN:
            self._matrix_now()  # before the transaction: scans are slow beside many dirty pages
        ids = [int(r[0]) for r in rows]
        model = get_meta(db, "embedding_model")
        dim_text = get_meta(db, "embedding_dim")
        vectors = self._stored_vectors(ids) if model and dim_text else {}
        meta: dict[str, str | int] = {
            **selection,
            "source_store_uuid": self.store_uuid,
            "source_path": str(self.path),
        }
        now = self._now()
        self._named_here = False  # the archive names the store: its uuid is settled
        archive_uuid = write_archive(
            path,
            rows,
            vectors,
            model_id=model,
            dim=int(dim_text) if dim_text else None,
            meta=meta,
            archive_uuid=self.new_uuid(),
            created_at=now,
        )
        try:
            with db.transaction():
                db.on_rollback(self._drop_matrix)
                if remove:  # out of every search, neighbours' context included, until restored
                    self._remove(ids)
                db.execute(
                    "INSERT OR REPLACE INTO archives(path, archive_uuid, episodes, removed, first_at_us, "
                    "last_at_us, created_us) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        str(path),
                        archive_uuid,
                        len(rows),
                        int(remove),
                        rows[0][2],
                        rows[-1][2],
                        to_us(now),
                    ),
                )
                db.executemany(  # its uuids stay taken: no new episode is given one of them
                    "INSERT OR IGNORE INTO archived_episodes(uuid, digest) VALUES (?, ?)",
                    [(str(r[1]), episode_digest(r)) for r in rows],
                )
        except BaseException:
            with contextlib.suppress(OSError):
                path.unlink()  # the live store kept everything; the copy is not tracked
            raise
        return len(rows)

    def restore(self, path: str | os.PathLike[str]) -> int:
        """Bring an archive's episodes back into this store; returns how many were added.

        Idempotent: an episode is skipped when the same one (same uuid, time and contents: see
        ``episode_digest``) is live or was deleted here, so restoring twice adds nothing;
        a different episode under a uuid held here comes back under a new uuid. Into the store
        that archived them they get their original ids back; into another store, new ids. Stored
        vectors are reused when the archive was embedded by this store's model. A damaged,
        truncated or foreign file raises :class:`ArchiveError` and changes nothing.
        """
        db = self._open_db()
        target = _path_arg(path, "path")
        archive = ArchiveFile(target, verify=True)
        try:
            rows = archive.rows()
            stored = archive.vectors()
            same_store = archive.source_store_uuid == self.store_uuid
            archive_model, archive_dim = archive.model_id, archive.dim
        finally:
            archive.close()
        arriving = [
            _Item(
                uuid=str(r[1]),
                at_us=int(r[2]),
                kind=str(r[3]),
                task_run_id=r[4],
                title=r[5],
                content=str(r[6]),
                tags=dump_tags(check_tags(load_tags(r[7]))),
                recorded_us=int(r[8]),
            )
            for r in rows
        ]
        # the same episode live or deleted for good is skipped; another one under a uuid held
        # here comes back under a uuid of its own
        placed = self._resolved(arriving, bring_back=False, source=f"archive {target.name}'s episode")
        todo = [r for r, p in zip(rows, placed, strict=True) if isinstance(p, _Item)]
        items = [p for p in placed if isinstance(p, _Item)]
        if not todo:
            return 0

        vectors = self._restore_vectors(todo, stored, archive_model, archive_dim)
        with db.transaction():
            db.on_rollback(self._drop_matrix)
            keep: set[int] = set()
            if same_store:
                wanted = [int(r[0]) for r in todo]
                taken = {int(r[0]) for r in query_in(db, "SELECT id FROM episodes WHERE id IN", wanted)}
                keep = set(wanted) - taken
            next_id = max([self._next_id() - 1, *keep]) + 1
            ids: list[int] = []
            for row in todo:
                if int(row[0]) in keep:
                    ids.append(int(row[0]))
                else:
                    ids.append(next_id)
                    next_id += 1
            self._insert_rows(ids, items, vectors)
        if vectors is None and self._embedder is not None:
            self._pending_ids.update(ids)  # deferred: the owner computes them (pending_texts)
        return len(todo)

    def _restore_vectors(
        self, rows: Sequence[Any], stored: Mapping[int, bytes], model: str | None, dim: int | None
    ) -> FloatArray | None:
        """The archive's own vectors when the same model made them, else fresh ones: none when
        vectors are deferred (:attr:`defer_vectors`: the owner computes them) or no model runs."""
        embedder = self._embedder
        if embedder is not None:
            current_model, current_dim = embedder.model_id, embedder.dim
        else:  # keyword-only: keep the archive's vectors if they match what this store holds
            current_model = get_meta(self._db, "embedding_model") or ""
            current_dim = self._vectors.dim if self._vectors is not None else 0
        if model == current_model and dim == current_dim and all(int(r[0]) in stored for r in rows):
            blob = b"".join(stored[int(r[0])] for r in rows)
            return np.frombuffer(blob, dtype=np.float32).reshape(len(rows), current_dim).copy()
        if embedder is None or self.defer_vectors:
            return None
        return self._embed(embedder, [(r[5], r[6], r[2]) for r in rows])
