"""The command line as real processes: one line per problem, reads that create nothing, and a
read-only data dir that serves reads and refuses writes with a one-line "read-only" error."""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import subprocess
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from memstrata.actors._outbox import Outbox
from tests._support import REPO, run_memstrata


def _memstrata(data_dir: Path, *args: str, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return run_memstrata(data_dir, *args, cwd=REPO, input=input)


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


def test_damaged_store_with_pending_outbox_prints_one_line_per_problem(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "knowledge").mkdir(parents=True)
    (data / "knowledge" / "victim.sqlite").write_bytes(b"not a database " * 500)
    outbox = Outbox(data / "outbox" / "victim.sqlite")
    outbox.append("completed", "t1", "a write-back waiting for its replay", dt.datetime.now(dt.UTC))
    outbox.close()
    for args in (["query", "anything", "-a", "victim"], ["store", "a fact", "-a", "other", "-c", "pattern"]):
        done = _memstrata(data, *args)
        stderr = done.stderr.decode()
        assert "Traceback" not in stderr, stderr
        lines = stderr.splitlines()
        assert 1 <= len(lines) <= 3, stderr
        assert all(line.startswith("memstrata: ") for line in lines), stderr
        assert any("victim.sqlite" in line for line in lines), stderr
    detailed = _memstrata(data, "--debug", "store", "another fact", "-a", "other", "-c", "pattern")
    assert "Traceback" in detailed.stderr.decode()


def test_read_commands_create_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    nobody = _memstrata(data, "query", "anything at all", "-a", "nobody", "--json")
    assert nobody.returncode == 0, nobody.stderr
    assert orjson.loads(nobody.stdout) == []
    episodes = _memstrata(data, "recall", "anything", "-a", "nobody", "--json")
    assert episodes.returncode == 0 and orjson.loads(episodes.stdout) == []
    search = _memstrata(data, "search", "anything")
    assert search.returncode == 1 and b"no memories indexed yet" in search.stderr
    assert _files(data) == set()
    bad = _memstrata(data, "query", "x", "-a", "../up")
    assert bad.returncode == 2 and b"agent_id" in bad.stderr
    missing = tmp_path / "never-created"
    status = _memstrata(missing, "status", "--json")
    assert status.returncode == 0, status.stderr
    assert orjson.loads(status.stdout)["exists"] is False and not missing.exists()
    present = _memstrata(data, "status", "--json")  # the same fields, whether the dir exists or not
    assert present.returncode == 0 and orjson.loads(present.stdout)["exists"] is True
    assert set(orjson.loads(present.stdout)) == set(orjson.loads(status.stdout))


@contextlib.contextmanager
def _read_only_view(source: Path, view: Path) -> Iterator[Path]:
    """``source`` seen read-only at ``view`` (a read-only bind mount: root cannot write it either)."""
    view.mkdir()
    if subprocess.run(["mount", "--bind", str(source), str(view)], capture_output=True).returncode:
        pytest.skip("cannot bind-mount here (needs root with CAP_SYS_ADMIN)")
    try:
        remount = subprocess.run(["mount", "-o", "remount,ro,bind", str(view)], capture_output=True)
        if remount.returncode:
            pytest.skip("cannot remount read-only here")
        yield view
    finally:
        subprocess.run(["umount", str(view)], capture_output=True, check=False)


def test_read_only_data_dir_serves_reads_and_refuses_writes(tmp_path: Path) -> None:
    data = tmp_path / "data"
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "MEMORY.md").write_text("# Notes\n\nThe standup is at nine thirty.\n", encoding="utf-8")
    assert (
        _memstrata(data, "store", "Deploys use blue-green slots", "-a", "a1", "-c", "pattern").returncode == 0
    )
    assert _memstrata(data, "remember", "We deployed on friday", "-a", "a1").returncode == 0
    assert _memstrata(data, "index", str(notes)).returncode == 0
    before = _files(data)
    with _read_only_view(data, tmp_path / "ro") as ro:
        found = _memstrata(ro, "query", "blue-green deploys", "-a", "a1", "--json")
        assert found.returncode == 0, found.stderr
        assert orjson.loads(found.stdout)[0]["content"] == "Deploys use blue-green slots"
        recalled = _memstrata(ro, "recall", "friday deploy", "-a", "a1", "--json")
        assert recalled.returncode == 0, recalled.stderr
        assert orjson.loads(recalled.stdout)[0]["content"] == "We deployed on friday"
        searched = _memstrata(ro, "search", "standup", "--json")
        assert searched.returncode == 0, searched.stderr
        assert "nine thirty" in orjson.loads(searched.stdout)[0]["snippet"]
        status = _memstrata(ro, "status", "--json")
        assert status.returncode == 0, status.stderr
        nobody = _memstrata(ro, "query", "x", "-a", "nobody", "--json")
        assert nobody.returncode == 0 and orjson.loads(nobody.stdout) == []
        for args in (
            ["store", "a new fact", "-a", "a1", "-c", "pattern"],
            ["remember", "a new episode", "-a", "a1"],
            ["store", "a new fact", "-a", "newcomer", "-c", "pattern"],
        ):
            refused = _memstrata(ro, *args)
            assert refused.returncode == 1, refused
            lines = refused.stderr.decode().splitlines()
            # the error, plus at most the log line of the actor that could not create the store
            assert len(lines) == 1 and "read-only" in lines[0], lines
            assert all(line.startswith("memstrata: ") and "Traceback" not in line for line in lines)
        requests = b"".join(
            orjson.dumps(r) + b"\n"
            for r in (
                {"id": 1, "method": "query_knowledge", "params": {"agent_id": "a1", "query": "blue-green"}},
                {"id": 2, "method": "store_knowledge", "params": {"agent_id": "a1", "content": "x"}},
            )
        )
        served = _memstrata(ro, "serve", input=requests)
        answers = {r["id"]: r for r in map(orjson.loads, served.stdout.splitlines())}
        assert answers[1]["result"]["hits"][0]["content"] == "Deploys use blue-green slots", answers
        assert "read-only" in answers[2]["error"]["message"], answers
        init = {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        }
        calls = [
            init,
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {"name": "knowledge_query", "arguments": {"query": "blue-green", "agent_id": "a1"}},
            },
            {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {"name": "memory_add", "arguments": {"content": "new", "agent_id": "a1"}},
            },
        ]
        mcp = _memstrata(ro, "mcp", input=b"".join(orjson.dumps(c) + b"\n" for c in calls))
        replies = {r["id"]: r for r in map(orjson.loads, mcp.stdout.splitlines())}
        found_text = replies[1]["result"]["content"][0]["text"]
        assert "Deploys use blue-green slots" in found_text, replies
        assert replies[2]["result"]["isError"] and "read-only" in replies[2]["result"]["content"][0]["text"]
    assert _files(data) == before


