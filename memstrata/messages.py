"""The typed messages agents and orchestrators exchange with memory actors.

Every message is a frozen, slotted dataclass that validates its fields when it is built (a bad
field raises :class:`~memstrata.errors.InvalidInputError` naming the message and the field), so a
malformed request fails in the sender's thread instead of inside an actor.

Wire format: :func:`encode` turns a message into orjson bytes tagged with its type name
(``{"type": "StoreKnowledge", ...}``) and :func:`decode` turns such bytes (or the decoded dict)
back into the same message; ``msg.to_dict()`` / ``Message.from_dict(d)`` do the same without the
bytes. Datetimes travel as ISO-8601 strings; search hits travel as nested objects.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import orjson

from memstrata.errors import InvalidInputError

if typing.TYPE_CHECKING:
    from memstrata.layers import EpisodeHit, KnowledgeEntry, KnowledgeHit

__all__ = [
    "AGENT_ID_PATTERN",
    "SHARED",
    "CategoryPattern",
    "ClearWorkingMemory",
    "CommitMemory",
    "DeleteKnowledge",
    "GetKnowledge",
    "GetWorkingMemory",
    "KnowledgeDeleted",
    "KnowledgeItem",
    "KnowledgeList",
    "KnowledgeResult",
    "KnowledgeStored",
    "ListKnowledge",
    "ListSignals",
    "MemoryCommitted",
    "MemorySearchResult",
    "MemoryStored",
    "Message",
    "PublishSignal",
    "QueryKnowledge",
    "QuerySignal",
    "SearchMemory",
    "SetWorkingMemory",
    "Signal",
    "SignalList",
    "SignalPublished",
    "SignalSubscribed",
    "SignalUnsubscribed",
    "SignalValue",
    "StoreKnowledge",
    "StoreMemory",
    "SubscribeSignal",
    "TaskAssigned",
    "TaskCompleted",
    "TaskFailed",
    "TaskPrompt",
    "UnsubscribeSignal",
    "WorkingMemoryCleared",
    "WorkingMemoryValue",
    "WriteBackQueued",
    "check_agent_id",
    "check_json_value",
    "check_session_id",
    "decode",
    "encode",
    "message_types",
]

SHARED = "shared"
"""The knowledge store every agent can read: ``knowledge/shared.sqlite``; not a valid agent id."""

AGENT_ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
_ID_RE = re.compile(AGENT_ID_PATTERN)
CategoryPattern = r"[a-z0-9][a-z0-9_-]{0,63}"
_CATEGORY_RE = re.compile(CategoryPattern)
# names some file systems refuse whatever the extension (ids become file names)
_DEVICE_NAMES = frozenset(
    {"con", "prn", "aux", "nul"} | {f"com{i}" for i in range(1, 10)} | {f"lpt{i}" for i in range(1, 10)}
)
MAX_TOP_K = 1000
MAX_KEY_CHARS = 1024
MAX_TASK_ID_CHARS = 256
MODES = ("hybrid", "vector", "keyword")

M = TypeVar("M", bound="Message")


# -- validation helpers (also used by the actors and the facade) --------------------------------


def _fail(where: str, what: str, value: object) -> InvalidInputError:
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return InvalidInputError(f"{where} {what}, got {shown}")


def _has_lone_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _check_id(value: object, where: str, *, kind: str, allow_shared: bool) -> str:
    if not isinstance(value, str) or not _ID_RE.fullmatch(value) or value.endswith("."):
        raise _fail(
            where,
            f"must be a {kind} id of 1-64 letters, digits, '_', '-' or '.' "
            "(starting with a letter or digit, not ending with '.')",
            value,
        )
    lowered = value.lower()
    if lowered.split(".", 1)[0] in _DEVICE_NAMES:
        raise _fail(where, f"is a reserved device name and cannot be a {kind} id", value)
    if lowered == SHARED and not allow_shared:
        raise _fail(where, f"'{SHARED}' is reserved for the shared knowledge store", value)
    return value


def check_agent_id(value: object, where: str = "agent_id", *, allow_shared: bool = False) -> str:
    """An agent id becomes a file name (``knowledge/{id}.sqlite``): a safe, portable name."""
    return _check_id(value, where, kind="agent", allow_shared=allow_shared)


def check_session_id(value: object, where: str = "session_id") -> str:
    """A blackboard session id becomes a file name when snapshots are on."""
    return _check_id(value, where, kind="session", allow_shared=True)


def _check_text(value: object, where: str, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise _fail(where, "must be a string", value)
    if not allow_empty and not value.strip():
        raise _fail(where, "must be a non-empty string", value)
    return value


def _check_task_id(value: object, where: str) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_TASK_ID_CHARS:
        raise _fail(where, f"must be a non-empty string of at most {MAX_TASK_ID_CHARS} characters", value)
    if _has_lone_surrogate(value) or any(ord(c) < 32 for c in value):
        raise _fail(where, "must not contain control characters or lone surrogates", value)
    return value


def _check_key(value: object, where: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_KEY_CHARS:
        raise _fail(where, f"must be a non-empty string of at most {MAX_KEY_CHARS} characters", value)
    if _has_lone_surrogate(value) or "\x00" in value:
        raise _fail(where, "must not contain NUL or lone surrogates", value)
    return value


def _check_optional_text(value: object, where: str) -> str | None:
    if value is None:
        return None
    return _check_text(value, where, allow_empty=True)


def _check_category(value: object, where: str, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not _CATEGORY_RE.fullmatch(value):
        raise _fail(where, f"must match {CategoryPattern} (e.g. 'pitfall', 'planning-pitfall')", value)
    return value


def _check_tags(value: object, where: str) -> dict[str, str] | None:
    """``dict[str, str]``; a list of strings is accepted as bare tags (value ``""``)."""
    if value is None:
        return None
    if isinstance(value, list | tuple) and all(isinstance(t, str) for t in value):
        value = dict.fromkeys(value, "")
    if not isinstance(value, Mapping):
        raise _fail(where, "must be a mapping of strings to strings", value)
    tags: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not key:
            raise _fail(where, "keys must be non-empty strings", key)
        if not isinstance(item, str):
            raise _fail(f"{where}[{key!r}]", "must be a string", item)
        tags[key] = item
    return tags


def _check_scope(value: object, where: str, *, optional: bool) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value.startswith("/"):
        raise _fail(where, "must be a path-like scope starting with '/'", value)
    return value


def _check_int(value: object, where: str, *, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _fail(where, f"must be an integer from {low} to {high}", value)
    return value


def _check_number(value: object, where: str, *, optional: bool = True, low: float = 0.0) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value or value < low:
        raise _fail(where, f"must be a number >= {low:g}", value)
    return float(value)


def _check_datetime(value: object, where: str) -> _dt.datetime | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = _dt.datetime.fromisoformat(value)
        except ValueError as exc:
            raise _fail(where, "must be an ISO-8601 datetime with a time zone", value) from exc
    if not isinstance(value, _dt.datetime):
        raise _fail(where, "must be a timezone-aware datetime", value)
    if value.tzinfo is None or value.utcoffset() is None:
        raise _fail(where, "must be timezone-aware (naive datetimes are ambiguous)", value)
    return value


def check_json_value(value: object, where: str) -> bytes:
    """The orjson bytes of ``value``; anything orjson cannot serialise is a clear error."""
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise InvalidInputError(f"{where} must be JSON-serialisable data: {exc}") from exc


def _bool(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise _fail(where, "must be true or false", value)
    return value


# -- the message base class and codec ---------------------------------------------------------


class Message:
    """Base of every message: ``to_dict``/``from_dict`` and a type tag for the wire."""

    __slots__ = ()
    type_name: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.type_name = cls.__name__
        _REGISTRY[cls.__name__] = cls

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict with a ``"type"`` tag (datetimes as ISO strings)."""
        data: dict[str, Any] = {"type": self.type_name}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            data[f.name] = _to_jsonable(getattr(self, f.name))
        return data

    @classmethod
    def from_dict(cls: type[M], data: Mapping[str, Any]) -> M:
        """Rebuild a message from :meth:`to_dict` output (the ``"type"`` tag is optional here)."""
        if not isinstance(data, Mapping):
            raise InvalidInputError(f"{cls.__name__}: expected an object, got {type(data).__name__}")
        tag = data.get("type", cls.__name__)
        if tag != cls.__name__:
            raise InvalidInputError(f"expected a {cls.__name__} message, got type {tag!r}")
        built = _from_fields(cls, {k: v for k, v in data.items() if k != "type"})
        return typing.cast(M, built)


