"""The shared batching embedder: coalescing, routing, failures, caching."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt
import pytest

from memstrata.actors import BatchingEmbedder
from memstrata.errors import EmbeddingError
from tests._support import FirstBatchHeld, in_threads, wait_until
from tests.fakes import FakeEmbedder


def run_threads(target: Callable[[int], object], n: int) -> list[object]:
    results: list[object] = [None] * n

    def work(i: int) -> None:
        try:
            results[i] = target(i)
        except Exception as exc:
            results[i] = exc

    in_threads(work, range(n), 10)
    return results


def queued_behind_a_held_batch(
    service: BatchingEmbedder, inner: FirstBatchHeld, calls: list[Callable[[], object]]
) -> None:
    """Run ``calls`` on threads while the model holds a first batch; release it once every call
    is queued behind it, and wait for them all."""
    first = threading.Thread(target=service.embed_documents, args=(["warm up"],))
    first.start()
    assert inner.entered.wait(5)
    threads = [threading.Thread(target=call) for call in calls]
    for t in threads:
        t.start()
    wait_until(lambda: service.stats().document_requests == len(calls) + 1)
    inner.release.set()
    for t in [*threads, first]:
        t.join(10)


def test_concurrent_requests_coalesce_and_results_are_routed_back() -> None:
    inner = FirstBatchHeld()
    service = BatchingEmbedder(inner, batch_size=64, max_batch_wait_ms=1)
    try:
        out: dict[int, npt.NDArray[np.float32]] = {}

        def embed(i: int) -> None:
            out[i] = service.embed_documents([f"text number {i}", f"other {i}"])

        queued_behind_a_held_batch(service, inner, [lambda i=i: embed(i) for i in range(8)])
        assert len(inner.batches) <= 3  # 1 + the 8 requests coalesced (at most split once)
        for i in range(8):
            expected = FakeEmbedder().embed_documents([f"text number {i}", f"other {i}"])
            np.testing.assert_allclose(out[i], expected, rtol=1e-6)
        stats = service.stats()
        assert stats.model_calls == len(inner.batches)
        assert stats.texts_requested == 17
    finally:
        service.close()


def test_a_failing_request_does_not_fail_its_batch_neighbours() -> None:
    inner = FirstBatchHeld()
    inner.fail_on = "poison"
    service = BatchingEmbedder(inner, max_batch_wait_ms=1)
    try:
        texts = ["fine a", "poison", "fine b"]
        results: list[object] = []
        calls = [lambda t=t: results.append(_try(service.embed_documents, [t])) for t in texts]
        queued_behind_a_held_batch(service, inner, calls)
        errors = [r for r in results if isinstance(r, Exception)]
        assert len(errors) == 1
        assert isinstance(errors[0], EmbeddingError)
        assert "poison" in str(errors[0])
    finally:
        service.close()


def _try(fn: Callable[..., object], *args: object) -> object:
    try:
        return fn(*args)
    except Exception as exc:
        return exc


def test_errors_reach_every_caller() -> None:
    class Broken(FakeEmbedder):
        def embed_documents(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
            raise RuntimeError("onnx exploded")

        def embed_query(self, text: str) -> npt.NDArray[np.float32]:
            raise RuntimeError("onnx exploded")

    service = BatchingEmbedder(Broken())
    try:
        results = run_threads(lambda i: service.embed_documents([f"t{i}"]), 6)
        assert all(isinstance(r, EmbeddingError) and "onnx exploded" in str(r) for r in results)
        with pytest.raises(EmbeddingError, match="onnx exploded"):
            service.embed_query("q")
    finally:
        service.close()


def test_repeated_texts_and_queries_hit_the_cache() -> None:
    inner = FakeEmbedder()
    service = BatchingEmbedder(inner)
    try:
        a = service.embed_documents(["same text", "same text"])
        calls = inner.calls
        b = service.embed_documents(["same text"])
        assert inner.calls == calls
        np.testing.assert_array_equal(a[0], b[0])
        q1 = service.embed_query("a query")
        q1[0] = 42.0  # callers get copies: the cache is not corrupted
        q2 = service.embed_query("a query")
        assert q2[0] != 42.0
        assert service.stats().cache_hits >= 2
    finally:
        service.close()


def test_closed_service_fails_clearly() -> None:
    service = BatchingEmbedder(FakeEmbedder())
    service.close()
    with pytest.raises(EmbeddingError, match="closed"):
        service.embed_documents(["x"])
    assert service.embed_documents([]).shape == (0, 64)


class GatedQueries(FakeEmbedder):
    """Holds every query inside the model until released; records what it computed."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()
        self.queries: list[str] = []

    def embed_query(self, text: str) -> npt.NDArray[np.float32]:
        self.queries.append(text)
        self.entered.set()
        assert self.release.wait(10)
        return super().embed_query(text)


