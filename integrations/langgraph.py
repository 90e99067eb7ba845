"""LangGraph ``BaseStore`` on memstrata's item store (``pip install 'memstrata[langgraph]'``).

Items are addressed by (namespace tuple, key); values stay JSON apart from the embedded text; the
``index`` config is LangGraph's (``dims``, ``embed``, ``fields`` or ``text_fields`` with JSON paths,
one vector per text a path reads, an item ranked by its best); search takes a namespace prefix and
filters evaluated inside SQLite; scores are cosine similarities; TTL follows ``TTLConfig``.

Every operation goes through a running ``MemorySystem``'s item actor (given, or started privately
on a data dir, see :mod:`memstrata.integrations`): a batch's puts are one message and one
transaction, with the vectors the index's ``embed`` computed; without one, the actor embeds the
fields with the system's model (so it computes them again when that model changes).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime
import math
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from memstrata.core.closing import Closeable
from memstrata.core.constants import (
    MAX_KEY_CHARS,
    MAX_LABEL_CHARS,
    MAX_NAMESPACE_DEPTH,
    MAX_TOP_K,
    MAX_TTL_MINUTES,
)
from memstrata.errors import InvalidInputError, SystemStoppedError
from memstrata.messages import PutItem

from ._common import missing, open_system, settled
from ._langgraph_filters import item_filter

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


def _item(rec: Any, kind: type[Item] = Item) -> Any:
    """A stored item as LangGraph's ``Item`` (or ``SearchItem``, with its score)."""
    scored = {"score": rec.score} if kind is SearchItem else {}
    stamps = {"created_at": _stamp(rec.created_at), "updated_at": _stamp(rec.updated_at)}
    return kind(namespace=tuple(rec.namespace), key=rec.key, value=rec.value, **stamps, **scored)


_R = TypeVar("_R")


