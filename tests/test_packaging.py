"""Only ``memstrata`` is importable after install: generic names never leak into site-packages."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

GENERIC = ("core", "storage", "layers", "actors", "bridges")


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


@pytest.mark.parametrize("name", ["storage", "core"])
def test_bare_folder_import_from_a_checkout_fails_clearly(name: str) -> None:
    root = Path(__file__).resolve().parent.parent
    result = _python(f"import {name}", root)
    assert result.returncode != 0
    assert f"import memstrata.{name}, not {name}" in result.stderr


def test_public_modules_re_export_the_ground_floor(tmp_path: Path) -> None:
    """``memstrata.errors``, ``memstrata.config`` and ``memstrata.messages`` stay the public paths."""
    code = (
        "import memstrata.errors as e, memstrata.core.errors as ce\n"
        "import memstrata.config as c, memstrata.core.config as cc\n"
        "import memstrata.messages as m, memstrata.actors.messages as am\n"
        "print(all(getattr(e, n) is getattr(ce, n) for n in ce.__all__))\n"
        "print(all(getattr(c, n) is getattr(cc, n) for n in cc.__all__))\n"
        "print(all(getattr(m, n) is getattr(am, n) for n in am.__all__))\n"
    )
    result = _python(code, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True", "True"]


def test_the_dependency_direction_holds() -> None:
    """The import-linter layers contract of pyproject.toml (bridges -> facade -> actors -> layers ->
    storage -> core), checked on the installed package as ``make lint`` does."""
    lint = Path(sys.executable).parent / "lint-imports"
    if not lint.exists():
        pytest.skip("import-linter is not installed (the dev extra)")
    root = Path(__file__).resolve().parent.parent
    result = subprocess.run(
        [str(lint), "--config", str(root / "pyproject.toml"), "--contract", "layers"],
        cwd=Path(sys.executable).parent,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert "KEPT" in result.stdout


def test_every_module_of_the_root_package_has_a_layer() -> None:
    """The layers contract names the facade's modules one by one: a new one must join a layer."""
    import tomllib

    root = Path(__file__).resolve().parent.parent
    config = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    contract = next(c for c in config["tool"]["importlinter"]["contracts"] if c["id"] == "layers")
    listed = {name.strip() for layer in contract["layers"] for name in layer.replace("|", ":").split(":")}
    modules = {f"memstrata.{p.stem}" for p in (root / "memstrata").glob("*.py") if p.stem != "__init__"}
    folders = {
        f"memstrata.{p.name}"
        for p in root.iterdir()
        if (p / "__init__.py").is_file() and p.name not in ("memstrata", "tests")
    }
    assert sorted((modules | folders) - listed) == []
