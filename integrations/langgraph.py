"""LangGraph ``BaseStore`` on memstrata's item store (``pip install 'memstrata[langgraph]'``).

Items are addressed by (namespace tuple, key); values stay JSON apart from the embedded text; the
``index`` config is LangGraph's (``dims``, ``embed``, ``fields`` or ``text_fields`` with JSON paths,
one vector per field and item ranked by its best field); search takes a namespace prefix and
filters evaluated inside SQLite; scores are cosine similarities; TTL follows ``TTLConfig``.

Every operation goes through a running ``MemorySystem``'s item actor (given, or started privately
on a data dir, see :mod:`memstrata.integrations`): a batch's puts are one message and one
transaction, with the vectors the index's ``embed`` computed (or the system's shared embedder).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime
import math
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from memstrata.core.closing import Closeable
from memstrata.core.constants import MAX_TOP_K
from memstrata.errors import InvalidInputError, SystemStoppedError
from memstrata.messages import PutItem

from ._common import missing, open_system, settled

if TYPE_CHECKING:
    from memstrata._items import Items

try:
    from langgraph.store.base import (
        BaseStore,
        GetOp,
        Item,
        ListNamespacesOp,
        PutOp,
        SearchItem,
        SearchOp,
    )
    from langgraph.store.base import embed as _embed
except ImportError as exc:  # the adapter is optional: say which extra brings it
    raise missing("langgraph", "langgraph", exc) from exc

__all__ = ["AsyncMemstrataStore", "MemstrataStore"]


def _stamp(seconds: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)


def _item(rec: Any) -> Any:
    return Item(
        value=rec.value,
        key=rec.key,
        namespace=tuple(rec.namespace),
        created_at=_stamp(rec.created_at),
        updated_at=_stamp(rec.updated_at),
    )


def _search_item(rec: Any) -> Any:
    return SearchItem(
        namespace=tuple(rec.namespace),
        key=rec.key,
        value=rec.value,
        created_at=_stamp(rec.created_at),
        updated_at=_stamp(rec.updated_at),
        score=rec.score,
    )


class _SystemEmbeddings:
    """A system's shared (batching) embedder with LangGraph's ``Embeddings`` methods."""

    def __init__(self, embedder: Any) -> None:
        self._embedder = embedder

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [row.tolist() for row in self._embedder.embed_documents(list(texts))]

    def embed_query(self, text: str) -> list[float]:
        return list(self._embedder.embed_query(text).tolist())


_MAX = sys.float_info.max
_NEVER = {"$gt": _MAX, "$lt": -_MAX}  # no finite number passes both


def _bound(op: str, value: float) -> dict[str, float] | None:
    """A comparison with infinity or NaN as the same test on finite numbers (JSON has no
    infinity, so a stored number is always finite); ``None``: every item passes."""
    if math.isnan(value):
        return dict(_NEVER)  # NaN compares false with everything, as SQL NULL does
    big = _MAX if value > 0 else -_MAX
    if op in ("$lt", "$lte"):
        return {"$lte": big} if value > 0 else dict(_NEVER)
    if op in ("$gt", "$gte"):
        return {"$gte": big} if value < 0 else dict(_NEVER)
    if op == "$eq":
        return dict(_NEVER)
    return None  # "$ne": every item differs from infinity


def _merge(kept: dict[str, Any], name: str, value: Any) -> None:
    """Adds one test to a field's operators: of two bounds on one side the stricter stays."""
    if name not in kept:
        kept[name] = value
    elif name == "$ne":
        if kept[name] != value:  # one "$ne" per field in a filter
            raise InvalidInputError(
                f"a filter cannot hold both $ne {kept[name]!r} and a range on null (which is $ne None)"
            )
    else:
        kept[name] = (min if name.startswith("$l") else max)(kept[name], value)


_R = TypeVar("_R")


