"""Lazy package attributes: a package names the module each public name lives in, and that module
is imported on first use, so importing the package itself stays cheap."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_attributes"]


def lazy_attributes(package: str, homes: Mapping[str, str], names: dict[str, Any]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: imports ``homes[name]`` (relative to the package)
    on first use and keeps the value in ``names`` (the package's ``globals()``)."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home, package), name)
        names[name] = value
        return value

    return __getattr__
