"""Several processes on one data dir: writes wait for each other, a lock held too long is a clear
error, every process sees the others' writes, and an outbox row is worked on by one process only."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from memstrata import Config, MemorySystem
from memstrata.actors._outbox import Outbox, _boot_id, _start_time
from memstrata.config import StorageConfig
from memstrata.errors import ConfigError, DatabaseBusyError, InvalidInputError
from memstrata.layers import EpisodicMemory, KnowledgeStore
from memstrata.storage import connection_defaults, open_database
from tests.fakes import FakeEmbedder

REPO = Path(__file__).resolve().parent.parent

HOLDER = textwrap.dedent(
    """
    import sys
    from memstrata.storage import open_database

    dbs = [open_database(p) for p in sys.argv[1:]]
    for db in dbs:
        db.execute("BEGIN IMMEDIATE")
    print("locked", flush=True)
    sys.stdin.readline()
    for db in dbs:
        db.execute("COMMIT")
    print("released", flush=True)
    sys.stdin.readline()
    """
)

FACADE_WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from memstrata import Config, MemorySystem
    from tests.fakes import FakeEmbedder

    data, tag, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    system = MemorySystem.start(Config(data_dir=data), embedder=FakeEmbedder())
    agent = system.agent("duo")
    print("ready", flush=True)
    sys.stdin.readline()
    for i in range(n):
        agent.store_knowledge(f"{tag} knowledge item {i}", category="pattern")
        agent.remember(f"{tag} episode item n{i}")
        agent.complete_task(f"{tag}-t{i}", f"{tag} outcome item {i}")
        print("wrote", i, flush=True)
    system.stop()
    print("done", flush=True)
    """
)

