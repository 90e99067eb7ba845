"""Helpers several test modules share: the command line run as a process, a model double whose
calls the test gates or spoils, a store's status, and a bounded poll."""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
import pytest
from click.testing import Result

from memstrata import Agent, Config, MemorySystem
from memstrata._workspaces import Workspaces
from memstrata.bridges._cli_query import _Loading
from memstrata.config import ActorsConfig, AgentConfig, StorageConfig
from memstrata.errors import EmbedderUnavailableError, InvalidInputError
from memstrata.layers import Episode, EpisodicMemory, KnowledgeStore
from memstrata.storage import (
    ConsistencyReport,
    Database,
    Filter,
    RankedId,
    SearchParams,
    VectorIndex,
    check_consistency,
    hybrid_search,
    open_database,
)
from memstrata.storage._vector_mirror import Mirror
from tests.fakes import FakeEmbedder

FloatArray = npt.NDArray[np.float32]
REPO = Path(__file__).resolve().parent.parent
CLI_TIMEOUT = 120


def cli_env() -> dict[str, str]:
    """This environment, with the checkout importable and none of the user's memstrata settings."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for key in ("MEMSTRATA_CONFIG", "MEMSTRATA_DATA_DIR", "MEMSTRATA_DEBUG"):
        env.pop(key, None)
    return env


def cli_ok(result: Result) -> Result:
    """``result`` of a command run in process, which must have succeeded."""
    assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr, result.exception)
    return result


def cli_fails(result: Result, code: int, needle: str) -> None:
    """Exit ``code`` with exactly one ``memstrata: error:`` line on stderr, no traceback."""
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("memstrata: error: ")
    assert needle in lines[0], lines[0]
    assert "Traceback" not in result.stderr


def run_memstrata(
    data_dir: Path, *args: str, cwd: Path, input: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    """``python -m memstrata --data-dir data_dir *args`` in a process of its own, run in ``cwd``."""
    return subprocess.run(
        [sys.executable, "-m", "memstrata", "--data-dir", str(data_dir), *args],
        input=input,
        capture_output=True,
        cwd=cwd,
        env=cli_env(),
        timeout=CLI_TIMEOUT,
        check=False,
    )


class GatedModel(FakeEmbedder):
    """``mode``: "ok", "hang" (every call waits for ``release``), "zeros" or "nan" (all-zero or
    NaN vectors). ``entered`` is set once a call waits in the model; ``inside`` counts the calls
    waiting there right now."""

    def __init__(self) -> None:
        super().__init__()
        self.mode = "ok"
        self.release = threading.Event()
        self.entered = threading.Event()
        self.inside = 0
        self._count = threading.Lock()

    def _answer(self, rows: FloatArray) -> FloatArray:
        if self.mode == "hang":
            with self._count:
                self.inside += 1
            self.entered.set()
            try:
                self.release.wait(60)
            finally:
                with self._count:
                    self.inside -= 1
        if self.mode == "zeros":
            return np.zeros_like(rows)
        if self.mode == "nan":
            return np.full_like(rows, np.nan)
        return rows

    def embed_documents(self, texts: Sequence[str]) -> FloatArray:
        return self._answer(super().embed_documents(texts))

    def embed_query(self, text: str) -> FloatArray:
        return self._answer(super().embed_query(text))


def start_with_model(
    data_dir: Path, model: FakeEmbedder, *, retrieval_timeout_s: float | None = None, **actors: Any
) -> MemorySystem:
    """A system around ``model`` with the actor bounds ``actors``: the lock bound stays below the
    request bound (at most 10 s), and pre-task retrieval gets at least 5 s, more than the query
    embedding bound unless ``retrieval_timeout_s`` says otherwise."""
    settings = ActorsConfig(**actors)
    retrieval = (
        max(5.0, settings.query_embed_timeout_s + 1) if retrieval_timeout_s is None else retrieval_timeout_s
    )
    config = Config(
        data_dir=data_dir,
        agent=AgentConfig(retrieval_timeout_s=retrieval),
        actors=settings,
        storage=StorageConfig(lock_timeout_s=min(10.0, settings.ask_timeout_s / 2)),
    )
    return MemorySystem.start(config, embedder=model)


@contextlib.contextmanager
def gated_system(
    data_dir: Path, model: GatedModel, *, retrieval_timeout_s: float | None = None, **actors: Any
) -> Iterator[MemorySystem]:
    """:func:`start_with_model` for a test that hangs ``model``: on the way out the model is
    released before the system stops, so the stop never waits for a hung call."""
    system = start_with_model(data_dir, model, retrieval_timeout_s=retrieval_timeout_s, **actors)
    try:
        yield system
    finally:
        model.release.set()
        system.stop()


def hung_agent(system: MemorySystem, model: GatedModel, *, episode: bool = False) -> Agent:
    """Agent ``a1`` with its knowledge store (and, with ``episode``, its episodic store) open and
    their first vectors computed, then ``model`` hung: where a hung-model test starts, so that
    what it measures is the hang alone, not a store's opening."""
    agent = system.agent("a1")
    agent.store_knowledge("warm-up entry", category="pattern")
    if episode:
        agent.remember("warm-up episode")
    assert system.wait_idle(20)
    model.mode = "hang"
    return agent


