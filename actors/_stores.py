"""The per-agent store actors: long-term knowledge, episodic memory and working memory.

Each one owns one layer object, opened in its own thread (so the layer's SQLite connection is
confined to that thread), and turns messages into method calls on it: the stores waiting in its
mailbox into one ``add_many`` / ``record_many`` call (group commit, see :class:`MemoryActor`).
Nothing else: the layers hold the logic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
from memstrata.core.config import Config
from memstrata.core.constants import EMBED_CHARS  # what a knowledge entry's vector is made of
from memstrata.core.errors import EmbeddingError, InvalidInputError
from memstrata.core.validation import check_content
from memstrata.storage import Embedder, embed_documents
from memstrata.storage._embedding import embed_deadline, embed_time_left

from ._base import ActorRuntime, MemoryActor
from .messages import (
    ArchiveEpisodes,
    ClearWorkingMemory,
    CommitMemory,
    DeleteEpisode,
    DeleteKnowledge,
    EpisodeDeleted,
    EpisodeItem,
    EpisodeList,
    EpisodesArchived,
    EpisodesRestored,
    GetEpisode,
    GetKnowledge,
    GetWorkingMemory,
    KnowledgeDeleted,
    KnowledgeItem,
    KnowledgeList,
    KnowledgeResult,
    KnowledgeStored,
    KnowledgeUpdated,
    ListEpisodes,
    ListKnowledge,
    MemoryCommitted,
    MemorySearchResult,
    MemoryStored,
    QueryKnowledge,
    RestoreEpisodes,
    SearchMemory,
    SetWorkingMemory,
    StoreKnowledge,
    StoreMemory,
    UpdateKnowledge,
    WorkingMemoryCleared,
    WorkingMemoryValue,
)

FloatArray = npt.NDArray[np.float32]

__all__ = [
    "BoundedSearch",
    "EpisodicActor",
    "ExportRecords",
    "ImportRecords",
    "KnowledgeStoreActor",
    "LayerStores",
    "Searched",
    "StoreFactory",
    "WorkingMemoryActor",
    "WriteBackEpisode",
]


class StoreFactory(Protocol):
    """Opens the persistent layers; tests pass their own to inject faults.

    ``embedder`` is the agent's embedding service (the shared one unless its
    ``[agents.<id>.embedding]`` names another), or ``None`` when no model could be loaded (the
    layers then run keyword-only and say so in their status).
    """

    def open_knowledge(self, path: Path, embedder: Embedder | None, config: Config) -> Any: ...

    def open_episodic(
        self, path: Path, embedder: Embedder | None, config: Config, clock: Callable[[], datetime]
    ) -> Any: ...


class LayerStores:
    """The real layers: :class:`KnowledgeStore` and :class:`EpisodicMemory`."""

    def open_knowledge(self, path: Path, embedder: Embedder | None, config: Config) -> Any:
        from memstrata.layers import KnowledgeStore

        return KnowledgeStore.open(path, embedder, config=config)

    def open_episodic(
        self, path: Path, embedder: Embedder | None, config: Config, clock: Callable[[], datetime]
    ) -> Any:
        from memstrata.layers import EpisodicMemory

        return EpisodicMemory.open(path, embedder, config=config, clock=clock)


@dataclass(frozen=True, slots=True)
class WriteBackEpisode:
    """Internal: the episode of a write-back.

    It is embedded by its content alone, the text its knowledge entry is embedded by, so the
    embedding service computes one vector for both. ``once``: record it unless the same episode
    of the same task run already exists (a replay after a crash, so a write-back committed just
    before the crash is not recorded twice).
    """

    message: StoreMemory
    once: bool = False


@dataclass(frozen=True, slots=True)
class BoundedSearch:
    """Internal: a ``QueryKnowledge`` or ``SearchMemory`` whose query embedding must answer within
    ``embed_s`` seconds (``None``: ``actors.query_embed_timeout_s``); answered with :class:`Searched`."""

    message: Any
    embed_s: float | None = None


@dataclass(frozen=True, slots=True)
class Searched:
    """Internal: a search's result and, when it ranked by keywords only because the model was
    late or faulty, why (``"keyword-only: model ... did not answer within 2 s"``)."""

    result: Any
    degraded: str | None = None


@dataclass(frozen=True, slots=True)
class ExportRecords:
    """Internal: every record the actor's store holds, as plain JSON-ready dicts (see
    ``memstrata export``), answered as a list."""


@dataclass(frozen=True, slots=True)
class ImportRecords:
    """Internal: restore records made by :class:`ExportRecords` (of this actor's kind) with
    their times and ids; answered with how many were added."""

    records: tuple[dict[str, Any], ...]


_EXPORT_PAGE = 1000


def _iso(value: datetime) -> str:
    return value.isoformat()


@dataclass(frozen=True, slots=True)
class CatchUp:
    """Internal: compute pending vectors now (posted by a timer, with backoff, while some wait)."""


_CATCH_UP_FIRST_S = 0.25  # first retry of pending vectors after a write left some
_CATCH_UP_MAX_S = 30.0  # backoff cap while the model stays faulty


def _layer_config(runtime: ActorRuntime, key: str) -> Config:
    """The config a store of ``key`` opens with: the system's, with the agent's ``[embedding]``,
    the model a store left keyword-only (its model could not be loaded) tries again."""
    settings = runtime.embedding_settings(key)
    config = runtime.config
    return config if settings == config.embedding else replace(config, embedding=settings)


class _PersistentActor(MemoryActor):
    """A store with vectors: searches bound their query embedding, and vectors left pending by a
    late or faulty model are retried in this process with backoff until they are all computed."""

    _catch_up_due = False
    _catch_up_misses = 0

    def _search(self, message: Any, embed_s: float | None) -> Searched:
        limit = self.runtime.config.actors.query_embed_timeout_s
        if embed_s is not None:
            limit = min(limit, max(0.0, embed_s))
        with embed_deadline(limit) as watch:
            result = self.handle(message)
        return Searched(result, watch.degraded)

    def pending_vectors(self) -> int:
        counter = getattr(self.layer, "pending_vectors", None)
        try:
            return int(counter()) if callable(counter) else 0
        except Exception:  # a closed or failing layer: the next write schedules again
            return 0

    def after_write(self) -> None:
        """A write may have left vectors pending (the model was late or faulty): retry soon."""
        if not self._catch_up_due and self.pending_vectors() > 0:
            self._schedule_catch_up()

    def _schedule_catch_up(self) -> None:
        delay = min(_CATCH_UP_MAX_S, _CATCH_UP_FIRST_S * 2**self._catch_up_misses)
        self._catch_up_due = True
        runtime, me = self.runtime, self.actor_ref

        def fire() -> None:
            if not runtime.stopped:
                runtime.post(me, CatchUp())

        runtime.scheduler.call_later(delay, fire)

    def catch_up(self) -> None:
        self._catch_up_due = False
        catch = getattr(self.layer, "catch_up_vectors", None)
        if not callable(catch):
            return
        before = self.pending_vectors()
        left = int(catch())
        if left == 0:
            self._catch_up_misses = 0
            return
        self._catch_up_misses = 0 if left < before else min(self._catch_up_misses + 1, 16)
        self._schedule_catch_up()

    def handle_internal(self, message: Any) -> tuple[bool, Any]:
        """Internal messages common to both stores, and a search's bound on its query embedding:
        ``(True, answer)``, or ``(False, None)`` for the store's own messages."""
        if isinstance(message, QueryKnowledge | SearchMemory) and embed_time_left() is None:
            return True, self._search(message, None).result
        if isinstance(message, BoundedSearch):
            return True, self._search(message.message, message.embed_s)
        if isinstance(message, CatchUp):
            self.catch_up()
            return True, None
        return False, None

    def _refused(self, text: str, what: str) -> InvalidInputError | None:
        """Why the layer would refuse ``text`` (the one rule, :func:`check_content`), so one bad
        message of a batch fails alone and the others still share one transaction. Messages
        handled alone are checked by the layer only."""
        try:
            check_content(text, what, max_bytes=self.runtime.config.max_content_bytes)
        except InvalidInputError as exc:
            return exc
        return None

    def status(self) -> dict[str, Any]:
        base = super().status()
        layer = self.layer
        if layer is not None:
            base["count"] = int(layer.count())
            layer_status = getattr(layer, "status", None)
            if callable(layer_status):
                base["store"] = layer_status()
        return base


class KnowledgeStoreActor(_PersistentActor):
    """``knowledge/{agent}.sqlite`` (or ``knowledge/shared.sqlite``) behind a mailbox."""

    kind = "knowledge"

    def open_layer(self) -> Any:
        runtime = self.runtime
        layer = runtime.stores.open_knowledge(
            runtime.path("knowledge", self.key),
            runtime.embedder_for(self.key),
            _layer_config(runtime, self.key),
        )
        if hasattr(layer, "clock"):  # entries are dated by the system's clock (simulations replay)
            clock = runtime.clock
            layer.clock = lambda: clock.now().timestamp()
        if hasattr(layer, "owner"):  # entries say which store they are in
            layer.owner = self.key
        return layer

    def batch_key(self, message: Any) -> str | None:
        return "store" if isinstance(message, StoreKnowledge) else None

    def handle_batch(self, messages: list[Any]) -> list[Any]:
        """Queued stores in one ``add_many``: one transaction, one embedding request."""
        results: list[Any] = [None] * len(messages)
        items: list[dict[str, Any]] = []
        where: list[int] = []
        for index, message in enumerate(messages):
            refused = self._refused(message.content, "StoreKnowledge.content")
            if refused is not None:
                results[index] = refused
                continue
            where.append(index)
            items.append(
                {
                    "content": message.content,
                    "category": message.category,
                    "tags": message.tags,
                    "scope": message.scope,
                    "author": message.author,
                }
            )
        if items:
            ids = self.layer.add_many(items)
            for index, entry_id in zip(where, ids, strict=True):
                results[index] = KnowledgeStored(self.key, int(entry_id))
            self.after_write()
        return results

    def handle(self, message: Any) -> Any:
        internal, answer = self.handle_internal(message)
        if internal:
            return answer
        layer = self.layer
        if isinstance(message, ExportRecords):
            return self._export()
        if isinstance(message, ImportRecords):
            return self._import(message.records)
        if isinstance(message, StoreKnowledge):
            entry_id = layer.add(
                message.content,
                category=message.category,
                tags=message.tags,
                scope=message.scope,
                author=message.author,
            )
            self.after_write()
            return KnowledgeStored(self.key, int(entry_id))
        if isinstance(message, QueryKnowledge):
            hits = layer.search(
                message.query,
                top_k=message.top_k,
                mode=message.mode,
                category=message.category,
                tags=message.tags,
                scope=message.scope,
                min_score=message.min_score,
            )
            return KnowledgeResult(self.key, tuple(hits))
        if isinstance(message, ListKnowledge):
            entries = layer.list(
                category=message.category,
                tags=message.tags,
                scope=message.scope,
                limit=message.limit,
                offset=message.offset,
            )
            return KnowledgeList(self.key, tuple(entries))
        if isinstance(message, GetKnowledge):
            return KnowledgeItem(self.key, layer.get(message.entry_id))
        if isinstance(message, UpdateKnowledge):
            return self._update(message)
        if isinstance(message, DeleteKnowledge):
            return KnowledgeDeleted(self.key, message.entry_id, bool(layer.delete(message.entry_id)))
        return super().handle(message)

    def _update(self, message: UpdateKnowledge) -> KnowledgeUpdated:
        """Only the given fields change (``tags``: all of them); the layer re-embeds new content
        and refuses a change that would duplicate another entry."""
        changes: dict[str, Any] = {}
        if message.content is not None:
            changes["content"] = message.content
        for name in ("category", "tags", "scope"):
            value = getattr(message, name)
            if value is not None:
                changes[name] = value
        entry = self.layer.update(message.entry_id, **changes)
        if "content" in changes:
            self.after_write()
        return KnowledgeUpdated(self.key, message.entry_id, entry)

    def _export(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        offset = 0
        while True:
            page = self.layer.list(limit=_EXPORT_PAGE, offset=offset, order_by="id", descending=False)
            for entry in page:
                out.append(
                    {
                        "kind": "knowledge",
                        "owner": self.key,
                        "id": int(entry.id),
                        "content": entry.content,
                        "category": entry.category,
                        "scope": entry.scope,
                        "tags": dict(entry.tags),
                        "author": entry.author,
                        "created_at": float(entry.created_at),
                        "updated_at": float(entry.updated_at),
                    }
                )
            if len(page) < _EXPORT_PAGE:
                return out
            offset += len(page)

    def _import(self, records: Sequence[dict[str, Any]]) -> int:
        """Entries in id order, each dated as exported: created by an ``add`` at ``created_at``,
        then (when it changed later) refreshed by the same ``add`` at ``updated_at``."""
        layer = self.layer
        saved = getattr(layer, "clock", None)
        added = 0
        try:
            for record in sorted(records, key=lambda r: int(r.get("id", 0))):
                args = {
                    "category": record["category"],
                    "tags": record.get("tags") or None,
                    "scope": record.get("scope", "/"),
                    "author": record.get("author"),
                }
                before = layer.count()
                for stamp in dict.fromkeys((record.get("created_at"), record.get("updated_at"))):
                    if stamp is not None and saved is not None:
                        layer.clock = lambda stamp=float(stamp): stamp
                    layer.add(record["content"], **args)
                added += int(layer.count()) - int(before)
        finally:
            if saved is not None:
                layer.clock = saved
        self.after_write()
        return added


class EpisodicActor(_PersistentActor):
    """``episodic/{agent}.sqlite`` behind a mailbox; committed before it closes."""

    kind = "episodic"

    def open_layer(self) -> Any:
        runtime = self.runtime
        layer = runtime.stores.open_episodic(
            runtime.path("episodic", self.key),
            runtime.embedder_for(self.key),
            _layer_config(runtime, self.key),
            runtime.clock.now,
        )
        if hasattr(layer, "new_uuid") and runtime.ids.seed is not None:
            # seeded ids continue after what the store holds, so a restart never reuses one
            held = int(layer.count())
            status = layer.status() if callable(getattr(layer, "status", None)) else {}
            held += sum(int(a.get("episodes", 0)) for a in status.get("archives", ()))
            layer.new_uuid = runtime.ids.for_scope(f"episode:{self.key}:{held}")
        return layer

    def close_layer(self, layer: Any) -> None:
        try:
            layer.commit()
        finally:
            layer.close()

    def batch_key(self, message: Any) -> str | None:
        if isinstance(message, StoreMemory) or (isinstance(message, WriteBackEpisode) and not message.once):
            return "store"
        return None

    def _shared_vectors(self, messages: Sequence[StoreMemory]) -> list[FloatArray | None]:
        """Vectors of write-back episodes: their content through the agent's embedding service
        (its knowledge store's too), which computes each text once for the knowledge entry and
        the episode. ``None`` where the layer embeds by itself (another embedder, keyword-only,
        or the model failed)."""
        embedder: Embedder | None = self.runtime.embedder_for(self.key)
        own: object = getattr(self.layer, "embedder", None)
        if not messages or embedder is None or own is not embedder:
            return [None] * len(messages)
        try:
            array = embed_documents(embedder, [m.content[:EMBED_CHARS] for m in messages])
        except EmbeddingError:
            return [None] * len(messages)  # the layer tries again and keeps the episode either way
        return list(array)

    def _item(self, message: StoreMemory, vector: FloatArray | None) -> dict[str, Any]:
        item: dict[str, Any] = {
            "content": message.content,
            "title": message.title,
            "task_run_id": message.task_run_id,
            "tags": message.tags,
            "kind": message.kind,
            "at": message.at or self.runtime.clock.now(),
        }
        if vector is not None:
            item["vector"] = vector
        return item

    def handle_batch(self, messages: list[Any]) -> list[Any]:
        """Queued episodes in one ``record_many``: one transaction, one embedding request."""
        results: list[Any] = [None] * len(messages)
        plain: list[tuple[int, StoreMemory]] = []
        shared: list[tuple[int, StoreMemory]] = []
        for index, message in enumerate(messages):
            original = message.message if isinstance(message, WriteBackEpisode) else message
            refused = None  # a write-back's text passed the same rule before its outbox acknowledged it
            if original is message:
                refused = self._refused(original.content, "StoreMemory.content")
            if refused is not None:
                results[index] = refused
                continue
            (shared if isinstance(message, WriteBackEpisode) else plain).append((index, original))
        vectors = self._shared_vectors([m for _, m in shared])
        order = [*plain, *shared]
        items = [self._item(m, None) for _, m in plain]
        items += [self._item(m, v) for (_, m), v in zip(shared, vectors, strict=True)]
        if items:
            ids = self.layer.record_many(items)
            for (index, _), episode_id in zip(order, ids, strict=True):
                results[index] = MemoryStored(self.key, int(episode_id))
            self.after_write()
        return results

    def handle(self, message: Any) -> Any:
        internal, answer = self.handle_internal(message)
        if internal:
            return answer
        layer = self.layer
        if isinstance(message, ExportRecords):
            return self._export()
        if isinstance(message, ImportRecords):
            return self._import(message.records)
        if isinstance(message, WriteBackEpisode):
            original = message.message
            if message.once:
                for episode in layer.timeline(task_run_id=original.task_run_id, limit=10_000):
                    if episode.content == original.content and episode.title == original.title:
                        return MemoryStored(self.key, int(episode.id))
            vector = self._shared_vectors([original])[0]
            episode_id = layer.record_many([self._item(original, vector)])[0]
            self.after_write()
            return MemoryStored(self.key, int(episode_id))
        if isinstance(message, StoreMemory):
            episode_id = layer.record(
                message.content,
                title=message.title,
                task_run_id=message.task_run_id,
                tags=message.tags,
                kind=message.kind,
                at=message.at or self.runtime.clock.now(),
            )
            self.after_write()
            return MemoryStored(self.key, int(episode_id))
        if isinstance(message, SearchMemory):
            hits = layer.search(
                message.query,
                top_k=message.top_k,
                task_run_id=message.task_run_id,
                since=message.since,
                until=message.until,
            )
            return MemorySearchResult(self.key, message.task_run_id, tuple(hits))
        if isinstance(message, ListEpisodes):
            episodes = layer.timeline(
                task_run_id=message.task_run_id,
                since=message.since,
                until=message.until,
                limit=message.limit,
                offset=message.offset,
                newest_first=message.newest_first,
            )
            return EpisodeList(self.key, tuple(episodes))
        if isinstance(message, GetEpisode):
            return EpisodeItem(self.key, layer.get(message.episode_id))
        if isinstance(message, DeleteEpisode):
            return EpisodeDeleted(self.key, message.episode_id, bool(layer.delete(message.episode_id)))
        if isinstance(message, ArchiveEpisodes):
            Path(message.path).parent.mkdir(parents=True, exist_ok=True)
            count = layer.archive(message.path, before=message.before, task_run_id=message.task_run_id)
            return EpisodesArchived(self.key, message.path, int(count))
        if isinstance(message, RestoreEpisodes):
            count = layer.restore(message.path)
            self.after_write()
            return EpisodesRestored(self.key, message.path, int(count))
        if isinstance(message, CommitMemory):
            layer.commit()
            return MemoryCommitted(self.key)
        return super().handle(message)

    def _record(self, episode: Any, archive: str | None) -> dict[str, Any]:
        return {
            "kind": "episode",
            "agent": self.key,
            "id": int(episode.id),
            "uuid": episode.uuid,
            "at": _iso(episode.at),
            "episode_kind": episode.kind,
            "title": episode.title,
            "task_run_id": episode.task_run_id,
            "tags": dict(episode.tags),
            "content": episode.content,
            "archive": archive,
        }

    def _export(self) -> list[dict[str, Any]]:
        """Live episodes, then the episodes of every readable archive (named by file name)."""
        from memstrata.layers._archive import ArchiveFile
        from memstrata.layers._episode_records import episode_from_row

        layer = self.layer
        out = [self._record(e, None) for e in layer.timeline(limit=None)]
        status = layer.status() if callable(getattr(layer, "status", None)) else {}
        for archive in status.get("archives", ()):
            if not archive.get("available"):
                continue
            path = Path(str(archive["path"]))
            opened = ArchiveFile(path, verify=False)
            try:
                rows = opened.rows()
            finally:
                opened.close()
            gone = layer.deleted_uuids([str(r[1]) for r in rows])  # deleted for good since
            out += [
                self._record(episode_from_row(r, path.name), path.name) for r in rows if str(r[1]) not in gone
            ]
        return out

    def _import(self, records: Sequence[dict[str, Any]]) -> int:
        """Live episodes with their uuid and time; those already present (same uuid) and
        archived ones (restore their archive file instead) are skipped."""
        layer = self.layer
        present = {e.uuid for e in layer.timeline(limit=None)}
        saved = getattr(layer, "new_uuid", None)
        added = 0
        try:
            for record in sorted(records, key=lambda r: (str(r.get("at")), int(r.get("id", 0)))):
                uuid = str(record.get("uuid") or "")
                if record.get("archive") or (uuid and uuid in present):
                    continue
                if uuid and saved is not None:
                    layer.new_uuid = lambda uuid=uuid: uuid
                layer.record(
                    record["content"],
                    title=record.get("title"),
                    task_run_id=record.get("task_run_id"),
                    tags=record.get("tags") or None,
                    kind=record.get("episode_kind", "note"),
                    at=datetime.fromisoformat(str(record["at"])),
                )
                present.add(uuid)
                added += 1
        finally:
            if saved is not None:
                layer.new_uuid = saved
        self.after_write()
        return added


class WorkingMemoryActor(MemoryActor):
    """One agent's working memory (in memory only)."""

    kind = "working"

    def open_layer(self) -> Any:
        from memstrata.layers import WorkingMemory

        return WorkingMemory(
            clock=self.runtime.clock.monotonic, max_value_bytes=self.runtime.config.max_content_bytes
        )

    def close_layer(self, layer: Any) -> None:
        layer.clear_all()

    def handle(self, message: Any) -> Any:
        layer = self.layer
        if isinstance(message, ExportRecords):
            return self._export()
        if isinstance(message, ImportRecords):
            for record in message.records:
                layer.set(
                    record["key"],
                    record["value"],
                    ttl_s=record.get("expires_in_s"),
                    task_id=record.get("task_id"),
                )
            return len(message.records)
        if isinstance(message, SetWorkingMemory):
            task = message.task_id or None
            layer.set(message.key, message.value, ttl_s=message.ttl_s, task_id=task)
            value = layer.get(message.key, task_id=task)
            return WorkingMemoryValue(self.key, message.key, value, True, task)
        if isinstance(message, GetWorkingMemory):
            task = message.task_id or None
            found = layer.contains(message.key, task_id=task)
            value = layer.get(message.key, task_id=task) if found else None
            return WorkingMemoryValue(self.key, message.key, value, found, task)
        if isinstance(message, ClearWorkingMemory):
            task = message.task_id or None
            if message.key is None:
                removed = layer.clear(task_id=task)
            else:
                removed = int(layer.delete(message.key, task_id=task))
            return WorkingMemoryCleared(self.key, removed)
        return super().handle(message)

    def status(self) -> dict[str, Any]:
        base = super().status()
        if self.layer is not None:
            base["count"] = len(self.layer)
        return base

    def _export(self) -> list[dict[str, Any]]:
        """Live keys with their values and, for those that expire, the seconds left."""
        out = []
        for item in self.layer.entries():
            record = {
                "kind": "working",
                "agent": self.key,
                "key": item.key,
                "value": item.value,
                "expires_in_s": item.expires_in_s,
            }
            if item.task_id is not None:  # a task's space (the agent-wide space has no field)
                record["task_id"] = item.task_id
            out.append(record)
        return out
