"""The field types of the messages, each carrying the rule that checks it.

A message declares ``agent_id: AgentId`` instead of checking the field by hand: the :class:`Rule`
in the type is applied by ``Message.__post_init__`` (see :mod:`._codec`) with the rules of
:mod:`memstrata.core.validation`, so every message checks a field of one kind the same way and
names it ``"MessageName.field"`` in the error. ``Opt*`` types also take ``None`` (not checked).
"""

from __future__ import annotations

import datetime as _dt
import functools
from typing import Annotated, Any, TypeVar

from memstrata.core.constants import MAX_ENTRY_ID, MAX_OFFSET, MAX_TITLE_CHARS
from memstrata.core.validation import (
    check_agent_id,
    check_author,
    check_bool,
    check_category,
    check_datetime,
    check_int,
    check_key,
    check_min_score,
    check_mode,
    check_optional_text,
    check_scope,
    check_session_id,
    check_signal_key,
    check_signal_pattern,
    check_tags,
    check_task_id,
    check_text,
    check_top_k,
    check_ttl,
    json_copy,
)

from ._codec import Rule

__all__ = [
    "AgentId",
    "Author",
    "Category",
    "Flag",
    "JsonValue",
    "Key",
    "Many",
    "MinScore",
    "Mode",
    "OptAgentId",
    "OptCategory",
    "OptKey",
    "OptKeyPrefix",
    "OptQuery",
    "OptScope",
    "OptTaskId",
    "OptText",
    "OptTopK",
    "PageSize",
    "PageStart",
    "Query",
    "RowId",
    "Scope",
    "SessionId",
    "SignalKey",
    "SignalPattern",
    "Tags",
    "TargetId",
    "TaskId",
    "Text",
    "Time",
    "Title",
    "TopK",
    "Ttl",
    "WorkingTaskId",
    "between",
]

T = TypeVar("T")


def between(low: int, high: int, *, optional: bool = False) -> Rule:
    """The rule of an ``int`` field from ``low`` to ``high`` (``Annotated[int, between(0, 100)]``)."""
    return Rule(functools.partial(check_int, low=low, high=high), optional=optional)


# partial objects, not wrapper functions: a message is built on hot paths
_check_query = functools.partial(check_text, allow_empty=True)
_check_target = functools.partial(check_agent_id, allow_shared=True)
_check_working_task = functools.partial(check_task_id, optional=True)
_check_title = functools.partial(check_optional_text, max_chars=MAX_TITLE_CHARS)


def _check_key_prefix(value: object, name: str) -> str:
    """A key prefix: ``""`` (every key), or written as a subscription writes one (a key, ``"x*"``
    or ``"*"``): keys hold no ``*``, so a trailing one only repeats that this is a prefix."""
    return "" if value == "" else check_signal_pattern(value, name)


def _as_tuple(value: Any, name: str) -> tuple[Any, ...]:
    return tuple(value)


# -- names --------------------------------------------------------------------------------------
AgentId = Annotated[str, Rule(check_agent_id)]
OptAgentId = Annotated[str | None, Rule(check_agent_id, optional=True)]
TargetId = Annotated[str, Rule(_check_target)]  # an agent id, or "shared" for the shared store
SessionId = Annotated[str, Rule(check_session_id)]
TaskId = Annotated[str, Rule(check_task_id)]
OptTaskId = Annotated[str | None, Rule(check_task_id, optional=True)]
WorkingTaskId = Annotated[str | None, Rule(_check_working_task)]  # None or "": the agent-wide space
Key = Annotated[str, Rule(check_key)]
OptKey = Annotated[str | None, Rule(check_key, optional=True)]
OptKeyPrefix = Annotated[str | None, Rule(_check_key_prefix, optional=True)]
SignalKey = Annotated[str, Rule(check_signal_key)]
SignalPattern = Annotated[str, Rule(check_signal_pattern)]
Category = Annotated[str, Rule(check_category)]
OptCategory = Annotated[str | None, Rule(check_category, optional=True)]

# -- text ---------------------------------------------------------------------------------------
Text = Annotated[str, Rule(check_text)]
OptText = Annotated[str | None, Rule(check_text, optional=True)]
Query = Annotated[str, Rule(_check_query)]
OptQuery = Annotated[str | None, Rule(_check_query, optional=True)]
Title = Annotated[str | None, Rule(_check_title)]
Author = Annotated[str | None, Rule(check_author)]

# -- normalised: the field holds the normal form ------------------------------------------------
Tags = Annotated[dict[str, str] | None, Rule(check_tags, normalise=True, optional=True)]
Scope = Annotated[str, Rule(check_scope, normalise=True)]
OptScope = Annotated[str | None, Rule(check_scope, normalise=True, optional=True)]
Time = Annotated[_dt.datetime | None, Rule(check_datetime, normalise=True)]
Many = Annotated[tuple[T, ...], Rule(_as_tuple, normalise=True)]  # any iterable, held as a tuple

# -- numbers, flags, values ---------------------------------------------------------------------
TopK = Annotated[int, Rule(check_top_k)]
OptTopK = Annotated[int | None, Rule(check_top_k, optional=True)]
RowId = Annotated[int, between(1, MAX_ENTRY_ID)]
PageSize = Annotated[int, between(0, 10_000)]  # a page of a listing (episodes, knowledge)
PageStart = Annotated[int, between(0, MAX_OFFSET)]  # how many rows of the listing come before the page
MinScore = Annotated[float | None, Rule(check_min_score)]
Ttl = Annotated[float | None, Rule(check_ttl)]  # seconds to live, None: no expiry
Flag = Annotated[bool, Rule(check_bool)]
Mode = Annotated[str, Rule(check_mode)]
JsonValue = Annotated[Any, Rule(json_copy, normalise=True)]  # the message's own copy
