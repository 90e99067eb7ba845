"""Write-backs and vectors in few transactions, without ever waiting for the model.

A store actor stores every vector request already answered in one transaction (a failed one
among them leaves only its own rows pending), writes a batch of writes in one transaction with
the vectors answered meanwhile, and holds the write-backs that reach it until their own vectors
are computed (at most a bound), to write them with their vectors. Transactions are counted on
the store's connection; nothing here depends on timing (the hold bound is raised where the test
must see writes held, and lowered where it must see them written without the model).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from memstrata import Config, MemorySystem
from memstrata.actors import _store_held_writebacks
from memstrata.actors._episodic_actor import EpisodicActor
from memstrata.actors._knowledge_actor import KnowledgeStoreActor
from memstrata.actors._store_messages import WriteBackKnowledge, _VectorRequest
from memstrata.config import ActorsConfig, AgentConfig
from memstrata.errors import ModelFaultError, StorageError
from memstrata.layers import EpisodicMemory, KnowledgeStore
from memstrata.messages import StoreKnowledge, StoreMemory
from memstrata.storage import Database, open_database
from tests._support import GatedModel, eventually, hung_agent, store_status, wait_until
from tests.fakes import FakeEmbedder


class Commits:
    """Counts the outer transactions of one connection (nested ones are savepoints in them)."""

    def __init__(self, db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        original = db.transaction

        @contextlib.contextmanager
        def counted() -> Iterator[Database]:
            if not db.in_transaction:
                self.count += 1
            with original() as inner:
                yield inner

        monkeypatch.setattr(db, "transaction", counted)


@pytest.fixture
def system(data_dir: Path) -> Iterator[MemorySystem]:
    with MemorySystem.start(Config(data_dir=data_dir), embedder=FakeEmbedder()) as running:
        yield running


class Unstarted:
    """The system's runtime, for an actor that is not started (its methods run in the test's
    thread): what it posts to itself is dropped."""

    def __init__(self, runtime: Any) -> None:
        self._runtime = runtime

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runtime, name)

    def post(self, ref: Any, message: Any, reply: Any = None) -> bool:
        return False


@contextlib.contextmanager
def opened(actor_class: Any, system: MemorySystem) -> Iterator[Any]:
    """An actor of ``actor_class`` for agent ``unit``, not started, with its layer open (and
    closed again on the way out, whatever the test raised)."""
    actor = actor_class(Unstarted(system._runtime), "unit")
    actor.on_start()
    try:
        assert actor.layer is not None and actor._service is not None
        yield actor
    finally:
        actor.on_stop()


def request(ids: list[int], texts: list[str], answer: Any) -> _VectorRequest:
    """An answered vector request: ``answer`` is the vectors or the model's error."""
    future: Future[Any] = Future()
    if isinstance(answer, BaseException):
        future.set_exception(answer)
    else:
        future.set_result(answer)
    return _VectorRequest(ids, texts, future)


@contextlib.contextmanager
def opened_with_answer(actor_class: Any, system: MemorySystem, text: str) -> Iterator[tuple[Any, int]]:
    """:func:`opened`, with one row of ``text`` in its layer (an entry or an episode) whose vector
    is answered in a request in flight but not yet stored: what the next write carries along."""
    with opened(actor_class, system) as actor:
        layer = actor.layer
        first = layer.add(text) if isinstance(layer, KnowledgeStore) else layer.record(text)
        pending = layer.pending_texts(10)
        assert [i for i, _ in pending] == [first]
        texts = [t for _, t in pending]
        actor._requests = {1: request([first], texts, FakeEmbedder().embed_documents(texts))}
        actor._in_flight = {first}
        yield actor, first


# -- answered requests, stored together ----------------------------------------------------------


