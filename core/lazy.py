"""Lazy package attributes: a package names the module each public name lives in, and that module
is imported on first use, so importing the package itself stays cheap."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from typing import Any

__all__ = ["lazy_attributes"]


def lazy_attributes(package: str, homes: Mapping[str, str]) -> None:
    """Give the module ``package`` a ``__getattr__`` that imports ``homes[name]`` (relative to the
    package) on first use and keeps the value in the module, and a ``__dir__`` that lists them.

    It is set at run time only, so type checkers see just the package's ``TYPE_CHECKING``
    imports and still flag a name the package does not have."""
    module = sys.modules[package]
    names = vars(module)

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home, package), name)
        names[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(names) | set(homes))

    module.__getattr__ = __getattr__  # type: ignore[method-assign]
    module.__dir__ = __dir__  # type: ignore[method-assign]
