"""The one place where memstrata's argument rules live: every layer, message and bridge calls it.

Each ``check_*`` returns the value (normalised where said) or raises
:class:`~memstrata.core.errors.InvalidInputError` with a one-line message that names the argument.
``name`` is how the argument is called in that message (``"tags"``, ``"StoreKnowledge.tags"``).

Two kinds of strings, two rules for unpaired UTF-16 surrogates (which UTF-8, and so SQLite and
JSON, cannot carry):

- **names** (agent, session and task ids, keys, tag keys, categories, scopes): rejected. Repairing
  them would make ``"a\\ud800"`` and ``"a\\udfff"`` the same name.
- **free text** (content, titles, authors, tag values): each unpaired surrogate becomes U+FFFD and
  the rest is kept as given, so a write-back never fails on one bad character.

Tags have one accepted shape: a mapping of ``str`` to ``str``, or a list/tuple/set of ``str``
meaning bare tags (each with value ``""``); the result is a new dict sorted by key.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Literal, TypeGuard, overload

from memstrata.core._text import clean_text, fail, has_lone_surrogate, show, show_path
from memstrata.core.constants import (
    AGENT_ID_PATTERN,
    CATEGORY_PATTERN,
    MAX_AUTHOR_CHARS,
    MAX_KEY_CHARS,
    MAX_PATH_CHARS,
    MAX_ROW_ID,
    MAX_SCOPE_CHARS,
    MAX_TAG_KEY_CHARS,
    MAX_TAG_VALUE_CHARS,
    MAX_TAGS,
    MAX_TASK_ID_CHARS,
    MAX_TOP_K,
    MIN_ROW_ID,
    MODES,
    SHARED,
)
from memstrata.core.errors import InvalidInputError
from memstrata.core.json_text import check_json_value, json_copy

__all__ = [
    "check_agent_id",
    "check_author",
    "check_aware",
    "check_bool",
    "check_category",
    "check_content",
    "check_datetime",
    "check_int",
    "check_json_value",
    "check_key",
    "check_language",
    "check_min_score",
    "check_mode",
    "check_number",
    "check_optional_text",
    "check_path",
    "check_row_id",
    "check_scope",
    "check_session_id",
    "check_signal_key",
    "check_signal_pattern",
    "check_tags",
    "check_task_id",
    "check_text",
    "check_timeout",
    "check_top_k",
    "check_ttl",
    "clean_text",
    "fail",
    "has_lone_surrogate",
    "is_plain_content",
    "json_copy",
    "read_iso_datetime",
    "show",
    "show_path",
]

_ID_RE = re.compile(AGENT_ID_PATTERN)
_CATEGORY_RE = re.compile(CATEGORY_PATTERN)
_CONTROL = re.compile("[\x00-\x1f\x7f]")
# names some file systems refuse whatever the extension (ids become file names)
_DEVICE_NAMES = frozenset(
    {"con", "prn", "aux", "nul"} | {f"com{i}" for i in range(1, 10)} | {f"lpt{i}" for i in range(1, 10)}
)


# -- text ---------------------------------------------------------------------------------------


def check_text(value: object, name: str, *, allow_empty: bool = False) -> str:
    """A ``str`` (a query, a task description); not blank unless ``allow_empty``. Kept as given:
    searches and prompts cope with any character."""
    if not isinstance(value, str):
        raise fail(name, "must be a string", value)
    if not allow_empty and not value.strip():
        raise fail(name, "must be a non-empty string", value)
    return value


def check_content(value: object, name: str = "content", *, max_bytes: int) -> str:
    """Stored free text: not blank, at most ``max_bytes`` bytes of UTF-8 (``max_content_bytes``);
    lone surrogates become U+FFFD. Callers on one write path call this once, where the text is
    stored."""
    if not isinstance(value, str):
        raise InvalidInputError(f"{name} must be a str, got {type(value).__name__}")
    if not value.strip():
        raise InvalidInputError(f"{name} must not be empty or only whitespace")
    if len(value) > 4 * max_bytes:  # a code point takes at most 4 bytes: no need to encode it all
        raise InvalidInputError(
            f"{name} is {len(value)} characters, over the limit of {max_bytes:,} bytes (max_content_bytes)"
        )
    cleaned = clean_text(value)
    size = len(cleaned.encode("utf-8"))
    if size > max_bytes:
        raise InvalidInputError(
            f"{name} is {size} bytes of UTF-8, over the limit of {max_bytes:,} bytes (max_content_bytes)"
        )
    return cleaned


def is_plain_content(value: object, *, max_bytes: int) -> TypeGuard[str]:
    """Whether ``value`` is content :func:`check_content` returns unchanged, decided without it
    for the common case: a ``str`` of ASCII (so no lone surrogate to replace, and as many UTF-8
    bytes as characters), not blank, within ``max_bytes``. ``False`` says nothing: the
    value still goes through :func:`check_content` (a bulk load checks 100k items this way)."""
    return type(value) is str and value.isascii() and 0 < len(value) <= max_bytes and not value.isspace()


def check_optional_text(value: object, name: str, *, max_chars: int) -> str | None:
    """``None`` or free text of at most ``max_chars`` characters (``""`` means ``None``); lone
    surrogates become U+FFFD."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidInputError(f"{name} must be a str or None, got {type(value).__name__}")
    if value == "":
        return None
    if len(value) > max_chars:
        raise InvalidInputError(f"{name} is {len(value)} characters, over the limit of {max_chars}")
    return clean_text(value)


