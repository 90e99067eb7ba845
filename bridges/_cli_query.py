"""``memstrata query`` without starting the system: the same search the agent's knowledge actor
runs, in this process.

Starting the system for one search costs importing and starting the actors, and the model
load waits in front of everything. Here the knowledge stores open (their index files mapped,
see ``storage/_index_files.py``) while the model loads in a helper process (``._query_model``)
or, where none can be forked, on a thread (a keyword search loads none), and the hits are the ones
``Agent.query_knowledge`` returns: each store searched with the same parameters, the shared
store's hits merged by the same rule. Whatever this path does not cover exactly (a Ray cluster,
an agent with its own embedding model, a model that cannot be loaded, a store with vectors still
to compute) returns ``None``, and the command starts the system as before.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from memstrata.core.errors import EmbedderUnavailableError, ModelFaultError
from memstrata.storage._embedder_identity import ModelIdentity

from ._query_model import QueryModel, blas_threads_set

if TYPE_CHECKING:
    import numpy.typing as npt

    from memstrata.core.config import Config
    from memstrata.storage import Embedder

__all__ = ["query_knowledge"]


class _Embedding:
    """One query's vector, computed on a thread of its own as soon as the model is loaded."""

    def __init__(self, loading: _Loading, text: str) -> None:
        self.vector: npt.NDArray[Any] | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        threading.Thread(
            target=self._run, args=(loading, text), name="memstrata-query-embedding", daemon=True
        ).start()

    def _run(self, loading: _Loading, text: str) -> None:
        try:
            self.vector = loading.model().embed_query(text)
        except BaseException as exc:  # handed to the caller of embed_query
            self.error = exc
        finally:
            self.done.set()


class _Loading(ModelIdentity):
    """The configured model, loaded on a thread; its id and dimension are known before (the
    stores check them when they open), a call waits for the load. A query embedding is bounded
    as the system bounds it (``query_embed_timeout_s``): a late model leaves keywords to rank.

    A search asks for its query's vector first (:meth:`prefetch_query`) and ranks by keywords
    while the model still loads; the vector is computed the moment the load ends, once per text
    (the agent's and the shared store's searches share it).

    ``imports`` runs first on the thread, and :attr:`imported` is set once it has ended (however
    it ended): a caller that waits for it before importing the stores lets the model's session
    build, the one part of the load that leaves the interpreter lock, start as early as it can
    and run while the stores open, instead of after them."""

    def __init__(
        self,
        model_id: str,
        dim: int,
        load: Callable[[], Embedder],
        limit: float,
        imports: Callable[[], None] | None = None,
    ) -> None:
        self._model_id, self._dim, self._limit = model_id, dim, limit
        self._loaded: Embedder | None = None
        self.error: BaseException | None = None
        self._done = threading.Event()
        self.imported = threading.Event()
        self._imports = imports
        self._lock = threading.Lock()
        self._queries: dict[str, _Embedding] = {}
        self._thread = threading.Thread(target=self._run, args=(load,), name="memstrata-model", daemon=True)
        self._thread.start()

    def _run(self, load: Callable[[], Embedder]) -> None:
        try:
            try:
                if self._imports is not None:
                    self._imports()
            finally:
                self.imported.set()
            self._loaded = load()
        except BaseException as exc:  # reported to the caller, which starts the system instead
            self.error = exc
        finally:
            self._done.set()

    def wait_imported(self) -> None:
        """Wait until ``imports`` has ended, at most as long as a query's vector is waited for: an
        import that hangs stalls the command no longer than a model that hangs would."""
        self.imported.wait(self._limit)

    @property
    def ready(self) -> bool:
        """True once the load has ended (with the model or with an error)."""
        return self._done.is_set()

    def model(self) -> Embedder:
        self._done.wait()
        if self._loaded is None:
            raise RuntimeError(f"the embedding model could not be loaded: {self.error}")
        return self._loaded

    @property
    def failed(self) -> bool:
        self._done.wait()
        return self._loaded is None

    def embed_documents(self, texts: Sequence[str]) -> npt.NDArray[Any]:
        return self.model().embed_documents(texts)

    def prefetch_query(self, text: str) -> None:
        """Compute ``text``'s vector as soon as the model is loaded (unless asked for already);
        never waits."""
        with self._lock:
            if text not in self._queries:
                self._queries[text] = _Embedding(self, text)

    def embed_query(self, text: str) -> npt.NDArray[Any]:
        self.model()
        with self._lock:
            job = self._queries.get(text)
            if job is None:
                job = self._queries[text] = _Embedding(self, text)
        if not job.done.wait(self._limit):
            raise ModelFaultError(f"model {self._model_id!r} gave no query vector within {self._limit:g} s")
        if job.error is not None:
            with self._lock:  # reported once: the caller's retry computes it again
                if self._queries.get(text) is job:
                    del self._queries[text]
            raise job.error
        assert job.vector is not None
        return job.vector.copy()

    def __getattr__(self, name: str) -> Any:  # count_tokens, thread_safe, ...: the model's own
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.model(), name)


