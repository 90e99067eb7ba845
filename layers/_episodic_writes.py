"""Episodic writes and reads by id or time: record (embedding title and content, or taking
the caller's vector), get, count, timeline and delete."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import numpy as np

from memstrata.core.constants import MAX_TITLE_CHARS
from memstrata.core.errors import (
    EmbeddingError,
    InvalidInputError,
)
from memstrata.core.validation import (
    check_aware,
    check_category,
    check_content,
    check_optional_text,
    check_tags,
    check_task_id,
    check_time_range,
)
from memstrata.storage import FloatArray

from ._common import next_id_at_least
from ._episode_records import (
    EPISODE_COLUMNS,
    Episode,
    context_holders,
    dump_tags,
    episode_from_row,
    has_context,
    query_in,
    refresh_context,
    time_conditions,
    to_us,
)
from ._episodic_base import EpisodicBase, log
from ._episodic_inputs import _RECORD_KEYS, _Item, episode_digest, renamed_uuid
from ._episodic_state import Held, held_episodes, held_uuids


class EpisodicWrites(EpisodicBase):
    """Records, reads and deletes live episodes (see ``EpisodicMemory``)."""

    def _item(
        self,
        content: object,
        title: object,
        task_run_id: object,
        tags: object,
        kind: object,
        at: object,
        prefix: str = "",
        now: datetime | None = None,
        vector: object = None,
    ) -> _Item:
        now = self._now() if now is None else now
        when = now if at is None else check_aware(at, f"{prefix}at")
        return _Item(
            uuid="",  # drawn when it is written: see _fresh_uuids
            at_us=to_us(when),
            kind=check_category(kind, f"{prefix}kind"),
            task_run_id=check_task_id(task_run_id, f"{prefix}task_run_id", optional=True),
            title=check_optional_text(title, f"{prefix}title", max_chars=MAX_TITLE_CHARS),
            content=check_content(content, f"{prefix}content", max_bytes=self._config.max_content_bytes),
            tags=dump_tags(check_tags(tags, f"{prefix}tags")),
            recorded_us=to_us(now),
            vector=self._checked_vector(vector, f"{prefix}vector"),
        )

    def _checked_vector(self, vector: object, name: str) -> FloatArray | None:
        """A caller's vector for an episode, unit length; ``None`` in keyword-only mode (there is
        no model it could belong to)."""
        if vector is None or self._embedder is None:
            return None
        dim = self._embedder.dim
        try:
            array = np.asarray(vector, dtype=np.float32).reshape(-1)
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"{name} must be an array of {dim} numbers: {exc}") from exc
        norm = float(np.linalg.norm(array)) if array.shape == (dim,) else 0.0
        if array.shape != (dim,) or not math.isfinite(norm) or norm == 0.0:
            raise InvalidInputError(
                f"{name} must be {dim} finite numbers, not all zero (a vector of the store's model "
                f"{self._embedder.model_id!r}); got shape {array.shape}"
            )
        unit: FloatArray = (array / norm).astype(np.float32)
        return unit

    def record(
        self,
        content: str,
        *,
        title: str | None = None,
        task_run_id: str | None = None,
        tags: Mapping[str, str] | None = None,
        kind: str = "note",
        at: datetime | None = None,
        vector: FloatArray | None = None,
    ) -> int:
        """Store one episode; returns its id once the write is committed.

        ``at`` must be timezone-aware (default: the clock's now). ``kind`` is a short label such
        as ``note``, ``observation`` or ``task-outcome`` (``[a-z0-9][a-z0-9_-]{0,63}``).
        ``vector``: the episode's vector, already computed with the store's model (e.g. shared
        with a knowledge entry of the same text), instead of embedding title and content;
        ignored in keyword-only mode.
        """
        self._open_db()
        return self._insert([self._item(content, title, task_run_id, tags, kind, at, vector=vector)])[0]

    def record_many(self, items: Iterable[Mapping[str, Any]]) -> list[int]:
        """Store many episodes in one transaction with one embedding batch; returns their ids.

        Each item is a mapping with :meth:`record`'s keyword names (``content`` required). All
        items are checked before anything is written.
        """
        self._open_db()
        if isinstance(items, str | bytes | Mapping) or not isinstance(items, Iterable):
            raise InvalidInputError(f"items must be an iterable of mappings, got {type(items).__name__}")
        now = self._now()
        checked: list[_Item] = []
        for n, item in enumerate(items):
            if not isinstance(item, Mapping):
                raise InvalidInputError(f"items[{n}] must be a mapping, got {type(item).__name__}")
            unknown = set(item) - _RECORD_KEYS
            if unknown:
                raise InvalidInputError(f"items[{n}] has unknown key(s) {sorted(map(str, unknown))}")
            if "content" not in item:
                raise InvalidInputError(f"items[{n}] lacks 'content'")
            checked.append(
                self._item(
                    item["content"],
                    item.get("title"),
                    item.get("task_run_id"),
                    item.get("tags"),
                    item.get("kind", "note"),
                    item.get("at"),
                    prefix=f"items[{n}].",
                    now=now,
                    vector=item.get("vector"),
                )
            )
        return self._insert(checked)

    def _indexed(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """Episode rows (as :meth:`_Item.row`) just inserted: their full-text rows, one statement
        per index for them all (no per-row insert trigger since migration 4), then the keyword
        index's caches. Updates and deletes keep their triggers."""
        fts = [(r[0], r[6], r[5], r[9]) for r in rows]  # id, content, title, ident
        for index in ("episodes_fts", "episodes_tri"):
            self._db.executemany(
                f"INSERT INTO {index}(rowid, content, title, ident) VALUES (?, ?, ?, ?)", fts
            )
        super()._indexed(rows)

    def _next_id(self) -> int:
        return 1 + int(
            self._db.scalar(
                "SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'episodes'), 0), "
                "coalesce((SELECT max(id) FROM episodes), 0))"
            )
        )

    def next_id_at_least(self, episode_id: int) -> None:
        """The next new episode takes at least ``episode_id`` (an import keeping the ids of an
        export, gaps included); ids already given out are never given again."""
        next_id_at_least(self._open_db(), "episodes", episode_id)

    def _insert(self, items: Sequence[_Item], vectors: FloatArray | None = None) -> list[int]:
        if not items:
            return []
        db = self._db
        embedder = self._embedder
        embedded = False
        deferred = self.defer_vectors and any(i.vector is None for i in items)  # the owner embeds them
        if vectors is None and embedder is not None and not deferred:
            rows = [i.vector for i in items]
            todo = [n for n, row in enumerate(rows) if row is None]  # the others came with a vector
            try:
                if todo:
                    computed = self._embed(
                        embedder, [(items[n].title, items[n].content, items[n].at_us) for n in todo]
                    )
                    for row, n in zip(computed, todo, strict=True):
                        rows[n] = row
                    embedded = True
                vectors = np.stack([row for row in rows if row is not None]).astype(np.float32, copy=False)
            except EmbeddingError as exc:  # the episodes are stored anyway; their vectors are pending
                self._last_error = str(exc)
                log.warning("episodic %s: storing without vectors, the embedder failed: %s", self.path, exc)
        with db.transaction():
            db.on_rollback(self._drop_matrix)
            drawn = iter(self._fresh_uuids(sum(1 for i in items if not i.uuid)))
            for item in items:
                item.uuid = item.uuid or next(drawn)
            start = self._next_id()
            ids = list(range(start, start + len(items)))
            self._insert_rows(ids, items, vectors)
        if vectors is None and embedder is not None:
            self._pending_ids.update(ids)
        elif embedded and self._pending_ids:  # the model works again: catch up (bounded per write)
            self._embed_missing(sorted(self._pending_ids)[:1000])
        return ids

    def _fresh_uuids(self, count: int) -> list[str]:
        """``count`` uuids from :attr:`new_uuid` that name nothing this store holds (live, deleted
        or archived): a seeded source goes on past those a snapshot of another run with the same
        seed brought in, so the uuids stay a function of the seed and what is stored."""
        fresh: list[str] = []
        drawn: set[str] = set()
        while len(fresh) < count:
            batch = [self.new_uuid() for _ in range(count - len(fresh))]
            repeated = [u for n, u in enumerate(batch) if u in drawn or u in batch[:n]]
            if repeated:
                raise InvalidInputError(f"new_uuid gave the uuid {repeated[0]!r} twice: it must never repeat")
            drawn.update(batch)
            held = held_uuids(self._db, batch)
            fresh += [u for u in batch if u not in held]
        return fresh

    def _resolved(self, items: Sequence[_Item], *, bring_back: bool, source: str) -> list[_Item | int | None]:
        """Episodes that come with a uuid (an import's, an archive's), checked against what the
        store holds: the item to write, under a new uuid (:func:`renamed_uuid`, with a warning)
        when its own names another episode here; or, for the same episode (same uuid and
        digest) already live, its id; for the same episode deleted here, ``None`` unless
        ``bring_back`` (an import brings back what its backup holds; a restore does not)."""
        uuids = [i.uuid for i in items]
        found = held_episodes(self._db, uuids)
        known: dict[str, Held | None] = {u: found.get(u) for u in uuids}
        out: list[_Item | int | None] = []
        for item in items:
            digest = item.digest()
            uuid, holder = self._placed(item.uuid, digest, known)
            if holder is not None and (holder[0] == "live" or (holder[0] == "deleted" and not bring_back)):
                out.append(holder[2])
                continue
            if uuid != item.uuid:
                log.warning(
                    "episodic %s: %s uuid %s names another episode here: kept under uuid %s",
                    self.path,
                    source,
                    item.uuid,
                    uuid,
                )
            item.uuid = uuid
            known[uuid] = ("live", digest, None)  # the same one twice in this call: written once
            out.append(item)
        return out

    def _placed(self, uuid: str, digest: str, known: dict[str, Held | None]) -> tuple[str, Held | None]:
        """The uuid an episode with ``digest`` arriving under ``uuid`` takes: its own, unless
        another episode holds it here (then one derived from both, checked in turn); with what
        holds it here, the same episode, if anything. ``known`` keeps what was looked up."""
        while True:
            if uuid not in known:
                known[uuid] = held_episodes(self._db, [uuid]).get(uuid)
            holder = known[uuid]
            if holder is None or holder[1] is None or holder[1] == digest:  # free, or the same one
                return uuid, holder
            uuid = renamed_uuid(uuid, digest)  # another episode: never lost, never merged

    def record_known(
        self,
        content: str,
        *,
        uuid: str | None,
        at: datetime,
        title: str | None = None,
        task_run_id: str | None = None,
        tags: Mapping[str, str] | None = None,
        kind: str = "note",
        id_at_least: int | None = None,
    ) -> tuple[int | None, bool]:
        """Store an episode that has a uuid already (an import's); returns its id here (``None``:
        the same episode was deleted here and stays deleted) and whether it was added.

        The same episode already live is not added again; a deleted one comes back under its
        uuid; a different episode under a uuid held here is kept under a new one. ``uuid`` None
        draws a new one; ``id_at_least``: what :meth:`next_id_at_least` takes, when it is added.
        """
        self._open_db()
        item = self._item(content, title, task_run_id, tags, kind, at)
        if uuid:
            item.uuid = uuid
            placed = self._resolved([item], bring_back=True, source="an imported episode's")[0]
            if not isinstance(placed, _Item):
                return placed, False
        if id_at_least is not None:
            self.next_id_at_least(id_at_least)
        return self._insert([item])[0], True

    # -- reading -------------------------------------------------------------------------------

    def get(self, episode_id: int) -> Episode | None:
        """The live episode with this id, or ``None``."""
        db = self._open_db()
        if isinstance(episode_id, bool) or not isinstance(episode_id, int):
            raise InvalidInputError(f"episode_id must be an integer, got {episode_id!r}")
        row = db.execute(f"SELECT {EPISODE_COLUMNS} FROM episodes WHERE id = ?", (episode_id,)).fetchone()
        return None if row is None else episode_from_row(row)

    def deleted_uuids(self, uuids: Iterable[str]) -> set[str]:
        """Those of ``uuids`` whose episode was deleted (see :meth:`delete`)."""
        db = self._open_db()
        sql = "SELECT uuid FROM deleted_episodes WHERE uuid IN"
        return {str(r[0]) for r in query_in(db, sql, list(uuids))}

    def count(self) -> int:
        """Live episodes (archived ones are not counted)."""
        return int(self._open_db().scalar("SELECT count(*) FROM episodes"))

    def _bounds(self, since: object, until: object) -> tuple[int | None, int | None]:
        first = None if since is None else check_aware(since, "since")
        last = None if until is None else check_aware(until, "until")
        check_time_range(first, last)
        return (None if first is None else to_us(first)), (None if last is None else to_us(last))

    def timeline(
        self,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        task_run_id: str | None = None,
        limit: int | None = 100,
        newest_first: bool = False,
        offset: int = 0,
    ) -> list[Episode]:
        """Live episodes in time order, oldest first (``since`` inclusive, ``until`` exclusive).

        ``limit`` caps the count (``None``: all); ``newest_first=True`` returns the most recent
        ones, newest first; ``offset`` skips that many first (pages of a long timeline).
        """
        db = self._open_db()
        since_us, until_us = self._bounds(since, until)
        run = check_task_id(task_run_id, "task_run_id", optional=True)
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise InvalidInputError(f"limit must be a non-negative integer or None, got {limit!r}")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise InvalidInputError(f"offset must be a non-negative integer, got {offset!r}")
        conds, params = time_conditions(since_us, until_us, run)
        where = " WHERE " + " AND ".join(conds) if conds else ""
        order = "DESC" if newest_first else "ASC"
        sql = f"SELECT {EPISODE_COLUMNS} FROM episodes e{where} ORDER BY e.at_us {order}, e.id {order}"
        if limit is not None or offset:
            sql += " LIMIT ? OFFSET ?"
            params += [-1 if limit is None else limit, offset]
        return [episode_from_row(r) for r in db.query(sql, params)]

    def delete(self, episode_id: int) -> bool:
        """Delete a live episode for good: its row, vector and full-text entries, and its words
        in its neighbours' conversation context. True if it existed.

        Its uuid is remembered: an archive file written before keeps its copy (archives never
        change once written), but ``search(include_archives=True)`` drops that copy and
        :meth:`restore` skips it, so no search and no archive brings it back.
        """
        db = self._open_db()
        if isinstance(episode_id, bool) or not isinstance(episode_id, int):
            raise InvalidInputError(f"episode_id must be an integer, got {episode_id!r}")
        with db.transaction():
            row = db.execute(f"SELECT {EPISODE_COLUMNS} FROM episodes WHERE id = ?", (episode_id,)).fetchone()
            if row is None:
                return False
            db.execute(
                "INSERT OR REPLACE INTO deleted_episodes(uuid, deleted_us, digest) VALUES (?, ?, ?)",
                (str(row[1]), to_us(self._now()), episode_digest(row)),
            )
            self._remove([episode_id])
        return True

    def _remove(self, ids: Sequence[int]) -> None:
        """Take the live episodes ``ids`` out, inside the caller's transaction: their rows,
        vectors and full-text entries, and their words in their neighbours' conversation context
        (refreshed as it now is), so nothing finds them until they are restored. What
        :meth:`delete`, archiving and retention all do."""
        db = self._db
        ordered = sorted(ids)  # ascending ids: the full-text indexes' deletes cost ~25% less
        near = context_holders(db, ordered) if has_context(db) else []  # before they go
        db.on_rollback(self._drop_matrix)
        query_in(db, "DELETE FROM episodes WHERE id IN", ordered)
        self._unindexed(ordered)
        self._delete_vectors(ordered)
        if self._matrix is not None:
            self._matrix.remove(ordered)
        self._pending_ids.difference_update(ordered)
        refresh_context(db, near)
