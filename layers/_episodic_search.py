"""Episodic search: argument checks, the query vector (given, or embedded once), the sources
(live store and archives, with their vector matrices and keyword indexes) and the hits'
conversation neighbours; the ranking itself is :class:`._episodic_ranking._Search`."""

from __future__ import annotations

import os
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

from memstrata.core.constants import EMBED_CHARS
from memstrata.core.errors import (
    ArchiveError,
    EmbeddingError,
    InvalidInputError,
)
from memstrata.core.validation import (
    check_task_id,
    check_top_k,
)
from memstrata.storage import (
    FloatArray,
    KeywordIndex,
    KeywordQuery,
    build_keyword_query,
    embed_query,
    validate_mode,
)

from ._archive import ArchiveFile
from ._episode_records import (
    EPISODE_KEYWORDS,
    MAX_NEIGHBOURS,
    EpisodeHit,
    neighbouring_episodes,
    time_conditions,
    to_us,
)
from ._episode_vectors import EpisodeVectors
from ._episodic_base import log
from ._episodic_inputs import DEFAULT, _Default, _positive_timedelta
from ._episodic_ranking import _Search
from ._episodic_state import _Source
from ._episodic_writes import EpisodicWrites


class EpisodicSearch(EpisodicWrites):
    """Hybrid search over live episodes and archives (see ``EpisodicMemory``)."""

    def search(
        self,
        query: str,
        *,
        top_k: int = 10,
        task_run_id: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        mode: str = "hybrid",
        recency_half_life: timedelta | _Default | None = DEFAULT,
        include_archives: bool = False,
        neighbours: int = 0,
        query_vector: FloatArray | None = None,
    ) -> list[EpisodeHit]:
        """Hybrid search, best first: vector and keyword lists fused by weighted RRF
        (``storage.fuse``); an episode's keyword side also counts the words of its neighbours
        in the same task run, at a lower weight.

        Filters are exact: ``task_run_id`` equality, ``since`` inclusive, ``until`` exclusive.
        ``recency_half_life`` multiplies each fused score by ``0.5 ** (age / half_life)``
        (``None``: no decay; default: the store's setting). ``include_archives`` also searches
        the archives this store created; their hits have ``hit.source == "archive"``.
        ``neighbours`` (conversation mode, for episodes that are turns of a dialogue) returns with
        each hit the ``neighbours`` episodes of its task run before and after it
        (``hit.neighbours``, in time order, the hit included). Any string is a valid query.
        ``query_vector`` replaces embedding the query (a vector of the store's model, computed
        once by a caller that searches several stores).
        """
        self._open_db()
        if not isinstance(query, str):
            raise InvalidInputError(f"query must be a string, got {type(query).__name__}")
        check_top_k(top_k)
        run = check_task_id(task_run_id, "task_run_id", optional=True)
        since_us, until_us = self._bounds(since, until)
        mode = validate_mode(mode)
        if recency_half_life is DEFAULT:
            half_life = self._half_life
        elif recency_half_life is None:
            half_life = None
        else:
            half_life = _positive_timedelta(recency_half_life, "recency_half_life")
        if not isinstance(include_archives, bool):
            raise InvalidInputError(f"include_archives must be True or False, got {include_archives!r}")
        if (
            isinstance(neighbours, bool)
            or not isinstance(neighbours, int)
            or not 0 <= neighbours <= MAX_NEIGHBOURS
        ):
            raise InvalidInputError(
                f"neighbours must be an integer from 0 to {MAX_NEIGHBOURS}, got {neighbours!r}"
            )
        now_us = to_us(self._now()) if half_life is not None else 0
        given = self._checked_vector(query_vector, "query_vector") if mode != "keyword" else None

        if not query.strip() and given is None:
            return []
        keywords = build_keyword_query(query) if mode != "vector" else KeywordQuery(None, None, ())
        query_vector = given
        if query_vector is None and mode != "keyword" and self._embedder is not None:
            try:
                query_vector = embed_query(self._embedder, query[:EMBED_CHARS])
            except EmbeddingError as exc:
                self._last_error = str(exc)
                if mode == "vector":  # nothing else was asked for: an empty answer would be wrong
                    raise
                log.warning(
                    "episodic %s: searching by keywords only, the embedder failed: %s", self.path, exc
                )
        if query_vector is None and keywords.empty:
            return []

        matrix = self._matrix_now() if query_vector is not None else None
        sources = [_Source(self._db, None, matrix, keywords=self._keywords)]
        if include_archives:
            sources.extend(self._archive_sources(since_us, until_us, query_vector is not None))
        if query_vector is not None:
            for source in sources:
                if source.matrix is not None:
                    source.ranking = source.matrix.rank(
                        query_vector, since_us=since_us, until_us=until_us, task_run_id=run
                    )
        hits = _Search(
            self,
            sources,
            query_vector,
            query,
            keywords,
            time_conditions(since_us, until_us, run),
            top_k=top_k,
            half_life_us=None if half_life is None else half_life / timedelta(microseconds=1),
            now_us=now_us,
        ).run()
        if neighbours:
            databases = {s.label: s.db for s in sources}
            hits = [
                replace(
                    h, neighbours=neighbouring_episodes(databases[h.episode.archive], h.episode, neighbours)
                )
                if h.episode.archive in databases
                else h
                for h in hits
            ]
        return hits

    def _archive_sources(self, since_us: int | None, until_us: int | None, vectors: bool) -> list[_Source]:
        sources = []
        rows = self._db.query("SELECT path, first_at_us, last_at_us FROM archives ORDER BY created_us, path")
        for path, first, last in rows:
            if first is not None and until_us is not None and first >= until_us:
                continue
            if last is not None and since_us is not None and last < since_us:
                continue
            archive = self._archive(path)
            if archive is None:
                continue
            matrix = None
            if vectors and self._embedder is not None:
                matrix = self._archive_matrix(path, archive)
            keywords = self._archive_keywords.get(path)
            if keywords is None:
                keywords = self._archive_keywords[path] = KeywordIndex(archive.db, EPISODE_KEYWORDS)
            sources.append(_Source(archive.db, path, matrix, archive, keywords=keywords))
        return sources

    def _archive(self, path: str) -> ArchiveFile | None:
        """A tracked archive, opened once and reopened if the file changes; ``None`` if unusable."""
        try:
            stat = os.stat(path)
            signature = (stat.st_mtime_ns, stat.st_size)
        except OSError as exc:
            self._archive_unusable(path, f"cannot read it: {exc.strerror or exc}")
            return None
        cached = self._archives.get(path)
        if cached is not None and cached[0] == signature:
            return cached[1]
        if cached is not None:
            cached[1].close()
            del self._archives[path]
            self._matrices.pop(path, None)
            self._archive_keywords.pop(path, None)
        try:
            archive = ArchiveFile(Path(path), verify=False)
        except ArchiveError as exc:
            self._archive_unusable(path, str(exc))
            return None
        self._archives[path] = (signature, archive)
        self._archive_problems.pop(path, None)
        return archive

    def _archive_unusable(self, path: str, problem: str) -> None:
        if self._archive_problems.get(path) != problem:
            log.warning("episodic archive %s is skipped: %s", path, problem)
        self._archive_problems[path] = problem

    def _archive_matrix(self, path: str, archive: ArchiveFile) -> EpisodeVectors | None:
        """The archive's vectors, if the current model made them (else it is searched by keywords)."""
        embedder = self._embedder
        if embedder is None or archive.model_id != embedder.model_id or archive.dim != embedder.dim:
            return None
        if path not in self._matrices:
            try:
                self._matrices[path] = archive.matrix()
            except ArchiveError as exc:
                self._archive_unusable(path, str(exc))
                self._matrices[path] = None
        return self._matrices[path]