def _paged(fetch: Callable[[int, int], list[_R]], limit: int, offset: int) -> list[_R]:
    """``limit`` results from ``offset``, in pages the item store answers (at most
    ``MAX_TOP_K`` each): LangGraph's own stores take any limit."""
    found: list[_R] = []
    while len(found) < limit:
        page = min(MAX_TOP_K, limit - len(found))
        got = fetch(page, offset + len(found))
        found += got
        if len(got) < page:
            break
    return found


def _finite(filter: dict[str, Any] | None) -> dict[str, Any] | None:
    """``filter`` as memstrata's item filter reads it, with the results of LangGraph's
    ``SqliteStore``: infinite and NaN operands rewritten (see :func:`_bound`), integers beyond 64
    bits as reals, and a range on ``None`` as SQLite evaluates it there (``None`` becomes a blob,
    which sorts above every JSON value: ``$gt``/``$gte`` pass nothing, ``$lt``/``$lte`` every
    value that is not null). Equality with ``None`` passes a null or missing field in both, as
    in ``SqliteStore`` and ``InMemoryStore``."""
    if not filter:
        return filter
    out: dict[str, Any] = {}
    for field, cond in _contained(filter).items():
        ops = cond if isinstance(cond, dict) and all(str(k).startswith("$") for k in cond) else None
        if ops is None:
            ops = {"$eq": cond}
        kept: dict[str, Any] = {}
        for op, value in ops.items():
            if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
                try:  # beyond JSON's integers: compared as a real, as SQLite does
                    value = float(value)
                except OverflowError:
                    value = math.inf if value > 0 else -math.inf
            if value is None and op in ("$gt", "$gte", "$lt", "$lte"):
                bound: dict[str, Any] | None = dict(_NEVER) if op in ("$gt", "$gte") else {"$ne": None}
            elif not isinstance(value, float) or math.isfinite(value):
                bound = {op: value}
            else:
                bound = _bound(op, value)
            for name, limit in (bound or {}).items():
                _merge(kept, name, limit)
        if kept:
            out[field] = kept if (ops is not cond or len(kept) != 1 or "$eq" not in kept) else kept["$eq"]
    return out


