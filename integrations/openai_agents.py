"""OpenAI Agents SDK conversation history on memstrata (``pip install 'memstrata[openai-agents]'``).

A conversation is a task run of an agent's episodic memory: each item the SDK adds is one episode
(kind ``turn``, task run = the session id) whose content is the item's JSON, so the history is
also searchable memory (``agent.recall(query, task_run_id=session_id)``). Recording does not wait
for the model: the system's episodic actor stores the episode and computes its vector apart.
``get_items(limit)`` reads the latest ``limit`` live episodes of the run from its index;
``pop_item`` and ``clear_session`` delete episodes for good (no search and no later archive
returns them). A write that is cancelled (``add_items``, ``pop_item``, ``clear_session``) lets the
cancellation through only once its outcome is known, as the SDK's ``SQLiteSession`` does: what
the caller sees after a ``CancelledError`` is the history as it stays.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
from pathlib import Path
from typing import Any

import orjson

from memstrata.core.validation import show
from memstrata.errors import InvalidInputError, SystemStoppedError
from memstrata.messages import StoreMemory

from ._common import InputTypeError, json_bytes, missing, open_system, settled

try:
    from agents.memory import session_settings as _settings
    from agents.memory.session import SessionABC
except ImportError as exc:  # the adapter is optional: say which extra brings it
    raise missing("agents", "openai-agents", exc) from exc

__all__ = ["AGENT_ID", "KIND", "InputTypeError", "MemstrataSession", "SessionClosedError"]

AGENT_ID = "openai-agents"
"""The agent whose episodic memory keeps the history unless another is named."""
KIND = "turn"
_PAGE = 10_000  # the most episodes one list request returns
_TICK = dt.timedelta(microseconds=1)


class SessionClosedError(SystemStoppedError, RuntimeError):
    """A call on a closed session: memstrata's ``SystemStoppedError`` and also the
    ``RuntimeError`` the SDK's ``SQLiteSession`` raises there."""


