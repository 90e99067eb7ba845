"""OpenAI Agents SDK conversation history on memstrata (``pip install 'memstrata[openai-agents]'``).

A conversation is a task run of an agent's episodic memory: each item the SDK adds is one episode
(kind ``turn``, task run = the session id) whose content is the item's JSON, so the history is
also searchable memory (``agent.recall(query, task_run_id=session_id)``). Recording does not wait
for the model: the system's episodic actor stores the episode and computes its vector apart.
``get_items(limit)`` reads the latest ``limit`` live episodes of the run from its index;
``pop_item`` and ``clear_session`` delete episodes for good (no search and no later archive
returns them). A turn episode that holds no JSON object (one recorded through another door as
plain text) is not an item: passed over and logged once, as ``SQLiteSession`` passes over a row
it cannot decode. An item over ``max_content_bytes`` is kept whole in the item store, its episode
holding its beginning (for searches) and the item's key. A write that is cancelled
(``add_items``, ``pop_item``, ``clear_session``) lets the cancellation through only once its
outcome is known, as the SDK's ``SQLiteSession`` does: what the caller sees after a
``CancelledError`` is the history as it stays.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import logging
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson

from memstrata.core.validation import show
from memstrata.errors import InvalidInputError, SystemStoppedError
from memstrata.messages import PutItem, StoreMemory

from ._common import InputTypeError, json_bytes, missing, open_system, settled

try:
    from agents.memory import session_settings as _settings
    from agents.memory.session import SessionABC
except ImportError as exc:  # the adapter is optional: say which extra brings it
    raise missing("agents", "openai-agents", exc) from exc

__all__ = ["AGENT_ID", "BODY_TAG", "KIND", "InputTypeError", "MemstrataSession", "SessionClosedError"]

log = logging.getLogger(__name__)

AGENT_ID = "openai-agents"
"""The agent whose episodic memory keeps the history unless another is named."""
KIND = "turn"
BODY_TAG = "openai-agents.item"
"""The tag of an episode whose item is kept whole in the item store: its value is the item's key
under ``(AGENT_ID, agent_id, session_id)``."""
_PAGE = 10_000  # the most episodes one list request returns
_PREVIEW_BYTES = 4_096  # the beginning of a large item its episode holds, for searches
_TICK = dt.timedelta(microseconds=1)


def _body_keys(episodes: Iterable[Any]) -> list[str]:
    """The item-store keys of the large items among ``episodes``."""
    return [episode.tags[BODY_TAG] for episode in episodes if BODY_TAG in episode.tags]


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
        self._bodies = (AGENT_ID, agent_id, session_id)
        self._lock = threading.Lock()
        self._last_at: dt.datetime | None = None
        self._skipped: dict[int, None] = {}  # the episodes passed over, in the order first met
        self._closed = False

    @property
    def agent(self) -> Any:
        """The agent whose episodic memory keeps this conversation."""
        return self._agent

    @property
    def skipped_episodes(self) -> tuple[int, ...]:
        """Ids of the turn episodes of the run this session passed over as holding no item."""
        with self._lock:
            return tuple(self._skipped)

    def _check_open(self) -> Any:
        if self._closed:
            raise SessionClosedError(f"MemstrataSession {self.session_id!r} is closed")
        return self._agent

    def _newest(self, first_page: int) -> Iterator[Any]:
        """The run's live episodes of kind ``turn``, newest first, listed as they are consumed
        (a note the agent remembered in the run is not a turn); pages grow from ``first_page``,
        so the last item costs a one-episode read."""
        agent = self._check_open()
        seen, page = 0, max(1, min(first_page, _PAGE))
        while True:
            got = agent.list_episodes(task_run_id=self.session_id, limit=page, offset=seen)
            seen += len(got)
            yield from (episode for episode in got if episode.kind == KIND)
            if len(got) < page:
                return
            page = min(2 * page, _PAGE)

    def _decode(self, episode: Any) -> tuple[Any, str]:
        """What ``episode`` holds (its JSON, or its large item's body from the item store), and
        why it is no item when it is not a JSON object."""
        key = episode.tags.get(BODY_TAG)
        if key is not None:
            stored = self._opened.system.items.get(self._bodies, key)
            return (
                (None, f"its body {key!r} is gone from the item store")
                if stored is None
                else (stored.value, "")
            )
        try:
            return orjson.loads(episode.content), "its content is JSON but not an object"
        except orjson.JSONDecodeError:
            return None, "its content is not JSON"

    def _item_of(self, episode: Any) -> dict[str, Any] | None:
        """The item ``episode`` holds, or ``None`` for one holding none (logged once)."""
        item, reason = self._decode(episode)
        if isinstance(item, dict):
            return item
        with self._lock:
            first = episode.id not in self._skipped
            self._skipped[episode.id] = None
        if first:
            log.warning(
                "MemstrataSession %r passes over episode %d of kind %r: not an item (%s)",
                self.session_id,
                episode.id,
                KIND,
                reason,
            )
        return None

    def _holds_item(self, episode: Any) -> bool:
        """Whether ``episode`` is one of the session's items, read without fetching a body."""
        if BODY_TAG in episode.tags:
            return True
        try:
            return isinstance(orjson.loads(episode.content), dict)
        except orjson.JSONDecodeError:
            return False

    def _latest(self, count: int) -> list[tuple[Any, dict[str, Any]]]:
        """The latest ``count`` items of the conversation with their episodes, oldest first
        (``-1``: all); episodes holding no item are passed over, not counted."""
        found: list[tuple[Any, dict[str, Any]]] = []
        for episode in self._newest(_PAGE if count < 0 else count):
            item = self._item_of(episode)
            if item is not None:
                found.append((episode, item))
                if len(found) == count:
                    break
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
        return [item for _, item in self._latest(-1 if n is None or n < 0 else n)]

    async def get_items(self, limit: int | None = None) -> list[Any]:
        """The conversation in order; with a limit, its last ``limit`` items."""
        return await asyncio.to_thread(self._read, limit)

    def _stamps(self, count: int) -> list[dt.datetime]:
        """Times strictly after the run's latest item (stored, or given out by this object and
        maybe not stored yet), so the timeline keeps the order the items were added in even if
        the clock steps back or another session object adds to the same conversation."""
        with self._lock:
            latest = next(self._newest(1), None)  # held or not, its time orders the next ones
            times = [t for t in (self._last_at, None if latest is None else latest.at) if t is not None]
            last = max(times) if times else None
            now = self._opened.system.clock.now()
            out = []
            for _ in range(count):
                now = now if last is None or now > last else last + _TICK
                out.append(now)
                last = now
            self._last_at = last
            return out

    def _check_items(self, items: list[Any] | tuple[Any, ...]) -> list[bytes]:
        """Each item's JSON, every one checked before anything of the call is written."""
        found = []
        for n, item in enumerate(items):
            if not isinstance(item, dict):  # the SDK's items are objects: another value is no turn
                raise InputTypeError(
                    f"items[{n}] must be a JSON object (a dict), got {type(item).__name__} {show(item)}"
                )
            found.append(json_bytes(item, f"items[{n}]"))  # a key that is not text is refused
        return found

    def _add(self, items: list[Any] | tuple[Any, ...]) -> None:
        agent = self._check_open()  # a closed session refuses even an empty list
        if not items:
            return
        texts = self._check_items(items)
        messages, bodies = [], []
        for item, data, at in zip(items, texts, self._stamps(len(texts)), strict=True):
            if len(data) <= self._max_bytes:
                messages.append(StoreMemory(agent.id, self.session_id, data.decode(), None, None, KIND, at))
                continue
            # too large for an episode: kept whole in the item store, its episode pointing to it
            key = f"{at:%Y%m%dT%H%M%S%f}-{hashlib.sha256(data).hexdigest()[:16]}"
            bodies.append(PutItem(self._bodies, key, item))
            preview = data[: min(self._max_bytes, _PREVIEW_BYTES)].decode("utf-8", "ignore")
            messages.append(StoreMemory(agent.id, self.session_id, preview, None, {BODY_TAG: key}, KIND, at))
        if bodies:
            self._opened.system.items.write(bodies)
        try:
            # one mailbox keeps them in order and stores the queued ones in one transaction: the
            # answer to the last says every one before it was handled
            for message in messages[:-1]:
                agent.tell(message)
            agent.ask(messages[-1])
        except BaseException:
            self._take_back([body.key for body in bodies])
            raise

    def _take_back(self, keys: list[str]) -> None:
        """Delete the bodies of a call whose episodes were not stored, so the call leaves nothing;
        one that cannot be deleted is logged (never read: no episode points to it)."""
        try:
            self._drop_bodies(keys)
        except Exception as exc:
            log.warning("MemstrataSession %r could not delete the bodies %s: %s", self.session_id, keys, exc)

    def _drop_bodies(self, keys: Iterable[str]) -> None:
        """Delete the item-store bodies of large items, in one transaction."""
        gone = [(self._bodies, key) for key in keys]
        if gone:
            self._opened.system.items.write(deletes=gone)

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
            episode, item = latest[0]  # read before it is deleted
            if self._agent.delete_episode(episode.id):
                self._drop_bodies(_body_keys([episode]))
                with self._lock:
                    self._last_at = None  # re-read: the next item may reuse the freed time
                return item

    async def pop_item(self) -> Any:
        """Remove the most recent item for good and return it (``None`` when there is none)."""
        return await settled(self._pop)

    def _clear(self) -> None:
        doomed = [episode for episode in self._newest(_PAGE) if self._holds_item(episode)]
        for episode in doomed:
            self._agent.delete_episode(episode.id)
        self._drop_bodies(_body_keys(doomed))

    async def clear_session(self) -> None:
        """Delete every item of the conversation for good."""
        await settled(self._clear)

    def close(self) -> None:
        """Lets a private system go (a given one keeps running); later calls are refused."""
        if not self._closed:
            self._closed = True
            self._opened.release()