@contextlib.contextmanager
def hung_system(
    data_dir: Path, *, episode: bool = False, **actors: Any
) -> Iterator[tuple[MemorySystem, GatedModel, Agent]]:
    """A :func:`gated_system` with the actor bounds ``actors`` around a fresh :class:`GatedModel`,
    and its agent from :func:`hung_agent`: the model hangs from the test's first write on, and is
    released before the system stops whatever the test raised."""
    model = GatedModel()
    with gated_system(data_dir, model, **actors) as system:
        yield system, model, hung_agent(system, model, episode=episode)


@contextlib.contextmanager
def late_model_loading() -> Iterator[_Loading]:
    """How ``memstrata query`` loads its model (a ``_Loading`` bounded at 0.05 s), around a model
    that answers a query vector only once the block is left: a late model, released on the way
    out whatever the test raised."""
    release = threading.Event()

    class Late(FakeEmbedder):
        def embed_query(self, text: str) -> Any:
            release.wait()  # answers only once the test lets it
            return super().embed_query(text)

    loading = _Loading("fake-bow", 64, Late, limit=0.05)
    try:
        yield loading
    finally:
        release.set()


def assert_bulk_write_refused(store: KnowledgeStore | EpisodicMemory, items: Any, error: str) -> None:
    """``items`` written in bulk to ``store`` (knowledge's ``add_many``, episodes' ``record_many``)
    fail with an :class:`InvalidInputError` matching ``error`` and leave ``store`` empty: every
    item is checked before the first is written."""
    write_many = store.add_many if isinstance(store, KnowledgeStore) else store.record_many
    with pytest.raises(InvalidInputError, match=error):
        write_many(items)
    assert store.count() == 0


def vector_blob(path: Path, episode_id: int) -> bytes:
    """The stored vector of episode ``episode_id`` in the episodic store at ``path``, as bytes."""
    with open_database(path) as db:
        blob = db.scalar("SELECT embedding FROM episodes_vec WHERE rowid = ?", (episode_id,))
    assert isinstance(blob, bytes)
    return blob


def assert_restored(
    restored: list[Episode], path: Path, originals: dict[str, Episode], blobs: dict[str, bytes]
) -> None:
    """Each episode of ``restored`` (stored at ``path``) equals its original of the same uuid field
    for field, its time still in UTC, with the original's vector: a restore loses nothing."""
    for episode in restored:
        original = originals[episode.uuid]
        assert (episode.content, episode.title, episode.task_run_id, episode.tags, episode.kind) == (
            original.content,
            original.title,
            original.task_run_id,
            original.tags,
            original.kind,
        )
        assert episode.at == original.at and episode.at.tzinfo is UTC
        assert vector_blob(path, episode.id) == blobs[episode.uuid]