_REGISTRY: dict[str, type[Message]] = {}


def message_types() -> dict[str, type[Message]]:
    """Every message class by its wire type name."""
    return dict(_REGISTRY)


def encode(message: Message) -> bytes:
    """orjson bytes of ``message`` with its type tag."""
    if not isinstance(message, Message):
        raise InvalidInputError(f"encode() takes a message, got {type(message).__name__}")
    return orjson.dumps(message.to_dict(), option=orjson.OPT_NON_STR_KEYS)


def decode(data: bytes | str | Mapping[str, Any]) -> Message:
    """The message that :func:`encode` (or ``to_dict``) produced; unknown types are a clear error."""
    if isinstance(data, bytes | bytearray | memoryview | str):
        try:
            data = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise InvalidInputError(f"message is not valid JSON: {exc}") from exc
    if not isinstance(data, Mapping):
        raise InvalidInputError(f"a message must be a JSON object, got {type(data).__name__}")
    tag = data.get("type")
    cls = _REGISTRY.get(tag) if isinstance(tag, str) else None
    if cls is None:
        raise InvalidInputError(f"unknown message type {tag!r}")
    return cls.from_dict(data)


def _to_jsonable(value: Any) -> Any:
    if isinstance(value, _dt.datetime):
        return value.isoformat()
    if isinstance(value, _dt.timedelta):
        return value.total_seconds()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # NamedTuple
        return {name: _to_jsonable(getattr(value, name)) for name in value._fields}
    if isinstance(value, list | tuple):
        return [_to_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _to_jsonable(v) for k, v in value.items()}
    if type(value).__module__ == "numpy":  # numpy scalars and arrays
        return value.tolist()
    return value