def check_author(value: object, name: str = "author") -> str | None:
    """Who wrote an entry: ``None`` or free text of at most 256 characters (``""`` is kept)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidInputError(f"{name} must be a str or None, got {type(value).__name__}")
    if len(value) > MAX_AUTHOR_CHARS:
        raise InvalidInputError(f"{name} is {len(value)} characters, over the limit of {MAX_AUTHOR_CHARS}")
    return clean_text(value)


def check_path(value: object, name: str = "path") -> str:
    """A file or folder path given as text (``str`` or ``os.PathLike[str]``), returned as given:
    not blank, at most 4096 characters, no NUL and no lone surrogate. Every database and every
    answer keeps paths as UTF-8 text, so a path that is not valid UTF-8 (JSON's ``"\\ud800"``, or
    a name in another encoding) could be neither stored nor reported: it is refused here, before
    the file system or a codec sees it."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise InvalidInputError(f"{name} must be a path given as a string, got {type(value).__name__}")
    if not value.strip():
        raise fail(name, "must be a non-empty path", value)
    if len(value) > MAX_PATH_CHARS:
        raise InvalidInputError(f"{name} is {len(value)} characters, over the limit of {MAX_PATH_CHARS}")
    if "\x00" in value:
        raise fail(name, "must not contain NUL characters", value)
    if has_lone_surrogate(value):
        shown = _CONTROL.sub(lambda found: repr(found.group())[1:-1], show_path(value))
        shown = shown if len(shown) <= 80 else shown[:77] + "..."  # one line, however long
        raise InvalidInputError(f"{name} must be valid UTF-8 text (no lone surrogates), got '{shown}'")
    return value


# -- names --------------------------------------------------------------------------------------


def _check_id(value: object, name: str, *, kind: str, allow_shared: bool) -> str:
    if not isinstance(value, str) or not _ID_RE.fullmatch(value) or value.endswith("."):
        raise fail(
            name,
            "must be an id of 1-64 letters, digits, '_', '-' or '.' "
            "(starting with a letter or digit, not ending with '.')",
            value,
        )
    lowered = value.lower()
    if lowered.split(".", 1)[0] in _DEVICE_NAMES:
        raise fail(name, f"is a reserved device name and cannot be a {kind} id", value)
    if lowered == SHARED and not allow_shared:
        raise fail(name, f"'{SHARED}' is reserved for the shared knowledge store", value)
    return value


def check_agent_id(value: object, name: str = "agent_id", *, allow_shared: bool = False) -> str:
    """An agent id becomes a file name (``knowledge/{id}.sqlite``): a safe, portable name.
    ``"shared"`` (any case) names the shared knowledge store, allowed only where it is a target."""
    return _check_id(value, name, kind="agent", allow_shared=allow_shared)


def check_session_id(value: object, name: str = "session_id") -> str:
    """A blackboard session id becomes a file name when snapshots are on."""
    return _check_id(value, name, kind="session", allow_shared=True)