def hybrid_docs(
    embedder: FakeEmbedder,
    corpus: tuple[Database, VectorIndex],
    text: str,
    flt: Filter | None = None,
    **params: Any,
) -> list[RankedId]:
    """:func:`hybrid_search` of ``text`` over a test corpus: table ``docs``, its full-text columns
    ``body`` and ``idwords``, its vectors, the query embedded by ``embedder``."""
    db, vectors = corpus
    return hybrid_search(
        db,
        table="docs",
        columns=["body", "idwords"],
        vectors=vectors,
        query_vector=embedder.embed_query(text),
        query_text=text,
        params=SearchParams(**params),
        flt=flt or Filter(),
    )


def unit(rows: FloatArray) -> FloatArray:
    """``rows`` scaled to unit length."""
    out: FloatArray = (rows / np.linalg.norm(rows, axis=-1, keepdims=True)).astype(np.float32)
    return out


def exact_top(mirror: Mirror, q: FloatArray, k: int, where: dict[str, Any]) -> list[int]:
    """The rowids of the ``k`` live rows of ``mirror`` that ``where`` allows most similar to
    ``q``, by a plain scan of its matrix (equal scores: storage order)."""
    size = mirror.size
    ok = mirror.alive[:size].copy()
    for column, value in where.items():
        ok &= mirror.codes[column][:size] == mirror.vocab[column][value]
    scores = mirror.matrix[:size] @ q
    scores[~ok] = -np.inf
    return [int(r) for r in mirror.rowids[np.lexsort((np.arange(size), -scores))[:k]]]


