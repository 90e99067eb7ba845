"""Reading knowledge entries by id: their rows, then their tags, a few queries for a whole list
(every part of the store that answers with entries reads them here)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memstrata.storage import Database

from ._knowledge_schema import ENTRY_COLUMNS, TABLE, KnowledgeEntry, _entry

__all__ = ["KnowledgeReads"]


class KnowledgeReads:
    """Entries and tags by id, from the store's connection (the base of ``KnowledgeBase``)."""

    _db: Database
    owner: str | None  # the name entries carry as their ``store``

    def _tags_of(self, ids: Sequence[int]) -> dict[int, dict[str, str]]:
        tags: dict[int, dict[str, str]] = {}
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for entry_id, key, value in self._db.query(
                f"SELECT entry_id, key, value FROM {TABLE}_tags WHERE entry_id IN ({marks}) "
                "ORDER BY entry_id, key",
                list(chunk),
            ):
                tags.setdefault(int(entry_id), {})[key] = value
        return tags

    def _load(self, ids: Sequence[int]) -> dict[int, KnowledgeEntry]:
        """Entries by id, two queries for the lot (rows, then tags)."""
        if not ids:
            return {}
        rows: list[Any] = []
        for start in range(0, len(ids), 500):
            chunk = list(ids[start : start + 500])
            marks = ",".join("?" * len(chunk))
            rows.extend(self._db.query(f"SELECT {ENTRY_COLUMNS} FROM {TABLE} WHERE id IN ({marks})", chunk))
        tags = self._tags_of([int(r[0]) for r in rows])
        return {int(r[0]): _entry(r, tags.get(int(r[0]), {}), self.owner) for r in rows}