class MemstrataSession(SessionABC):
    """History of one conversation, kept in an agent's episodic memory.

    ``db_path``: the data dir of a private system (``str`` or ``Path``; every session of the
    process given that path shares it), or ``None`` for a temporary one removed at
    :meth:`close`. ``system``: a running ``MemorySystem`` to use instead. ``agent_id``: whose
    episodic memory (default ``"openai-agents"``). ``session_settings``: the SDK's settings
    (``limit`` is the default for :meth:`get_items`). The session id is the task run id (1-256
    characters, no control characters).
    """

    def __init__(
        self,
        session_id: str,
        db_path: str | Path | None = None,
        *,
        system: Any = None,
        session_settings: Any = None,
        agent_id: str = AGENT_ID,
        embedder: Any = None,
    ) -> None:
        if not isinstance(session_id, str):
            raise InputTypeError(f"session_id must be a non-empty string, got {session_id!r}")
        if not session_id:
            raise InvalidInputError(f"session_id must be a non-empty string, got {session_id!r}")
        StoreMemory(agent_id, session_id, "-")  # the ids' own checks, before anything starts
        if system is not None and db_path is not None:
            raise InvalidInputError("give db_path or system, not both")
        self.session_id = session_id
        try:
            self.session_settings = (
                _settings.coerce_session_settings(session_settings)
                if session_settings is not None
                else _settings.SessionSettings()
            )
        except (TypeError, ValueError) as exc:  # the SDK's own checks; pydantic's run over lines
            reason = " ".join(str(exc).split())
            error = InputTypeError if isinstance(exc, TypeError) else InvalidInputError  # as the SDK's
            raise error(
                f"session_settings must be a SessionSettings or a dict of its fields: {reason}"
            ) from exc
        self._opened = open_system(
            system if system is not None else db_path, embedder=embedder, what="MemstrataSession db_path"
        )
        self._agent = self._opened.system.agent(agent_id)
        self._max_bytes = self._opened.system.config.max_content_bytes
        self._lock = threading.Lock()
        self._last_at: dt.datetime | None = None
        self._closed = False

    @property
    def agent(self) -> Any:
        """The agent whose episodic memory keeps this conversation."""
        return self._agent

    def _check_open(self) -> Any:
        if self._closed:
            raise SessionClosedError(f"MemstrataSession {self.session_id!r} is closed")
        return self._agent

    def _latest(self, count: int) -> list[Any]:
        """The latest ``count`` items of the conversation, oldest first (``-1``: all): the run's
        live episodes of kind ``turn`` (a note the agent remembered in the run is not an item)."""
        agent = self._check_open()
        found: list[Any] = []
        seen = 0
        while count < 0 or len(found) < count:
            page = _PAGE if count < 0 else min(_PAGE, count - len(found))
            got = agent.list_episodes(task_run_id=self.session_id, limit=page, offset=seen)
            seen += len(got)
            found += [episode for episode in got if episode.kind == KIND]
            if len(got) < page:
                break
        found = found if count < 0 else found[:count]
        found.reverse()
        return found

    def _read(self, limit: int | None) -> list[Any]:
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise InputTypeError(f"limit must be an integer or None (negative: all items), got {show(limit)}")
        n = _settings.resolve_session_limit(limit, self.session_settings)
        if n is not None and n <= 0 and limit is not None and limit < 0:
            n = None  # a negative limit means all, as SQLite reads it
        if n == 0:
            self._check_open()
            return []
        return [orjson.loads(e.content) for e in self._latest(-1 if n is None or n < 0 else n)]

    async def get_items(self, limit: int | None = None) -> list[Any]:
        """The conversation in order; with a limit, its last ``limit`` items."""
        return await asyncio.to_thread(self._read, limit)

    def _stamps(self, count: int) -> list[dt.datetime]:
        """Times strictly after the run's latest item (stored, or given out by this object and
        maybe not stored yet), so the timeline keeps the order the items were added in even if
        the clock steps back or another session object adds to the same conversation."""
        with self._lock:
            latest = self._latest(1)
            times = [t for t in (self._last_at, latest[0].at if latest else None) if t is not None]
            last = max(times) if times else None
            now = self._opened.system.clock.now()
            out = []
            for _ in range(count):
                now = now if last is None or now > last else last + _TICK
                out.append(now)
                last = now
            self._last_at = last
            return out

    def _add(self, items: list[Any] | tuple[Any, ...]) -> None:
        agent = self._check_open()  # a closed session refuses even an empty list
        if not items:
            return
        texts = []
        for n, item in enumerate(items):
            data = json_bytes(item, f"items[{n}]")  # a key that is not text is refused, not turned into one
            if len(data) > self._max_bytes:
                raise InvalidInputError(f"items[{n}] is over max_content_bytes ({self._max_bytes:,} bytes)")
            texts.append(data.decode())
        stamps = self._stamps(len(texts))
        messages = [
            StoreMemory(agent.id, self.session_id, t, None, None, KIND, at)
            for t, at in zip(texts, stamps, strict=True)
        ]
        # one mailbox keeps them in order and stores the queued ones in one transaction: the
        # answer to the last says every one before it was handled
        for message in messages[:-1]:
            agent.tell(message)
        agent.ask(messages[-1])

    async def add_items(self, items: list[Any]) -> None:
        """Record the items in order, as episodes of the run (not waiting for their vectors)."""
        if not isinstance(items, list | tuple):  # list() would split a str or dict into characters or keys
            raise InputTypeError(f"items must be a list of items, got {type(items).__name__} {show(items)}")
        await settled(self._add, tuple(items))

    def _pop(self) -> Any:
        while True:
            latest = self._latest(1)
            if not latest:
                return None
            item = orjson.loads(latest[0].content)  # before it is deleted: a bad one stays
            if self._agent.delete_episode(latest[0].id):
                with self._lock:
                    self._last_at = None  # re-read: the next item may reuse the freed time
                return item

    async def pop_item(self) -> Any:
        """Remove the most recent item for good and return it (``None`` when there is none)."""
        return await settled(self._pop)

    def _clear(self) -> None:
        while True:
            page = self._latest(_PAGE)
            if not page:
                return
            for episode in page:
                self._agent.delete_episode(episode.id)

    async def clear_session(self) -> None:
        """Delete every item of the conversation for good."""
        await settled(self._clear)

    def close(self) -> None:
        """Lets a private system go (a given one keeps running); later calls are refused."""
        if not self._closed:
            self._closed = True
            self._opened.release()