def record_calls(
    monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, note: Callable[..., Any]
) -> list[Any]:
    """Patch ``owner.name`` (a function of a module, or a method of a class) to call through and
    record ``note`` of each call's arguments; returns the list it records into."""
    calls: list[Any] = []
    real = getattr(owner, name)

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(note(*args, **kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, spy)
    return calls


def seeded_vector(n: int, dim: int = 8) -> FloatArray:
    """The same vector for the same ``n`` every run: what a store is filled and repaired with."""
    return np.random.default_rng(n).standard_normal(dim).astype(np.float32)


class VectorRepair:
    """A ``repair_missing`` callback: it records each list of ids it is asked for and stores
    their :func:`seeded_vector` in ``vectors``."""

    def __init__(self, vectors: VectorIndex) -> None:
        self.vectors = vectors
        self.asked: list[list[int]] = []

    def __call__(self, ids: list[int]) -> int:
        self.asked.append(ids)
        self.vectors.upsert_many(ids, np.stack([seeded_vector(n) for n in ids]))
        return len(ids)


def write_tree(root: Path, files: dict[str, str]) -> Path:
    """``root`` with ``files`` (relative path: text) written below it."""
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


@contextlib.contextmanager
def system_with_notes(base: Path) -> Iterator[tuple[MemorySystem, Workspaces]]:
    """A running system (fake model) and the file-index registry of its data dir, with one
    indexed memory file, all below ``base``."""
    root = base / "ws"
    root.mkdir()
    (root / "MEMORY.md").write_text("# Notes\n\nsome notes to search\n", encoding="utf-8")
    embedder = FakeEmbedder()
    with (
        MemorySystem.start(Config(data_dir=base / "data"), embedder=embedder) as system,
        Workspaces(base / "data", config=system.config, embedder=embedder) as registry,
    ):
        registry.index(root)
        yield system, registry


# arguments with which every agent-facing tool succeeds on a system_with_notes
TOOL_ARGUMENTS: dict[str, dict[str, Any]] = {
    "memory_search": {"query": "notes"},
    "memory_get": {"path": "MEMORY.md"},
    "memory_add": {"content": "a note"},
    "memory_save": {"content": "a note"},
    "memory_list": {},
    "memory_delete": {"id": 1},
    "knowledge_query": {"query": "notes"},
    "knowledge_store": {"content": "a fact", "category": "pattern"},
    "knowledge_get": {"entry_id": 1},
    "knowledge_update": {"entry_id": 1, "content": "a changed fact"},
    "knowledge_delete": {"entry_id": 1, "store": "shared"},
    "knowledge_list": {},
    "episode_remember": {"content": "an episode"},
    "episode_recall": {"query": "episode"},
    "episode_list": {},
    "working_set": {"key": "k", "value": '[1, "two"]'},
    "working_get": {"key": "k"},
    "working_clear": {"key": "k"},
    "blackboard_publish": {"session_id": "s", "key": "k", "value": "1"},
    "blackboard_get": {"session_id": "s", "key": "k"},
    "blackboard_list": {"session_id": "s"},
    "item_put": {"namespace": ["h"], "key": "k", "value": '{"t": "x"}'},
    "item_get": {"namespace": ["h"], "key": "k"},
    "item_search": {"prefix": ["h"], "query": "x"},
    "item_delete": {"namespace": ["h"], "key": "k"},
    "item_namespaces": {},
}


def check_knowledge(db: Database, vectors: VectorIndex | None = None, **options: Any) -> ConsistencyReport:
    """The shared consistency check with the knowledge layer's arguments: its table, its two
    full-text indexes and, given ``vectors``, the vectors of the rows not pending."""
    if vectors is not None:
        options.update(vectors=vectors, vector_rows="vector_pending = 0")
    fts = {"knowledge_fts": None, "knowledge_tri": "cjk != ''"}
    return check_consistency(db, table="knowledge", fts=fts, **options)


def without_default_model(monkeypatch: pytest.MonkeyPatch, reason: str) -> None:
    """The shared ``default_embedder`` (which every layer's model choice goes through) fails
    with ``reason``, as when no model can be loaded."""
    import memstrata.storage._fastembed as fastembed_module

    def unavailable() -> Any:
        raise EmbedderUnavailableError(reason)

    monkeypatch.setattr(fastembed_module, "default_embedder", unavailable)


def store_status(system: MemorySystem, agent_id: str, kind: str) -> dict[str, Any]:
    """The ``store`` section of one of an agent's stores in :meth:`MemorySystem.status`."""
    state: dict[str, Any] = system.status()["agents"][agent_id][kind].get("store", {})
    return state


class FirstBatchHeld(FakeEmbedder):
    """Holds its first document call until ``release`` is set (``entered`` says it is held), so
    other requests queue up meanwhile; records every batch, and fails one holding ``fail_on``."""

    def __init__(self, *, thread_safe: bool = False) -> None:
        super().__init__()
        self.thread_safe = thread_safe
        self.entered = threading.Event()
        self.release = threading.Event()
        self.batches: list[list[str]] = []
        self.fail_on: str | None = None

    def embed_documents(self, texts: Sequence[str]) -> FloatArray:
        self.batches.append(list(texts))
        if len(self.batches) == 1:
            self.entered.set()
            assert self.release.wait(10)
        if self.fail_on is not None and self.fail_on in texts:
            raise RuntimeError(f"model choked on {self.fail_on}")
        return super().embed_documents(texts)


class HandClock:
    """Seconds that move only when the test moves them (``now += ...``): the clock of a store
    with expiring entries."""

    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll a condition (bounded): for a mailbox or a queue filling up, which has no event to
    wait on."""
    tick = threading.Event()
    for _ in range(int(timeout * 1000)):
        if predicate():
            return
        tick.wait(0.001)
    raise AssertionError("condition not reached in time")


def eventually(condition: Callable[[], bool], timeout_s: float = 20.0) -> bool:
    """Whether ``condition`` holds within ``timeout_s`` (checked every 20 ms): for work a
    background timer does, where the test has nothing to wait on."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def in_threads(target: Callable[[Any], object], args: Iterable[Any], timeout: float) -> None:
    """``target(a)`` for each of ``args``, each in a thread of its own, all started before any is
    joined; fails when one is still running ``timeout`` seconds into its join."""
    threads = [threading.Thread(target=target, args=(a,)) for a in args]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), f"{target.__name__}({t.name}) did not end"


