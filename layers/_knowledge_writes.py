"""Knowledge writes: add and bulk add, checked item by item and deduplicated by content,
category and scope, in batches that keep the full-text, BM25 and vector indexes in step (update
and delete of stored entries: ``_knowledge_edits.py``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from memstrata.core.constants import MAX_TAGS
from memstrata.core.errors import InvalidInputError, StorageError
from memstrata.core.validation import (
    check_author,
    check_category,
    check_content,
    check_scope,
    check_tags,
    check_timestamp,
    is_plain_content,
)
from memstrata.storage import FloatArray, bulk_cache, precomputed_vectors

from ._knowledge_base import KnowledgeBase
from ._knowledge_bulk import Ahead, OwnRows, Prepared, cycles_paused, prepare
from ._knowledge_rows import RowPlan, row_insert, row_plan, row_statement
from ._knowledge_schema import (
    ALLOWED_ITEM_KEYS,
    BATCH,
    BULK_BATCH,
    HASH_KEY,
    HASH_KEY_BYTES,
    TABLE,
    _cjk_text,
    _Item,
    _merge_into,
    _tag_text,
)


class KnowledgeWrites(KnowledgeBase):
    """Adds entries, one or in bulk (see ``KnowledgeStore``)."""

    def add(
        self,
        content: str,
        *,
        category: str = "pattern",
        tags: Mapping[str, str] | Sequence[str] | None = None,
        scope: str = "/",
        author: str | None = None,
        at: float | None = None,
    ) -> int:
        """Store one entry and return its id. The same content, category and scope as an existing
        entry returns that entry's id: its ``updated_at`` is refreshed and the given tags are
        merged into its tags (a given key's value replaces the old one; other keys stay).

        ``at``: when the write was made (UNIX seconds; ``None``: the store's clock now), for a
        write made before it reaches the store (a write-back, dated when its outbox acknowledged
        it). An entry's ``created_at`` is the earliest time its content was written and
        ``updated_at`` the latest, whatever order the writes arrive in: a write dated before
        the entry's ``updated_at`` leaves it as it is."""
        self._open_db()
        item = {"content": content, "category": category, "tags": tags, "scope": scope, "author": author}
        checked = [self._check_item(item, "")]
        return self._write(checked, times=None if at is None else [_checked_time(at, "at")])[0]

    def add_many(
        self,
        items: Iterable[Mapping[str, Any]],
        *,
        vectors: Any = None,
        times: Sequence[float | None] | None = None,
    ) -> list[int]:
        """Store many entries (mappings with :meth:`add`'s keyword names); ids in input order.

        Every item is checked before anything is written. Embedding is batched; writes are one
        transaction per batch (1000 entries, or :data:`BULK_BATCH` with ``vectors``).

        ``vectors``: precomputed vectors of the store's model, one row per item (shape
        ``(len(items), dim)``, finite, non-zero; normalised here), so the model is not called:
        the bulk-import path. A row whose item is a duplicate of a stored entry is not used
        (the entry keeps its vector). While the store cannot write vectors (keyword-only, a
        model change not finished) the rows are stored with their vectors pending instead.
        With ``vectors``, the next batch is prepared on a worker thread while one is written,
        and Python's cyclic garbage collector is paused until the call returns (process-wide:
        its passes over the load's live objects cost ~7 % of a 100k load).

        ``times``: each item's :meth:`add` ``at`` (one per item, ``None``: the store's clock).
        """
        self._open_db()
        if isinstance(items, str | bytes) or not isinstance(items, Iterable):
            raise InvalidInputError(f"items must be an iterable of mappings, got {type(items).__name__}")
        if vectors is None:  # the model's time dwarfs the rest
            checked = self._check_items(items)
            return self._write(checked, times=_checked_times(times, len(checked), "times"))
        with cycles_paused():
            checked = self._check_items(items)
            stamps = _checked_times(times, len(checked), "times")
            return self._write(checked, precomputed_vectors(vectors, len(checked), self._store_dim()), stamps)

    def _check_items(self, items: Iterable[Any]) -> list[_Item]:
        """Every item checked (see :meth:`_check_item`). The common item (a dict of ASCII
        content, a category and scope already found valid, no tags or author) takes a shortcut
        that accepts exactly what the full check accepts unchanged; any other goes the full way,
        which names the item in its error."""
        checked: list[_Item] = []
        seen: dict[tuple[str, str], str] = {}
        limit = self._max_bytes
        for index, item in enumerate(items):
            if type(item) is dict and item.keys() <= ALLOWED_ITEM_KEYS:
                content = item.get("content")
                category = item.get("category", "pattern")
                scope = item.get("scope", "/")
                if (
                    is_plain_content(content, max_bytes=limit)
                    and type(category) is str
                    and (checked_category := seen.get(("c", category))) is not None
                    and type(scope) is str
                    and (checked_scope := seen.get(("s", scope))) is not None
                    and item.get("tags") is None
                    and item.get("author") is None
                ):
                    checked.append(_Item(content, checked_category, {}, checked_scope, None))
                    continue
            if not isinstance(item, Mapping):
                raise InvalidInputError(f"items[{index}] must be a mapping, got {type(item).__name__}")
            checked.append(self._check_item(item, f"items[{index}].", seen))
        return checked

    def _store_dim(self) -> int | None:
        if self._vectors is not None:
            return self._vectors.dim
        return None if self._embedder is None else self._embedder.dim

    def _write(
        self,
        checked: list[_Item],
        given: tuple[FloatArray, npt.NDArray[np.float64]] | None = None,
        times: list[float | None] | None = None,
    ) -> list[int]:
        self._refresh_foreign()
        if self._rebuild_needed and checked:
            self._try_rebuild()
        ids: list[int] = []
        embedded_ok = True
        size = BATCH if given is None else BULK_BATCH
        own = OwnRows() if len(checked) > size else None

        def prepare_from(start: int) -> Prepared:
            return prepare(checked[start : start + size], given, start, start + size)

        ahead = Ahead(prepare_from, range(0, len(checked), size))
        with bulk_cache(self._db, len(checked)), contextlib.closing(ahead):
            for start, ready in ahead:
                batch = checked[start : start + size]
                stamps = None if times is None else times[start : start + size]
                batch_ids, ok = self._add_batch(batch, ready.part, own, ahead.start_next, ready, stamps)
                ahead.start_next()  # no new row in the batch: not started yet
                ids.extend(batch_ids)
                embedded_ok = embedded_ok and ok
        if embedded_ok and checked:
            self._catch_up()
        return ids

    def _check_item(
        self, item: Mapping[str, Any], where: str, seen: dict[tuple[str, str], str] | None = None
    ) -> _Item:
        """One item checked; ``seen`` remembers categories and scopes already found valid (a
        bulk load repeats a few of them: each is checked once)."""
        if not ALLOWED_ITEM_KEYS.issuperset(item):
            unknown = set(item) - ALLOWED_ITEM_KEYS
            raise InvalidInputError(
                f"{where.rstrip('.') or 'item'} has unknown key(s) {sorted(map(str, unknown))}; "
                f"allowed: {', '.join(sorted(ALLOWED_ITEM_KEYS))}"
            )
        if "content" not in item:
            raise InvalidInputError(f"{where.rstrip('.') or 'item'} has no 'content'")
        category = item.get("category", "pattern")
        scope = item.get("scope", "/")
        category = "pattern" if category is None else category
        scope = "/" if scope is None else scope
        seen = {} if seen is None else seen
        if type(category) is not str or (checked_category := seen.get(("c", category))) is None:
            checked_category = check_category(category, name=f"{where}category")
            seen[("c", checked_category)] = checked_category
        if type(scope) is not str or (checked_scope := seen.get(("s", scope))) is None:
            checked_scope = check_scope(scope, name=f"{where}scope")
            if type(scope) is str:
                seen[("s", scope)] = checked_scope
        tags = item.get("tags")
        author = item.get("author")
        return _Item(
            content=check_content(item["content"], max_bytes=self._max_bytes, name=f"{where}content"),
            category=checked_category,
            tags={} if tags is None else check_tags(tags, name=f"{where}tags"),
            scope=checked_scope,
            author=None if author is None else check_author(author, name=f"{where}author"),
        )

    def _existing(self, items: Sequence[_Item]) -> dict[tuple[bytes, str, str], int]:
        """Ids of stored entries with the content of ``items``, by (hash, category, scope); an
        entry with the same content elsewhere is also listed under (hash, "", "")."""
        found: dict[tuple[bytes, str, str], int] = {}
        hashes = list(dict.fromkeys(i.hash for i in items))
        for start in range(0, len(hashes), 500):
            chunk = hashes[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for row_id, digest, category, scope in self._db.query(
                f"SELECT id, content_hash, category, scope FROM {TABLE} WHERE {HASH_KEY} IN ({marks})",
                [h[:HASH_KEY_BYTES] for h in chunk],
            ):  # a row whose hash only starts alike is listed under its own hash: never matched
                found[(bytes(digest), category, scope)] = int(row_id)
                found.setdefault((bytes(digest), "", ""), int(row_id))
        return found

    def _add_batch(
        self,
        batch: list[_Item],
        given: FloatArray | None,
        own: OwnRows | None = None,
        window: Callable[[], None] | None = None,
        ready: Prepared | None = None,
        times: list[float | None] | None = None,
    ) -> tuple[list[int], bool]:
        """Write one prepared batch (``_Item.prepare``; with its precomputed vectors, if
        ``given``); returns its ids and whether its embedding succeeded. ``own``: see
        :class:`OwnRows`; ``window``: called before the statements that run without the GIL;
        ``ready``: the batch as :func:`prepare` left it; ``times``: each item's time (see
        :meth:`add`)."""
        vectors: dict[tuple[bytes, str, str], FloatArray] = {}
        embedded_ok = True
        keys = [item.key for item in batch] if ready is None else ready.keys
        unique = len(set(keys)) == len(keys) if ready is None else ready.unique
        if given is not None:
            if self._vectors_writable():  # a duplicate merges into the first: reversed, it comes last
                vectors = dict(zip(reversed(keys), given[::-1], strict=True))
        else:
            embedded_ok = self._embed_batch(batch, vectors)
        now = self.clock()
        with self._db.transaction():
            # authoritative, under the write lock
            if own is not None and own.usable(self._db, self._empty):
                existing = own.ids
            else:
                existing = self._existing(batch)
            next_id = self._next_id()
            new_rows: dict[tuple[bytes, str, str], tuple[int, _Item]] = {}
            refresh: dict[int, _Item] = {}
            ids: list[int] = []
            rest, plan = batch, None
            if unique and existing.keys().isdisjoint(keys):
                # every item new (a bulk load's common batch): what the loop below gives, at C speed
                ids = list(range(next_id, next_id + len(batch)))
                new_rows = dict(zip(keys, zip(ids, batch, strict=True), strict=True))
                rest, plan = [], None if ready is None else ready.plan
            for item in rest:
                if item.key in existing:
                    row_id = existing[item.key]
                    _merge_into(refresh, row_id, item)
                elif item.key in new_rows:
                    row_id, first = new_rows[item.key]
                    if item.tags:
                        first.tags = {**first.tags, **item.tags}  # items are never shared: rebinding is safe
                        _check_merged(len(first.tags), "items of one batch alike: merging their tags")
                        first.retag()
                    first.author = first.author or item.author
                else:
                    row_id = next_id
                    next_id += 1
                    new_rows[item.key] = (row_id, item)
                ids.append(row_id)
            spans = _spans(ids, times, now)
            base = now if spans is None else _common_time(spans, now)
            if new_rows:
                # every item new, in order: the given rows are the new rows' vectors as they are
                whole = given if given is not None and vectors and len(new_rows) == len(batch) else None
                self._insert_rows(new_rows, vectors, base, window, whole, plan)
                if spans is not None:
                    self._date_rows({r: spans[r] for r, _ in new_rows.values() if spans[r] != (base, base)})
            if refresh:
                self._refresh_rows(refresh, {r: (now, now) if spans is None else spans[r] for r in refresh})
        if own is not None and not own.off:
            own.ids.update((key, row_id) for key, (row_id, _) in new_rows.items())
            own.settle(self._db)
        return ids, embedded_ok

    def _empty(self) -> bool:
        return self._db.scalar(f"SELECT 1 FROM {TABLE} LIMIT 1") is None

    def _embed_batch(self, batch: list[_Item], vectors: dict[tuple[bytes, str, str], FloatArray]) -> bool:
        """Fill ``vectors`` for the batch's new entries; False when the model failed."""
        if not self._vectors_writable():
            return True
        assert self._vectors is not None
        existing = self._existing(batch)
        fresh: dict[tuple[bytes, str, str], _Item] = {}
        for item in batch:
            if item.key not in existing and item.key not in fresh:
                fresh[item.key] = item
        for key in list(fresh):  # the same content stored in another category or scope
            sibling = existing.get((key[0], "", ""))
            stored = None if sibling is None else self._vectors.get(sibling)
            if stored is not None:
                vectors[key] = stored
        keys = [k for k in fresh if k not in vectors]
        if not keys:
            return True
        array = self._embed([fresh[k].content for k in keys])
        if array is None:
            return False
        vectors.update(zip(keys, array, strict=True))
        return True

    def _next_id(self) -> int:
        seq = self._db.scalar("SELECT seq FROM sqlite_sequence WHERE name = ?", (TABLE,))
        top = self._db.scalar(f"SELECT max(id) FROM {TABLE}")
        return max(int(seq or 0), int(top or 0)) + 1

    def _insert_rows(
        self,
        rows: Mapping[tuple[bytes, str, str], tuple[int, _Item]],
        vectors: Mapping[tuple[bytes, str, str], FloatArray],
        now: float,
        window: Callable[[], None] | None = None,
        whole: FloatArray | None = None,
        plan: RowPlan | None = None,
    ) -> None:
        """The new rows, their full-text rows, tags and vectors (``whole``: the vectors of all
        the rows, in order, when ``vectors`` holds them all; ``plan``: the rows' plan, made
        ahead)."""
        news = list(rows.values())
        plan = row_plan([item for _, item in news]) if plan is None else plan
        pending = [0] * len(news) if whole is not None else [0 if i.key in vectors else 1 for _, i in news]
        insert = row_insert(plan, pending, now)
        if insert is not None:
            self._db.execute(*insert)
        else:
            self._db.executemany(*row_statement(plan, pending, now))
        last = self._db.scalar("SELECT last_insert_rowid()")
        if last != news[-1][0]:  # SQLite numbers the rows as _next_id does: never seen
            raise StorageError(f"new {TABLE} rows were numbered up to {last}, not {news[-1][0]}")
        tag_rows = [(row_id, k, v) for row_id, item in news for k, v in item.tags.items()]
        if tag_rows:
            self._db.executemany(f"INSERT INTO {TABLE}_tags(entry_id, key, value) VALUES (?, ?, ?)", tag_rows)
        with_vectors = [(row_id, item) for row_id, item in news if item.key in vectors]
        if with_vectors:
            assert self._vectors is not None
            metas = {c: {"category": c} for c in {item.category for _, item in with_vectors}}  # read only
            self._vectors.upsert_many(
                [r for r, _ in with_vectors],
                whole
                if whole is not None and len(with_vectors) == len(news)
                else np.stack([vectors[item.key] for _, item in with_vectors]),
                [metas[item.category] for _, item in with_vectors],
            )
        if window is not None:  # what follows is long statements: the next batch is prepared meanwhile
            window()
        # The full-text rows of the new entries, in bulk (no insert trigger since migration 2):
        # their ids are one run above every stored id, so the range holds exactly them.
        first, last = news[0][0], news[-1][0]
        assert last - first + 1 == len(news), "new ids are consecutive"
        self._db.execute(
            f"INSERT INTO {TABLE}_fts(rowid, content, tag_text, ident) "
            f"SELECT id, content, tag_text, ident FROM {TABLE} WHERE id BETWEEN ? AND ?",
            (first, last),
        )
        if any(item.cjk for _, item in news):
            self._db.execute(
                f"INSERT INTO {TABLE}_tri(rowid, cjk) "
                f"SELECT id, cjk FROM {TABLE} WHERE id BETWEEN ? AND ? AND cjk != ''",
                (first, last),
            )
        self._db.on_rollback(self._bm25.reset)
        self._bm25.added([(r, i.content, i.tag_text, i.ident) for r, i in news])

    def _date_rows(self, spans: Mapping[int, tuple[float, float]]) -> None:
        """New rows written at another time than the rest of their batch: their own times."""
        if spans:
            self._db.executemany(
                f"UPDATE {TABLE} SET created_at = ?, updated_at = ? WHERE id = ?",
                [(first, last, row_id) for row_id, (first, last) in spans.items()],
            )

    def _refresh_rows(self, refresh: Mapping[int, _Item], spans: Mapping[int, tuple[float, float]]) -> None:
        """Dedup hits: widen the entry's times to this write's (``spans``: the first and last
        time of the items merged into each row), merge tags, fill a missing author. Tags that
        would take an entry past :data:`MAX_TAGS` are refused, and the whole batch with them."""
        tagged = {row_id: item.tags for row_id, item in refresh.items() if item.tags}
        current = self._tags_of(list(tagged)) if tagged else {}
        for row_id, tags in tagged.items():
            where = f"entry {row_id} holds the same content, category and scope: merging these tags"
            _check_merged(len({**current.get(row_id, {}), **tags}), f"{where} into its own")
        self._db.executemany(
            f"UPDATE {TABLE} SET created_at = min(created_at, ?), updated_at = max(updated_at, ?), "
            "author = coalesce(author, ?) WHERE id = ?",
            [(*spans[row_id], item.author, row_id) for row_id, item in refresh.items()],
        )
        if not tagged:
            return
        self._db.executemany(
            f"INSERT INTO {TABLE}_tags(entry_id, key, value) VALUES (?, ?, ?) "
            "ON CONFLICT(entry_id, key) DO UPDATE SET value = excluded.value",
            [(row_id, k, v) for row_id, tags in tagged.items() for k, v in tags.items()],
        )
        merged = self._tags_of(list(tagged))
        texts = {row_id: _tag_text(merged.get(row_id, {})) for row_id in tagged}
        changed = [
            i for i, t in texts.items()
            if self._db.execute(
                f"UPDATE {TABLE} SET tag_text = ?, cjk = ? WHERE id = ? AND tag_text != ?",
                (t, _cjk_text(refresh[i].content, t), i, t),
            ).rowcount
        ]  # fmt: skip
        self._db.on_rollback(self._bm25.reset)
        self._bm25.changed(changed)


def _check_merged(count: int, what: str) -> None:
    """Refuse a merge of tags past :data:`MAX_TAGS`: the entry could not be written again as it
    is (an update, an import of its export)."""
    if count > MAX_TAGS:
        raise InvalidInputError(
            f"{what} would give {count} tags, over the limit of {MAX_TAGS}: nothing was stored"
        )


def _checked_time(value: object, name: str) -> float:
    """A write's time: UNIX seconds within the years a stored time may hold."""
    stamp = check_timestamp(value, name)
    assert stamp is not None  # not optional
    return stamp


def _checked_times(times: Sequence[float | None] | None, count: int, name: str) -> list[float | None] | None:
    """``times`` checked, one per item (``None`` when no item has a time of its own)."""
    if times is None:
        return None
    if isinstance(times, str | bytes) or not isinstance(times, Sequence):
        raise InvalidInputError(f"{name} must be a sequence of UNIX seconds, got {type(times).__name__}")
    if len(times) != count:
        raise InvalidInputError(f"{name} holds {len(times)} times for {count} items")
    checked = [None if t is None else _checked_time(t, f"{name}[{i}]") for i, t in enumerate(times)]
    return None if all(t is None for t in checked) else checked


def _spans(
    ids: Sequence[int], times: Sequence[float | None] | None, now: float
) -> dict[int, tuple[float, float]] | None:
    """Each row's earliest and latest time among the batch's items (an item without a time of
    its own is written ``now``); ``None`` when every item is written ``now``."""
    if times is None:
        return None
    spans: dict[int, tuple[float, float]] = {}
    for row_id, given in zip(ids, times, strict=True):
        stamp = now if given is None else given
        first, last = spans.get(row_id, (stamp, stamp))
        spans[row_id] = (min(first, stamp), max(last, stamp))
    return spans


def _common_time(spans: Mapping[int, tuple[float, float]], now: float) -> float:
    """The one time every row of a batch is written at, when they share one; else ``now``
    (the rows at another time are dated apart: :meth:`KnowledgeWrites._date_rows`)."""
    shared = set(spans.values())
    if len(shared) == 1:
        first, last = shared.pop()
        if first == last:
            return first
    return now
