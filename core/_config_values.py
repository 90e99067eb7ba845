"""Raw configuration values (TOML tables, ``MEMSTRATA_*`` environment strings) checked and
converted to the types of the config dataclasses; errors name the key and where it came from.

Each numeric field carries its range as a rule (:func:`checked`): the rules of
:mod:`memstrata.core.validation` where the value feeds a message (``top_k``, ``min_score``), else
the range the code using the value needs. A string field of a few choices carries them the same
way (:func:`one_of`). The same rule checks a value read from TOML or the
environment (:func:`convert`) and one given to a dataclass directly (:func:`check_fields`).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import math
import threading
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import field, fields
from functools import partial
from pathlib import Path
from typing import Any, Final

from memstrata.core.errors import ConfigError, InvalidInputError
from memstrata.core.validation import check_int, check_number, fail

__all__ = [
    "MAX_SPAN_S",
    "MAX_WAIT_S",
    "UNSET",
    "EnvValue",
    "Rule",
    "at_least",
    "check_fields",
    "checked",
    "convert",
    "env_source",
    "find_file",
    "in_range",
    "number",
    "one_of",
    "seconds",
    "set_dotted",
    "type_name",
    "unless_empty",
]

Rule = Callable[[object, str], object]
"""Checks ``value`` (``rule(value, name)``), raising InvalidInputError with ``name`` in the message."""

MAX_WAIT_S: Final = threading.TIMEOUT_MAX
"""The longest a lock or event can wait (longer raises OverflowError): the bound of every timeout."""

MAX_SPAN_S: Final = float(_dt.timedelta.max.days * 86_400)
"""The longest span a ``timedelta`` holds: episodic half-lives and ages become timedeltas."""


def checked(default: Any, rule: Rule, *, unset: bool = False) -> Any:
    """A dataclass field whose values ``rule`` checks wherever they come from; ``unset``: the
    field may also be ``None``."""
    return field(default=default, metadata={"rule": rule, "unset": unset})


def at_least(low: int) -> Rule:
    """An integer of at least ``low``."""
    return partial(check_int, low=low)


def in_range(low: int, high: int) -> Rule:
    """An integer from ``low`` to ``high``."""
    return partial(check_int, low=low, high=high)


def number(low: float = 0.0, high: float = math.inf) -> Rule:
    """A finite number from ``low`` to ``high``."""
    return partial(check_number, low=low, high=high, optional=False)


def _check_choice(value: object, name: str, choices: tuple[str, ...]) -> object:
    if value not in choices:
        raise fail(name, f"must be one of {', '.join(map(repr, choices))}", value)
    return value


def one_of(choices: Sequence[str]) -> Rule:
    """One of the strings ``choices``."""
    return partial(_check_choice, choices=tuple(choices))


def _check_seconds(value: object, name: str, high: float) -> object:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= high:
        bound = f" up to {high:.0f}" if math.isfinite(high) else ""
        raise fail(name, f"must be a positive number of seconds{bound}", value)
    return value


def seconds(high: float = MAX_WAIT_S) -> Rule:
    """A duration above 0 (a timeout of 0 s or less would wait for nothing) and at most ``high``."""
    return partial(_check_seconds, high=high)


def _check(value: object, metadata: Mapping[str, Any], name: str) -> None:
    if value is None and metadata["unset"]:
        return
    if metadata["rule"](value, name) is None:  # a rule that lets None through, for a key that must be set
        raise fail(name, "must be set", value)


def check_fields(section: Any, prefix: str) -> None:
    """Every checked field of a config dataclass holds a value its rule accepts (for values given
    to the dataclass directly; :func:`convert` checked those read from TOML or the environment)."""
    for item in fields(section):
        if "rule" in item.metadata:
            try:
                _check(getattr(section, item.name), item.metadata, f"config key '{prefix}{item.name}'")
            except InvalidInputError as exc:
                raise ConfigError(str(exc)) from None


def find_file(path: str | Path | None, env: Mapping[str, str]) -> Path | None:
    if path is None and env.get("MEMSTRATA_CONFIG"):
        path = env["MEMSTRATA_CONFIG"]
    if path is not None:
        candidate = Path(path).expanduser()
        if candidate.is_dir():
            raise ConfigError(f"config file {candidate} is a folder, not a file")
        if not candidate.exists():  # a pipe (`--config <(...)`, /dev/stdin) exists and is read
            raise ConfigError(f"config file {candidate} does not exist")
        return candidate
    for candidate in (Path.cwd() / "memstrata.toml", Path.home() / ".config" / "memstrata" / "config.toml"):
        if candidate.is_file():
            return candidate
    return None


def set_dotted(data: dict[str, Any], dotted: str, value: Any, *, from_env: bool) -> None:
    parts = dotted.split(".")
    node = data
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"config key {dotted!r}: {part!r} is not a table")
    if from_env:
        value = EnvValue(value)
        value.replaces = node.get(parts[-1], UNSET)
    node[parts[-1]] = value


UNSET: Final = object()
"""A key given no value: it keeps its default."""


class EnvValue(str):
    """A string from the environment: converted to the field's type, not type-checked as str.
    ``replaces`` is the file's value it overrides (:data:`UNSET` when the file had none)."""

    replaces: Any = UNSET