def _page(op: Any, call: str) -> None:
    """A search's or listing's ``limit`` and ``offset``: any integer from 0. A negative one is
    refused by name, where LangGraph's stores disagree (SQLite reads a limit of -1 as none,
    ``InMemoryStore`` slices from the end, Postgres refuses it)."""
    for name in ("limit", "offset"):
        value = getattr(op, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidInputError(f"{call} {name} must be an integer from 0, got {value!r}")


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


def _joined(paths: list[tuple[str, ...]]) -> tuple[str, ...] | None:
    """Prefix conditions that must all hold, as one: label by label, a label wins over ``"*"``;
    ``None`` when two labels differ (no namespace matches)."""
    joined: list[str] = []
    for n in range(max(map(len, paths), default=0)):
        labels = {p[n] for p in paths if n < len(p)} - {"*"}
        if len(labels) > 1:
            return None
        joined.append(labels.pop() if labels else "*")
    return tuple(joined)


def _paths(fields: Sequence[str]) -> list[tuple[str, Any]]:
    return [(p, "$" if p == "$" else _embed.tokenize_path(p)) for p in fields]


def _address(namespace: Any, key: Any) -> None:
    """The item store's limits on a LangGraph address, said with the names LangGraph's methods
    give the arguments (keys are names: one of only whitespace is refused too)."""
    labels = namespace if isinstance(namespace, tuple | list) else ()
    if len(labels) > MAX_NAMESPACE_DEPTH:
        raise InvalidInputError(
            f"namespace must hold at most {MAX_NAMESPACE_DEPTH} labels, got {len(labels)}"
        )
    longest = max((len(x) for x in labels if isinstance(x, str)), default=0)
    if longest > MAX_LABEL_CHARS:
        raise InvalidInputError(
            f"namespace labels must be at most {MAX_LABEL_CHARS} characters, got {longest}"
        )
    if isinstance(key, str) and not key.strip():
        raise InvalidInputError(f"key must not be empty or only whitespace, got {key!r}")
    if isinstance(key, str) and len(key) > MAX_KEY_CHARS:
        raise InvalidInputError(f"key must be at most {MAX_KEY_CHARS} characters, got {len(key)}")


def _ttl(value: Any, name: str = "ttl", *, zero: bool = True) -> None:
    """A lifetime in minutes as LangGraph's SQL stores take it: 0 (where ``zero``) expires at once."""
    number = value if isinstance(value, int | float) and not isinstance(value, bool) else math.nan
    if value is not None and not (0 <= number <= MAX_TTL_MINUTES and (zero or number > 0)):
        span = "from 0 to" if zero else "above 0 up to"
        raise InvalidInputError(
            f"{name} must be None or a number of minutes {span} {MAX_TTL_MINUTES:g}, got {value!r}"
        )


class MemstrataStore(BaseStore, Closeable):
    """A LangGraph store on a memstrata system's item store.

    ``target``: a running ``MemorySystem`` (its item actor and shared embedder are used), a data
    dir path (a private system on it, shared by the stores of the process given that path), or
    ``":memory:"`` (a private system in a temporary folder, removed at :meth:`close`).
    ``index``: LangGraph's index config (without ``embed``: the system's model, in its actor).
    ``ttl``: LangGraph's ``TTLConfig``. ``embedder``: the model of a private system.
    """

    supports_ttl = True

    def __init__(
        self, target: Any = ":memory:", *, index: Any = None, ttl: Any = None, embedder: Any = None
    ) -> None:
        self.index_config: dict[str, Any] | None = None
        self.embeddings: Any = None
        self._by_system = False  # the item actor embeds ``_fields`` with the system's model
        self._fields: tuple[str, ...] = ()
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
        _ttl((ttl or {}).get("default_ttl"), "ttl default_ttl", zero=False)
        self._opened = open_system(target, embedder=embedder, what="MemstrataStore target")
        try:
            if self.index_config is not None:
                config = self.index_config
                config["__tokenized_fields"] = _paths(fields)
                if config.get("embed") is None:
                    self._check_system_model(config, fields)
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

    def _check_system_model(self, config: dict[str, Any], fields: list[str]) -> None:
        """An index without ``embed``: the item actor embeds ``fields`` with the system's model
        and marks the vectors as that model's, so it computes them again when the model changes
        (vectors computed here would count as the caller's and be kept as they are)."""
        model = self._opened.system.embedder
        if model is None:
            raise InvalidInputError(
                'the MemorySystem runs keyword-only (no embedder): give the index an "embed"'
            )
        dims = config.setdefault("dims", model.dim)
        if dims != model.dim:
            raise InvalidInputError(
                f"index dims {dims} are not what the system's model {model.model_id!r} gives {model.dim}: "
                'leave dims out, or give the index an "embed" of that length'
            )
        self._by_system, self._fields = True, tuple(fields)

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

    def _check(self, ops: list[Any]) -> None:
        """Refuse the batch before any of it runs: a put's lifetime, an address the item store
        cannot hold, a negative limit."""
        for op in ops:
            if isinstance(op, SearchOp | ListNamespacesOp):
                _page(op, "search" if isinstance(op, SearchOp) else "list_namespaces")
            if isinstance(op, GetOp | PutOp):
                _address(op.namespace, op.key)
            if isinstance(op, PutOp):
                _ttl(op.ttl)

    def _run(self, ops: list[Any], loop: asyncio.AbstractEventLoop | None = None) -> list[Any]:
        self._check(ops)
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
        in one call (or, on the system's model, naming the fields for the item actor to embed).
        A put with ``ttl`` 0 expires at once, so it deletes the key (an expired item is never
        returned)."""
        if not puts:
            return
        last: dict[tuple[tuple[str, ...], str], Any] = {}
        for op in puts:
            last[(tuple(op.namespace), op.key)] = op
        puts.clear()
        deletes = [k for k, op in last.items() if op.value is None or op.ttl == 0]
        gone = set(deletes)
        texts: list[str] = []
        owners: list[tuple[tuple[tuple[str, ...], str], str]] = []
        fields: dict[tuple[tuple[str, ...], str], tuple[str, ...]] = {}
        for k, op in last.items():
            if k in gone or not self.index_config or op.index is False:
                continue
            if self._by_system:
                fields[k] = self._fields if op.index is None else tuple(op.index)
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
            PutItem(k[0], k[1], dict(op.value), fields.get(k), op.ttl, vectors.get(k) or None)
            for k, op in last.items()
            if k not in gone
        ]
        self._items.write(messages, deletes)

    def _search(self, op: Any, loop: asyncio.AbstractEventLoop | None = None) -> list[Any]:
        vector = query = None
        if op.query and self.index_config is not None:
            if self._by_system:  # the actor embeds it, after computing again another model's vectors
                query = op.query
            else:
                vector = self._vectors([self._embedded([op.query], loop, query=True)])[0]
        prefix, where = tuple(op.namespace_prefix), item_filter(op.filter)
        refresh = bool(op.refresh_ttl) and self._refresh_on_read
        records = _paged(
            lambda limit, offset: self._items.search(
                prefix,
                query=query,
                filter=where,
                limit=limit,
                offset=offset,
                query_vector=vector,
                refresh_ttl=refresh,
            ),
            op.limit,
            op.offset,
        )
        return [_item(r, SearchItem) for r in records]

    def _list(self, op: Any) -> list[tuple[str, ...]]:
        """The namespaces every match condition holds for, as in ``InMemoryStore``: the prefix
        conditions joined into one, and the suffix ones (see :func:`_joined`)."""
        paths: dict[str, list[tuple[str, ...]]] = {"prefix": [], "suffix": []}
        for cond in op.match_conditions or ():
            if cond.match_type not in paths:
                raise InvalidInputError(f"unknown namespace match type {cond.match_type!r}")
            paths[cond.match_type].append(tuple(cond.path))
        prefix, suffix = _joined(paths["prefix"]), _joined([p[::-1] for p in paths["suffix"]])

        def fetch(limit: int, offset: int) -> list[tuple[str, ...]]:
            if prefix is None or suffix is None:  # two labels at one place: no namespace matches
                return []
            return self._items.list_namespaces(
                prefix=prefix, suffix=suffix[::-1], max_depth=op.max_depth, limit=limit, offset=offset
            )

        return _paged(fetch, op.limit, op.offset)

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