def _layer_names() -> dict[str, Any]:
    """Hit classes referenced by result messages, imported only when a result is decoded."""
    from memstrata.layers import Episode, EpisodeHit, KnowledgeEntry, KnowledgeHit

    return {
        "KnowledgeHit": KnowledgeHit,
        "KnowledgeEntry": KnowledgeEntry,
        "EpisodeHit": EpisodeHit,
        "Episode": Episode,
    }


def _hints(cls: type) -> dict[str, Any]:
    cached = _HINTS.get(cls)
    if cached is None:
        try:
            cached = typing.get_type_hints(cls)
        except NameError:
            cached = typing.get_type_hints(cls, localns=_layer_names())
        _HINTS[cls] = cached
    return cached


_HINTS: dict[type, dict[str, Any]] = {}


def _from_fields(cls: type, data: Mapping[str, Any]) -> Any:
    hints = _hints(cls)
    names: list[str]
    if dataclasses.is_dataclass(cls):
        names = [f.name for f in dataclasses.fields(cls)]
    else:
        names = list(getattr(cls, "_fields", hints))
    unknown = set(data) - set(names)
    if unknown:
        raise InvalidInputError(f"{cls.__name__}: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
    kwargs = {
        name: _from_jsonable(data[name], hints.get(name, Any), f"{cls.__name__}.{name}") for name in data
    }
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise InvalidInputError(f"{cls.__name__}: {exc}") from exc


def _from_jsonable(value: Any, hint: Any, where: str) -> Any:
    if value is None or hint is Any:
        return value
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        for candidate in inner:  # the first type the value decodes as
            try:
                return _from_jsonable(value, candidate, where)
            except (InvalidInputError, TypeError, ValueError):
                continue
        return value
    if hint is _dt.datetime:
        if isinstance(value, str):
            try:
                return _dt.datetime.fromisoformat(value)
            except ValueError as exc:
                raise InvalidInputError(f"{where} is not an ISO-8601 datetime: {value!r}") from exc
        return value
    if hint is _dt.timedelta and isinstance(value, int | float):
        return _dt.timedelta(seconds=value)
    if origin is tuple and isinstance(value, list | tuple):
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_from_jsonable(v, args[0], where) for v in value)
        return tuple(value)
    if origin is dict and isinstance(value, Mapping) and len(args) == 2:
        return {k: _from_jsonable(v, args[1], where) for k, v in value.items()}
    if isinstance(hint, type) and isinstance(value, Mapping):
        if dataclasses.is_dataclass(hint) or hasattr(hint, "_fields"):
            return _from_fields(hint, value)
        if issubclass(hint, Message):
            return hint.from_dict(value)
    return value


