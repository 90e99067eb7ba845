"""The wire form of the actors' messages: the :class:`Message` base, its registry and the codec.

:func:`encode` turns a message into orjson bytes tagged with its type name
(``{"type": "StoreKnowledge", ...}``) and :func:`decode` turns such bytes (or the decoded dict)
back into the same message; ``msg.to_dict()`` / ``Message.from_dict(d)`` do the same without the
bytes. Datetimes travel as ISO-8601 strings; search hits travel as nested objects.

A message checks itself when it is built: each field whose type is ``Annotated[..., Rule(...)]``
(the field types of :mod:`._msg_fields`) is checked by its rule, in field order, with
``"MessageName.field"`` as the name in the error; the rules of a class are read into one
function on its first message. A check that spans fields is the class's ``_check`` method, run
after the rules (a message class defines ``_check``, never ``__post_init__``).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

import orjson

from memstrata.core.errors import InvalidInputError
from memstrata.core.json_text import loads_or_refuse
from memstrata.core.jsonable import to_jsonable

__all__ = ["Message", "Rule", "decode", "encode", "field_rules", "message_types"]

M = TypeVar("M", bound="Message")


@dataclasses.dataclass(frozen=True, slots=True)
class Rule:
    """How one message field is checked, put in its type: ``Annotated[str, Rule(check_key)]``.

    ``check(value, "MessageName.field")`` raises :class:`InvalidInputError` on a bad value;
    ``normalise`` stores what it returns (sorted tags, a clean scope, a parsed time, a tuple);
    ``optional`` lets ``None`` through unchecked.
    """

    check: Callable[[Any, str], object]
    normalise: bool = False
    optional: bool = False


@typing.dataclass_transform(frozen_default=True)
class _MessageType(type):
    """Makes each class built on :class:`Message` a frozen, slotted dataclass, so that no
    message can be declared mutable or without slots by forgetting a decorator."""

    def __new__(
        mcls, name: str, bases: tuple[type, ...], namespace: dict[str, Any], **kwargs: Any
    ) -> _MessageType:
        cls = super().__new__(mcls, name, bases, namespace, **kwargs)
        if not bases or "__dataclass_fields__" in namespace:
            return cls  # the base itself, or the slotted class ``dataclass`` makes of a message
        return typing.cast(_MessageType, dataclasses.dataclass(frozen=True, slots=True)(cls))


class Message(metaclass=_MessageType):
    """Base of every message: ``to_dict``/``from_dict`` and a type tag for the wire. A subclass
    is a frozen, slotted dataclass without a decorator (see :class:`_MessageType`)."""

    __slots__ = ()
    type_name: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.type_name = cls.__name__
        _REGISTRY[cls.__name__] = cls
        if "__post_init__" not in cls.__dict__:  # each class compiles its own on first use
            setattr(cls, "__post_init__", Message.__post_init__)  # noqa: B010

    def __post_init__(self) -> None:
        """Compile the class's checks (its field rules, then its ``_check``) and run them."""
        cls = type(self)
        checks = _compile_checks(cls)
        setattr(cls, "__post_init__", checks)  # noqa: B010
        checks(self)

    def _check(self) -> None:
        """Checks that span fields (one of two fields, a name built from another field)."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict with a ``"type"`` tag (datetimes as ISO strings)."""
        data: dict[str, Any] = {"type": self.type_name}
        for f in dataclasses.fields(self):
            data[f.name] = to_jsonable(getattr(self, f.name))
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
        data = loads_or_refuse(data, "message")
    if not isinstance(data, Mapping):
        raise InvalidInputError(f"a message must be a JSON object, got {type(data).__name__}")
    tag = data.get("type")
    cls = _REGISTRY.get(tag) if isinstance(tag, str) else None
    if cls is None:
        raise InvalidInputError(f"unknown message type {tag!r}")
    return cls.from_dict(data)


def _layer_names() -> dict[str, Any]:
    """Hit classes referenced by result messages, imported only when a result is decoded."""
    from memstrata.layers import Episode, EpisodeHit, KnowledgeEntry, KnowledgeHit

    return {
        "KnowledgeHit": KnowledgeHit,
        "KnowledgeEntry": KnowledgeEntry,
        "EpisodeHit": EpisodeHit,
        "Episode": Episode,
    }


def _resolve_hints(cls: type, *, extras: bool) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls, include_extras=extras)
    except NameError:
        return typing.get_type_hints(cls, localns=_layer_names(), include_extras=extras)


def _hints(cls: type) -> dict[str, Any]:
    cached = _HINTS.get(cls)
    if cached is None:
        cached = _HINTS[cls] = _resolve_hints(cls, extras=False)
    return cached


_HINTS: dict[type, dict[str, Any]] = {}


def field_rules(cls: type[Message]) -> dict[str, Rule]:
    """The :class:`Rule` of each checked field of a message class, in field order."""
    hints = _resolve_hints(cls, extras=True)
    rules: dict[str, Rule] = {}
    for field in dataclasses.fields(cls):
        found = [m for m in getattr(hints.get(field.name), "__metadata__", ()) if isinstance(m, Rule)]
        if len(found) > 1:
            raise TypeError(f"{cls.__name__}.{field.name} has more than one Rule")
        if found:
            rules[field.name] = found[0]
    return rules


def _compile_checks(cls: type[Message]) -> Callable[[Message], None]:
    """The class's checks as one function: its field rules in field order, then its ``_check``."""
    rules = [(name, f"{cls.__name__}.{name}", rule) for name, rule in field_rules(cls).items()]
    cross = cls._check if cls._check is not Message._check else None

    def __post_init__(self: Message) -> None:
        for name, where, rule in rules:
            value = getattr(self, name)
            if rule.optional and value is None:
                continue
            checked = rule.check(value, where)
            if rule.normalise:
                object.__setattr__(self, name, checked)
        if cross is not None:
            cross(self)

    __post_init__.__qualname__ = f"{cls.__qualname__}.__post_init__"
    return __post_init__


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
