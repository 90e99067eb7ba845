"""Knowledge edits of stored entries: get one by id, update its fields (re-embedding changed
content, refusing a change that would duplicate another entry) and delete it, each keeping the
full-text, BM25 and vector indexes in step."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from memstrata.core.errors import InvalidInputError
from memstrata.core.validation import (
    check_author,
    check_category,
    check_content,
    check_row_id,
    check_scope,
    check_tags,
)
from memstrata.storage import FloatArray, identifier_words, text_hash

from ._common import next_id_at_least
from ._knowledge_schema import (
    HASH_KEY,
    HASH_KEY_BYTES,
    TABLE,
    UNSET,
    KnowledgeEntry,
    _cjk_text,
    _tag_text,
    _Unset,
)
from ._knowledge_writes import KnowledgeWrites


class KnowledgeEdits(KnowledgeWrites):
    """Reads one entry, updates and deletes entries (see ``KnowledgeStore``)."""

    def get(self, id: int) -> KnowledgeEntry | None:
        """The entry with this id, or ``None``."""
        self._open_db()
        entries = self._load([check_row_id(id)])
        return entries.get(id)

    def find(self, content: str, *, category: str = "pattern", scope: str = "/") -> int | None:
        """The id of the entry with this content, category and scope (the one :meth:`add` would
        refresh), or ``None``: an import leaves an entry it finds as it is."""
        self._open_db()
        digest = text_hash(check_content(content, max_bytes=self._max_bytes))
        return self._same_entry(digest, check_category(category), check_scope(scope))

    def _same_entry(self, digest: bytes, category: str, scope: str, *, other_than: int = 0) -> int | None:
        """The entry other than ``other_than`` with this content hash, category and scope."""
        found = self._db.scalar(
            f"SELECT id FROM {TABLE} WHERE {HASH_KEY} = ? AND content_hash = ? AND category = ? "
            "AND scope = ? AND id != ?",
            (digest[:HASH_KEY_BYTES], digest, category, scope, other_than),
        )
        return None if found is None else int(found)

    def update(
        self,
        id: int,
        *,
        content: str | _Unset = UNSET,
        category: str | _Unset = UNSET,
        tags: Mapping[str, str] | Sequence[str] | _Unset | None = UNSET,
        scope: str | _Unset = UNSET,
        author: str | _Unset | None = UNSET,
    ) -> KnowledgeEntry | None:
        """Change the given fields (``tags`` replaces all tags; ``None`` or ``{}`` clears them);
        re-embeds when the content changes. Returns the new entry, or ``None`` if ``id`` does not
        exist. A change that would duplicate another entry (same content, category and scope)
        raises ``InvalidInputError`` (a ``ValueError``) naming it, and changes nothing."""
        self._open_db()
        entry_id = check_row_id(id)
        new_content = (
            None if isinstance(content, _Unset) else check_content(content, max_bytes=self._max_bytes)
        )
        new_category = None if isinstance(category, _Unset) else check_category(category)
        new_tags = None if isinstance(tags, _Unset) else check_tags(tags)
        new_scope = None if isinstance(scope, _Unset) else check_scope(scope)
        new_author = UNSET if isinstance(author, _Unset) else check_author(author)
        current = self.get(entry_id)
        if current is None:
            return None
        current_tag_text = _tag_text(current.tags)
        self._refresh_foreign()
        content_changed = new_content is not None and new_content != current.content
        vector: FloatArray | None = None
        embedded_ok = True
        if content_changed and self._vectors_writable():
            assert new_content is not None
            array = self._embed([new_content])
            embedded_ok = array is not None
            vector = None if array is None else array[0]
        final_content = new_content if new_content is not None else current.content
        final_category = new_category or current.category
        final_scope = new_scope or current.scope
        digest = text_hash(final_content)
        with self._db.transaction():
            other = self._same_entry(digest, final_category, final_scope, other_than=entry_id)
            if other is not None:
                raise InvalidInputError(
                    f"update of entry {entry_id} would duplicate entry {other} "
                    "(same content, category and scope)"
                )
            if self._db.scalar(f"SELECT 1 FROM {TABLE} WHERE id = ?", (entry_id,)) is None:
                return None
            sets = ["updated_at = ?", "category = ?", "scope = ?"]
            params: list[Any] = [self.clock(), final_category, final_scope]
            tag_text = None if new_tags is None else _tag_text(new_tags)
            if content_changed:
                sets += ["content = ?", "content_hash = ?", "ident = ?"]
                params += [final_content, digest, identifier_words(final_content)]
            if tag_text is not None:
                sets.append("tag_text = ?")
                params.append(tag_text)
            if content_changed or tag_text is not None:
                # only text changes touch the full-text indexes (a 1 MB entry is costly to reindex)
                sets.append("cjk = ?")
                params.append(
                    _cjk_text(final_content, tag_text if tag_text is not None else current_tag_text)
                )
            if not isinstance(new_author, _Unset):
                sets.append("author = ?")
                params.append(new_author)
            if new_tags is not None:
                self._db.execute(f"DELETE FROM {TABLE}_tags WHERE entry_id = ?", (entry_id,))
                self._db.executemany(
                    f"INSERT INTO {TABLE}_tags(entry_id, key, value) VALUES (?, ?, ?)",
                    [(entry_id, k, v) for k, v in new_tags.items()],
                )
            self._db.execute(f"UPDATE {TABLE} SET {', '.join(sets)} WHERE id = ?", (*params, entry_id))
            if content_changed or tag_text is not None:
                self._db.on_rollback(self._bm25.reset)
                self._bm25.changed([entry_id])
            self._update_vector(entry_id, content_changed, vector, final_category, current.category)
        if embedded_ok and content_changed:
            self._catch_up()
        return self.get(entry_id)

    def _update_vector(
        self,
        entry_id: int,
        content_changed: bool,
        vector: FloatArray | None,
        category: str,
        old_category: str,
    ) -> None:
        if vector is not None:
            assert self._vectors is not None
            self._vectors.upsert_many([entry_id], vector.reshape(1, -1), [{"category": category}])
            self._db.execute(f"UPDATE {TABLE} SET vector_pending = 0 WHERE id = ?", (entry_id,))
        elif content_changed:
            # the old vector describes old text: drop it, compute the new one later
            if self._vectors is not None:
                self._vectors.delete_many([entry_id])
            self._db.execute(f"UPDATE {TABLE} SET vector_pending = 1 WHERE id = ?", (entry_id,))
        elif category != old_category and self._vectors is not None:
            stored = self._vectors.get(entry_id) if self._vectors.available else None
            if stored is not None and not self._rebuild_needed and self._foreign_model is None:
                self._vectors.upsert_many([entry_id], stored.reshape(1, -1), [{"category": category}])
            elif self._db.scalar(f"SELECT vector_pending FROM {TABLE} WHERE id = ?", (entry_id,)) == 0:
                # the vector cannot be reached now: rewrite it (with its new category) later
                self._vectors.delete_many([entry_id])
                self._db.execute(f"UPDATE {TABLE} SET vector_pending = 1 WHERE id = ?", (entry_id,))

    def delete(self, id: int) -> bool:
        """Delete an entry: ``True`` if it existed, ``False`` otherwise."""
        self._open_db()
        entry_id = check_row_id(id)
        with self._db.transaction():
            gone = self._db.execute(f"DELETE FROM {TABLE} WHERE id = ?", (entry_id,)).rowcount > 0
            if gone:
                self._db.on_rollback(self._bm25.reset)
                self._bm25.removed([entry_id])
            if gone and self._vectors is not None:
                self._vectors.delete_many([entry_id])
        return bool(gone)

    def next_id_at_least(self, entry_id: int) -> None:
        """The next new entry takes at least ``entry_id`` (an import keeping the ids of an
        export, gaps included); ids already given out are never given again."""
        self._open_db()
        next_id_at_least(self._db, TABLE, entry_id)
