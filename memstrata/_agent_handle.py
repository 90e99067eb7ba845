"""The Agent handle: agent-scoped calls built as messages, apart from the system's lifecycle."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memstrata.core.errors import InvalidInputError
from memstrata.core.validation import check_bool, check_path, check_timeout
from memstrata.messages import (
    SHARED,
    ArchiveEpisodes,
    ClearWorkingMemory,
    CommitMemory,
    DeleteEpisode,
    DeleteKnowledge,
    EpisodesArchived,
    GetEpisode,
    GetKnowledge,
    GetWorkingMemory,
    ListEpisodes,
    ListKnowledge,
    Message,
    QueryKnowledge,
    RestoreEpisodes,
    SearchMemory,
    SetWorkingMemory,
    StoreKnowledge,
    StoreMemory,
    TaskAssigned,
    TaskCompleted,
    TaskFailed,
    TaskPrompt,
    UpdateKnowledge,
    WriteBackQueued,
)

if TYPE_CHECKING:
    from memstrata.layers import Episode, EpisodeHit, KnowledgeEntry, KnowledgeHit

    from ._system import MemorySystem

__all__ = ["Agent", "Hits"]


class Hits(list[Any]):
    """Search hits, best first; ``degraded`` says why they were ranked by keywords only when the
    model was late or faulty (``"keyword-only: model 'm' did not answer within 2 s"``), else ``None``."""

    def __init__(self, hits: Any = (), *, degraded: str | None = None) -> None:
        super().__init__(hits)
        self.degraded = degraded


def _timeout(system: MemorySystem, timeout: object) -> float:
    """``timeout`` checked, or the system's ask bound for ``None``."""
    checked = check_timeout(timeout)
    return system.config.actors.ask_timeout_s if checked is None else checked


def _absolute(path: object) -> str:
    """An archive path, checked in the caller and made absolute against the caller's directory."""
    if not isinstance(path, str | Path):
        raise InvalidInputError(f"path must be a str or Path, got {type(path).__name__}")
    return str(Path(check_path(path)).absolute())  # "" would be the caller's own directory