def _contained(filter: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """An object in a filter as LangGraph's ``InMemoryStore`` reads it: ``{"meta": {"user":
    "ada"}}`` passes an item whose ``meta`` holds ``user`` ``"ada"``, whatever else it holds;
    each of its keys becomes a dotted path. An object mixing operators and keys is refused, as
    LangGraph's SQL stores refuse it."""
    out: dict[str, Any] = {}
    for field, cond in filter.items():
        path = f"{prefix}{field}"
        if prefix and "." in str(field):
            raise InvalidInputError(f"filter key {field!r} inside {prefix[:-1]!r} holds a '.'")
        operators = [k for k in cond if str(k).startswith("$")] if isinstance(cond, dict) else []
        if not isinstance(cond, dict) or not cond or len(operators) == len(cond):
            out[path] = cond
        elif operators:
            raise InvalidInputError(f"filter {path!r} mixes operators and keys: {sorted(map(str, cond))}")
        else:
            out.update(_contained(cond, f"{path}."))
    return out


def _paths(fields: Sequence[str]) -> list[tuple[str, Any]]:
    return [(p, "$" if p == "$" else _embed.tokenize_path(p)) for p in fields]


class MemstrataStore(BaseStore, Closeable):
    """A LangGraph store on a memstrata system's item store.

    ``target``: a running ``MemorySystem`` (its item actor and shared embedder are used), a data
    dir path (a private system on it, shared by the stores of the process given that path), or
    ``":memory:"`` (a private system in a temporary folder, removed at :meth:`close`).
    ``index``: LangGraph's index config (without ``embed``: the system's embedder).
    ``ttl``: LangGraph's ``TTLConfig``. ``embedder``: the model of a private system.
    """

    supports_ttl = True

    def __init__(
        self, target: Any = ":memory:", *, index: Any = None, ttl: Any = None, embedder: Any = None
    ) -> None:
        self.index_config: dict[str, Any] | None = None
        self.embeddings: Any = None
        fields: list[str] = []
        if index:
            config = dict(index)
            raw = config.get("fields") or config.get("text_fields") or ["$"]
            fields = [raw] if isinstance(raw, str) else raw
            if not isinstance(fields, list) or not all(isinstance(f, str) and f for f in fields):
                raise InvalidInputError(f"index fields must be a list of paths or one path, got {raw!r}")
            dims = config.get("dims")
            if dims is not None and (isinstance(dims, bool) or not isinstance(dims, int) or dims < 1):
                raise InvalidInputError(f"index dims must be a positive integer, got {dims!r}")
            distance = config.get("distance_type", "cosine")  # PostgresStore's setting
            if distance != "cosine":
                raise InvalidInputError(
                    f"index distance_type must be 'cosine' (memstrata ranks by cosine), got {distance!r}"
                )
            self.index_config = config
        self._opened = open_system(target, embedder=embedder, what="MemstrataStore target")
        system = self._opened.system
        try:
            if self.index_config is not None:
                config = self.index_config
                config["__tokenized_fields"] = _paths(fields)
                if config.get("embed") is None:
                    if system.embedder is None:
                        raise InvalidInputError(
                            'the MemorySystem runs keyword-only (no embedder): give the index an "embed"'
                        )
                    self.embeddings = _SystemEmbeddings(system.embedder)
                    config.setdefault("dims", system.embedder.dim)
                else:
                    self.embeddings = _embed.ensure_embeddings(config["embed"])
        except BaseException:
            self._opened.release()
            raise
        self.ttl_config = ttl
        # a read refreshes expiry only when the config turns refresh_on_read on (LangGraph's
        # SQLite store reads it so: the per-call flag alone does not extend a lifetime)
        self._refresh_on_read = bool(ttl and ttl.get("refresh_on_read", False))
        self._stop = threading.Event()
        self._sweeper: threading.Thread | None = None

    @property
    def system(self) -> Any:
        """The ``MemorySystem`` the store goes through."""
        return self._opened.system

    @classmethod
    @contextlib.contextmanager
    def from_conn_string(
        cls, conn_string: str | Path, *, index: Any = None, ttl: Any = None
    ) -> Iterator[MemstrataStore]:
        """A store on ``conn_string`` (a data dir path or ``":memory:"``), closed on exit."""
        store = cls(conn_string, index=index, ttl=ttl)
        try:
            yield store
        finally:
            store.close()

    def setup(self) -> None:
        """Nothing to do: the schema is created on open (kept for LangGraph's store protocol)."""

    def close(self) -> None:
        """Stops the sweeper and lets a private system go (a given one keeps running); the store
        then refuses every call (``SystemStoppedError``), whoever else shares its system."""
        MemstrataStore.stop_ttl_sweeper(self, timeout=5)
        self._opened.release()

    @property
    def _items(self) -> Items:
        if self._opened.released:
            raise SystemStoppedError(f"this {type(self).__name__} is closed")
        return self._opened.system.items

    # operations --------------------------------------------------------------------------

    def batch(self, ops: Iterable[Any]) -> list[Any]:
        return self._run(list(ops))

    async def abatch(self, ops: Iterable[Any]) -> list[Any]:
        return await settled(self._run, list(ops), asyncio.get_running_loop())

    def _embedded(self, texts: list[str], loop: asyncio.AbstractEventLoop | None, *, query: bool) -> Any:
        """The index's vectors of ``texts`` (of the one query text). An ``embed`` given as an async
        function only (LangGraph takes one) is awaited on the caller's event loop, which waits
        for this worker thread meanwhile (see :func:`settled`)."""
        model = self.embeddings
        assert model is not None
        async_only = isinstance(model, _embed.EmbeddingsLambda) and not hasattr(model, "func")
        if loop is not None and async_only:
            call = model.aembed_query(texts[0]) if query else model.aembed_documents(texts)
            return asyncio.run_coroutine_threadsafe(call, loop).result()
        return model.embed_query(texts[0]) if query else model.embed_documents(texts)

    def _run(self, ops: list[Any], loop: asyncio.AbstractEventLoop | None = None) -> list[Any]:
        results: list[Any] = [None] * len(ops)
        pending: list[Any] = []
        for i, op in enumerate(ops):
            if isinstance(op, PutOp):
                pending.append(op)
                continue
            self._flush(pending, loop)
            if isinstance(op, GetOp):
                rec = self._items.get(
                    op.namespace, op.key, refresh_ttl=bool(op.refresh_ttl) and self._refresh_on_read
                )
                results[i] = None if rec is None else _item(rec)
            elif isinstance(op, SearchOp):
                results[i] = self._search(op, loop)
            elif isinstance(op, ListNamespacesOp):
                results[i] = self._list(op)
            else:
                raise InvalidInputError(f"unknown store operation {type(op).__name__}")
        self._flush(pending, loop)
        return results

    def _vectors(self, values: list[Sequence[float]]) -> list[tuple[float, ...]]:
        """The embedding function's rows, checked: one per text, ``dims`` finite numbers each."""
        dims = (self.index_config or {}).get("dims")
        out = []
        for n, row in enumerate(values):
            vec = tuple(float(x) for x in row)
            if dims is not None and len(vec) != dims:
                raise InvalidInputError(
                    f"index embed returned {len(vec)} dimensions for text {n}, not {dims}"
                )
            if not all(math.isfinite(x) for x in vec):
                raise InvalidInputError(f"index embed returned a vector with NaN or infinity for text {n}")
            out.append(vec)
        return out

    def _flush(self, puts: list[Any], loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Apply puts in order (last write of a key wins) in one message, embedding every text
        in one call."""
        if not puts:
            return
        last: dict[tuple[tuple[str, ...], str], Any] = {}
        for op in puts:
            last[(tuple(op.namespace), op.key)] = op
        puts.clear()
        deletes = [k for k, op in last.items() if op.value is None]
        texts: list[str] = []
        owners: list[tuple[tuple[tuple[str, ...], str], str]] = []
        for k, op in last.items():
            if op.value is None or not self.index_config or op.index is False:
                continue
            paths = self.index_config["__tokenized_fields"] if op.index is None else _paths(op.index)
            for path, tokens in paths:
                found = _embed.get_text_at_path(op.value, tokens)
                for n, text in enumerate(found):
                    owners.append((k, f"{path}.{n}" if len(found) > 1 else path))
                    texts.append(text)
        vectors: dict[tuple[tuple[str, ...], str], dict[str, tuple[float, ...]]] = {}
        if texts:
            rows = self._vectors(self._embedded(texts, loop, query=False))
            if len(rows) != len(texts):
                raise InvalidInputError(f"index embed returned {len(rows)} vectors for {len(texts)} texts")
            for (k, field), vec in zip(owners, rows, strict=True):
                vectors.setdefault(k, {})[field] = vec
        messages = [
            PutItem(k[0], k[1], dict(op.value), None, op.ttl, vectors.get(k) or None)
            for k, op in last.items()
            if op.value is not None
        ]
        self._items.write(messages, deletes)

    def _search(self, op: Any, loop: asyncio.AbstractEventLoop | None = None) -> list[Any]:
        vector = None
        if op.query and self.embeddings is not None:
            vector = self._vectors([self._embedded([op.query], loop, query=True)])[0]
        prefix, where = tuple(op.namespace_prefix), _finite(op.filter)
        refresh = bool(op.refresh_ttl) and self._refresh_on_read
        records = _paged(
            lambda limit, offset: self._items.search(
                prefix, filter=where, limit=limit, offset=offset, query_vector=vector, refresh_ttl=refresh
            ),
            op.limit,
            op.offset,
        )
        return [_search_item(r) for r in records]

    def _list(self, op: Any) -> list[tuple[str, ...]]:
        prefix = suffix = None
        for cond in op.match_conditions or ():
            if cond.match_type == "prefix":
                prefix = tuple(cond.path)
            elif cond.match_type == "suffix":
                suffix = tuple(cond.path)
            else:
                raise InvalidInputError(f"unknown namespace match type {cond.match_type!r}")
        return _paged(
            lambda limit, offset: self._items.list_namespaces(
                prefix=prefix, suffix=suffix, max_depth=op.max_depth, limit=limit, offset=offset
            ),
            op.limit,
            op.offset,
        )

    # time to live -------------------------------------------------------------------------

    def sweep_ttl(self) -> int:
        """Delete expired items now; returns how many."""
        return self._items.sweep()

    def start_ttl_sweeper(
        self, sweep_interval_minutes: float | None = None
    ) -> concurrent.futures.Future[None]:
        """Sweep expired items every interval on a daemon thread until :meth:`stop_ttl_sweeper`."""
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        if not self.ttl_config or (self._sweeper is not None and self._sweeper.is_alive()):
            future.set_result(None)
            return future
        interval = float(sweep_interval_minutes or self.ttl_config.get("sweep_interval_minutes") or 5) * 60
        self._stop.clear()

        def loop() -> None:
            while not self._stop.wait(interval):
                with contextlib.suppress(Exception):
                    MemstrataStore.sweep_ttl(self)
            future.set_result(None)

        self._sweeper = threading.Thread(target=loop, daemon=True, name="memstrata-ttl-sweeper")
        self._sweeper.start()
        return future

    def stop_ttl_sweeper(self, timeout: float | None = None) -> bool:
        """Stop the sweeper; True once it has stopped (within ``timeout`` seconds)."""
        if self._sweeper is None or not self._sweeper.is_alive():
            return True
        self._stop.set()
        self._sweeper.join(timeout)
        stopped = not self._sweeper.is_alive()
        if stopped:
            self._sweeper = None
        return stopped


class AsyncMemstrataStore(MemstrataStore):
    """The same store for asyncio code: ``a*`` methods run off the event loop; the synchronous
    ones refuse to block the loop's own thread (as LangGraph's async stores do)."""

    @classmethod
    @contextlib.asynccontextmanager
    async def from_conn_string(  # type: ignore[override]
        cls, conn_string: str | Path, *, index: Any = None, ttl: Any = None
    ) -> AsyncIterator[AsyncMemstrataStore]:
        store = await asyncio.to_thread(cls, conn_string, index=index, ttl=ttl)
        try:
            yield store
        finally:
            await asyncio.to_thread(store.close)

    async def setup(self) -> None:  # type: ignore[override]
        """Nothing to do: the schema is created on open."""

    def batch(self, ops: Iterable[Any]) -> list[Any]:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self._run(list(ops))
        raise asyncio.InvalidStateError(
            "AsyncMemstrataStore: a synchronous call cannot run on the event loop's thread;"
            " use the a* methods"
        )

    async def sweep_ttl(self) -> int:  # type: ignore[override]
        return await asyncio.to_thread(self._items.sweep)

    async def start_ttl_sweeper(  # type: ignore[override]
        self, sweep_interval_minutes: float | None = None
    ) -> concurrent.futures.Future[None]:
        return MemstrataStore.start_ttl_sweeper(self, sweep_interval_minutes)

    async def stop_ttl_sweeper(self, timeout: float | None = None) -> bool:  # type: ignore[override]
        self._stop.set()
        return await asyncio.to_thread(MemstrataStore.stop_ttl_sweeper, self, timeout)
