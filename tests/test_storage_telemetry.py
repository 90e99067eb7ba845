"""ONNX Runtime's telemetry is off in a process that uses memstrata, unless its environment
turns it on: each process runs with a cache folder of its own, where ONNX Runtime would keep the
events it records (``Microsoft/DeveloperTools/.onnxruntime``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def _without_setting() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "ORT_DISABLE_TELEMETRY"}


def _events_folder(home: Path, code: str) -> Path:
    """Where ONNX Runtime keeps its events for a process running ``code`` with ``home``."""
    cache = home / "cache"
    cache.mkdir(parents=True)
    environ = {**_without_setting(), "XDG_CACHE_HOME": str(cache), "HOME": str(home)}
    subprocess.run([sys.executable, "-c", code], check=True, env=environ, timeout=120)
    return cache / "Microsoft" / "DeveloperTools" / ".onnxruntime"


def test_onnxruntime_records_nothing_once_memstrata_storage_is_imported(tmp_path: Path) -> None:
    control = _events_folder(tmp_path / "control", "import onnxruntime")
    if not control.exists():
        pytest.skip("this onnxruntime records no telemetry here: nothing to turn off")
    quiet = _events_folder(tmp_path / "memstrata", "import memstrata.storage, onnxruntime")
    assert not quiet.exists()


def test_the_environment_keeps_its_own_choice() -> None:
    code = "import os, memstrata.storage; print(os.environ['ORT_DISABLE_TELEMETRY'], end='')"
    for given, seen in ((None, "1"), ("0", "0")):
        env = _without_setting()
        if given is not None:
            env["ORT_DISABLE_TELEMETRY"] = given
        command = [sys.executable, "-c", code]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout == seen