def run_threads_started(target: Callable[[], npt.NDArray[np.float32]]) -> Callable[[], object]:
    """Start ``target`` on a thread now; the returned function joins it and gives its result."""
    results: list[object] = []
    thread = threading.Thread(target=lambda: results.append(target()))
    thread.start()

    def join() -> object:
        thread.join(10)
        assert not thread.is_alive() and len(results) == 1
        return results[0]

    return join


def test_a_prefetched_query_is_computed_once_in_the_background() -> None:
    inner = GatedQueries()
    service = BatchingEmbedder(inner)
    try:
        service.prefetch_query("why is the build red")  # returns while the model is held
        assert inner.entered.wait(5)
        waiting = run_threads_started(lambda: service.embed_query("why is the build red"))
        inner.release.set()
        vector = waiting()
        np.testing.assert_array_equal(vector, FakeEmbedder().embed_query("why is the build red"))
        service.prefetch_query("why is the build red")  # already known: nothing computed
        assert service.embed_query("why is the build red").shape == (64,)
        assert inner.queries == ["why is the build red"]
    finally:
        service.close()
    service.prefetch_query("after close")  # a closed service ignores it; embed_query reports it
    with pytest.raises(EmbeddingError, match="closed"):
        service.embed_query("after close")


def test_a_stuck_model_fails_later_requests_at_once_and_says_since_when() -> None:
    from memstrata.errors import ModelFaultError
    from memstrata.storage._embedding import embed_deadline

    inner = FirstBatchHeld()  # its first document call waits inside the model until released
    service = BatchingEmbedder(inner, call_timeout_s=30.0)
    try:
        assert service.model_status()["state"] == "ok"
        first = run_threads_started(lambda: service.embed_documents(["held inside the model"]))
        assert inner.entered.wait(5)
        # a caller with a deadline gives up waiting behind it: the call is stuck from now on
        with embed_deadline(0.05), pytest.raises(ModelFaultError, match=r"did not answer within 0\.05 s"):
            service.embed_documents(["queued behind it"])
        status = service.model_status()
        assert status["state"] == "stuck" and status["texts"] == 1 and status["since"].endswith("Z")
        # nothing else queues behind the stuck call (the fake is not thread-safe: queries neither)
        with pytest.raises(ModelFaultError, match=r"is stuck since .* on a call of 1 text"):
            service.embed_documents(["another text"])
        with pytest.raises(ModelFaultError, match="is stuck since"):
            service.embed_query("a query")
        inner.release.set()
        assert np.asarray(first()).shape == (1, 64)  # the stuck caller gets its answer after all
        wait_until(lambda: service.model_status()["state"] == "ok")
        assert service.embed_documents(["another text"]).shape == (1, 64)
    finally:
        inner.release.set()
        service.close()


def test_a_caller_whose_bound_is_spent_is_told_so_not_that_the_model_took_0_s() -> None:
    """A search waits for new vectors within its embedding bound first; if that took it all, the
    query's embedding got no time, which the error says instead of "within 0 s"."""
    from memstrata.errors import ModelFaultError
    from memstrata.storage._embedding import embed_deadline

    inner = FirstBatchHeld()
    service = BatchingEmbedder(inner, call_timeout_s=30.0)
    try:
        first = run_threads_started(lambda: service.embed_documents(["held inside the model"]))
        assert inner.entered.wait(5)
        with embed_deadline(0.0), pytest.raises(ModelFaultError) as refused:
            service.embed_documents(["queued behind it"])
        assert str(refused.value) == (
            f"model {inner.model_id!r} got no time to answer: its caller's bound was used up before it asked"
        )
        inner.release.set()
        assert np.asarray(first()).shape == (1, 64)
    finally:
        inner.release.set()
        service.close()


def test_unusable_vectors_are_a_model_fault_and_never_cached() -> None:
    from memstrata.errors import InvalidInputError, ModelFaultError

    class Zeros(FakeEmbedder):
        broken = True

        def embed_documents(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
            rows = super().embed_documents(texts)
            return np.zeros_like(rows) if self.broken else rows

    inner = Zeros()
    service = BatchingEmbedder(inner)
    try:
        with pytest.raises(ModelFaultError, match="all-zero vector") as caught:
            service.embed_documents(["a text"])
        assert not isinstance(caught.value, InvalidInputError)
        status = service.model_status()
        assert status["state"] == "faulty" and "all-zero" in status["last_error"]
        inner.broken = False  # fixed: the text is computed again, not answered from the cache
        assert np.abs(service.embed_documents(["a text"])).max() > 0
        assert service.model_status()["state"] == "ok"
    finally:
        service.close()
