"""The SQLite driver and sqlite-vec: which module connects, and loading the extension into it.

stdlib ``sqlite3`` is used when it can load extensions; otherwise ``sqlean`` (sqlean.py), a
drop-in driver built with extension loading. Apart from :mod:`._connection` so that probing the
driver (``driver_info``) needs no connection logic, and the connection logic no probing.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sqlite3
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any

__all__ = ["DriverInfo", "disable_vec_for_tests", "driver_info"]


@dataclass(frozen=True, slots=True)
class DriverInfo:
    """Which SQLite driver is in use and whether sqlite-vec is native."""

    driver: str
    sqlite_version: str
    vec_version: str | None
    native_vectors: bool
    reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _stdlib_can_load() -> bool:
    try:
        conn = sqlite3.connect(":memory:")
    except sqlite3.Error:
        return False
    try:
        return hasattr(conn, "enable_load_extension")
    finally:
        conn.close()


def _pick_module() -> ModuleType:
    if _stdlib_can_load():
        return sqlite3
    try:
        import sqlean  # type: ignore[import-not-found,unused-ignore]
    except ImportError:  # pragma: no cover - sqlean.py is a hard dependency
        return sqlite3
    return sqlean  # type: ignore[no-any-return,unused-ignore]


_MODULE: ModuleType = _pick_module()
_VEC_DISABLED = threading.Event()  # tests flip this to exercise the numpy fallback


def _vec_library() -> str:
    """The sqlite-vec library's path, found without importing the ``sqlite_vec`` package (whose
    import pulls in numpy, which a process that only counts rows does not need)."""
    spec = importlib.util.find_spec("sqlite_vec")
    if spec is None or spec.origin is None:
        raise ImportError("the sqlite_vec package is not installed")
    return os.path.join(os.path.dirname(spec.origin), "vec0")


def _load_vec(conn: Any) -> tuple[str | None, str | None]:
    """Load sqlite-vec into ``conn``; returns (version, reason it could not load)."""
    if _VEC_DISABLED.is_set():
        return None, "sqlite-vec disabled"
    if not hasattr(conn, "enable_load_extension"):
        return None, f"{_MODULE.__name__} cannot load extensions"
    try:
        conn.enable_load_extension(True)
        try:
            conn.load_extension(_vec_library())
        finally:
            conn.enable_load_extension(False)
        version = conn.execute("SELECT vec_version()").fetchone()[0]
    except Exception as exc:  # any failure means: use the numpy fallback, and say why
        return None, f"sqlite-vec could not be loaded: {exc}"
    return str(version), None


def driver_info() -> DriverInfo:
    """Probe the driver on an in-memory database."""
    conn = _MODULE.connect(":memory:")
    try:
        version, reason = _load_vec(conn)
        sqlite_version = conn.execute("SELECT sqlite_version()").fetchone()[0]
    finally:
        conn.close()
    return DriverInfo(_MODULE.__name__, sqlite_version, version, version is not None, reason)


def disable_vec_for_tests(disabled: bool) -> None:
    """Force the numpy fallback (used by tests that compare both engines)."""
    if disabled:
        _VEC_DISABLED.set()
    else:
        _VEC_DISABLED.clear()