def fail_once(monkeypatch: pytest.MonkeyPatch, owner: type, name: str) -> None:
    """``owner.name`` raises ``RuntimeError("injected crash")`` at its next call, then works as
    before: the crash of the actor that calls it, once."""
    real = getattr(owner, name)
    calls = iter([True])

    def failing_once(self: Any, *args: Any, **kwargs: Any) -> Any:
        if next(calls, False):
            raise RuntimeError("injected crash")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(owner, name, failing_once)


# -- a JSON-RPC client on a local socket -------------------------------------------------------

RPC_WAIT = 30.0  # seconds a test waits for one message before it fails


class RpcClient:
    """A JSON-lines client on a socket; a reader thread parses every line into a queue."""

    def __init__(self, address: Any, family: int = socket.AF_UNIX) -> None:
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.connect(address)
        self.messages: queue.Queue[Any] = queue.Queue()
        self.seen: list[Any] = []
        self._unclaimed: list[Any] = []
        self.reading = threading.Event()  # clear it to stop reading (the socket then fills up)
        self.reading.set()
        self._ids = iter(range(1, 1 << 30))
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        with self.sock.makefile("rb") as reader:
            for line in reader:
                self.messages.put(orjson.loads(line))
                self.reading.wait(RPC_WAIT)
        self.messages.put(EOFError)

    def send(self, message: Any) -> None:
        self.sock.sendall(orjson.dumps(message) + b"\n")

    def next(self, predicate: Callable[[Any], bool]) -> Any:
        """The first unclaimed message that satisfies ``predicate`` (every message read is in ``seen``)."""
        for i, message in enumerate(self._unclaimed):
            if predicate(message):
                return self._unclaimed.pop(i)
        while True:
            message = self.messages.get(timeout=RPC_WAIT)
            assert message is not EOFError, "the server closed the connection"
            self.seen.append(message)
            if predicate(message):
                return message
            self._unclaimed.append(message)

    def call(self, method: str, **params: Any) -> Any:
        request_id = next(self._ids)
        self.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        response = self.next(lambda m: m.get("id") == request_id)
        assert "result" in response, response
        return response["result"]

    def signal(self, subscription_id: int | None = None) -> dict[str, Any]:
        """The next signal notification's params (of ``subscription_id``, when given)."""
        message = self.next(lambda m: m.get("method") == "signal")
        if subscription_id is not None:
            assert message["params"]["subscription_id"] == subscription_id, message
        return dict(message["params"])

    def close(self) -> None:
        with contextlib.suppress(OSError):  # the reader's file keeps the socket open otherwise
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


# -- processes that speak a protocol on stdin/stdout ---------------------------------------------

MCP_INITIALIZE = {
    "jsonrpc": "2.0",
    "id": "init",
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "test", "version": "1"},
    },
}
MCP_INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def output_when_done(proc: subprocess.Popen[bytes], timeout: float) -> tuple[bytes, bytes]:
    """``proc``'s stdout and stderr once it exits by itself, its stdin left open until then
    (killed after ``timeout``, should it hang, so the test fails instead of waiting)."""
    assert proc.stdout is not None and proc.stderr is not None
    guard = threading.Timer(timeout, proc.kill)
    guard.start()
    try:
        out, err = proc.stdout.read(), proc.stderr.read()
        proc.wait()
    finally:
        guard.cancel()
        assert proc.stdin is not None
        proc.stdin.close()
    return out, err
