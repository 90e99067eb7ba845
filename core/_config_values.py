"""Raw configuration values (TOML tables, ``MEMSTRATA_*`` environment strings) checked and
converted to the types of the config dataclasses; errors name the key and where it came from."""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memstrata.core.errors import ConfigError

__all__ = ["EnvValue", "convert", "env_source", "find_file", "set_dotted", "type_name"]


def find_file(path: str | Path | None, env: Mapping[str, str]) -> Path | None:
    if path is None and env.get("MEMSTRATA_CONFIG"):
        path = env["MEMSTRATA_CONFIG"]
    if path is not None:
        candidate = Path(path).expanduser()
        if not candidate.is_file():
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
    node[parts[-1]] = EnvValue(value) if from_env else value


class EnvValue(str):
    """A string from the environment: converted to the field's type, not type-checked as str."""


def env_source(raw: Any, dotted: str) -> str:
    """Names the environment variable a bad value came from, so the user knows where to look."""
    if not isinstance(raw, EnvValue):
        return ""
    return f" (from environment variable MEMSTRATA_{dotted.upper().replace('.', '__')})"


def convert(raw: Any, hint: Any, key: str, where: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if isinstance(raw, EnvValue) and raw.lower() in ("", "none", "null") and type(None) in args:
            return None
        if raw is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return convert(raw, inner[0], key, where)
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
        if hint is int:
            if isinstance(raw, bool) or not isinstance(raw, int | str):
                raise TypeError
            value = int(raw) if isinstance(raw, EnvValue) else raw
            if not isinstance(value, int) or value < 0:
                raise ValueError
            return value
        if hint is float:
            if isinstance(raw, bool) or not isinstance(raw, int | float | str):
                raise TypeError
            number = float(raw) if isinstance(raw, EnvValue) else raw
            if not isinstance(number, int | float) or not math.isfinite(number) or number < 0:
                raise ValueError
            return float(number)
        if hint is str:
            if not isinstance(raw, str):
                raise TypeError
            return str(raw)
        if origin is tuple:
            items = raw.split(",") if isinstance(raw, EnvValue) else raw
            if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
                raise TypeError
            return tuple(i.strip() for i in items if i.strip())
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"{where}: config key {key!r} has invalid value {raw!r} (expected {type_name(hint)})"
            f"{env_source(raw, key)}"
        ) from exc
    raise ConfigError(f"{where}: config key {key!r} has an unsupported type")  # pragma: no cover


def type_name(hint: Any) -> str:
    if hint is float:
        return "a non-negative number"
    if hint is int:
        return "a non-negative integer"
    if typing.get_origin(hint) is tuple:
        return "a list of strings"
    return getattr(hint, "__name__", str(hint))
