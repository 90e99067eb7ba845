"""What the adapters share: where a running system keeps its items, and a clear missing-extra error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memstrata.errors import ConfigError

ITEMS_FILE = "items.sqlite"


def missing(module: str, extra: str, exc: ImportError) -> ImportError:
    """The error for an adapter whose framework is not installed: names the extra."""
    return ImportError(f"{module} is not installed: pip install 'memstrata[{extra}]' ({exc})")


def items_path(target: Any) -> Path | str:
    """The item database for a path, ``":memory:"``, or a running ``MemorySystem``."""
    from memstrata._system import MemorySystem

    if isinstance(target, MemorySystem):
        return target.data_dir / ITEMS_FILE
    if isinstance(target, str | Path):
        return target
    raise ConfigError(f"expected a database path or a MemorySystem, got {type(target).__name__}")


def items_of(system: Any) -> Any:
    """A running ``MemorySystem``'s item store handle (``system.items``)."""
    from memstrata._system import MemorySystem

    if not isinstance(system, MemorySystem):
        raise ConfigError(f"system must be a running MemorySystem, got {type(system).__name__}")
    return system.items