@overload
def check_task_id(value: object, name: str = ..., *, optional: Literal[False] = ...) -> str: ...
@overload
def check_task_id(value: object, name: str = ..., *, optional: bool) -> str | None: ...
def check_task_id(value: object, name: str = "task_id", *, optional: bool = False) -> str | None:
    """A task or task-run id: 1-256 characters, no control characters, no lone surrogates;
    ``optional`` lets ``None`` and ``""`` through as ``None`` (no task run)."""
    if optional and (value is None or value == ""):
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_TASK_ID_CHARS:
        raise fail(name, f"must be a non-empty string of at most {MAX_TASK_ID_CHARS} characters", value)
    if has_lone_surrogate(value) or _CONTROL.search(value):
        raise fail(name, "must not contain control characters or lone surrogates", value)
    return value


def check_key(value: object, name: str = "key") -> str:
    """A working-memory or blackboard key: 1-1024 characters, no NUL, no lone surrogates."""
    if not isinstance(value, str) or not value or len(value) > MAX_KEY_CHARS:
        raise fail(name, f"must be a non-empty string of at most {MAX_KEY_CHARS} characters", value)
    if has_lone_surrogate(value) or "\x00" in value:
        raise fail(name, "must not contain NUL or lone surrogates", value)
    return value


def check_signal_key(value: object, name: str = "key") -> str:
    """A blackboard key to publish or read: a key without ``*`` (kept for prefix patterns)."""
    key = check_key(value, name)
    if "*" in key:
        raise fail(name, "must not contain '*' (reserved for prefix subscriptions)", value)
    return key


def check_signal_pattern(value: object, name: str = "key_or_prefix") -> str:
    """A blackboard subscription: a key, or a prefix ending in ``*`` (``"*"`` alone: every key)."""
    if value == "*":
        return "*"
    pattern = check_key(value, name)
    if "*" in pattern[:-1]:
        raise fail(name, "may contain '*' only at the end (a prefix subscription)", value)
    return pattern


def check_category(value: object, name: str = "category") -> str:
    """A knowledge category or episode kind: 1-64 of ``a-z 0-9 _ -``, starting with a letter or
    digit (``pitfall``, ``planning-pitfall``); any such name is accepted."""
    if not isinstance(value, str) or _CATEGORY_RE.fullmatch(value) is None:
        raise fail(
            name,
            "is not valid: use 1-64 characters from a-z, 0-9, '_' and '-', starting with a letter or "
            "digit (e.g. 'pitfall', 'planning-pitfall')",
            value,
        )
    return value


def check_tags(value: object, name: str = "tags") -> dict[str, str]:
    """Tags in their one accepted shape (see the module docstring), as a new dict sorted by key.

    Keys: 1-128 characters, not blank, no control characters, no lone surrogates. Values: free
    text of at most 1024 characters. At most 64 tags. ``None`` is no tags (``{}``).
    """
    if value is None:
        return {}
    items: Iterable[tuple[object, object]]
    if isinstance(value, Mapping):
        items = value.items()
    elif isinstance(value, list | tuple | set | frozenset):
        items = ((tag, "") for tag in value)
    else:
        raise InvalidInputError(f"{name} must be a dict of str to str, got {type(value).__name__}")
    tags: dict[str, str] = {}
    for key, item in items:
        if not isinstance(key, str):
            raise InvalidInputError(f"{name} keys must be str, got {type(key).__name__} {show(key)}")
        if not isinstance(item, str):
            raise InvalidInputError(
                f"{name}[{show(key)}] must be a str, got {type(item).__name__} (use '' for a bare tag)"
            )
        if not key.strip() or len(key) > MAX_TAG_KEY_CHARS or _CONTROL.search(key):
            raise InvalidInputError(
                f"{name} key {show(key)} must be 1-{MAX_TAG_KEY_CHARS} characters without control characters"
            )
        if has_lone_surrogate(key):
            raise InvalidInputError(f"{name} key {show(key)} must not contain lone surrogates")
        if len(item) > MAX_TAG_VALUE_CHARS:
            raise InvalidInputError(
                f"{name}[{show(key)}] is {len(item)} characters, over the limit of {MAX_TAG_VALUE_CHARS}"
            )
        tags[key] = clean_text(item)
        if len(tags) > MAX_TAGS:
            raise InvalidInputError(f"{name} has more than {MAX_TAGS} keys, over the limit of {MAX_TAGS}")
    return dict(sorted(tags.items()))


