"""``memstrata serve`` as a real subprocess (real model, real storage), spoken to over pipes."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest

from memstrata.layers import EpisodicMemory, KnowledgeStore

pytestmark = pytest.mark.model

REPO = Path(__file__).resolve().parent.parent
TIMEOUT = 120.0


class Serve:
    """A ``memstrata serve`` process; responses are collected by a reader thread."""

    def __init__(self, data_dir: Path, *extra: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        env.pop("MEMSTRATA_CONFIG", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "memstrata", "--data-dir", str(data_dir), "serve", *extra],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=data_dir,
            env=env,
        )
        self.responses: queue.Queue[Any] = queue.Queue()
        self.raw: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.raw.append(line)
            self.responses.put(orjson.loads(line))
        self.responses.put(EOFError)

    def send(self, *requests: Any) -> None:
        assert self.proc.stdin is not None
        for request in requests:
            data = request if isinstance(request, bytes) else orjson.dumps(request) + b"\n"
            self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def collect(self, count: int) -> list[dict[str, Any]]:
        out = []
        for _ in range(count):
            item = self.responses.get(timeout=TIMEOUT)
            assert item is not EOFError, self.stderr()
            out.append(item)
        return out

    def call(self, request_id: Any, method: str, **params: Any) -> Any:
        self.send({"id": request_id, "method": method, "params": params})
        (response,) = self.collect(1)
        assert response["id"] == request_id, response
        assert "result" in response, response
        return response["result"]

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        code = self.proc.wait(TIMEOUT)
        self._reader.join(TIMEOUT)
        return code

    def stderr(self) -> str:
        assert self.proc.stderr is not None
        if self.proc.poll() is None:
            return "(still running)"
        return self.proc.stderr.read().decode("utf-8", "replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(TIMEOUT)


def req(request_id: Any, method: str, **params: Any) -> bytes:
    return orjson.dumps({"id": request_id, "method": method, "params": params}) + b"\n"


@pytest.fixture
def serve(data_dir: Path) -> Any:
    started: list[Serve] = []

    def start(*extra: str) -> Serve:
        process = Serve(data_dir, *extra)
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()
        for stream in (process.proc.stdin, process.proc.stdout, process.proc.stderr):
            if stream is not None:
                stream.close()


def test_every_method_malformed_lines_and_limits(serve: Any, tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "MEMORY.md").write_text(
        "# Ops\n\nThe release train leaves every Thursday at noon.\n", encoding="utf-8"
    )
    server = serve("--max-line-bytes", "65536")
    arch = {"agent_id": "arch"}
    requests: list[Any] = [
        req(1, "store_knowledge", **arch, content="Avoid global state in the payment module",
            category="pitfall", tags={"module": "payment"}),
        req(2, "query_knowledge", **arch, query="payment global state"),  # same lane: sees id 1
        req(3, "remember", **arch, content="Paired with Bo on payments", task_run_id="r1",
            at="2025-03-01T10:00:00Z"),
        req(4, "recall", **arch, query="paired payments", since="2025-01-01T00:00:00+00:00"),
        req(5, "begin_task", **arch, task_id="t1", description="Refactor the payment module"),
        req(6, "complete_task", **arch, task_id="t1", summary="Extracted a PaymentGateway interface"),
        req(7, "fail_task", **arch, task_id="t2", reason="Migration locked the orders table"),
        req("p", "publish", session_id="s1", key="agent:arch:status", value={"state": "busy", "n": [1, 2]}),
        req("g", "get_signal", session_id="s1", key="agent:arch:status"),
        req("l", "list_signals", session_id="s1", prefix="agent:"),
        req("i", "index", path=str(workspace)),
        req("s", "search_files", query="when does the release train leave"),
        req("f", "get_file", path="MEMORY.md", from_line=3, lines=1),
        req("st", "status"),
        b"this is not json\n",
        req(8, "drop_everything"),
        req(9, "recall", **arch, query=7),
        req(10, "recall", **arch, query="x", since="2025-01-01"),
        req(11, "store_knowledge", **arch, content="x", category="Bad"),
        req(12, "store_knowledge", agent_id="../x", content="x"),
        req(13, "get_file", path="../../etc/passwd"),
        req(14, "query_knowledge", **arch, query='" OR NEAR( * AND'),
        req(15, "publish", session_id="s1", key="k", value="y" * 100_000),  # longer than the limit
        b'{"id": 16, "params": {"v": ' + b"[" * 5000 + b"]" * 5000 + b"}}\n",
        b'{"id": 17, "method": "publish", "params": {"session_id": "s1", "key": "k", "value": '
        + b"[" * 100 + b"]" * 100 + b"}}\n",
        b"\xff\xfe\x00\n",
        b"[]\n",
    ]  # fmt: skip
    server.send(*requests)
    responses = server.collect(len(requests))  # every line is answered, exactly once
    assert server.close() == 0
    by_id: dict[Any, list[dict[str, Any]]] = {}
    for response in responses:
        by_id.setdefault(response["id"], []).append(response)
    ok = {k: v[0]["result"] for k, v in by_id.items() if k is not None and "result" in v[0]}
    errors = {k: v[0]["error"] for k, v in by_id.items() if k is not None and "error" in v[0]}

    assert isinstance(ok[1]["id"], int)
    assert all(r["jsonrpc"] == "2.0" for r in responses)
    assert ok[2]["complete"] is True and ok[2]["degraded"] is None and ok[2]["warnings"] == []
    assert ok[2]["hits"][0]["id"] == ok[1]["id"] and ok[2]["hits"][0]["category"] == "pitfall"
    assert ok[2]["hits"][0]["tags"] == {"module": "payment"}
    assert [h["id"] for h in ok[4]["hits"]] == [ok[3]["id"]]
    assert ok[5]["fallback"] is False and "Avoid global state" in ok[5]["text"]
    assert ok[6]["queued"] is True and ok[7]["queued"] is True
    assert ok["p"]["version"] == 1
    assert ok["g"]["value"] == {"state": "busy", "n": [1, 2]} and ok["g"]["found"] is True
    assert ok["l"] == ["agent:arch:status"]
    assert ok["i"]["kind"] == "memory" and ok["i"]["stats"]["files_processed"] == 1
    assert ok["s"]["hits"][0]["path"] == "MEMORY.md" and ok["s"]["hits"][0]["start_line"] >= 1
    assert ok["f"]["text"] == "The release train leaves every Thursday at noon."
    assert ok["st"]["system"]["embedding"]["dim"] == 384
    assert ok["st"]["server"]["max_line_bytes"] == 65536
    assert isinstance(ok[14]["hits"], list)

    assert errors[8]["code"] == -32601
    assert errors[9]["code"] == -32602 and "'query'" in errors[9]["message"]
    assert errors[10]["code"] == -32602 and "time zone" in errors[10]["message"]
    assert errors[11]["code"] == -32602 and "'Bad'" in errors[11]["message"]
    assert errors[12]["code"] == -32602 and "agent_id" in errors[12]["message"]
    assert errors[13]["code"] == -32602 and ".." in errors[13]["message"]
    assert errors[17]["code"] == -32600 and "nested deeper than" in errors[17]["message"]
    null = [r["error"] for r in by_id[None]]
    assert sorted(e["code"] for e in null) == sorted([-32700, -32600, -32600, -32700, -32600])
    assert any("longer than 65536 bytes" in e["message"] for e in null)
    assert any("nested deeper than" in e["message"] for e in null)
    assert all("Traceback" not in line.decode() for line in server.raw)
    assert all(len(v) == 1 for k, v in by_id.items() if k is not None)


def test_eof_drains_and_flushes_write_backs(serve: Any, data_dir: Path) -> None:
    server = serve()
    count = 60
    requests = [
        req(i, "complete_task", agent_id=f"w{i % 3}", task_id=f"t{i}", summary=f"finished task {i} cleanly")
        for i in range(count)
    ]
    requests.append(
        req("x", "fail_task", agent_id="w0", task_id="bad", reason="the build server ran out of disk")
    )
    server.send(*requests)
    server.proc.stdin.close()  # EOF right away: every request must still be answered and flushed
    responses = server.collect(count + 1)
    assert server.proc.wait(TIMEOUT) == 0
    assert all("result" in r for r in responses), [r for r in responses if "error" in r]
    assert sorted(str(r["id"]) for r in responses) == sorted([*map(str, range(count)), "x"])
    total_outcomes = 0
    for agent in ("w0", "w1", "w2"):
        with KnowledgeStore.open(data_dir / "knowledge" / f"{agent}.sqlite") as store:
            outcomes = store.list(category="outcome", limit=1000)
            total_outcomes += len(outcomes)
            if agent == "w0":
                (pitfall,) = store.list(category="pitfall")
                assert pitfall.content == "the build server ran out of disk"
        episodic = EpisodicMemory.open(data_dir / "episodic" / f"{agent}.sqlite")
        try:
            assert episodic.count() == len(outcomes) + (agent == "w0")  # a failure is an episode too
        finally:
            episodic.close()
    assert total_outcomes == count


def test_sigterm_stops_gracefully(serve: Any, data_dir: Path) -> None:
    server = serve()
    assert server.call(1, "complete_task", agent_id="a1", task_id="t1", summary="shipped the feature")[
        "queued"
    ]
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(TIMEOUT) == 0
    with KnowledgeStore.open(data_dir / "knowledge" / "a1.sqlite") as store:
        assert [e.content for e in store.list(category="outcome")] == ["shipped the feature"]