def test_answered_requests_are_stored_in_one_transaction_and_a_failed_one_stays_pending(
    system: MemorySystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    with opened(KnowledgeStoreActor, system) as actor:
        layer, model = actor.layer, FakeEmbedder()
        ids = [layer.add(f"entry {n} about the {word} queue", category="pattern") for n, word in
               enumerate(["billing", "shipping", "refund", "audit"])]  # fmt: skip
        texts = dict(layer.pending_texts(10))
        assert layer.pending_vectors() == 4
        a, b, c, d = ids
        actor._requests = {
            1: request([a, b], [texts[a], texts[b]], model.embed_documents([texts[a], texts[b]])),
            2: request([c], [texts[c]], ModelFaultError("model 'fake-bow' choked")),
            3: request([d], [texts[d]], model.embed_documents([texts[d]])),
        }
        actor._in_flight = set(ids)
        commits = Commits(layer._db, monkeypatch)
        assert actor._store_answered() == 3
        assert commits.count == 1  # three answers, one transaction
        assert [i for i, _ in layer.pending_texts(10)] == [c]  # only the failed request's row
        assert actor._requests == {} and actor._in_flight == set()
        assert "choked" in str(layer.status()["last_error"])
        assert actor._catch_up_due  # the failed row is asked for again, with backoff
        hit = layer.search("entry 3 about the audit queue", mode="vector", top_k=1)
        assert hit[0].entry.id == d


def test_a_batch_of_writes_carries_the_answered_vectors_in_its_transaction(
    system: MemorySystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    with opened_with_answer(KnowledgeStoreActor, system, "the first entry, its vector answered") as (
        actor,
        first,
    ):
        layer = actor.layer
        commits = Commits(layer._db, monkeypatch)
        results = actor.handle_batch(
            [
                StoreKnowledge("unit", "a user's entry", "pattern"),
                WriteBackKnowledge(StoreKnowledge("unit", "a write-back's entry", "outcome")),
            ]
        )
        assert commits.count == 1  # both rows and the answered vector
        assert [type(r).__name__ for r in results] == ["KnowledgeStored", "KnowledgeStored"]
        pending = {i for i, _ in layer.pending_texts(10)}
        assert first not in pending and pending == {results[0].entry_id, results[1].entry_id}
        assert actor._requests and actor._in_flight == pending  # their vectors are asked for at once


def test_a_failed_write_rolls_back_the_vectors_it_carried_and_they_stay_pending(
    system: MemorySystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    with opened_with_answer(EpisodicActor, system, "the deploy of build 9 failed") as (actor, first):
        layer = actor.layer
        record_many = layer.record_many

        def disk_full(items: Any) -> Any:
            record_many(items)  # written inside the transaction, then the disk fills up
            raise StorageError("database episodic/unit.sqlite: the disk is full")

        monkeypatch.setattr(layer, "record_many", disk_full)
        with pytest.raises(StorageError, match="disk is full"):
            actor.handle_batch([StoreMemory("unit", None, "a note that was not kept")])
        monkeypatch.setattr(layer, "record_many", record_many)
        assert layer.count() == 1
        assert [i for i, _ in layer.pending_texts(10)] == [first]  # its vector was rolled back too
        assert actor._catch_up_due and actor._requests == {}
        assert actor._store_answered() == 0
        actor._request_vectors()  # what the catch-up does: the row is asked for again
        assert actor._in_flight == {first}


# -- write-backs held for the vectors in flight ----------------------------------------------------


def start_gated(data_dir: Path, model: GatedModel) -> MemorySystem:
    actors = ActorsConfig(ask_timeout_s=30.0, embed_timeout_s=25.0, query_embed_timeout_s=0.5)
    config = Config(data_dir=data_dir, agent=AgentConfig(retrieval_timeout_s=5.0), actors=actors)
    return MemorySystem.start(config, embedder=model)


def knowledge_rows(data_dir: Path) -> list[str]:
    """The knowledge store's committed entries, read from the file by a connection of its own."""
    db = open_database(data_dir / "knowledge" / "a1.sqlite")
    try:
        return [str(r[0]) for r in db.query("SELECT content FROM knowledge ORDER BY id")]
    finally:
        db.close()


def test_write_backs_wait_for_their_vectors_and_are_written_with_them(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_store_held_writebacks, "_HOLD_S", 60.0)  # only the model's answers write them here
    commits: dict[str, int] = {}
    transaction = Database.transaction

    def counted(db: Database) -> Any:
        if not db.in_transaction:
            name = f"{db.path.parent.name}/{db.path.name}"
            commits[name] = commits.get(name, 0) + 1
        return transaction(db)

    stored_apart: list[int] = []
    store_vectors = KnowledgeStore.store_vectors

    def recorded(store: KnowledgeStore, ids: Any, texts: Any, vectors: Any) -> int:
        stored_apart.extend(int(i) for i in ids)
        return store_vectors(store, ids, texts, vectors)

    model = GatedModel()
    with start_gated(data_dir, model) as system:
        agent = hung_agent(system, model, episode=True)
        first = agent.store_knowledge("deploys are frozen on fridays", category="pattern")
        assert model.entered.wait(10)  # its vector is inside the model now
        monkeypatch.setattr(Database, "transaction", counted)
        monkeypatch.setattr(KnowledgeStore, "store_vectors", recorded)
        agent.complete_task("t1", "moved the invoice export to a queue")  # acknowledged at once
        agent.complete_task("t2", "sharded the ledger by month")
        wait_until(lambda: system.status()["agents"]["a1"]["knowledge"]["writes_waiting"] == 2)
        assert "moved the invoice export to a queue" not in knowledge_rows(data_dir)
        assert commits.get("knowledge/a1.sqlite", 0) == 0
        model.mode = "ok"
        model.release.set()
        assert system.wait_idle(20)
        # each write-back written with its own vector, the earlier entry's vector in the same
        # transaction: one per model answer (both write-backs in one, or one each)
        assert 1 <= commits["knowledge/a1.sqlite"] <= 2
        assert knowledge_rows(data_dir)[-2:] == [
            "moved the invoice export to a queue",
            "sharded the ledger by month",
        ]
        written_back = {e.id for e in agent.list_knowledge() if e.category == "outcome"}
        assert len(written_back) == 2 and not written_back & set(stored_apart)
        assert first in stored_apart
        assert store_status(system, "a1", "knowledge")["pending_vectors"] == 0
        assert store_status(system, "a1", "episodic")["pending_vectors"] == 0
        outbox = system.status()["agents"]["a1"]["agent"]
        assert outbox["outbox_pending"] == 0 and outbox["outbox_dead"] == 0
        hit = agent.query_knowledge("sharded the ledger by month", mode="vector", top_k=1)
        assert hit.degraded is None and hit[0].entry.content == "sharded the ledger by month"
        recalled = agent.recall("invoice export queue", top_k=1)
        assert recalled.degraded is None and recalled[0].episode.task_run_id == "t1"


def test_write_backs_arriving_while_a_vector_is_computed_wait_in_the_mailbox_and_go_together(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store waits for the held vector in its own thread: the write-backs arriving meanwhile
    do not wake it one by one, and are delivered together once the vector is answered."""
    monkeypatch.setattr(_store_held_writebacks, "_HOLD_S", 60.0)
    delivered: list[int] = []
    deliver_batch = KnowledgeStoreActor._deliver_batch

    def recorded(actor: KnowledgeStoreActor, envelopes: list[Any]) -> None:
        delivered.append(sum(isinstance(e.message, WriteBackKnowledge) for e in envelopes))
        deliver_batch(actor, envelopes)

    model = GatedModel()
    system = start_gated(data_dir, model)
    try:
        agent = hung_agent(system, model)
        ref = system._runtime.existing("knowledge", "a1")
        assert ref is not None
        inbox = ref.actor_inbox
        monkeypatch.setattr(KnowledgeStoreActor, "_deliver_batch", recorded)
        agent.complete_task("t1", "the invoice export runs on a queue")
        wait_until(lambda: inbox._watch is not None)  # the store waits for t1's vector
        for n in (2, 3, 4):
            agent.complete_task(f"t{n}", f"shard {n} of the ledger moved")  # its part is posted
        assert inbox.qsize() == 3 and inbox._watch is not None  # queued, the store still waiting
        model.mode = "ok"
        model.release.set()
        assert system.wait_idle(20)
        assert delivered[:2] == [1, 3]
        assert knowledge_rows(data_dir)[-4:] == [
            "the invoice export runs on a queue",
            *(f"shard {n} of the ledger moved" for n in (2, 3, 4)),
        ]
        assert store_status(system, "a1", "knowledge")["pending_vectors"] == 0
    finally:
        model.release.set()
        system.stop()


def test_a_search_writes_the_held_write_backs_first(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_store_held_writebacks, "_HOLD_S", 60.0)
    model = GatedModel()
    system = start_gated(data_dir, model)
    try:
        agent = hung_agent(system, model)
        agent.store_knowledge("deploys are frozen on fridays", category="pattern")
        assert model.entered.wait(10)
        agent.complete_task("t1", "the payment retries now back off exponentially")
        wait_until(lambda: system.status()["agents"]["a1"]["knowledge"]["writes_waiting"] == 1)
        hits = agent.query_knowledge("payment retries back off")  # keyword-ranked: the model hangs
        assert hits[0].entry.content == "the payment retries now back off exponentially"
        assert hits.degraded is not None
        assert system.status()["agents"]["a1"]["knowledge"]["writes_waiting"] == 0
    finally:
        model.release.set()
        system.stop()


def test_a_hung_model_holds_a_write_back_no_longer_than_the_bound(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_store_held_writebacks, "_HOLD_S", 0.05)
    model = GatedModel()
    system = start_gated(data_dir, model)
    try:
        agent = hung_agent(system, model, episode=True)
        agent.store_knowledge("deploys are frozen on fridays", category="pattern")
        assert model.entered.wait(10)
        agent.complete_task("t1", "the cache is warmed before the deploy")
        # written while the model call is still blocked: nothing but the bound let it through
        assert eventually(lambda: "the cache is warmed before the deploy" in knowledge_rows(data_dir))
        assert model.inside >= 1 and not model.release.is_set()
        assert eventually(lambda: system.status()["agents"]["a1"]["agent"]["outbox_pending"] == 0)
    finally:
        model.release.set()
        system.stop()


# -- the episodic layer's bulk keyword write ---------------------------------------------------------


def index_of(db: Database, table: str) -> list[tuple[Any, ...]]:
    """Every (term, row, column, offset) of an FTS5 index, as the index holds them."""
    db.execute(f"CREATE VIRTUAL TABLE IF NOT EXISTS temp.{table}_v USING fts5vocab(main, {table}, instance)")
    return [
        tuple(r) for r in db.query(f"SELECT term, doc, col, offset FROM temp.{table}_v ORDER BY 1, 2, 3, 4")
    ]


def test_record_many_indexes_exactly_what_the_insert_trigger_did(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memstrata.layers._episodic_state import EpisodicState
    from memstrata.layers._episodic_writes import EpisodicWrites
    from memstrata.storage import fts_schema, get_meta

    items = [
        {"content": f"turn {n}: the ärger über café 語 {n % 3}", "title": "chat" if n % 2 else None,
         "task_run_id": "run-1" if n < 6 else None}
        for n in range(10)
    ]  # fmt: skip

    def fill(store: EpisodicMemory) -> dict[str, list[tuple[Any, ...]]]:
        ids = store.record_many(items)
        store.record("one more, alone", task_run_id="run-1")
        store.delete(ids[2])  # the delete trigger removes exactly what was indexed
        for table in ("episodes_fts", "episodes_tri"):
            store._db.execute(f"INSERT INTO {table}({table}) VALUES ('integrity-check')")
        return {t: index_of(store._db, t) for t in ("episodes_fts", "episodes_tri", "episodes_ctx")}

    with EpisodicMemory.open(tmp_path / "bulk.sqlite", FakeEmbedder()) as bulk:
        assert bulk._db.scalar("SELECT count(*) FROM sqlite_master WHERE name = 'episodes_ai'") == 0
        assert get_meta(bulk._db, "migration:4") == "bulk-ingest-1"
        expected = fill(bulk)
    # the same episodes indexed by the insert trigger of the schema, as before migration 4
    trigger = re.search(
        r"CREATE TRIGGER episodes_ai .*?END;", fts_schema("episodes", ["content", "title", "ident"]), re.S
    )
    assert trigger is not None
    monkeypatch.setattr(EpisodicWrites, "_indexed", EpisodicState._indexed)
    with EpisodicMemory.open(tmp_path / "trigger.sqlite", FakeEmbedder()) as store:
        store._db.executescript(trigger.group(0))
        got = fill(store)
    assert got == expected and all(expected.values())