def test_serve_names_the_byte_of_invalid_utf8() -> None:
    from memstrata.bridges._server import ErrorCode, JsonLinesServer

    out = io.BytesIO()
    JsonLinesServer({}).serve(io.BytesIO(b'{"id": 1, "method": "x\xff"}\n'), out)
    (answer,) = [orjson.loads(line) for line in out.getvalue().splitlines()]
    assert answer["error"]["code"] == ErrorCode.PARSE_ERROR
    assert "invalid UTF-8 at byte 22" in answer["error"]["message"]
    assert "surrogates" not in answer["error"]["message"]


def test_memory_get_of_a_superscript_id_is_a_clear_error(data_dir: Path) -> None:
    from memstrata import Config, MemorySystem
    from memstrata.bridges import tools
    from tests.fakes import FakeEmbedder

    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system:
        for path in ("memory://²", "memory://١٢"):
            result = tools.dispatch("memory_get", {"path": path}, system, agent_id="a1")
            assert "invalid literal" not in result["error"], result
            assert repr(path[len("memory://") :]) in result["error"], result


def test_storage_errors_leave_status_once_writes_succeed_again(data_dir: Path) -> None:
    """A full disk is a warning while it lasts; a later successful write clears it."""
    from memstrata import Config, MemorySystem
    from memstrata.actors import _knowledge_actor
    from memstrata.errors import StorageError
    from tests.fakes import FakeEmbedder

    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system:
        agent = system.agent("disk")
        agent.store_knowledge("before the disk filled up", category="pattern")
        original = _knowledge_actor.KnowledgeStoreActor.handle_batch

        def full(self: object, messages: list[object]) -> list[object]:
            raise StorageError("database x: the disk is full")

        _knowledge_actor.KnowledgeStoreActor.handle_batch = full  # type: ignore[method-assign]
        original_handle = _knowledge_actor.KnowledgeStoreActor.handle

        def full_handle(self: object, message: object) -> object:
            raise StorageError("database x: the disk is full")

        _knowledge_actor.KnowledgeStoreActor.handle = full_handle  # type: ignore[method-assign]
        try:
            with pytest.raises(StorageError):
                agent.store_knowledge("while the disk is full", category="pattern")
        finally:
            _knowledge_actor.KnowledgeStoreActor.handle_batch = original  # type: ignore[method-assign]
            _knowledge_actor.KnowledgeStoreActor.handle = original_handle  # type: ignore[method-assign]
        assert any("disk is full" in w for w in system.status()["warnings"])
        agent.store_knowledge("after space was freed", category="pattern")
        assert not any("disk is full" in w for w in system.status()["warnings"]), system.status()["warnings"]
