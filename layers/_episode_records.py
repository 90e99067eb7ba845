"""What live episodic stores and their archives share: the episode records, time handling, the
``episodes`` table, how it is found by keywords and the neighbouring-turn context (argument
checks: :mod:`memstrata.core.validation`).

An archive file holds the same ``episodes`` table (and its full-text indexes) as a live store,
so every query here runs unchanged against either.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from memstrata.core.constants import EMBED_CHARS
from memstrata.storage import FTS_TOKENIZER, Database, KeywordTable, fts_schema

__all__ = [
    "EPISODE_COLUMNS",
    "EPISODE_KEYWORDS",
    "Episode",
    "EpisodeHit",
    "context_holders",
    "embed_text",
    "episode_from_row",
    "episodes_schema",
    "from_us",
    "has_context",
    "neighbouring_episodes",
    "query_in",
    "refresh_context",
    "time_conditions",
    "to_us",
]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_US = timedelta(microseconds=1)
# content, title, identifier words: a title states what an episode was about
BM25_WEIGHTS = (1.0, 1.5, 1.0)

# Neighbouring episodes of the same task run (turns of one conversation), indexed as each
# episode's context: a turn alone is a poor document ("Yes, last weekend!"), and the question
# about it usually uses its neighbours' words. The context's BM25 counts with this weight.
CONTEXT_TURNS = 2  # on each side
CONTEXT_WEIGHT = 0.4
CONTEXT_CHARS = 600  # of each neighbour
CONTEXT_SCHEMA = (
    f"CREATE VIRTUAL TABLE IF NOT EXISTS episodes_ctx USING fts5(context, tokenize='{FTS_TOKENIZER}')",
    "CREATE TRIGGER IF NOT EXISTS episodes_ctx_ad AFTER DELETE ON episodes BEGIN "
    "DELETE FROM episodes_ctx WHERE rowid = old.id; END",
)

EPISODE_COLUMNS = "id, uuid, at_us, kind, task_run_id, title, content, tags, recorded_us"


@dataclass(frozen=True, slots=True)
class Episode:
    """One thing an agent experienced. ``at`` is UTC-aware; ``uuid`` never changes, even across
    archive and restore; ``archive`` is the archive file holding it, ``None`` for live episodes."""

    id: int
    content: str
    title: str | None
    task_run_id: str | None
    tags: dict[str, str]
    kind: str
    at: datetime
    uuid: str
    archive: str | None = None

    @property
    def archived(self) -> bool:
        return self.archive is not None


@dataclass(frozen=True, slots=True)
class EpisodeHit:
    """A search result: ``score`` is the fused 0..1 score (after recency decay when asked)."""

    episode: Episode
    score: float
    match_type: str  # "semantic", "keyword" or "hybrid"
    similarity: float | None = None  # cosine similarity to the query, when vectors exist
    vector_rank: int | None = None
    keyword_rank: int | None = None
    # conversation mode (``search(neighbours=n)``): the episodes of the same task run just
    # before and after this one, in time order, so a turn is read with what it answers
    neighbours: tuple[Episode, ...] = ()

    @property
    def source(self) -> str:
        """``"live"`` or ``"archive"``."""
        return "live" if self.episode.archive is None else "archive"


# -- time ---------------------------------------------------------------------------------------


def to_us(value: datetime) -> int:
    """Microseconds since the Unix epoch, exact (no float rounding)."""
    return (value - _EPOCH) // _ONE_US


def from_us(value: int) -> datetime:
    return _EPOCH + timedelta(microseconds=int(value))


def time_conditions(
    since_us: int | None, until_us: int | None, task_run_id: str | None, alias: str = "e"
) -> tuple[list[str], list[Any]]:
    """SQL conditions on an ``episodes`` row: ``since`` inclusive, ``until`` exclusive."""
    conds: list[str] = []
    params: list[Any] = []
    if since_us is not None:
        conds.append(f"{alias}.at_us >= ?")
        params.append(since_us)
    if until_us is not None:
        conds.append(f"{alias}.at_us < ?")
        params.append(until_us)
    if task_run_id is not None:
        conds.append(f"{alias}.task_run_id = ?")
        params.append(task_run_id)
    return conds, params


def embed_text(title: str | None, content: str, at_us: int | None = None) -> str:
    """The text whose vector represents an episode: its title, its content, then its date.

    The date lets a question about when something happened ("in May 2023") lean towards the
    episodes of that time. It goes last: put first, it pulled the vectors of one day's turns
    together and cost 0.024 of evidence recall@5 on conversations (``bench_quality``).
    """
    text = f"{title}\n\n{content}" if title else content
    if at_us is None:
        return text[:EMBED_CHARS]
    day = from_us(at_us)
    return f"{text[: EMBED_CHARS - 20]} ({day.day} {day:%B %Y})"


# -- rows ---------------------------------------------------------------------------------------


def episodes_schema(*, archive: bool) -> str:
    """The ``episodes`` table and its full-text indexes; ids never reused in a live store.

    An archive never changes once written, so its indexes have no triggers: they are built in
    one pass (``'rebuild'``) after the rows are in, several times faster than row by row.
    """
    key = "INTEGER PRIMARY KEY" if archive else "INTEGER PRIMARY KEY AUTOINCREMENT"
    fts = fts_schema("episodes", ["content", "title", "ident"])
    if archive:
        fts = re.sub(r"CREATE TRIGGER .*?\bEND;", "", fts, flags=re.S).strip()
    return (
        f"CREATE TABLE episodes (\n"
        f"  id {key},\n"
        "  uuid TEXT NOT NULL UNIQUE,\n"
        "  at_us INTEGER NOT NULL,\n"
        "  kind TEXT NOT NULL,\n"
        "  task_run_id TEXT,\n"
        "  title TEXT,\n"
        "  content TEXT NOT NULL,\n"
        "  tags TEXT NOT NULL DEFAULT '{}',\n"
        "  ident TEXT NOT NULL DEFAULT '',\n"
        "  recorded_us INTEGER NOT NULL\n"
        ");\n"
        "CREATE INDEX episodes_at ON episodes(at_us, id);\n"
        "CREATE INDEX episodes_run ON episodes(task_run_id, at_us, id);\n" + fts
    )


def dump_tags(tags: Mapping[str, str]) -> str:
    return orjson.dumps(dict(tags), option=orjson.OPT_SORT_KEYS).decode("utf-8")


def load_tags(text: str) -> dict[str, str]:
    value = orjson.loads(text)
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ValueError("tags are not an object of strings")
    return value


def episode_from_row(row: Sequence[Any], archive: str | None = None) -> Episode:
    """An :class:`Episode` from a row selected as :data:`EPISODE_COLUMNS`."""
    ident, uuid, at_us, kind, run, title, content, tags, _recorded = row
    return Episode(
        id=int(ident),
        content=str(content),
        title=None if title is None else str(title),
        task_run_id=None if run is None else str(run),
        tags=load_tags(tags),
        kind=str(kind),
        at=from_us(at_us),
        uuid=str(uuid),
        archive=archive,
    )


def query_in(db: Database, sql: str, values: Sequence[Any], *, batch: int = 500) -> list[Any]:
    """Rows of ``sql + " (?, ?, ...)"`` for all ``values``, in batches (SQLite caps parameters).

    ``sql`` ends with ``IN``; a ``DELETE`` works too (it returns no rows).
    """
    rows: list[Any] = []
    for start in range(0, len(values), batch):
        part = list(values[start : start + batch])
        rows.extend(db.query(f"{sql} ({','.join('?' * len(part))})", part))
    return rows


# -- keyword side -------------------------------------------------------------------------------

# how episodes are found by keywords (:class:`storage.KeywordIndex`): words of content, title and
# identifiers by BM25, plus the neighbouring turns' words at ``CONTEXT_WEIGHT``; CJK runs by
# trigrams; runs too short for trigrams by substring, newest first
EPISODE_KEYWORDS = KeywordTable(
    table="episodes",
    columns=("content", "title", "ident"),
    weights=BM25_WEIGHTS,
    like_columns=("content", "title"),
    like_order="at_us",
    context=("episodes_ctx", ("context",), CONTEXT_WEIGHT),
)


def has_context(db: Database) -> bool:
    """Whether this store indexes neighbouring episodes (archives do not; a store without task
    runs has none), so the context query is skipped where it cannot match."""
    if db.scalar("SELECT 1 FROM sqlite_master WHERE name = 'episodes_ctx'") is None:
        return False
    return db.scalar("SELECT 1 FROM episodes_ctx LIMIT 1") is not None


def _context_windows(db: Database, ids: Sequence[int]) -> Iterator[tuple[list[int], set[int]]]:
    """Per task run of ``ids``: its episodes in time order around them (``2 * CONTEXT_TURNS``
    beyond the first and the last, so each affected episode's own neighbours are there), and the
    positions in that order of the episodes whose context holds one of ``ids`` (``ids``
    included). The runs' order is read from their index alone (``episodes_run`` covers it)."""
    runs: dict[str, list[tuple[int, int]]] = {}
    sql = "SELECT task_run_id, at_us, id FROM episodes WHERE task_run_id IS NOT NULL AND id IN"
    for run, at_us, ident in query_in(db, sql, list(ids)):
        runs.setdefault(str(run), []).append((int(at_us), int(ident)))
    reach = 2 * CONTEXT_TURNS  # an affected neighbour needs its own neighbours
    for run, keys in runs.items():
        low, high = min(keys), max(keys)
        # one statement a run (each one waits for the interpreter lock again under load): the
        # ``reach`` before the first, those from the first to the last, the ``reach`` after it
        window = db.query(
            "SELECT at_us, id FROM (SELECT at_us, id FROM episodes WHERE task_run_id = ?1 "
            "AND (at_us, id) < (?2, ?3) ORDER BY at_us DESC, id DESC LIMIT ?6) "
            "UNION ALL SELECT at_us, id FROM episodes WHERE task_run_id = ?1 "
            "AND (at_us, id) >= (?2, ?3) AND (at_us, id) <= (?4, ?5) "
            "UNION ALL SELECT at_us, id FROM (SELECT at_us, id FROM episodes WHERE task_run_id = ?1 "
            "AND (at_us, id) > (?4, ?5) ORDER BY at_us, id LIMIT ?6)",
            (run, *low, *high, reach),
        )
        order = [int(ident) for _, ident in sorted((int(a), int(i)) for a, i in window)]
        position = {ident: n for n, ident in enumerate(order)}
        affected: set[int] = set()
        for _, ident in keys:
            n = position[ident]
            affected.update(range(max(0, n - CONTEXT_TURNS), min(len(order), n + CONTEXT_TURNS + 1)))
        yield order, affected


def context_holders(db: Database, ids: Sequence[int]) -> list[int]:
    """The episodes, other than ``ids``, whose context holds one of ``ids``: their neighbours,
    whose context is to be refreshed (:func:`refresh_context`) once ``ids`` are deleted."""
    if not ids:
        return []
    gone = set(ids)
    near = {order[n] for order, affected in _context_windows(db, ids) for n in affected}
    return sorted(near - gone)


def refresh_context(db: Database, ids: Sequence[int]) -> None:
    """Index the context of the episodes ``ids`` and of their neighbours, whose context now
    holds them; run inside the transaction that inserted ``ids`` (or, given the
    :func:`context_holders` of deleted episodes, that deleted them).

    The contexts of a whole batch are written at the end, in ascending rowid order: FTS5 keeps
    pending rows in memory only while rowids ascend and flushes a segment to disk whenever one
    goes back, and a batch of backdated episodes spread over many task runs wrote its runs one
    after the other (5,000 episodes into 30,000: 2.6 s of segment flushes). Only the texts
    needed are read.
    """
    if not ids:
        return
    contexts: dict[int, list[int]] = {}  # an affected episode -> its neighbours, in time order
    for order, affected in _context_windows(db, ids):
        for n in affected:
            contexts[order[n]] = order[max(0, n - CONTEXT_TURNS) : n] + order[n + 1 : n + CONTEXT_TURNS + 1]
    needed = sorted({i for near in contexts.values() for i in near})
    texts = {
        int(i): str(c)[:CONTEXT_CHARS]
        for i, c in query_in(db, "SELECT id, content FROM episodes WHERE id IN", needed)
    }
    lone = sorted(ident for ident, near in contexts.items() if not near)
    query_in(db, "DELETE FROM episodes_ctx WHERE rowid IN", lone)
    db.executemany(
        "INSERT OR REPLACE INTO episodes_ctx(rowid, context) VALUES (?, ?)",
        [
            (ident, "\n".join(texts[i] for i in contexts[ident]))
            for ident in sorted(contexts)
            if contexts[ident]
        ],
    )


MAX_NEIGHBOURS = 20


def neighbouring_episodes(db: Database, episode: Episode, count: int) -> tuple[Episode, ...]:
    """Up to ``count`` episodes of ``episode``'s task run on each side of it, in time order
    (the episode itself included), or ``()`` for an episode outside any task run."""
    if episode.task_run_id is None or count <= 0:
        return ()
    key = (episode.task_run_id, to_us(episode.at), episode.id)
    before = db.query(
        f"SELECT {EPISODE_COLUMNS} FROM episodes WHERE task_run_id = ? AND (at_us, id) < (?, ?) "
        "ORDER BY at_us DESC, id DESC LIMIT ?",
        (*key, count),
    )
    after = db.query(
        f"SELECT {EPISODE_COLUMNS} FROM episodes WHERE task_run_id = ? AND (at_us, id) > (?, ?) "
        "ORDER BY at_us, id LIMIT ?",
        (*key, count),
    )
    near = [episode_from_row(r, episode.archive) for r in reversed(before)]
    return (*near, episode, *(episode_from_row(r, episode.archive) for r in after))
