"""A faulty model never blocks the stores, never loses an acknowledged write, and pre-task
retrieval degrades to the keyword ranking rather than to nothing.

The model is a double: its calls wait on an event the test controls ("hang"), or return all-zero
or NaN vectors on demand. Nothing sleeps to synchronise; time is only bounded from above.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from memstrata import Config
from memstrata.actors._outbox import Outbox
from memstrata.config import ActorsConfig, StorageConfig
from memstrata.errors import ConfigError, InvalidInputError, ModelFaultError
from memstrata.storage import open_database
from tests._support import (
    GatedModel,
    eventually,
    gated_system,
    hung_agent,
    hung_system,
    start_with_model,
    store_status,
)

MARGIN_S = 2.0  # "within the timeout plus a small bound" on a shared 2-core machine


def timed(call: Callable[[], Any]) -> tuple[Any, float]:
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


# -- point 2: a hung model blocks nothing ---------------------------------------------------------


def test_list_store_remember_and_query_answer_while_the_model_hangs(data_dir: Path) -> None:
    # the inner bound (embedding) is below the outer one (the request), as Config requires
    with hung_system(data_dir, ask_timeout_s=2.5, embed_timeout_s=1.0, query_embed_timeout_s=0.5) as (
        system,
        model,
        agent,
    ):
        entry, took = timed(lambda: agent.store_knowledge("the cache warms up after deploys"))
        assert took < 1.0 + MARGIN_S
        assert model.entered.wait(10)  # its vector is computed apart: the store did not wait for it
        # nothing waits for the model
        for call in (
            lambda: agent.store_knowledge("rollbacks need the previous image tag", category="pitfall"),
            lambda: agent.remember("deploy of build 42 rolled back"),
            lambda: agent.list_knowledge(),
            lambda: agent.recall("rolled back"),
        ):
            _, took = timed(call)
            assert took < MARGIN_S
        listed = {e.content for e in agent.list_knowledge()}
        assert "the cache warms up after deploys" in listed
        assert "rollbacks need the previous image tag" in listed
        # searchable by keywords at once, and the result says why it is keyword-only
        hits, took = timed(lambda: agent.query_knowledge("previous image tag"))
        assert took < 0.5 + MARGIN_S
        assert hits[0].entry.content == "rollbacks need the previous image tag"
        assert hits.degraded is not None and hits.degraded.startswith("keyword-only: model 'fake-bow'")
        assert agent.get_knowledge(entry) is not None
        recalled = agent.recall("rolled back")
        assert recalled[0].episode.content == "deploy of build 42 rolled back"
        assert recalled.degraded is not None and recalled.degraded.startswith("keyword-only: model")
        # status names the stuck model and since when
        state = system.status()["embedding"]["state"]
        assert state["state"] == "stuck" and state["model"] == "fake-bow"
        assert state["texts"] >= 1 and state["since"].endswith("Z")
        warnings = system.status()["warnings"]
        assert warnings[0].startswith("model 'fake-bow' is stuck since "), warnings
        assert store_status(system, "a1", "knowledge")["pending_vectors"] == 2
        assert store_status(system, "a1", "episodic")["pending_vectors"] == 1
        # the model comes back: vectors catch up in this process, with no further write
        model.mode = "ok"
        model.release.set()
        assert eventually(lambda: store_status(system, "a1", "knowledge")["pending_vectors"] == 0)
        assert eventually(lambda: store_status(system, "a1", "episodic")["pending_vectors"] == 0)
        semantic = agent.query_knowledge("rollbacks need the previous image tag", mode="vector", top_k=1)
        assert semantic[0].entry.content == "rollbacks need the previous image tag"
        assert semantic.degraded is None
        assert system.status()["embedding"]["state"]["state"] == "ok"


# -- point 3: bad vectors are the model's fault ---------------------------------------------------


@pytest.mark.parametrize("mode", ["zeros", "nan"])
def test_zero_or_nan_vectors_are_stored_pending_and_caught_up_in_process(data_dir: Path, mode: str) -> None:
    model = GatedModel()
    with start_with_model(data_dir, model) as system:
        agent = system.agent("a1")
        model.mode = mode
        entry = agent.store_knowledge("invoices are numbered per tenant", category="pattern")
        episode = agent.remember("invoice numbering clashed across tenants")
        assert agent.get_knowledge(entry) is not None
        knowledge = store_status(system, "a1", "knowledge")
        assert knowledge["pending_vectors"] == 1
        assert "model 'fake-bow' returned" in knowledge["last_error"]
        assert store_status(system, "a1", "episodic")["pending_vectors"] == 1
        state = system.status()["embedding"]["state"]
        assert state["state"] == "faulty" and "ModelFaultError" in state["last_error"]
        hits = agent.query_knowledge("invoices numbered")
        assert hits[0].entry.id == entry and hits.degraded is not None
        model.mode = "ok"  # fixed: the bad vectors were never cached, so they are computed again
        assert eventually(lambda: store_status(system, "a1", "knowledge")["pending_vectors"] == 0)
        assert eventually(lambda: store_status(system, "a1", "episodic")["pending_vectors"] == 0)
        assert (
            agent.query_knowledge("invoices are numbered per tenant", mode="vector", top_k=1)[0].entry.id
            == entry
        )
        assert agent.recall("invoice numbering clashed")[0].episode.id == episode


def test_a_completed_task_is_delivered_with_a_zero_vector_model_never_a_dead_letter(data_dir: Path) -> None:
    model = GatedModel()
    with start_with_model(data_dir, model) as system:
        agent = system.agent("a1")
        model.mode = "zeros"
        agent.complete_task("t1", "moved the invoice export to a queue")
        assert system.wait_idle(20)
        status = system.status()["agents"]["a1"]["agent"]
        assert status["outbox_dead"] == 0 and status["outbox_pending"] == 0
        assert status.get("dead_letters", 0) == 0
        assert [e.content for e in agent.list_knowledge()] == ["moved the invoice export to a queue"]
        model.mode = "ok"
        assert eventually(lambda: store_status(system, "a1", "knowledge")["pending_vectors"] == 0)
        assert eventually(lambda: store_status(system, "a1", "episodic")["pending_vectors"] == 0)
        hit = agent.query_knowledge("invoice export queue", mode="vector", top_k=1)[0]
        assert hit.entry.content == "moved the invoice export to a queue"


def test_a_write_back_parked_by_an_older_version_for_a_zero_vector_is_delivered(data_dir: Path) -> None:
    path = data_dir / "outbox" / "a1.sqlite"
    path.parent.mkdir(parents=True)
    outbox = Outbox(path)
    from datetime import UTC, datetime

    row = outbox.append("completed", "t1", "sharded the ledger by month", datetime.now(UTC))
    outbox.record_failure(
        row,
        "knowledge: InvalidInputError: vectors contain a zero vector, which has no cosine similarity",
        dead=True,
    )
    outbox.close()
    db = open_database(path, load_vec=False)
    with db.transaction():  # as an older version left it: before the migration that revives it
        db.execute("UPDATE metadata SET value = '2' WHERE key = 'schema_version'")
    db.close()
    with start_with_model(data_dir, GatedModel()) as system:
        assert system.wait_idle(20)
        agent = system.agent("a1")
        assert [e.content for e in agent.list_knowledge()] == ["sharded the ledger by month"]
        assert [h.episode.task_run_id for h in agent.recall("sharded ledger")] == ["t1"]
        status = system.status()["agents"]["a1"]["agent"]
        assert status["outbox_dead"] == 0 and status["outbox_pending"] == 0


def test_a_bad_vector_is_a_model_fault_not_invalid_input() -> None:
    from memstrata.storage import embed_documents

    model = GatedModel()
    model.mode = "zeros"
    with pytest.raises(ModelFaultError, match="all-zero vector") as caught:
        embed_documents(model, ["any text"])
    assert not isinstance(caught.value, InvalidInputError)
    model.mode = "nan"
    with pytest.raises(ModelFaultError, match="NaN"):
        embed_documents(model, ["any text"])


# -- point 4: pre-task retrieval degrades to keywords ---------------------------------------------


def test_pre_task_retrieval_with_a_hung_query_embedding_uses_the_keyword_hits(data_dir: Path) -> None:
    model = GatedModel()
    with gated_system(data_dir, model, retrieval_timeout_s=1.0) as system:
        agent = system.agent("a1")
        agent.store_knowledge("webhooks are retried with exponential backoff", category="pattern")
        model.mode = "hang"
        prompt, took = timed(lambda: agent.begin_task("t1", "retry the failed webhooks"))
        assert took < 1.0 + MARGIN_S
        assert not prompt.fallback
        assert "webhooks are retried with exponential backoff" in prompt.text
        assert prompt.reason is not None and prompt.reason.startswith(
            "degraded: keyword-only: model 'fake-bow'"
        )
        # nothing found in time by keywords either: the bare prompt, with the reason
        empty, took = timed(lambda: agent.begin_task("t2", "rotate the signing keys"))
        assert took < 1.0 + MARGIN_S
        assert empty.fallback and empty.reason is not None and empty.reason.startswith("no-hits:")


# -- stop is a hard bound -------------------------------------------------------------------------


def test_stop_with_a_hung_model_is_bounded_and_the_next_start_delivers_what_was_left(data_dir: Path) -> None:
    model = GatedModel()
    before = set(threading.enumerate())
    system = start_with_model(data_dir, model, ask_timeout_s=20.0, embed_timeout_s=10.0)
    agent = hung_agent(system, model, episode=True)
    agent.complete_task("t1", "split the billing job into shards")  # acknowledged: in the outbox
    assert model.entered.wait(10)  # its vectors wait inside the model now; its stores did not
    report, took = timed(lambda: system.stop(timeout=2))
    assert took < 2 + MARGIN_S
    assert not report.drained  # the vectors were still being computed
    assert report.left == ()  # the write-back itself was stored, its vectors left pending on disk
    model.mode = "ok"
    model.release.set()
    for thread in set(threading.enumerate()) - before:  # the late actors finish what they hold
        if "Actor" in thread.name:
            thread.join(10)
            assert not thread.is_alive()
    with start_with_model(data_dir, model) as again:
        assert again.wait_idle(20)
        agent = again.agent("a1")
        assert "split the billing job into shards" in {e.content for e in agent.list_knowledge()}
        episodes = [h.episode for h in agent.recall("billing job shards") if h.episode.task_run_id == "t1"]
        assert len(episodes) == 1
        assert again.status()["agents"]["a1"].get("agent", {}).get("outbox_pending", 0) == 0
        # the vectors left pending are computed by this start, with no further write
        assert eventually(lambda: store_status(again, "a1", "knowledge")["pending_vectors"] == 0)
        assert eventually(lambda: store_status(again, "a1", "episodic")["pending_vectors"] == 0)
        hit = agent.query_knowledge("split the billing job into shards", mode="vector", top_k=1)[0]
        assert hit.entry.content == "split the billing job into shards"


# -- the order of timeouts ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "names"),
    [
        (lambda: ActorsConfig(embed_timeout_s=40.0), ("actors.embed_timeout_s", "actors.ask_timeout_s")),
        (
            lambda: ActorsConfig(ask_timeout_s=1.0),
            ("actors.embed_timeout_s", "actors.ask_timeout_s"),
        ),
        (
            lambda: ActorsConfig(query_embed_timeout_s=30.0),
            ("actors.query_embed_timeout_s", "actors.ask_timeout_s"),
        ),
        (
            lambda: Config(storage=StorageConfig(lock_timeout_s=30.0)),
            ("storage.lock_timeout_s", "actors.ask_timeout_s"),
        ),
    ],
)
def test_timeouts_out_of_order_are_a_clear_config_error(
    make: Callable[[], Any], names: tuple[str, ...]
) -> None:
    with pytest.raises(ConfigError) as caught:
        make()
    assert all(name in str(caught.value) for name in names)
    assert "must be below" in str(caught.value)


def test_the_default_timeouts_are_ordered_inner_first() -> None:
    config = Config()
    actors = config.actors
    assert actors.embed_timeout_s < actors.ask_timeout_s
    assert actors.query_embed_timeout_s < config.agent.retrieval_timeout_s
    assert config.storage.lock_timeout_s < actors.ask_timeout_s


def test_timeouts_out_of_order_from_a_file_name_the_keys(tmp_path: Path) -> None:
    path = tmp_path / "memstrata.toml"
    path.write_text("[actors]\nask_timeout_s = 5.0\n", encoding="utf-8")
    with pytest.raises(
        ConfigError, match=r"actors\.embed_timeout_s \(10 s\) must be below actors\.ask_timeout_s \(5 s\)"
    ):
        Config.load(path, env={})