def check_scope(value: object, name: str = "scope") -> str:
    """A normalised path-like scope: ``/`` or ``/a/b`` (no trailing slash, no empty segments).

    ``"src//auth/"`` becomes ``"/src/auth"``, each segment is stripped of surrounding spaces
    (``"/src/auth /"`` is ``"/src/auth"``, so a normal scope normalises to itself), ``"."``
    segments are dropped, ``""`` is ``"/"``; ``".."`` segments, control characters and lone
    surrogates are rejected.
    """
    if not isinstance(value, str):
        raise InvalidInputError(f"{name} must be a str like '/src/auth', got {type(value).__name__}")
    if len(value) > MAX_SCOPE_CHARS:
        raise InvalidInputError(f"{name} is {len(value)} characters, over the limit of {MAX_SCOPE_CHARS}")
    if _CONTROL.search(value) or has_lone_surrogate(value):
        raise InvalidInputError(f"{name} {show(value)} contains control characters or lone surrogates")
    parts = [p for p in (segment.strip() for segment in value.split("/")) if p not in ("", ".")]
    if ".." in parts:
        raise InvalidInputError(f"{name} {show(value)} must not contain '..' segments")
    return "/" + "/".join(parts)


# -- numbers and flags --------------------------------------------------------------------------


def check_int(value: object, name: str, low: int, high: int | None = None) -> int:
    """An ``int`` (not ``bool``) from ``low`` to ``high`` (``None``: no upper bound)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < low
        or (high is not None and value > high)
    ):
        bound = f">= {low}" if high is None else f"from {low} to {high}"
        raise fail(name, f"must be an integer {bound}", value)
    return value


def check_top_k(value: object, name: str = "top_k") -> int:
    """How many hits a search returns: 1 to :data:`~memstrata.core.constants.MAX_TOP_K`."""
    return check_int(value, name, 1, MAX_TOP_K)


def check_row_id(value: object, name: str = "id") -> int:
    """A row id: an ``int`` SQLite can hold (a larger one could never name a row)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(f"{name} must be an int, got {type(value).__name__} {show(value)}")
    if not MIN_ROW_ID <= value <= MAX_ROW_ID:
        raise InvalidInputError(f"{name} must be a 64-bit integer (-2**63 to 2**63 - 1), got {show(value)}")
    return value


def check_number(
    value: object, name: str, *, low: float = 0.0, high: float = math.inf, optional: bool = True
) -> float | None:
    """A finite ``int`` or ``float`` (not ``bool``) from ``low`` to ``high``; ``None`` if optional."""
    if value is None and optional:
        return None
    number = _as_float(value)
    if number is None or not math.isfinite(number) or not low <= number <= high:
        bound = f"from {low:g} to {high:g}" if math.isfinite(high) else f">= {low:g}"
        raise fail(name, f"must be a number {bound}", value)
    return number


