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

from ._common import items_of, items_path, missing

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
        # on a running system the history goes through its item actor (shared by every session
        # of the process); otherwise the session opens the item layer itself
        self._system_items: Any = None if system is None else items_of(system)
        self._items: ItemStore | None = None
        if self._system_items is None:
            self._items = ItemStore(items_path(db_path if db_path is not None else ":memory:"))
        self._namespace = (NAMESPACE, session_id)
        self._closed = False

    def _open(self) -> Any:
        """The item store: the system's ``items`` handle or the layer (same method names)."""
        if self._closed:
            raise SystemStoppedError(f"MemstrataSession {self.session_id!r} is closed")
        return self._system_items if self._system_items is not None else self._items

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
        if store is self._system_items:

            def put_in_order() -> None:
                for item in items:
                    store.put(self._namespace, uuid.uuid4().hex, {"item": item})

            await asyncio.to_thread(put_in_order)
            return
        rows = [(self._namespace, uuid.uuid4().hex, {"item": item}, None, None) for item in items]
        await asyncio.to_thread(store.put_many, rows)

    async def pop_item(self) -> Any:
        """Remove the most recent item and return it (``None`` when there is none)."""
        record = await asyncio.to_thread(self._open().pop_last, self._namespace)
        return None if record is None else record.value["item"]

    async def clear_session(self) -> None:
        store = self._open()
        clear = store.clear if store is self._system_items else store.delete_namespace
        await asyncio.to_thread(clear, self._namespace)

    def close(self) -> None:
        """Closes the session's own database (a running system stays as it is)."""
        if not self._closed:
            self._closed = True
            if self._items is not None:
                self._items.close()