def unless_empty(raw: Any, hint: Any) -> Any:
    """``raw``, unless it is an empty environment value for a key that may not be unset (a number,
    a flag, a string, a path): that counts as not set, so the key keeps its value from the file,
    else its default (:data:`UNSET`). For a key that may be unset it unsets the key, and for a
    list it is the empty list: :func:`convert` reads those."""
    if not isinstance(raw, EnvValue) or raw != "":
        return raw
    origin = typing.get_origin(hint)
    if origin is tuple or (origin in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint)):
        return raw
    return raw.replaces


def env_source(raw: Any, dotted: str) -> str:
    """Names the environment variable a bad value came from, so the user knows where to look."""
    if not isinstance(raw, EnvValue):
        return ""
    return f" (from environment variable MEMSTRATA_{dotted.upper().replace('.', '__')})"


def convert(raw: Any, hint: Any, key: str, where: str, metadata: Mapping[str, Any] | None = None) -> Any:
    """``raw`` as a value of type ``hint`` for the config key ``key``; a number is also checked
    by the rule in its field's ``metadata`` (see :func:`checked`)."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Path and isinstance(raw, str) and not raw.strip():  # Path("") would be the working dir
        raise ConfigError(f"{where}: config key {key!r} must be a path, got {raw!r}{env_source(raw, key)}")
    if origin in (typing.Union, types.UnionType):
        if isinstance(raw, EnvValue) and raw.lower() in ("", "none", "null") and type(None) in args:
            return None
        if raw is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return convert(raw, inner[0], key, where, metadata)
    if hint is int or hint is float:
        return _number(raw, hint, key, where, metadata or {})
    if hint is str and isinstance(raw, str):
        return _ruled(str(raw), raw, key, where, metadata or {})
    try:
        if hint is Path:
            if not isinstance(raw, str | Path):
                raise TypeError
            return Path(raw).expanduser()
        if hint is bool:
            if isinstance(raw, EnvValue):
                lowered = raw.lower()
                if lowered in ("1", "true", "yes", "on"):
                    return True
                if lowered in ("0", "false", "no", "off"):
                    return False
                raise ValueError
            if not isinstance(raw, bool):
                raise TypeError
            return raw
        if hint is str:  # and not a string (a string is checked above)
            raise TypeError
        if origin is tuple:
            items = raw.split(",") if isinstance(raw, EnvValue) else raw
            if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
                raise TypeError
            value = tuple(i.strip() for i in items if i.strip())
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"{where}: config key {key!r} has invalid value {raw!r} (expected {type_name(hint)})"
            f"{env_source(raw, key)}"
        ) from exc
    if origin is tuple:
        return _ruled(value, raw, key, where, metadata or {})
    raise ConfigError(f"{where}: config key {key!r} has an unsupported type")  # pragma: no cover


def _number(raw: Any, hint: Any, key: str, where: str, metadata: Mapping[str, Any]) -> Any:
    """A number checked by its field's rule; an environment string is read as ``hint`` first (one
    that does not read as a number goes to the rule as it is, which names it)."""
    if "rule" not in metadata:  # pragma: no cover - every numeric field declares its range
        raise ConfigError(f"{where}: config key {key!r} has no range")
    value = raw
    if isinstance(raw, EnvValue):
        with contextlib.suppress(ValueError):
            value = int(raw) if hint is int else float(raw)
    _ruled(value, raw, key, where, metadata)
    return float(value) if hint is float else value


def _ruled(value: Any, raw: Any, key: str, where: str, metadata: Mapping[str, Any]) -> Any:
    """``value`` when its field's rule (if it has one) accepts it; else an error naming the key and
    the environment variable ``raw`` came from."""
    if "rule" in metadata:
        try:
            _check(value, metadata, f"config key {key!r}")
        except InvalidInputError as exc:
            raise ConfigError(f"{where}: {exc}{env_source(raw, key)}") from None
    return value


def type_name(hint: Any) -> str:
    if typing.get_origin(hint) is tuple:
        return "a list of strings"
    return getattr(hint, "__name__", str(hint))