class _NoModel(ModelIdentity):
    """The default model named, never loaded: a keyword search embeds nothing, and a store
    checks only the model's id and dimension when it opens (its vector index still serves the
    search's filters). A store that asks for vectors anyway (one made by another model, which
    rebuilds on open) is told the model is unavailable and ranks by keywords, as it would
    while the rebuild ran; its vectors are left as they were."""

    def __init__(self, model_id: str, dim: int) -> None:
        self._model_id, self._dim = model_id, dim

    def embed_query(self, text: str) -> npt.NDArray[Any]:
        raise EmbedderUnavailableError("a keyword search loads no embedding model")

    def embed_documents(self, texts: Sequence[str]) -> npt.NDArray[Any]:
        raise EmbedderUnavailableError("a keyword search loads no embedding model")


class _VectorsPending(Exception):
    """A store holds entries whose vectors are still to be computed (written while no model
    could be loaded): the system computes them when it opens the store, so it answers."""


@contextlib.contextmanager
def _blas_loads_one_thread() -> Iterator[None]:
    """numpy's OpenBLAS loads with one thread here, unless numpy is loaded already or the
    environment says how many threads it should use (:func:`._query_model.blas_threads_set`).

    OpenBLAS starts a thread per core when it loads, and they spin waiting for work: on two
    cores ~50 ms of the core the model's load runs on (its session build leaves the interpreter
    lock, or it runs in a helper process), 5-10 ms of a query process. The query's products run
    on one thread anyway (the vector scans hold OpenBLAS at one, ``storage/_mirror_threads.py``),
    so the hits are the same. The variable is gone again once the block ends (numpy loaded):
    nothing started later inherits it."""
    if "numpy" in sys.modules or blas_threads_set():
        yield
        return
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        yield
    finally:
        os.environ.pop("OPENBLAS_NUM_THREADS", None)


def _warm_vectors(store: Any) -> None:
    """Load the store's vector index (its files, checked against the database) while the model
    still loads, so the real search, which needs the query's vector first, does not load the
    index after the model. Nothing is searched (a search with a stand-in vector also scanned
    the rows: 5-20 ms more at 100k), and nothing here may fail the query: the real search loads
    (and reports) whatever this could not."""
    try:
        store.load_vector_index()
    except Exception:  # the real search below meets the same problem and reports it
        return


def _embedder(
    config: Config, given: Embedder | None, helper: QueryModel | None, keywords_only: bool
) -> Embedder | _Loading | _NoModel | None:
    """The embedder the system would give the agent's stores, loaded by ``helper`` if there is
    one, not loaded at all for a keyword search; ``None``: not known without loading it (the
    caller starts the system)."""
    if given is not None:
        return given
    from memstrata.storage._model_id import DEFAULT_DIM, DEFAULT_MODEL_ID

    if config.embedding.model not in ("", "default", DEFAULT_MODEL_ID):
        return None
    if keywords_only:  # the same hits; the model's load was most of the command's time
        return _NoModel(DEFAULT_MODEL_ID, DEFAULT_DIM)
    # the bound the system puts on a query's embedding (see Runtime.search_knowledge)
    limit = min(config.actors.query_embed_timeout_s, config.actors.ask_timeout_s / 2)
    if helper is not None:  # the default model, as load_embedder gives it whatever dim and threads say
        return _Loading(DEFAULT_MODEL_ID, DEFAULT_DIM, helper.load, limit)

    def load() -> Embedder:
        from memstrata.storage import load_embedder

        return load_embedder(None, dim=config.embedding.dim, threads=config.embedding.threads)

    def imports() -> None:  # what the load imports, numpy first, and the model's folder checked
        import numpy  # noqa: F401
        import onnxruntime  # type: ignore[import-untyped]  # noqa: F401
        import tokenizers  # noqa: F401

        from memstrata.storage import default_model_dir, load_embedder  # noqa: F401

        default_model_dir()

    return _Loading(DEFAULT_MODEL_ID, DEFAULT_DIM, load, limit, imports)


