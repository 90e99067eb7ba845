"""The command line as real processes: the console script, `watch` until Ctrl-C, keyword-only mode."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import orjson
import pytest

pytestmark = pytest.mark.model

REPO = Path(__file__).resolve().parent.parent
TIMEOUT = 120


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for key in ("MEMSTRATA_CONFIG", "MEMSTRATA_DATA_DIR", "MEMSTRATA_DEBUG"):
        env.pop(key, None)
    return env


def _memstrata(data_dir: Path, *args: str, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "memstrata", "--data-dir", str(data_dir), *args],
        input=input,
        capture_output=True,
        cwd=data_dir,
        env=_env(),
        timeout=TIMEOUT,
        check=False,
    )


def test_store_query_in_separate_processes(data_dir: Path) -> None:
    stored = _memstrata(
        data_dir, "store", "Cache invalidation uses version stamps", "-a", "dev", "-c", "pattern"
    )
    assert stored.returncode == 0, stored.stderr
    found = _memstrata(data_dir, "query", "how are caches invalidated", "-a", "dev", "--json")
    assert found.returncode == 0, found.stderr
    assert orjson.loads(found.stdout)[0]["content"] == "Cache invalidation uses version stamps"
    bad = _memstrata(data_dir, "query", "x", "-a", "dev", "--top-k", "nope")
    assert bad.returncode == 2
    assert bad.stderr.decode().count("\n") == 1 and bad.stderr.startswith(b"memstrata: error: ")


def test_keyword_only_mode_is_loud(data_dir: Path) -> None:
    config = data_dir / "memstrata.toml"
    config.write_text('[embedding]\nmodel = "/nonexistent/model-dir"\ndim = 384\n', encoding="utf-8")
    result = _memstrata(data_dir, "--config", str(config), "status")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(b"WARNING: KEYWORD-ONLY MODE")
    assert b"memstrata: warning: KEYWORD-ONLY MODE" in result.stderr
    stored = _memstrata(
        data_dir, "--config", str(config), "store", "keyword only still stores", "-a", "k", "-c", "x"
    )
    assert stored.returncode == 0, stored.stderr
    found = _memstrata(data_dir, "--config", str(config), "query", "keyword stores", "-a", "k", "--json")
    assert orjson.loads(found.stdout)[0]["match_type"] == "keyword"


def test_watch_until_interrupted(data_dir: Path, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "memory").mkdir(parents=True)
    (root / "MEMORY.md").write_text("# Start\n", encoding="utf-8")
    config = data_dir / "memstrata.toml"
    config.write_text("[files]\nwatch_debounce_ms = 100\n", encoding="utf-8")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "memstrata",
            "--data-dir",
            str(data_dir),
            "--config",
            str(config),
            "watch",
            str(root),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=data_dir,
        env=_env(),
    )
    lines: queue.Queue[bytes] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(b"")

    threading.Thread(target=read, daemon=True).start()
    try:
        assert lines.get(timeout=TIMEOUT).startswith(b"watching ")
        (root / "memory" / "2025-03-03.md").write_text("The heron came back to the pond.\n", encoding="utf-8")
        synced = lines.get(timeout=TIMEOUT)
        assert synced.startswith(b"synced ") and b"1 files indexed" in synced, synced
        proc.send_signal(signal.SIGINT)
        assert proc.wait(TIMEOUT) == 0
        assert proc.stderr is not None and b"Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(TIMEOUT)
    found = _memstrata(data_dir, "search", "heron pond", "--json")
    assert orjson.loads(found.stdout)[0]["path"] == "memory/2025-03-03.md"