def _set(obj: object, name: str, value: object) -> None:
    object.__setattr__(obj, name, value)


# -- long-term knowledge ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoreKnowledge(Message):
    """Add an entry to ``agent_id``'s knowledge store (``"shared"`` targets the shared store)."""

    agent_id: str
    content: str
    category: str
    tags: dict[str, str] | None = None
    scope: str = "/"
    author: str | None = None

    def __post_init__(self) -> None:
        check_agent_id(self.agent_id, "StoreKnowledge.agent_id", allow_shared=True)
        _check_text(self.content, "StoreKnowledge.content")
        _check_category(self.category, "StoreKnowledge.category")
        _set(self, "tags", _check_tags(self.tags, "StoreKnowledge.tags"))
        _check_scope(self.scope, "StoreKnowledge.scope", optional=False)
        _check_optional_text(self.author, "StoreKnowledge.author")


@dataclass(frozen=True, slots=True)
class KnowledgeStored(Message):
    agent_id: str
    entry_id: int


@dataclass(frozen=True, slots=True)
class QueryKnowledge(Message):
    """Hybrid search of ``agent_id``'s store; ``include_shared`` adds the shared store's hits."""

    agent_id: str
    query: str
    category: str | None = None
    top_k: int = 10
    tags: dict[str, str] | None = None
    scope: str | None = None
    include_shared: bool = False
    mode: str = "hybrid"
    min_score: float | None = None

    def __post_init__(self) -> None:
        check_agent_id(self.agent_id, "QueryKnowledge.agent_id", allow_shared=True)
        _check_text(self.query, "QueryKnowledge.query", allow_empty=True)
        _check_category(self.category, "QueryKnowledge.category", optional=True)
        _check_int(self.top_k, "QueryKnowledge.top_k", low=1, high=MAX_TOP_K)
        _set(self, "tags", _check_tags(self.tags, "QueryKnowledge.tags"))
        _check_scope(self.scope, "QueryKnowledge.scope", optional=True)
        _bool(self.include_shared, "QueryKnowledge.include_shared")
        if self.mode not in MODES:
            raise _fail("QueryKnowledge.mode", f"must be one of {', '.join(MODES)}", self.mode)
        if self.min_score is not None:
            score = _check_number(self.min_score, "QueryKnowledge.min_score", low=-1.0)
            if score is not None and score > 1.0:
                raise _fail("QueryKnowledge.min_score", "must be at most 1", self.min_score)


@dataclass(frozen=True, slots=True)
class KnowledgeResult(Message):
    """The hits of a :class:`QueryKnowledge`, best first (``KnowledgeStore.search`` objects)."""

    agent_id: str
    hits: tuple[KnowledgeHit, ...] = ()

    def __post_init__(self) -> None:
        _set(self, "hits", tuple(self.hits))


@dataclass(frozen=True, slots=True)
class ListKnowledge(Message):
    """Entries of ``agent_id``'s store, newest first; ``scope`` selects that scope and below."""

    agent_id: str
    category: str | None = None
    tags: dict[str, str] | None = None
    scope: str | None = None
    limit: int = 50
    offset: int = 0

    def __post_init__(self) -> None:
        check_agent_id(self.agent_id, "ListKnowledge.agent_id", allow_shared=True)
        _check_category(self.category, "ListKnowledge.category", optional=True)
        _set(self, "tags", _check_tags(self.tags, "ListKnowledge.tags"))
        _check_scope(self.scope, "ListKnowledge.scope", optional=True)
        _check_int(self.limit, "ListKnowledge.limit", low=0, high=10_000)
        _check_int(self.offset, "ListKnowledge.offset", low=0, high=2**62)