class Agent:
    """One agent's memory: knowledge, episodes, working memory and the task lifecycle."""

    def __init__(self, system: MemorySystem, agent_id: str) -> None:
        self._system = system
        self.id = agent_id

    def __repr__(self) -> str:
        return f"<Agent {self.id}>"

    def _ask(self, message: Message, timeout: float | None = None) -> Any:
        return self._system.ask(message, timeout=_timeout(self._system, timeout))

    def _search(self, search: Callable[..., Any], message: Message, timeout: float | None) -> Hits:
        """Run a hybrid search on the runtime directly (not as a plain ask), so the answer says
        whether keywords ranked alone; ``search`` is the runtime's method for that kind."""
        self._system._runtime.check_open()
        found = search(message, timeout=_timeout(self._system, timeout))
        return Hits(found.result.hits, degraded=found.degraded)

    # -- long-term knowledge -------------------------------------------------------------------

    def store_knowledge(
        self,
        content: str,
        *,
        category: str = "pattern",
        tags: Mapping[str, str] | Sequence[str] | None = None,
        scope: str = "/",
        shared: bool = False,
        timeout: float | None = None,
    ) -> int:
        """Add an entry to this agent's store (or, with ``shared=True``, the shared store, with
        this agent as its author); returns its id. Same content, category and scope -> same id."""
        target = SHARED if check_bool(shared, "shared") else self.id
        message = StoreKnowledge(target, content, category, tags, scope, author=self.id)  # type: ignore[arg-type]
        return int(self._ask(message, timeout).entry_id)

    def query_knowledge(
        self,
        query: str,
        *,
        top_k: int | None = None,
        category: str | None = None,
        tags: Mapping[str, str] | Sequence[str] | None = None,
        scope: str | None = None,
        include_shared: bool | None = None,
        mode: str = "hybrid",
        min_score: float | None = None,
        timeout: float | None = None,
    ) -> list[KnowledgeHit]:
        """Hybrid search, best first: the same ``KnowledgeHit`` objects as ``KnowledgeStore.search``,
        in a list whose ``degraded`` says when the model was late or faulty and keywords ranked alone.

        ``top_k``: 1 to 1000 hits (``None``: ``search.top_k``). ``include_shared`` (default: the
        agent's ``include_shared`` setting) merges the shared store's hits by score.
        """
        if include_shared is None:
            include_shared = self._system.config.for_agent(self.id).include_shared
        if top_k is None:
            top_k = self._system.config.search.top_k
        message = QueryKnowledge(
            self.id,
            query,
            category=category,
            top_k=top_k,
            tags=tags,  # type: ignore[arg-type]
            scope=scope,
            include_shared=include_shared,
            mode=mode,
            min_score=min_score,
        )
        return self._search(self._system._runtime.search_knowledge, message, timeout)

    def _store(self, store: str | None, shared: bool) -> str:
        """The store an entry id refers to: ``store`` (this agent's id or ``"shared"``) or, for
        callers of the older form, ``shared=True``; both given must agree."""
        check_bool(shared, "shared")
        if store is None:
            return SHARED if shared else self.id
        if store not in (self.id, SHARED):
            raise InvalidInputError(
                f"store must be {self.id!r} (this agent) or 'shared', got {str(store)[:64]!r}"
            )
        if shared and store != SHARED:
            raise InvalidInputError(f"store={store!r} contradicts shared=True")
        return store

    def list_knowledge(
        self,
        *,
        category: str | None = None,
        tags: Mapping[str, str] | Sequence[str] | None = None,
        scope: str | None = None,
        limit: int = 50,
        offset: int = 0,
        shared: bool = False,
        store: str | None = None,
        timeout: float | None = None,
    ) -> list[KnowledgeEntry]:
        """Entries of one store, newest first (``scope``: that scope and its descendants); each
        says its ``store``. ``store``: this agent's id (default) or ``"shared"``."""
        target = self._store(store, shared)
        message = ListKnowledge(target, category, tags, scope, limit, offset)  # type: ignore[arg-type]
        return list(self._ask(message, timeout).entries)

    def get_knowledge(
        self,
        entry_id: int,
        *,
        store: str | None = None,
        shared: bool = False,
        timeout: float | None = None,
    ) -> KnowledgeEntry | None:
        """The entry with this id in ``store`` (this agent's id, the default, or ``"shared"``:
        ids are per store, so take it from the hit's ``store``), or ``None``."""
        target = self._store(store, shared)
        return self._ask(GetKnowledge(target, entry_id), timeout).entry  # type: ignore[no-any-return]

    def update_knowledge(
        self,
        entry_id: int,
        *,
        store: str | None = None,
        content: str | None = None,
        category: str | None = None,
        tags: Mapping[str, str] | Sequence[str] | None = None,
        scope: str | None = None,
        shared: bool = False,
        timeout: float | None = None,
    ) -> KnowledgeEntry | None:
        """Change the given fields of an entry, keeping its id; returns it as it now is, or
        ``None`` when there is no such id. ``None`` leaves a field as it is; ``tags`` replaces
        every tag (``{}`` clears them); new content is embedded again. A change that would make
        it a duplicate of another entry of the store (same content, category and scope) raises
        :class:`InvalidInputError` naming that entry, and changes nothing."""
        target = self._store(store, shared)
        message = UpdateKnowledge(target, entry_id, content, category, tags, scope)  # type: ignore[arg-type]
        return self._ask(message, timeout).entry  # type: ignore[no-any-return]

    def delete_knowledge(
        self,
        entry_id: int,
        *,
        store: str | None = None,
        shared: bool = False,
        timeout: float | None = None,
    ) -> bool:
        """Delete the entry with this id in ``store`` (this agent's id or ``"shared"``); True if
        it existed."""
        target = self._store(store, shared)
        return bool(self._ask(DeleteKnowledge(target, entry_id), timeout).deleted)

    # -- episodic memory -----------------------------------------------------------------------

    def remember(
        self,
        content: str,
        *,
        title: str | None = None,
        task_run_id: str | None = None,
        tags: Mapping[str, str] | None = None,
        kind: str = "note",
        at: _dt.datetime | None = None,
        timeout: float | None = None,
    ) -> int:
        """Record an episode (``at`` defaults to the system clock); returns its id once committed."""
        message = StoreMemory(self.id, task_run_id, content, title, tags, kind, at)  # type: ignore[arg-type]
        return int(self._ask(message, timeout).episode_id)

    def recall(
        self,
        query: str,
        *,
        top_k: int | None = None,
        task_run_id: str | None = None,
        since: _dt.datetime | None = None,
        until: _dt.datetime | None = None,
        timeout: float | None = None,
    ) -> list[EpisodeHit]:
        """Search this agent's episodes (hybrid), optionally within a task run or time range;
        ``top_k``: 1 to 1000 hits (``None``: ``search.top_k``). The list's ``degraded`` says when
        the model was late or faulty and keywords ranked alone."""
        if top_k is None:
            top_k = self._system.config.search.top_k
        message = SearchMemory(self.id, query, task_run_id, top_k, since, until)
        return self._search(self._system._runtime.search_memory, message, timeout)

    def commit(self, timeout: float | None = None) -> None:
        """Apply the episodic retention policy and checkpoint its database."""
        self._ask(CommitMemory(self.id), timeout)

    def list_episodes(
        self,
        *,
        task_run_id: str | None = None,
        since: _dt.datetime | None = None,
        until: _dt.datetime | None = None,
        limit: int = 100,
        offset: int = 0,
        newest_first: bool = True,
        timeout: float | None = None,
    ) -> list[Episode]:
        """The timeline of live episodes, newest first (``newest_first=False``: oldest first),
        within a task run and/or a time range (``since`` inclusive, ``until`` exclusive)."""
        message = ListEpisodes(self.id, task_run_id, since, until, limit, offset, newest_first)
        return list(self._ask(message, timeout).episodes)

    def get_episode(self, episode_id: int, *, timeout: float | None = None) -> Episode | None:
        """The live episode with this id, or ``None``."""
        return self._ask(GetEpisode(self.id, episode_id), timeout).episode  # type: ignore[no-any-return]

    def delete_episode(self, episode_id: int, *, timeout: float | None = None) -> bool:
        """Delete a live episode for good: no search finds it and no later archive holds it
        (its vector, text index and its words in its neighbours' context go too). True if it
        existed. Archive files written before keep their copy: they never change."""
        return bool(self._ask(DeleteEpisode(self.id, episode_id), timeout).deleted)

    def archive_episodes(
        self,
        path: str | Path | None = None,
        *,
        before: _dt.datetime | None = None,
        task_run_id: str | None = None,
        timeout: float | None = None,
    ) -> EpisodesArchived:
        """Move live episodes older than ``before`` (and/or of ``task_run_id``; all when neither
        is given) into one portable archive file; its ``archived`` counts them. ``path``
        defaults to ``{data_dir}/episodic/archives/{agent}-{time}.sqlite`` (``-2``, ``-3``, ...
        added when that name is taken, as on a manual clock); nothing selected
        writes no file. Archived episodes leave the timeline and :meth:`recall`;
        :meth:`restore_episodes` brings them back."""
        # no path: the agent's episodic actor names the file, one archive at a time, so callers
        # archiving at one time of a manual clock each get a name of their own
        message = ArchiveEpisodes(self.id, None if path is None else _absolute(path), before, task_run_id)
        return self._ask(message, timeout)  # type: ignore[no-any-return]

    def restore_episodes(self, path: str | Path, *, timeout: float | None = None) -> int:
        """Bring back the episodes of an archive file; returns how many were added (the same
        episode, by uuid and contents, live or deleted here is skipped, so restoring twice adds
        nothing; a different one under a uuid held here comes back under a new uuid)."""
        message = RestoreEpisodes(self.id, _absolute(path))
        return int(self._ask(message, timeout).restored)

    def promote_episode(
        self,
        episode_id: int,
        *,
        category: str = "outcome",
        scope: str = "/",
        store: str | None = None,
        timeout: float | None = None,
    ) -> KnowledgeEntry:
        """Copy a live episode into long-term knowledge (this agent's store, or ``"shared"``);
        returns the entry. It keeps the episode's tags plus ``episode_id`` and ``task_run_id``,
        so it says where it came from; promoting twice returns the same entry."""
        from memstrata.layers._episodic import promotion_tags

        target = self._store(store, False)
        episode = self.get_episode(episode_id, timeout=timeout)
        if episode is None:
            raise InvalidInputError(f"episode_id: agent {self.id!r} has no live episode {episode_id}")
        message = StoreKnowledge(
            target, episode.content, category, promotion_tags(episode), scope, author=self.id
        )
        entry_id = int(self._ask(message, timeout).entry_id)
        entry = self.get_knowledge(entry_id, store=target, timeout=timeout)
        if entry is None:  # deleted by someone else in between
            raise InvalidInputError(f"the entry promoted from episode {episode_id} was deleted meanwhile")
        return entry

    # -- task lifecycle ------------------------------------------------------------------------

    def begin_task(
        self,
        task_id: str,
        description: str,
        *,
        query: str | None = None,
        category: str | None = None,
        tags: Mapping[str, str] | None = None,
        scope: str | None = None,
        top_k: int | None = None,
    ) -> TaskPrompt:
        """The prompt for a task, within the agent's retrieval timeout (+1 s at most).

        Knowledge found -> ``<knowledge-context>`` + ``<task>``; nothing found, an error or the
        timeout -> the fallback prompt (the task alone) with ``fallback=True`` and a ``reason``.
        """
        message = TaskAssigned(task_id, description, self.id, query, category, tags, scope, top_k)  # type: ignore[arg-type]
        return self._system._runtime.begin_task(message)

    def complete_task(self, task_id: str, summary: str, *, timeout: float | None = None) -> WriteBackQueued:
        """Record the outcome: durable when this returns; stored as knowledge and episode soon after."""
        return self._ask(TaskCompleted(task_id, summary, self.id), timeout)  # type: ignore[no-any-return]

    def fail_task(self, task_id: str, reason: str, *, timeout: float | None = None) -> WriteBackQueued:
        """Record a failure: the reason becomes a ``pitfall`` (durable when this returns)."""
        return self._ask(TaskFailed(task_id, reason, self.id), timeout)  # type: ignore[no-any-return]

    # -- working memory ------------------------------------------------------------------------

    def set_working(
        self,
        key: str,
        value: Any,
        *,
        task_id: str | None = None,
        ttl_s: float | None = None,
        timeout: float | None = None,
    ) -> None:
        """Set a working-memory key (JSON data) in the space of ``task_id`` (omitted: the
        agent-wide space); ``ttl_s`` makes it expire. Ending a task clears its space only."""
        self._ask(SetWorkingMemory(self.id, key, value, ttl_s, task_id), timeout)

    def get_working(
        self, key: str, default: Any = None, *, task_id: str | None = None, timeout: float | None = None
    ) -> Any:
        """A copy of a working-memory value of that space (``task_id`` omitted: the agent-wide
        one), or ``default``."""
        reply = self._ask(GetWorkingMemory(self.id, key, task_id), timeout)
        return reply.value if reply.found else default

    def clear_working(
        self, key: str | None = None, *, task_id: str | None = None, timeout: float | None = None
    ) -> int:
        """Remove one key, or every key, of that space (``task_id`` omitted: the agent-wide
        one); the other spaces keep theirs. Returns how many keys were removed."""
        return int(self._ask(ClearWorkingMemory(self.id, key, task_id), timeout).removed)

    # -- raw messages --------------------------------------------------------------------------

    def _own(self, message: Message) -> Message:
        current = getattr(message, "agent_id", self.id)
        if current is None and isinstance(message, TaskAssigned | TaskCompleted | TaskFailed):
            import dataclasses

            return dataclasses.replace(message, agent_id=self.id)
        if current != self.id:
            raise InvalidInputError(f"message is for agent {current!r}, not {self.id!r}")
        return message

    def tell(self, message: Message) -> None:
        self._system.tell(self._own(message))

    def ask(self, message: Message, *, timeout: float | None = None) -> Any:
        return self._system.ask(self._own(message), timeout=timeout)
