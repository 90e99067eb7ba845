"""Plain JSON types for values that leave memstrata: messages on the wire, bridge results."""

from __future__ import annotations

import dataclasses
import datetime as _dt
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

__all__ = ["to_jsonable"]


def to_jsonable(value: Any) -> Any:
    """``value`` with datetimes and dates as ISO 8601 strings, durations as seconds, paths as
    strings, dataclasses and named tuples as objects, sets and tuples as lists, numpy values as
    Python numbers; everything else unchanged (orjson writes it or says why not)."""
    if isinstance(value, _dt.datetime | _dt.date):
        return value.isoformat()
    if isinstance(value, _dt.timedelta):
        return value.total_seconds()
    if isinstance(value, PurePath):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a NamedTuple
        return {name: to_jsonable(getattr(value, name)) for name in value._fields}
    if isinstance(value, Mapping):
        return {k if isinstance(k, str) else str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [to_jsonable(v) for v in value]
    if type(value).__module__ == "numpy":  # numpy scalars and arrays
        return value.tolist()
    return value