@dataclass(frozen=True, slots=True)
class KnowledgeList(Message):
    agent_id: str
    entries: tuple[KnowledgeEntry, ...] = ()

    def __post_init__(self) -> None:
        _set(self, "entries", tuple(self.entries))


@dataclass(frozen=True, slots=True)
class GetKnowledge(Message):
    agent_id: str
    entry_id: int

    def __post_init__(self) -> None:
        check_agent_id(self.agent_id, "GetKnowledge.agent_id", allow_shared=True)
        _check_int(self.entry_id, "GetKnowledge.entry_id", low=1, high=2**62)


@dataclass(frozen=True, slots=True)
class KnowledgeItem(Message):
    """The answer to :class:`GetKnowledge`: the entry, or ``None`` when there is no such id."""

    agent_id: str
    entry: KnowledgeEntry | None = None


@dataclass(frozen=True, slots=True)
class DeleteKnowledge(Message):
    agent_id: str
    entry_id: int

    def __post_init__(self) -> None:
        check_agent_id(self.agent_id, "DeleteKnowledge.agent_id", allow_shared=True)
        _check_int(self.entry_id, "DeleteKnowledge.entry_id", low=1, high=2**62)


@dataclass(frozen=True, slots=True)
class KnowledgeDeleted(Message):
    agent_id: str
    entry_id: int
    deleted: bool


# -- episodic memory ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoreMemory(Message):
    """Record an episode in ``agent_id``'s episodic memory (``at`` defaults to the system clock)."""

    agent_id: str
    task_run_id: str | None
    content: str
    title: str | None = None
    tags: dict[str, str] | None = None
    kind: str = "note"
    at: _dt.datetime | None = None

    def __post_init__(self) -> None:
        check_agent_id(self.agent_id, "StoreMemory.agent_id")
        if self.task_run_id is not None:
            _check_task_id(self.task_run_id, "StoreMemory.task_run_id")
        _check_text(self.content, "StoreMemory.content")
        _check_optional_text(self.title, "StoreMemory.title")
        _set(self, "tags", _check_tags(self.tags, "StoreMemory.tags"))
        _check_category(self.kind, "StoreMemory.kind")
        _set(self, "at", _check_datetime(self.at, "StoreMemory.at"))


@dataclass(frozen=True, slots=True)
class MemoryStored(Message):
    agent_id: str
    episode_id: int


@dataclass(frozen=True, slots=True)
class SearchMemory(Message):
    """Hybrid search of ``agent_id``'s episodes, optionally within a task run or a time range."""

    agent_id: str
    query: str
    task_run_id: str | None = None
    top_k: int = 10
    since: _dt.datetime | None = None
    until: _dt.datetime | None = None

    def __post_init__(self) -> None:
        check_agent_id(self.agent_id, "SearchMemory.agent_id")
        _check_text(self.query, "SearchMemory.query", allow_empty=True)
        if self.task_run_id is not None:
            _check_task_id(self.task_run_id, "SearchMemory.task_run_id")
        _check_int(self.top_k, "SearchMemory.top_k", low=1, high=MAX_TOP_K)
        _set(self, "since", _check_datetime(self.since, "SearchMemory.since"))
        _set(self, "until", _check_datetime(self.until, "SearchMemory.until"))


@dataclass(frozen=True, slots=True)
class MemorySearchResult(Message):
    agent_id: str
    task_run_id: str | None
    hits: tuple[EpisodeHit, ...] = ()

    def __post_init__(self) -> None:
        _set(self, "hits", tuple(self.hits))


@dataclass(frozen=True, slots=True)
class CommitMemory(Message):
    """Flush ``agent_id``'s episodic memory (and apply its retention policy)."""

    agent_id: str

    def __post_init__(self) -> None:
        check_agent_id(self.agent_id, "CommitMemory.agent_id")


@dataclass(frozen=True, slots=True)
class MemoryCommitted(Message):
    agent_id: str