def query_knowledge(
    config: Config,
    embedder: Embedder | None,
    agent_id: str,
    query: str,
    options: Mapping[str, Any],
    helper: QueryModel | None = None,
) -> list[Any] | None:
    """The hits of ``Agent.query_knowledge(query, **options)`` for ``agent_id`` (whose store
    exists), or ``None`` when only a running system can answer exactly. ``helper``: a process
    loading the default model (:mod:`._query_model`), used if that is the model to use."""
    from memstrata.core.constants import EMBED_CHARS, SHARED
    from memstrata.core.validation import (
        check_category,
        check_min_score,
        check_mode,
        check_scope,
        check_tags,
        check_text,
        check_top_k,
    )

    if config.cluster.engine != "local" or "embedding" in config.agent_sections.get(agent_id, {}):
        return None
    # the checks (and their messages) of the QueryKnowledge message the system would build
    check_text(query, "QueryKnowledge.query", allow_empty=True)
    category = options.get("category")
    if category is not None:
        check_category(category, "QueryKnowledge.category")
    top_k = options.get("top_k") or config.search.top_k
    check_top_k(top_k, "QueryKnowledge.top_k")
    tags = options.get("tags")
    tags = None if tags is None else check_tags(tags, "QueryKnowledge.tags")
    scope = options.get("scope")
    scope = None if scope is None else check_scope(scope, "QueryKnowledge.scope")
    mode = options.get("mode", "hybrid")
    check_mode(mode, "QueryKnowledge.mode")
    min_score = options.get("min_score")
    check_min_score(min_score, "QueryKnowledge.min_score")
    with _blas_loads_one_thread():  # before the model's thread imports numpy
        service = _embedder(config, embedder, helper, keywords_only=mode == "keyword")
        if service is None:
            return None
        if isinstance(service, _Loading):  # the model's imports first (see _Loading)
            service.wait_imported()
            if query.strip():  # asked for now, as the searches will ask: computed once loaded
                from memstrata.storage import prefetch_query

                if helper is not None:  # the one text the searches embed
                    helper.last(query[:EMBED_CHARS])
                prefetch_query(service, query[:EMBED_CHARS])
        from memstrata.layers import KnowledgeStore
        from memstrata.storage import configured

    params = {
        "top_k": top_k,
        "mode": mode,
        "category": category,
        "tags": tags,
        "scope": scope,
        "min_score": min_score,
    }

    def search(owner: str) -> list[Any]:
        path = KnowledgeStore.path_for(config.data_dir, owner)
        with configured(config.storage):  # as the actors open their stores
            store = KnowledgeStore.open(path, service, config=config, defer_vectors=True)
        try:
            if store.pending_vectors():  # the system computes them first: only it answers the same
                raise _VectorsPending(owner)
            if hasattr(store, "owner"):  # as the actor does: entries say which store they are in
                store.owner = owner
            if loading is not None and not loading.ready and mode != "keyword":
                _warm_vectors(store)
            return list(store.search(query, **params))
        finally:
            store.close()

    loading = service if isinstance(service, _Loading) else None
    try:
        own = search(agent_id)
    except _VectorsPending:
        return None
    except Exception:
        if loading is not None and loading.failed:
            return None  # keyword-only as the system would run it: let it say so
        raise
    shared_path = KnowledgeStore.path_for(config.data_dir, SHARED)
    merge = config.for_agent(agent_id).include_shared and agent_id != SHARED and shared_path.exists()
    shared: list[Any] = []
    if merge:
        try:
            shared = search(SHARED)
        except _VectorsPending:
            return None
        except Exception:  # the shared store is a supplement: the agent's own hits still count
            shared = []
    if loading is not None and loading.failed:
        return None
    if not merge:
        return own
    from memstrata.layers import merge_hits

    return list(merge_hits(own, shared, top_k, query=query, search=config.search))
