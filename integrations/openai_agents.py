"""OpenAI Agents SDK conversation history on memstrata (``pip install 'memstrata[openai-agents]'``).

Each item of a conversation is one keyed item of memstrata's item layer under the namespace
``("openai-agents", session_id)``: recorded without embedding (a turn costs one insert), read
back as "the last N live items" by an index walk from the end, and really deleted by
``pop_item`` and ``clear_session``.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

from memstrata.layers._items import ItemStore

from memstrata.errors import InvalidInputError, SystemStoppedError

from ._common import items_path, missing

try:
    from agents.memory import session_settings as _settings
    from agents.memory.session import SessionABC
except ImportError as exc:  # the adapter is optional: say which extra brings it
    raise missing("agents", "openai-agents", exc) from exc

__all__ = ["NAMESPACE", "MemstrataSession"]

NAMESPACE = "openai-agents"


class MemstrataSession(SessionABC):
    """History of one conversation, kept by memstrata.

    ``db_path``: a file (``str`` or ``Path``), or ``None`` for a private in-memory database;
    ``system``: a running ``MemorySystem`` whose data dir keeps the history instead.
    ``session_settings``: the SDK's settings (``limit`` is the default for :meth:`get_items`).
    """

    def __init__(
        self,
        session_id: str,
        db_path: str | Path | None = None,
        *,
        system: Any = None,
        session_settings: Any = None,
    ) -> None:
        if not isinstance(session_id, str) or not session_id:
            raise InvalidInputError(f"session_id must be a non-empty string, got {session_id!r}")
        if system is not None and db_path is not None:
            raise InvalidInputError("give db_path or system, not both")
        self.session_id = session_id
        self.session_settings = (
            _settings.coerce_session_settings(session_settings)
            if session_settings is not None
            else _settings.SessionSettings()
        )
        target: Any = system if system is not None else (db_path if db_path is not None else ":memory:")
        self._items = ItemStore(items_path(target))
        self._namespace = (NAMESPACE, session_id)
        self._closed = False

    def _open(self) -> ItemStore:
        if self._closed:
            raise SystemStoppedError(f"MemstrataSession {self.session_id!r} is closed")
        return self._items

    async def get_items(self, limit: int | None = None) -> list[Any]:
        """The conversation in order; with a limit, its last ``limit`` items (a negative
        limit means all, as SQLite reads it)."""
        n = _settings.resolve_session_limit(limit, self.session_settings)
        if n is not None and n < 0:
            n = None
        records = await asyncio.to_thread(self._open().tail, self._namespace, n)
        return [r.value["item"] for r in records]

    async def add_items(self, items: list[Any]) -> None:
        store = self._open()  # a closed session refuses even an empty list
        if not items:
            return
        rows = [(self._namespace, uuid.uuid4().hex, {"item": item}, None, None) for item in items]
        await asyncio.to_thread(store.put_many, rows)

    async def pop_item(self) -> Any:
        """Remove the most recent item and return it (``None`` when there is none)."""
        record = await asyncio.to_thread(self._open().pop_last, self._namespace)
        return None if record is None else record.value["item"]

    async def clear_session(self) -> None:
        await asyncio.to_thread(self._open().delete_namespace, self._namespace)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._items.close()
