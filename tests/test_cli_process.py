"""The command line as real processes: the console script, `watch` until Ctrl-C, keyword-only mode,
`board watch` on a running server."""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests._support import CLI_TIMEOUT as TIMEOUT
from tests._support import cli_env as _env
from tests._support import run_memstrata

pytestmark = pytest.mark.model


def _memstrata(data_dir: Path, *args: str, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return run_memstrata(data_dir, *args, cwd=data_dir, input=input)


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


def _memory_workspace(tmp_path: Path, data_dir: Path) -> tuple[Path, Path]:
    """A memory workspace to watch, and a config that syncs 100 ms after a change."""
    root = tmp_path / "ws"
    (root / "memory").mkdir(parents=True)
    (root / "MEMORY.md").write_text("# Start\n", encoding="utf-8")
    config = data_dir / "memstrata.toml"
    config.write_text("[files]\nwatch_debounce_ms = 100\n", encoding="utf-8")
    return root, config


def test_watch_until_interrupted(data_dir: Path, tmp_path: Path) -> None:
    root, config = _memory_workspace(tmp_path, data_dir)
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
        _kill_if_running(proc)
    found = _memstrata(data_dir, "search", "heron pond", "--json")
    assert orjson.loads(found.stdout)[0]["path"] == "memory/2025-03-03.md"


def test_watch_says_when_its_root_is_gone_and_resumes_when_it_is_back(data_dir: Path, tmp_path: Path) -> None:
    root, config = _memory_workspace(tmp_path, data_dir)
    proc = _popen(data_dir, "--config", str(config), "watch", str(root))
    out, err = _line_queue(proc.stdout), _line_queue(proc.stderr)
    try:
        assert out.get(timeout=TIMEOUT).startswith(b"watching ")
        shutil.rmtree(root)
        gone = err.get(timeout=TIMEOUT).decode()
        assert gone == (
            f"memstrata: warning: root {root.resolve()} is missing (deleted, moved or unmounted): "
            "watching resumes when a directory is back at that path\n"
        ), gone
        (root / "memory").mkdir(parents=True)
        (root / "memory" / "2025-03-03.md").write_text("The heron came back to the pond.\n", encoding="utf-8")
        synced = out.get(timeout=TIMEOUT)
        while b"1 files indexed" not in synced:  # the folder back, then the note in it
            synced = out.get(timeout=TIMEOUT)
        assert synced.startswith(b"synced "), synced
        proc.send_signal(signal.SIGINT)
        assert proc.wait(TIMEOUT) == 0
        assert err.get(timeout=TIMEOUT) == b"stopped watching\n"
    finally:
        _kill_if_running(proc)
    found = _memstrata(data_dir, "search", "heron pond", "--json")
    assert orjson.loads(found.stdout)[0]["path"] == "memory/2025-03-03.md"


def _kill_if_running(proc: subprocess.Popen[bytes]) -> None:
    """A test that failed midway leaves no watcher behind."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(TIMEOUT)


def _popen(data_dir: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "memstrata", "--data-dir", str(data_dir), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=data_dir,
        env=_env(),
    )


def _line_queue(stream: Any) -> queue.Queue[bytes]:
    lines: queue.Queue[bytes] = queue.Queue()

    def read() -> None:
        for line in stream:
            lines.put(line)
        lines.put(b"")

    threading.Thread(target=read, daemon=True).start()
    return lines


def _call(conn: socket.socket, reader: Any, request_id: int, method: str, **params: Any) -> Any:
    conn.sendall(
        orjson.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}) + b"\n"
    )
    for line in reader:
        message = orjson.loads(line)
        if message.get("id") == request_id:
            return message["result"]
    raise AssertionError("the server closed the connection")


def test_board_watch_follows_a_running_server(data_dir: Path) -> None:
    folder = tempfile.mkdtemp(prefix="ms-")  # short: socket paths are limited to ~100 bytes
    address = f"unix:{os.path.join(folder, 'serve.sock')}"
    server = _popen(data_dir, "serve", "--listen", address)
    watchers: list[subprocess.Popen[bytes]] = []
    try:
        assert server.stderr is not None
        assert b"listening on" in _line_queue(server.stderr).get(timeout=TIMEOUT)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(address[len("unix:") :])
        reader = conn.makefile("rb")
        _call(conn, reader, 1, "publish", session_id="s1", key="plan", value={"step": 1}, publisher="boss")
        watch = ["board", "watch", "--connect", address, "-s", "s1", "pl*", "--json"]
        counted = _popen(data_dir, *watch, "--count", "2")
        watchers.append(counted)
        out = _line_queue(counted.stdout)
        first = orjson.loads(out.get(timeout=TIMEOUT))  # the current value first ...
        assert first == {
            "session_id": "s1",
            "key": "plan",
            "value": {"step": 1},
            "version": 1,
            "publisher": "boss",
            "deleted": False,
        }
        _call(conn, reader, 2, "publish", session_id="s1", key="plan", value={"step": 2})
        second = orjson.loads(out.get(timeout=TIMEOUT))  # ... then the change another client made
        assert second["value"] == {"step": 2} and second["version"] == 2
        assert counted.wait(TIMEOUT) == 0  # --count 2: done
        endless = _popen(data_dir, *watch[:-1])
        watchers.append(endless)
        assert b"plan = " in _line_queue(endless.stdout).get(timeout=TIMEOUT)
        endless.send_signal(signal.SIGINT)
        assert endless.wait(TIMEOUT) == 0
        assert endless.stderr is not None and endless.stderr.read() == b""
        conn.close()
    finally:
        for proc in [*watchers, server]:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(TIMEOUT)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(TIMEOUT)
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(folder, "serve.sock"))
        os.rmdir(folder)


def test_an_in_process_query_writes_its_whole_answer_before_the_process_ends(data_dir: Path) -> None:
    """``memstrata query`` answered without the system ends its process at once after the
    answer: an answer larger than a pipe's buffer still arrives whole, and the exit is 0."""
    from memstrata.layers import KnowledgeStore
    from memstrata.storage import load_embedder

    path = KnowledgeStore.path_for(data_dir, "dev")
    store = KnowledgeStore.open(path, load_embedder(None))
    try:
        texts = [f"cache note {i}: version stamps expire " + "and are renewed " * 25 for i in range(300)]
        store.add_many([{"content": t, "category": "pattern"} for t in texts])
    finally:
        store.close()
    found = _memstrata(data_dir, "query", "cache version stamps", "-a", "dev", "--top-k", "300", "--json")
    assert found.returncode == 0, found.stderr
    assert len(found.stdout) > 1 << 17  # beyond any pipe buffer
    hits = orjson.loads(found.stdout)
    assert sorted(h["content"] for h in hits) == sorted(texts)
    assert found.stderr == b""
    # a reader that goes away after a few bytes (`| head -c 100`) is no error
    args = ["query", "cache version stamps", "-a", "dev", "--top-k", "300", "--json"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "memstrata", "--data-dir", str(data_dir), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=data_dir,
        env=_env(),
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert len(proc.stdout.read(100)) == 100
    proc.stdout.close()
    assert proc.wait(timeout=TIMEOUT) == 0
    assert proc.stderr.read() == b""
    proc.stderr.close()


@pytest.mark.parametrize("args", [("--help",), ("roots", "list", "--json"), ("status", "--json")])
def test_a_reader_gone_before_the_output_is_no_error(data_dir: Path, args: tuple[str, ...]) -> None:
    """``memstrata ... | head``: the pipe's reader closed before anything was written. Exit 0,
    nothing on stderr (a script under ``set -o pipefail`` goes on)."""
    read, write = os.pipe()
    os.close(read)  # closed before the process starts: its first write meets a broken pipe
    try:
        done = subprocess.run(
            [sys.executable, "-m", "memstrata", "--data-dir", str(data_dir), *args],
            stdout=write,
            stderr=subprocess.PIPE,
            cwd=data_dir,
            env=_env(),
            timeout=TIMEOUT,
            check=False,
        )
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (0, b"")


def test_ctrl_c_exits_130_saying_interrupted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C reaches click as KeyboardInterrupt, which it turns into Abort: memstrata's exit is
    130 with its own line, not 1 ("aborted", a runtime failure)."""
    from click.testing import CliRunner

    from memstrata.bridges import _status
    from memstrata.bridges.cli import cli

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(_status, "empty", interrupted)  # a status of a data dir not made yet
    result = CliRunner().invoke(cli, ["--data-dir", str(Path(tempfile.mkdtemp()) / "none"), "status"])
    # click first ends the terminal's "^C" echo with a newline
    assert (result.exit_code, result.stderr) == (130, "\nmemstrata: interrupted\n")


def test_ctrl_c_before_the_command_line_runs_exits_130_saying_interrupted(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """While the console script imports the command line (~0.2 s of a query), Ctrl-C is its own
    to word as the command line does, not a traceback."""
    import types

    from memstrata.bridges import _console

    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setitem(sys.modules, "memstrata.bridges.cli", types.SimpleNamespace(main=interrupted))
    monkeypatch.setattr(sys, "argv", ["memstrata", "status"])
    code: Any = None
    try:
        _console.main()
    except KeyboardInterrupt:  # caught here, or pytest would take it for its own and stop the run
        pytest.fail("the interrupt escaped the console script")
    except SystemExit as ended:
        code = ended.code
    assert code == 130
    assert capsys.readouterr().err == "\nmemstrata: interrupted\n"
