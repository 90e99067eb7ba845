"""EpisodicActor: episodic memory behind a mailbox; one store actor per module."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from memstrata.core.constants import (
    ARCHIVES_DIR,
    EMBED_CHARS,  # what a knowledge entry's vector is made of
)
from memstrata.core.errors import ArchiveError, ConfigError, EmbeddingError, InvalidInputError
from memstrata.layers._episodic_inputs import free_archive_path
from memstrata.layers._roots import refused_output
from memstrata.storage import Embedder, FloatArray, embed_documents

from ._routing import _FOLDER
from ._store_base import (
    _fields,
    _iso,
    _PersistentActor,
)
from ._store_messages import EpisodesImported, ExportRecords, WriteBackEpisode
from .messages import (
    ArchiveEpisodes,
    CommitMemory,
    DeleteEpisode,
    EpisodeDeleted,
    EpisodeItem,
    EpisodeList,
    EpisodesArchived,
    EpisodesRestored,
    GetEpisode,
    ListEpisodes,
    MemoryCommitted,
    MemorySearchResult,
    MemoryStored,
    RestoreEpisodes,
    SearchMemory,
    StoreMemory,
)

__all__ = ["EpisodicActor", "check_archive_dir"]

log = logging.getLogger("memstrata.actors")


def check_archive_dir(archive_dir: str | None, data_dir: Path) -> None:
    """Refuse ``[episodic] archive_dir`` inside the data dir (other than its archives folder) when
    the system starts: retention's archives there would sit among the stores, taken for the
    stores of an agent named after them. A relative folder is relative to the episodic stores'
    folder, as the layer reads it."""
    if archive_dir is None:
        return
    folder = data_dir / _FOLDER["episodic"] / Path(archive_dir).expanduser()
    refused = refused_output(folder / "archive.sqlite", data_dir, managed=data_dir / ARCHIVES_DIR)
    if refused is not None:
        raise ConfigError(f"config key 'episodic.archive_dir': {archive_dir!r} {refused}")


class EpisodicActor(_PersistentActor):
    """``episodic/{agent}.sqlite`` behind a mailbox; committed before it closes.

    A write-back's episode is embedded by its content alone, the text its knowledge entry is
    embedded by, so the embedding service computes one vector for both (the layer's rule, title,
    content and date, would be a second model call per write-back: 2.5 times the model's work per
    task, measured). With vectors computed apart, ``_content_only`` holds the texts of those
    episodes until their vectors are stored; one still pending at a restart gets the layer's rule.
    """

    kind = "episodic"
    _content_only: dict[int, str]

    def _open(self) -> Any:
        self._content_only = {}
        return super()._open()

    def open_layer(self) -> Any:
        runtime = self.runtime
        layer = runtime.stores.open_episodic(*self._store_args(), runtime.clock.now)
        if hasattr(layer, "new_uuid") and runtime.ids.seed is not None:
            # each open draws from its own seeded sequence, so a restart never reuses a uuid
            layer.new_uuid = runtime.ids.for_scope(f"episode:{self.key}:{layer.count_open()}")
            layer.name_store(runtime.ids.uuid(f"episodic-store:{self.key}"))  # a new store only
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

    def _texts_to_embed(self, ids: list[int], texts: list[str]) -> list[str]:
        return [self._content_only.get(i, t) for i, t in zip(ids, texts, strict=True)]

    def _vectors_stored(self, ids: list[int]) -> None:
        for episode_id in ids:
            self._content_only.pop(episode_id, None)

    def _shared_vectors(self, messages: Sequence[StoreMemory]) -> list[FloatArray | None]:
        """Vectors of write-back episodes computed inline (an embedder other than the shared
        service): their content, which the knowledge entry's vector is made of too. ``None``
        where the layer embeds by itself (vectors computed apart, keyword-only, or the model
        failed)."""
        embedder: Embedder | None = self.runtime.embedder_for(self.key)
        own: object = getattr(self.layer, "embedder", None)
        if not messages or self._service is not None or embedder is None or own is not embedder:
            return [None] * len(messages)
        try:
            array = embed_documents(embedder, [m.content[:EMBED_CHARS] for m in messages])
        except EmbeddingError:
            return [None] * len(messages)  # the layer tries again and keeps the episode either way
        return list(array)

    def _committed(self, messages: list[Any], answers: list[Any]) -> None:
        """Write-back episodes just recorded with their vectors pending: their content is embedded."""
        if self._service is not None:
            for message, answer in zip(messages, answers, strict=True):
                if isinstance(message, WriteBackEpisode) and id(message) not in self._inline:
                    self._content_only[int(answer.episode_id)] = message.message.content[:EMBED_CHARS]

    def _item(self, message: StoreMemory, vector: FloatArray | None = None) -> dict[str, Any]:
        """``record_many``'s item of ``message`` (dated now unless it says when)."""
        item = {"content": message.content, **_fields(message, "title", "task_run_id", "tags", "kind")}
        item["at"] = message.at or self.runtime.clock.now()
        if vector is not None:
            item["vector"] = vector
        return item

    def handle_batch(self, messages: list[Any]) -> list[Any]:
        """Queued episodes in one ``record_many``: one transaction, one embedding request."""
        return self._write_batch(messages, "StoreMemory.content", self._record_many)

    def _record_many(self, messages: list[Any]) -> list[Any]:
        """Episodes in mailbox order; a write-back's is embedded by its content (see the class)."""

        def record(run: list[Any], vectors: FloatArray | None) -> list[int]:
            shared = [m.message for m in run if isinstance(m, WriteBackEpisode)]
            given = iter(self._shared_vectors(shared) if vectors is None else list(vectors))
            items = [
                self._item(m.message, next(given)) if isinstance(m, WriteBackEpisode) else self._item(m)
                for m in run
            ]
            return [int(i) for i in self.layer.record_many(items)]

        return [MemoryStored(self.key, i) for i in self._with_vectors(messages, record)]

    def handle(self, message: Any) -> Any:
        if isinstance(message, ExportRecords):  # with the file it will replace: see _export
            return self._export(message.into)
        return super().handle(message)

    def handle_store(self, message: Any) -> Any:
        layer = self.layer
        if isinstance(message, WriteBackEpisode):
            original = message.message
            if message.once:
                for episode in layer.timeline(task_run_id=original.task_run_id, limit=10_000):
                    if episode.content == original.content and episode.title == original.title:
                        return MemoryStored(self.key, int(episode.id))
            return self.handle_batch([message])[0]  # with the vectors answered meanwhile
        if isinstance(message, StoreMemory):
            episode_id = layer.record(**self._item(message))
            self.after_write()
            return MemoryStored(self.key, int(episode_id))
        if isinstance(message, SearchMemory):
            hits = layer.search(message.query, **_fields(message, "top_k", "task_run_id", "since", "until"))
            return MemorySearchResult(self.key, message.task_run_id, tuple(hits))
        if isinstance(message, ListEpisodes):
            window = _fields(message, "task_run_id", "since", "until", "limit", "offset", "newest_first")
            return EpisodeList(self.key, tuple(layer.timeline(**window)))
        if isinstance(message, GetEpisode):
            return EpisodeItem(self.key, layer.get(message.episode_id))
        if isinstance(message, DeleteEpisode):
            self._content_only.pop(message.episode_id, None)
            return EpisodeDeleted(self.key, message.episode_id, bool(layer.delete(message.episode_id)))
        if isinstance(message, ArchiveEpisodes):
            return self._archive(message)
        if isinstance(message, RestoreEpisodes):
            count = layer.restore(message.path)
            self.after_write()
            return EpisodesRestored(self.key, message.path, int(count))
        if isinstance(message, CommitMemory):
            self.settle_vectors()  # retention may archive
            layer.commit()
            return MemoryCommitted(self.key)
        return super().handle_store(message)

    def _archive(self, message: ArchiveEpisodes) -> EpisodesArchived:
        """Archive to the caller's path, or to a free name in the archives folder chosen here,
        where this agent's archives are written one at a time (after the vectors it waits for:
        an archive written meanwhile takes no name this one has)."""
        data_dir = self.runtime.data_dir
        path = message.path
        if path is not None:
            refused = refused_output(path, data_dir, managed=data_dir / ARCHIVES_DIR)
            if refused is not None:
                raise InvalidInputError(f"archive path {path!r} {refused}: archive elsewhere")
        folder = data_dir / ARCHIVES_DIR if path is None else Path(path).parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # the caller's path: an error of the call, not a crash of the store
            raise ArchiveError(f"cannot write archive {path or folder}: {exc.strerror or exc}") from exc
        self.settle_vectors()
        if path is None:
            path = str(free_archive_path(folder, self.key, self.runtime.clock.now()))
        count = self.layer.archive(path, before=message.before, task_run_id=message.task_run_id)
        return EpisodesArchived(self.key, path, int(count))

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

    def _export(self, into: str | None = None) -> list[dict[str, Any]]:
        """Live episodes, then the episodes of every readable archive (named by file name) that
        are not live again (restored: the archive keeps its copy, as searches skip it), each once
        (archived again after a restore, it stands in two archives: the first names it). An
        export ``into`` one of the archives would replace it: refused, so its episodes stay."""
        from memstrata.layers._archive import ArchiveFile
        from memstrata.layers._episode_records import episode_from_row

        layer = self.layer
        status = layer.status() if callable(getattr(layer, "status", None)) else {}
        archives = status.get("archives", ())
        for archive in archives:
            if into is not None and os.path.realpath(str(archive["path"])) == into:
                raise InvalidInputError(
                    f"export path {into!r} is an episode archive of agent {self.key!r}: "
                    "write the export elsewhere"
                )
        live = layer.timeline(limit=None)
        out = [self._record(e, None) for e in live]
        seen = {e.uuid for e in live}
        for archive in archives:
            path = Path(str(archive["path"]))
            try:
                if not archive.get("available"):
                    raise ArchiveError(str(archive.get("problem") or "it cannot be read"))
                opened = ArchiveFile(path, verify=False)
                try:
                    rows = opened.rows()
                finally:
                    opened.close()
            except ArchiveError as exc:  # nothing of it can be exported: the rest still is, and said so
                log.warning(
                    "export: the episodes of archive %s of agent %r are left out: %s", path, self.key, exc
                )
                continue
            gone = layer.deleted_uuids([str(r[1]) for r in rows]) | seen  # deleted, live or exported
            kept = [r for r in rows if str(r[1]) not in gone]
            out += [self._record(episode_from_row(r, path.name), path.name) for r in kept]
            seen.update(str(r[1]) for r in kept)
        return out

    def _import(self, records: Sequence[dict[str, Any]]) -> EpisodesImported:
        """Live episodes with their uuid and time, in id order; into an empty store they keep
        their ids, gaps included (as knowledge does: a promoted entry's ``episode_id`` tag still
        names its episode). The same episode already here (same uuid, time and contents) and
        archived ones (restore their archive file instead) are skipped; a different episode
        under a uuid held here is kept under a new uuid (see ``EpisodicMemory.record_known``).
        Answers with the ids that differ from the file's."""
        layer = self.layer
        keep_ids = layer.count() == 0
        added = 0
        moved: dict[int, int] = {}
        for record in sorted(records, key=lambda r: int(r["id"])):
            if record.get("archive"):
                continue
            exported = int(record["id"])
            here, new = layer.record_known(
                record["content"],
                uuid=str(record.get("uuid") or "") or None,
                at=datetime.fromisoformat(str(record["at"])),
                title=record.get("title"),
                task_run_id=record.get("task_run_id"),
                tags=record.get("tags") or None,
                kind=record.get("episode_kind", "note"),
                id_at_least=exported if keep_ids else None,
            )
            added += int(new)
            if here is not None and here != exported:
                moved[exported] = here
        self.after_write()
        return EpisodesImported(added, moved)
