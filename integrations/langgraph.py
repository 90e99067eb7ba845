"""LangGraph ``BaseStore`` on memstrata's item layer (``pip install 'memstrata[langgraph]'``).

Items are addressed by (namespace tuple, key); values stay JSON apart from the embedded text; the
``index`` config is LangGraph's (``dims``, ``embed``, ``fields`` or ``text_fields`` with JSON paths,
one vector per field and item ranked by its best field); search takes a namespace prefix and
filters evaluated inside SQLite; scores are cosine similarities; TTL follows ``TTLConfig``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from memstrata.layers._items import ItemRecord, ItemStore
from memstrata.storage import embed_documents

from memstrata.errors import InvalidInputError

from ._common import items_path, missing

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


def _item(rec: ItemRecord) -> Any:
    return Item(
        value=rec.value,
        key=rec.key,
        namespace=rec.namespace,
        created_at=_stamp(rec.created_at),
        updated_at=_stamp(rec.updated_at),
    )


def _search_item(rec: ItemRecord) -> Any:
    return SearchItem(
        namespace=rec.namespace,
        key=rec.key,
        value=rec.value,
        created_at=_stamp(rec.created_at),
        updated_at=_stamp(rec.updated_at),
        score=rec.score,
    )


def _system_embed(target: Any) -> Callable[[Sequence[str]], list[list[float]]]:
    """A running system's shared (batching) embedder as LangGraph's ``embed`` function."""
    from memstrata._system import MemorySystem

    if not isinstance(target, MemorySystem):
        raise InvalidInputError(
            'index needs "embed" (a function or Embeddings) unless the store is on a MemorySystem'
        )
    embedder = target.embedder
    if embedder is None:
        raise InvalidInputError('the MemorySystem runs keyword-only (no embedder): give the index an "embed"')

    def embed(texts: Sequence[str]) -> list[list[float]]:
        return [row.tolist() for row in embed_documents(embedder, list(texts))]

    return embed


class MemstrataStore(BaseStore):
    """A LangGraph store on a memstrata item database.

    ``target``: a database path, ``":memory:"``, or a running ``MemorySystem`` (its data dir
    holds the items). ``index``: LangGraph's index config. ``ttl``: LangGraph's ``TTLConfig``.
    """

    supports_ttl = True

    def __init__(self, target: Any = ":memory:", *, index: Any = None, ttl: Any = None) -> None:
        self._items = ItemStore(items_path(target))
        self.ttl_config = ttl
        # a read refreshes expiry only when the config turns refresh_on_read on (LangGraph's
        # SQLite store reads it so: the per-call flag alone does not extend a lifetime)
        self._refresh_on_read = bool(ttl and ttl.get("refresh_on_read", False))
        self.index_config: dict[str, Any] | None = None
        self.embeddings: Any = None
        if index:
            config = dict(index)
            fields = config.get("fields") or config.get("text_fields") or ["$"]
            if isinstance(fields, str):
                fields = [fields]
            if not isinstance(fields, list):
                raise InvalidInputError(f"index fields must be a list of paths or one path, got {fields!r}")
            config["__tokenized_fields"] = [(p, "$" if p == "$" else _embed.tokenize_path(p)) for p in fields]
            if config.get("embed") is None:
                config["embed"] = _system_embed(target)
                config.setdefault("dims", getattr(target, "embedder", None) and target.embedder.dim)
            self.embeddings = _embed.ensure_embeddings(config.get("embed"))
            self.index_config = config
        self._stop = threading.Event()
        self._sweeper: threading.Thread | None = None

    @classmethod
    @contextlib.contextmanager
    def from_conn_string(
        cls, conn_string: str | Path, *, index: Any = None, ttl: Any = None
    ) -> Iterator[MemstrataStore]:
        """A store on ``conn_string`` (a path or ``":memory:"``), closed on exit."""
        store = cls(conn_string, index=index, ttl=ttl)
        try:
            yield store
        finally:
            store.close()

    def setup(self) -> None:
        """Nothing to do: the schema is created on open (kept for LangGraph's store protocol)."""

    def close(self) -> None:
        """Stops the sweeper and closes the database (the async store's too: it is synchronous)."""
        MemstrataStore.stop_ttl_sweeper(self, timeout=5)
        self._items.close()

    # operations --------------------------------------------------------------------------

    def batch(self, ops: Iterable[Any]) -> list[Any]:
        return self._run(list(ops))

    async def abatch(self, ops: Iterable[Any]) -> list[Any]:
        return await asyncio.to_thread(self._run, list(ops))

    def _run(self, ops: list[Any]) -> list[Any]:
        results: list[Any] = [None] * len(ops)
        pending: list[Any] = []
        for i, op in enumerate(ops):
            if isinstance(op, PutOp):
                pending.append(op)
                continue
            self._flush(pending)
            if isinstance(op, GetOp):
                rec = self._items.get(
                    op.namespace, op.key, refresh_ttl=bool(op.refresh_ttl) and self._refresh_on_read
                )
                results[i] = None if rec is None else _item(rec)
            elif isinstance(op, SearchOp):
                results[i] = self._search(op)
            elif isinstance(op, ListNamespacesOp):
                results[i] = self._list(op)
            else:
                raise InvalidInputError(f"unknown store operation {type(op).__name__}")
        self._flush(pending)
        return results

    def _flush(self, puts: list[Any]) -> None:
        """Apply puts in order (last write of a key wins), embedding every text in one call."""
        if not puts:
            return
        last: dict[tuple[tuple[str, ...], str], Any] = {}
        for op in puts:
            last[(tuple(op.namespace), op.key)] = op
        puts.clear()
        deletes = [k for k, op in last.items() if op.value is None]
        if deletes:
            self._items.delete_many(deletes)
        texts: list[str] = []
        owners: list[tuple[tuple[tuple[str, ...], str], str]] = []
        for k, op in last.items():
            if op.value is None or not self.index_config or op.index is False:
                continue
            if op.index is None:
                paths = self.index_config["__tokenized_fields"]
            else:
                paths = [(p, "$" if p == "$" else _embed.tokenize_path(p)) for p in op.index]
            for path, tokens in paths:
                found = _embed.get_text_at_path(op.value, tokens)
                for n, text in enumerate(found):
                    owners.append((k, f"{path}.{n}" if len(found) > 1 else path))
                    texts.append(text)
        vectors: dict[tuple[tuple[str, ...], str], dict[str, Sequence[float]]] = {}
        if texts:
            for (k, field), vec in zip(owners, self.embeddings.embed_documents(texts), strict=True):
                vectors.setdefault(k, {})[field] = vec
        rows = []
        for k, op in last.items():
            if op.value is None:
                continue
            embedded = self.index_config is not None and op.index is not False
            rows.append((k[0], k[1], dict(op.value), vectors.get(k, {}) if embedded else None, op.ttl))
        self._items.put_many(rows)

    def _search(self, op: Any) -> list[Any]:
        vector = None
        if op.query and self.embeddings is not None:
            vector = self.embeddings.embed_query(op.query)
        records = self._items.search(
            tuple(op.namespace_prefix),
            query_vector=vector,
            filter=op.filter,
            limit=op.limit,
            offset=op.offset,
            refresh_ttl=bool(op.refresh_ttl) and self._refresh_on_read,
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
        return self._items.list_namespaces(
            prefix=prefix, suffix=suffix, max_depth=op.max_depth, limit=op.limit, offset=op.offset
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
                    self.sweep_ttl()
            future.set_result(None)

        self._sweeper = threading.Thread(target=loop, daemon=True, name="memstrata-ttl-sweeper")
        self._sweeper.start()
        return future

    def stop_ttl_sweeper(self, timeout: float | None = None) -> bool:
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
        store = cls(conn_string, index=index, ttl=ttl)
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