# -- working memory -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SetWorkingMemory(Message):
    """Set a key in ``agent_id``'s working memory; ``ttl_s`` makes it expire."""

    agent_id: str
    key: str
    value: Any
    ttl_s: float | None = None

    def __post_init__(self) -> None:
        check_agent_id(self.agent_id, "SetWorkingMemory.agent_id")
        _check_key(self.key, "SetWorkingMemory.key")
        check_json_value(self.value, "SetWorkingMemory.value")
        _check_number(self.ttl_s, "SetWorkingMemory.ttl_s")


@dataclass(frozen=True, slots=True)
class GetWorkingMemory(Message):
    agent_id: str
    key: str

    def __post_init__(self) -> None:
        check_agent_id(self.agent_id, "GetWorkingMemory.agent_id")
        _check_key(self.key, "GetWorkingMemory.key")


@dataclass(frozen=True, slots=True)
class WorkingMemoryValue(Message):
    agent_id: str
    key: str
    value: Any = None
    found: bool = False


@dataclass(frozen=True, slots=True)
class ClearWorkingMemory(Message):
    """Clear ``agent_id``'s working memory, or only ``key``."""

    agent_id: str
    key: str | None = None

    def __post_init__(self) -> None:
        check_agent_id(self.agent_id, "ClearWorkingMemory.agent_id")
        if self.key is not None:
            _check_key(self.key, "ClearWorkingMemory.key")


@dataclass(frozen=True, slots=True)
class WorkingMemoryCleared(Message):
    agent_id: str
    removed: int


# -- blackboard ---------------------------------------------------------------------------------


def _check_pattern(value: object, where: str) -> str:
    """A key, or a prefix ending in ``*`` (``"*"`` alone matches every key)."""
    if value == "*":
        return "*"
    _check_key(value, where)
    assert isinstance(value, str)
    if "*" in value[:-1]:
        raise _fail(where, "may contain '*' only at the end (a prefix subscription)", value)
    return value


def _check_signal_key(value: object, where: str) -> str:
    _check_key(value, where)
    assert isinstance(value, str)
    if "*" in value:
        raise _fail(where, "must not contain '*' (reserved for prefix subscriptions)", value)
    return value


@dataclass(frozen=True, slots=True)
class PublishSignal(Message):
    """Set ``key`` on a session's blackboard and notify its subscribers."""

    key: str
    value: Any
    publisher_id: str | None = None
    session_id: str = "default"

    def __post_init__(self) -> None:
        _check_signal_key(self.key, "PublishSignal.key")
        check_json_value(self.value, "PublishSignal.value")
        if self.publisher_id is not None:
            _check_key(self.publisher_id, "PublishSignal.publisher_id")
        check_session_id(self.session_id, "PublishSignal.session_id")


@dataclass(frozen=True, slots=True)
class SignalPublished(Message):
    session_id: str
    key: str
    version: int


@dataclass(frozen=True, slots=True)
class QuerySignal(Message):
    key: str
    session_id: str = "default"

    def __post_init__(self) -> None:
        _check_signal_key(self.key, "QuerySignal.key")
        check_session_id(self.session_id, "QuerySignal.session_id")


@dataclass(frozen=True, slots=True)
class SignalValue(Message):
    session_id: str
    key: str
    value: Any = None
    found: bool = False
    publisher_id: str | None = None
    version: int = 0
    updated_at: _dt.datetime | None = None


@dataclass(frozen=True, slots=True)
class Signal(Message):
    """What a subscriber receives: one value of one key (``version`` grows per key)."""

    session_id: str
    key: str
    value: Any
    publisher_id: str | None = None
    version: int = 0
    updated_at: _dt.datetime | None = None


@dataclass(frozen=True, slots=True)
class SubscribeSignal(Message):
    """Subscribe to a key, or to a prefix ending in ``*``; the callback is given separately."""

    key_or_prefix: str
    session_id: str = "default"

    def __post_init__(self) -> None:
        _check_pattern(self.key_or_prefix, "SubscribeSignal.key_or_prefix")
        check_session_id(self.session_id, "SubscribeSignal.session_id")


@dataclass(frozen=True, slots=True)
class SignalSubscribed(Message):
    session_id: str
    subscription_id: int
    key_or_prefix: str


