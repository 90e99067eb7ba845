"""Only ``memstrata`` is importable after install: generic names never leak into site-packages."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

GENERIC = ("storage", "layers", "actors", "bridges")


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize("name", GENERIC)
def test_generic_top_level_name_is_not_importable(name: str, tmp_path: Path) -> None:
    result = _python(f"import {name}", tmp_path)
    assert result.returncode != 0
    assert "ModuleNotFoundError" in result.stderr, result.stderr


def test_memstrata_subpackages_import(tmp_path: Path) -> None:
    code = (
        "import importlib.util, memstrata.storage\n"
        "print(memstrata.storage.__name__, memstrata.storage.open_database.__module__)\n"
        f"print([n for n in {GENERIC!r} if importlib.util.find_spec(n) is not None])\n"
        f"print([n for n in {GENERIC!r} if importlib.util.find_spec('memstrata.' + n) is None])\n"
    )
    result = _python(code, tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "memstrata.storage memstrata.storage._connection"
    assert lines[1] == "[]"  # no generic top-level name is installed
    assert lines[2] == "[]"  # every part is installed under memstrata


def test_bare_folder_import_from_a_checkout_fails_clearly() -> None:
    root = Path(__file__).resolve().parent.parent
    result = _python("import storage", root)
    assert result.returncode != 0
    assert "import memstrata.storage, not storage" in result.stderr