def _as_float(value: object) -> float | None:
    """An ``int`` or ``float`` (not ``bool``) as a float; ``None`` for anything else, an integer
    beyond a double's range included (``float()`` would raise ``OverflowError``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def check_timeout(value: object, name: str = "timeout") -> float | None:
    """``None`` (the default bound) or how many seconds to wait: a finite number from 0 up to
    what a thread can wait for. Checked before anything is sent: a bad bound is the caller's
    mistake, named as such, not a timeout that never was (``no answer within nan s``)."""
    if value is None:
        return None
    number = _as_float(value)
    if number is None or not 0 <= number <= threading.TIMEOUT_MAX:  # NaN and inf fail too
        raise fail(name, "must be a number of seconds, at least 0 and finite", value)
    return number


def check_ttl(value: object, name: str, *, unit: str = "seconds", high: float = math.inf) -> float | None:
    """A time to live: a positive number of ``unit`` up to ``high``, or ``None`` (no expiry). 0 is
    refused: a value gone the moment it is stored is a mistake, not a choice."""
    if value is None:
        return None
    number = _as_float(value)
    if number is None or not (math.isfinite(number) and 0 < number <= high):
        bound = f" up to {high:g}" if math.isfinite(high) else ""
        raise fail(name, f"must be a positive number of {unit}{bound}", value)
    return number


def check_min_score(value: object, name: str = "min_score") -> float | None:
    """``None`` or a cosine similarity threshold from -1 to 1."""
    return check_number(value, name, low=-1.0, high=1.0)


def check_language(value: object, names: Mapping[str, str], name: str = "language") -> str:
    """A language filter as the name chunks are stored with. ``names`` maps every accepted
    spelling (lowercase: a language, a file extension without its dot, an alias) to that name;
    any case and a leading dot are accepted. An unknown language is refused, listing the known
    ones, rather than matching nothing without a word."""
    if not isinstance(value, str) or not value.strip():
        raise fail(name, "must be a non-empty string", value)
    key = value.strip().lower()
    found = names.get(key, names.get(key.lstrip(".")))
    if found is None:
        known = ", ".join(sorted(set(names.values())))
        raise InvalidInputError(
            f"{name} {show(value)} is not a known language: use one of {known} "
            "(or a file extension such as py)"
        )
    return found


def check_mode(value: object, name: str = "mode") -> str:
    """A search mode: ``hybrid``, ``vector`` or ``keyword``."""
    if not isinstance(value, str) or value not in MODES:
        raise fail(name, f"must be one of {', '.join(MODES)}", value)
    return value


def check_bool(value: object, name: str) -> bool:
    """``True`` or ``False`` (not 0/1, not a string)."""
    if not isinstance(value, bool):
        raise fail(name, "must be true or false", value)
    return value


# -- times --------------------------------------------------------------------------------------


def check_aware(value: object, name: str) -> _dt.datetime:
    """A timezone-aware datetime that converts to UTC (naive datetimes are ambiguous)."""
    if not isinstance(value, _dt.datetime):
        raise InvalidInputError(f"{name} must be a timezone-aware datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidInputError(
            f"{name} must be timezone-aware (e.g. datetime.now(timezone.utc)); got naive {value.isoformat()}"
        )
    try:
        value.astimezone(_dt.UTC)
    except OverflowError as exc:
        raise InvalidInputError(f"{name} is out of range in UTC: {value.isoformat()}") from exc
    return value


def read_iso_datetime(value: str) -> _dt.datetime:
    """An ISO 8601 date-time as every door reads it (naive without a zone; RFC 3339's ``t``/``z``
    are ``T``/``Z``); ``ValueError`` when it is none, white space around it or a leap second too."""
    text = value[:-1] + "+00:00" if value.endswith(("z", "Z")) else value
    return _dt.datetime.fromisoformat(text)


def check_datetime(value: object, name: str) -> _dt.datetime | None:
    """``None``, an aware datetime, or an ISO 8601 string with a time zone (as sent over JSON)."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = read_iso_datetime(value)
        except ValueError as exc:
            raise fail(name, "must be an ISO-8601 datetime with a time zone", value) from exc
    return check_aware(value, name)


_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)
# UNIX seconds a datetime holds, whole seconds (the last one's fraction rounds into year 10000)
_FIRST_SECOND = (_dt.datetime.min.replace(tzinfo=_dt.UTC) - _EPOCH).total_seconds()
_LAST_SECOND = (_dt.datetime.max.replace(tzinfo=_dt.UTC, microsecond=0) - _EPOCH).total_seconds()


def check_timestamp(value: object, name: str, *, optional: bool = False) -> float | None:
    """UNIX seconds within years 1 to 9999 (UTC), as every time the clock stamps is: a stored
    time beyond could not be shown as a date (each door would fail on it); ``None`` if optional."""
    if value is None and optional:
        return None
    number = _as_float(value)
    if number is None or not _FIRST_SECOND <= number <= _LAST_SECOND:
        raise fail(name, "must be a number of UNIX seconds within years 1 to 9999", value)
    return number


def check_time_range(since: _dt.datetime | None, until: _dt.datetime | None) -> None:
    """``since`` is not after ``until`` (aware datetimes, either may be ``None``): every door
    refuses the empty range the same way, whether or not the agent has episodes yet."""
    if since is not None and until is not None and since > until:
        raise InvalidInputError(
            f"since ({since.astimezone(_dt.UTC).isoformat()}) is after until "
            f"({until.astimezone(_dt.UTC).isoformat()})"
        )