@dataclass(frozen=True, slots=True)
class UnsubscribeSignal(Message):
    subscription_id: int
    session_id: str = "default"

    def __post_init__(self) -> None:
        _check_int(self.subscription_id, "UnsubscribeSignal.subscription_id", low=1, high=2**62)
        check_session_id(self.session_id, "UnsubscribeSignal.session_id")


@dataclass(frozen=True, slots=True)
class SignalUnsubscribed(Message):
    session_id: str
    subscription_id: int
    removed: bool


@dataclass(frozen=True, slots=True)
class ListSignals(Message):
    prefix: str | None = None
    session_id: str = "default"

    def __post_init__(self) -> None:
        if self.prefix is not None and self.prefix != "":
            _check_key(self.prefix, "ListSignals.prefix")
        check_session_id(self.session_id, "ListSignals.session_id")


@dataclass(frozen=True, slots=True)
class SignalList(Message):
    """The keys on the blackboard (sorted), optionally only those starting with ``prefix``."""

    session_id: str
    prefix: str | None
    keys: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _set(self, "keys", tuple(self.keys))


# -- task lifecycle -----------------------------------------------------------------------------


def _check_optional_agent(value: object, where: str) -> None:
    if value is not None:
        check_agent_id(value, where)


@dataclass(frozen=True, slots=True)
class TaskAssigned(Message):
    """A task for an agent: answered with a :class:`TaskPrompt` built from its knowledge.

    ``agent_id`` may be left out when the message is sent through an agent handle
    (``system.agent(id).ask(msg)``); ``query`` defaults to the description.
    """

    task_id: str
    description: str
    agent_id: str | None = None
    query: str | None = None
    category: str | None = None
    tags: dict[str, str] | None = None
    scope: str | None = None
    top_k: int | None = None

    def __post_init__(self) -> None:
        _check_task_id(self.task_id, "TaskAssigned.task_id")
        _check_text(self.description, "TaskAssigned.description")
        _check_optional_agent(self.agent_id, "TaskAssigned.agent_id")
        _check_optional_text(self.query, "TaskAssigned.query")
        _check_category(self.category, "TaskAssigned.category", optional=True)
        _set(self, "tags", _check_tags(self.tags, "TaskAssigned.tags"))
        _check_scope(self.scope, "TaskAssigned.scope", optional=True)
        if self.top_k is not None:
            _check_int(self.top_k, "TaskAssigned.top_k", low=1, high=MAX_TOP_K)


@dataclass(frozen=True, slots=True)
class TaskPrompt(Message):
    """The prompt for a task: knowledge context + task, or the fallback (task only) and why."""

    text: str
    hits: tuple[KnowledgeHit, ...] = ()
    fallback: bool = False
    reason: str | None = None
    agent_id: str = ""
    task_id: str = ""
    episodes: tuple[EpisodeHit, ...] = ()

    def __post_init__(self) -> None:
        _set(self, "hits", tuple(self.hits))
        _set(self, "episodes", tuple(self.episodes))


@dataclass(frozen=True, slots=True)
class TaskCompleted(Message):
    """Write-back: the summary becomes an ``outcome`` entry and an episode (durable when acked)."""

    task_id: str
    summary: str
    agent_id: str | None = None

    def __post_init__(self) -> None:
        _check_task_id(self.task_id, "TaskCompleted.task_id")
        _check_text(self.summary, "TaskCompleted.summary")
        _check_optional_agent(self.agent_id, "TaskCompleted.agent_id")


@dataclass(frozen=True, slots=True)
class TaskFailed(Message):
    """Write-back: the reason becomes a ``pitfall`` entry and an episode (durable when acked)."""

    task_id: str
    reason: str
    agent_id: str | None = None

    def __post_init__(self) -> None:
        _check_task_id(self.task_id, "TaskFailed.task_id")
        _check_text(self.reason, "TaskFailed.reason")
        _check_optional_agent(self.agent_id, "TaskFailed.agent_id")


@dataclass(frozen=True, slots=True)
class WriteBackQueued(Message):
    """The write-back is in the agent's outbox (committed): it survives a crash from here on."""

    agent_id: str
    task_id: str
    outbox_id: int