DIRECT_WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from memstrata.layers import EpisodicMemory, KnowledgeStore
    from tests.fakes import FakeEmbedder

    data, tag, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    embedder = FakeEmbedder()
    store = KnowledgeStore.open(data / "knowledge" / "duo.sqlite", embedder)
    episodic = EpisodicMemory.open(data / "episodic" / "duo.sqlite", embedder)
    print("ready", flush=True)
    sys.stdin.readline()
    for i in range(n):
        store.add(f"{tag} knowledge item {i}", category="pattern")
        episodic.record(f"{tag} episode item n{i}")
        print("wrote", i, flush=True)
    store.close()
    episodic.close()
    print("done", flush=True)
    """
)


class Child:
    """A Python child process driven by lines: the parent waits for what it prints."""

    def __init__(self, script: str, *args: str, log: Path) -> None:
        self.log = log
        self._errors: IO[str] = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", script, *args],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._errors,
            text=True,
        )

    def expect(self, word: str) -> str:
        assert self.proc.stdout is not None
        for _ in range(100_000):  # bounded: every line the child can print before ``word``
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError(f"the child ended before {word!r}: {self.stderr()[-3000:]}")
            if line.split()[0] == word:
                return line
        raise AssertionError(f"no {word!r} from the child")

    def send(self, line: str = "") -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def stderr(self) -> str:
        if not self._errors.closed:
            self._errors.flush()
        return self.log.read_text()

    def finish(self) -> int:
        code = self.proc.wait(60)
        self.close()
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None and not stream.closed:
                stream.close()
        self._errors.close()


@pytest.fixture
def children(tmp_path: Path) -> Iterator[list[Child]]:
    started: list[Child] = []
    yield started
    for child in started:
        child.close()


def spawn(children: list[Child], tmp_path: Path, script: str, *args: str) -> Child:
    child = Child(script, *args, log=tmp_path / f"child{len(children)}.log")
    children.append(child)
    return child


def test_a_lock_held_past_the_bound_is_a_clear_busy_error(
    data_dir: Path, tmp_path: Path, children: list[Child]
) -> None:
    config = Config(data_dir=data_dir, storage=StorageConfig(lock_timeout_s=0.5))
    with MemorySystem.start(config, embedder=FakeEmbedder()) as system:
        agent = system.agent("a1")
        agent.store_knowledge("the ledger service retries on conflict", category="pattern")
        agent.remember("ledger retries observed")
        agent.complete_task("t0", "ledger conflict handled")
        assert system.wait_idle(10)
        paths = {kind: data_dir / kind / "a1.sqlite" for kind in ("knowledge", "episodic", "outbox")}
        holder = spawn(children, tmp_path, HOLDER, *(str(p) for p in paths.values()))
        holder.expect("locked")

        writes = {
            "knowledge": lambda: agent.store_knowledge("written while locked", category="pattern"),
            "episodic": lambda: agent.remember("remembered while locked"),
            "outbox": lambda: agent.complete_task("t1", "completed while locked"),
        }
        for kind, write in writes.items():
            started = time.monotonic()
            with pytest.raises(DatabaseBusyError, match=re.escape(str(paths[kind]))) as caught:
                write()
            assert time.monotonic() - started < 10  # the configured bound, not the 20 s default
            assert "stayed locked by another process for more than 0.5 s" in str(caught.value)
            assert "database is locked" not in str(caught.value)
        # reads are never blocked by a writer
        assert agent.query_knowledge("ledger service retries")[0].entry.content.startswith("the ledger")
        assert agent.recall("ledger retries")[0].episode.content == "ledger retries observed"
        status = system.status()["agents"]["a1"]
        assert status["knowledge"]["storage_errors"] == 1
        assert "stayed locked" in status["knowledge"]["last_storage_error"]

        holder.send()
        holder.expect("released")
        assert agent.store_knowledge("written after the lock", category="pattern") > 0
        agent.remember("remembered after the lock")
        agent.complete_task("t2", "completed after the lock")
        assert system.wait_idle(10)
        assert system.status()["agents"]["a1"]["agent"]["outbox_pending"] == 0
        contents = {e.content for e in agent.list_knowledge(limit=100)}
        assert "written after the lock" in contents and "completed after the lock" in contents
        assert "written while locked" not in contents and "completed while locked" not in contents


def test_a_new_system_reads_the_stores_another_process_is_writing(data_dir: Path) -> None:
    """``memstrata query`` beside a long write: a system started while another connection holds
    the write locks of the agent's stores opens them without waiting, since an open whose schema
    is current and whose check agrees writes nothing. The holder uses memstrata's driver: POSIX
    locks belong to a process, so a second copy of SQLite in it would not see them."""
    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system:
        system.agent("a1").store_knowledge("the ledger service retries on conflict", category="pattern")
        system.agent("a1").remember("ledger retries observed")
    holders = [open_database(data_dir / kind / "a1.sqlite") for kind in ("knowledge", "episodic")]
    config = Config(data_dir=data_dir, storage=StorageConfig(lock_timeout_s=0.5))
    try:
        for holder in holders:
            holder.execute("BEGIN IMMEDIATE")
        with MemorySystem.start(config, embedder=FakeEmbedder()) as system:
            agent = system.agent("a1")
            assert [e.content for e in agent.list_knowledge()] == ["the ledger service retries on conflict"]
            assert agent.query_knowledge("ledger retries")[0].entry.content.startswith("the ledger")
            assert agent.recall("ledger retries")[0].episode.content == "ledger retries observed"
            status = system.status()
            assert status["restarts"] == {} and status["warnings"] == []
            for holder in holders:  # before the stop, which checkpoints the episodic store
                holder.execute("ROLLBACK")
    finally:
        for holder in holders:
            holder.close()


def test_a_writer_waits_for_another_process_and_then_succeeds(
    data_dir: Path, tmp_path: Path, children: list[Child], backoff_signal: threading.Event
) -> None:
    path = data_dir / "k.sqlite"
    with connection_defaults(lock_bound_s=60, busy_timeout_ms=20):
        store = KnowledgeStore.open(path, FakeEmbedder())
    try:
        store.add("present before the lock", category="pattern")
        holder = spawn(children, tmp_path, HOLDER, str(path))
        holder.expect("locked")
        result: list[Any] = []

        def write() -> None:
            try:
                result.append(store.add("waited for the other process", category="pattern"))
            except BaseException as exc:
                result.append(exc)

        writer = threading.Thread(target=write)
        writer.start()
        assert backoff_signal.wait(30), "the writer never waited for the lock"
        assert result == []  # still waiting: the lock is held
        holder.send()
        writer.join(60)
        assert not writer.is_alive()
        assert len(result) == 1 and isinstance(result[0], int), result
        entry = store.get(result[0])
        assert entry is not None and entry.content == "waited for the other process"
    finally:
        store.close()


def test_two_systems_and_a_direct_writer_share_one_agent(
    data_dir: Path, tmp_path: Path, children: list[Child]
) -> None:
    n = 40
    first = spawn(children, tmp_path, FACADE_WRITER, str(data_dir), "alpha", str(n))
    direct = spawn(children, tmp_path, DIRECT_WRITER, str(data_dir), "gamma", str(n))
    for child in (first, direct):
        child.expect("ready")
        child.send("go")
    for _ in range(5):
        first.expect("wrote")  # the second system starts while the first has write-backs in flight
    second = spawn(children, tmp_path, FACADE_WRITER, str(data_dir), "beta", str(n))
    second.expect("ready")
    second.send("go")
    for child in (first, second, direct):
        child.expect("done")
        assert child.finish() == 0
        assert "Traceback" not in child.stderr() and "locked" not in child.stderr(), child.stderr()
    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system:
        assert system.wait_idle(30)
        agent = system.agent("duo")
        knowledge = [e.content for e in agent.list_knowledge(limit=1000)]
    assert len(knowledge) == len(set(knowledge)) == 5 * n
    for tag in ("alpha", "beta"):
        for i in range(n):
            assert f"{tag} knowledge item {i}" in knowledge and f"{tag} outcome item {i}" in knowledge
    with EpisodicMemory.open(data_dir / "episodic" / "duo.sqlite", FakeEmbedder()) as episodic:
        episodes = [e.content for e in episodic.timeline(limit=None)]
        assert episodic.status()["consistency"]["consistent"]
    assert len(episodes) == len(set(episodes)) == 5 * n, "an episode is missing or was recorded twice"


def test_each_process_sees_the_others_writes_in_vector_search(
    data_dir: Path, tmp_path: Path, children: list[Child]
) -> None:
    embedder = FakeEmbedder()
    with MemorySystem.start(Config(data_dir=data_dir), embedder=embedder) as system:
        agent = system.agent("duo")
        agent.store_knowledge("warm up the vector mirror of this process", category="pattern")
        agent.query_knowledge("warm up the vector mirror", mode="vector")  # loads the mirror
        with EpisodicMemory.open(data_dir / "episodic" / "duo.sqlite", embedder) as episodic:
            episodic.record("warm up the episode matrix")
            assert episodic.search("warm up the episode matrix", mode="vector")
            writer = spawn(children, tmp_path, DIRECT_WRITER, str(data_dir), "zulu", "3")
            writer.expect("ready")
            writer.send("go")
            writer.expect("done")
            assert writer.finish() == 0
            hits = agent.query_knowledge("zulu knowledge item 2", mode="vector", top_k=1)
            assert hits and hits[0].entry.content == "zulu knowledge item 2"
            assert hits[0].match_type == "semantic"
            # "n1", not "1": an episode's vector is of its text and its date, and "1 December"
            # would make item 0 as near as item 1
            found = episodic.search("zulu episode item n1", mode="vector", top_k=1)
            assert found and found[0].episode.content == "zulu episode item n1"
            # and the keyword side (FTS5 and its in-memory BM25 statistics) too
            keyword = agent.query_knowledge("zulu", mode="keyword", top_k=5)
            assert sorted(h.entry.content for h in keyword) == [f"zulu knowledge item {i}" for i in range(3)]
            assert len(episodic.search("zulu", mode="keyword", top_k=5)) == 3


SLEEPER = textwrap.dedent(
    """
    import sys
    print("ready", flush=True)
    sys.stdin.readline()
    """
)


def test_outbox_rows_of_a_live_process_are_left_to_it(
    data_dir: Path, tmp_path: Path, children: list[Child]
) -> None:
    other = spawn(children, tmp_path, SLEEPER)
    other.expect("ready")
    pid = other.proc.pid
    owner = f"{pid}:{_start_time(pid) or '-'}:{_boot_id()}:feedface"
    outbox = Outbox(data_dir / "outbox" / "a1.sqlite", owner=owner)
    import datetime as dt

    outbox.append("completed", "t1", "finished by the other process", dt.datetime.now(dt.UTC))
    outbox.close()
    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as system:
        assert system.wait_idle(10)
        status = system.status()["agents"]["a1"]["agent"]
        assert status["outbox_pending"] == 1  # the other process is alive: its row is not taken
        assert system.agent("a1").list_knowledge() == []
        other.proc.send_signal(signal.SIGKILL)
        other.proc.wait(30)
        system.revive("a1")  # a restart of the agent's actor claims rows whose owner is gone
        assert system.wait_idle(10)
        assert system.status()["agents"]["a1"]["agent"]["outbox_pending"] == 0
        assert [e.content for e in system.agent("a1").list_knowledge()] == ["finished by the other process"]


def test_connection_defaults_apply_to_their_block_and_thread_only(tmp_path: Path) -> None:
    with connection_defaults(lock_bound_s=0.25, synchronous="full", busy_timeout_ms=40):
        inside = open_database(tmp_path / "a.sqlite")
        seen: list[float] = []
        other = threading.Thread(
            target=lambda: seen.append(open_database(tmp_path / "b.sqlite").lock_bound_s)
        )
        other.start()
        other.join(30)
    outside = open_database(tmp_path / "c.sqlite")
    try:
        assert inside.lock_bound_s == 0.25
        assert inside.pragmas()["synchronous"] == 2 and inside.pragmas()["busy_timeout"] == 40
        assert seen == [30.0]  # another thread keeps the defaults
        assert outside.lock_bound_s == 30.0 and outside.pragmas()["synchronous"] == 1
        # SQLite's own wait never outlasts the bound
        assert open_database(tmp_path / "d.sqlite", lock_bound_s=0.1).pragmas()["busy_timeout"] == 100
    finally:
        inside.close()
        outside.close()
    with pytest.raises(InvalidInputError, match="lock_bound_s"), connection_defaults(lock_bound_s=0):
        pass
    with pytest.raises(InvalidInputError, match="synchronous"), connection_defaults(synchronous="off"):
        pass


def test_storage_config_is_checked_before_anything_starts(data_dir: Path) -> None:
    for fields, key in (
        ({"lock_timeout_s": 0}, "storage.lock_timeout_s"),
        ({"synchronous": "off"}, "storage.synchronous"),
    ):
        with pytest.raises(ConfigError, match=re.escape(key)):
            StorageConfig(**fields)  # type: ignore[arg-type]
        variable = f"MEMSTRATA_STORAGE__{key.split('.')[1].upper()}"
        with pytest.raises(ConfigError, match=re.escape(key)):
            Config.load(env={variable: str(next(iter(fields.values())))})
    env = {"MEMSTRATA_STORAGE__SYNCHRONOUS": "full", "MEMSTRATA_DATA_DIR": str(data_dir)}
    config = Config.load(env=env)
    assert config.storage.synchronous == "full"
    with MemorySystem.start(config, embedder=FakeEmbedder()) as system:
        assert system.agent("a1").store_knowledge("fsynced on every commit", category="pattern") > 0
