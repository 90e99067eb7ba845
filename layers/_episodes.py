"""What live episodic stores and their archives share: the episode records, time handling,
argument checks, the ``episodes`` table and keyword scoring over it.

An archive file holds the same ``episodes`` table (and its full-text indexes) as a live store,
so every query here runs unchanged against either.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from memstrata.storage import Database, KeywordQuery, fts_schema

from memstrata.errors import InvalidInputError

__all__ = [
    "EMBED_CHARS",
    "EPISODE_COLUMNS",
    "Episode",
    "EpisodeHit",
    "check_aware",
    "check_kind",
    "check_optional_text",
    "check_tags",
    "embed_text",
    "episode_from_row",
    "episodes_schema",
    "from_us",
    "keyword_lists",
    "query_in",
    "time_conditions",
    "to_us",
]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_US = timedelta(microseconds=1)
_KIND = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
MAX_TITLE_CHARS = 1_000
MAX_LABEL_CHARS = 256  # task-run ids, tag keys
MAX_TAG_VALUE_CHARS = 4_096
MAX_TAGS = 256
# The models in use read a few hundred tokens; embedding megabytes of text only costs time.
EMBED_CHARS = 8_192
# content, title, identifier words: a title states what an episode was about
BM25_WEIGHTS = (1.0, 1.5, 1.0)

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

    @property
    def source(self) -> str:
        """``"live"`` or ``"archive"``."""
        return "live" if self.episode.archive is None else "archive"


# -- time ---------------------------------------------------------------------------------------


def check_aware(value: object, name: str) -> datetime:
    """``value`` as a timezone-aware datetime, or a one-line error naming ``name``."""
    if not isinstance(value, datetime):
        raise InvalidInputError(f"{name} must be a timezone-aware datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidInputError(
            f"{name} must be timezone-aware (e.g. datetime.now(timezone.utc)); got naive {value.isoformat()}"
        )
    try:
        value.astimezone(UTC)
    except OverflowError as exc:
        raise InvalidInputError(f"{name} is out of range in UTC: {value.isoformat()}") from exc
    return value


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


# -- argument checks ----------------------------------------------------------------------------


def _valid_unicode(value: str, name: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInputError(
            f"{name} is not valid Unicode text (lone surrogate at position {exc.start})"
        ) from exc
    return value


def check_kind(value: object, name: str = "kind") -> str:
    if not isinstance(value, str) or not _KIND.fullmatch(value):
        raise InvalidInputError(
            f"{name} must match [a-z0-9][a-z0-9_-]{{0,63}} (e.g. 'note', 'task-outcome'); got {value!r}"
        )
    return value


def check_optional_text(value: object, name: str, max_chars: int) -> str | None:
    """``None`` or a non-empty string of at most ``max_chars`` characters (``""`` counts as None)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidInputError(f"{name} must be a string or None, got {type(value).__name__}")
    if value == "":
        return None
    if len(value) > max_chars:
        raise InvalidInputError(f"{name} is {len(value)} characters long; the limit is {max_chars}")
    return _valid_unicode(value, name)


def check_content(value: object, name: str, max_bytes: int) -> str:
    if not isinstance(value, str):
        raise InvalidInputError(f"{name} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise InvalidInputError(f"{name} must not be empty")
    size = len(_valid_unicode(value, name).encode("utf-8"))
    if size > max_bytes:
        raise InvalidInputError(
            f"{name} is {size} bytes of UTF-8; the limit is {max_bytes} (max_content_bytes)"
        )
    return value


def check_tags(value: object, name: str = "tags") -> dict[str, str]:
    """``dict[str, str]``; a bare tag is a key with the value ``""``."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidInputError(f"{name} must be a mapping of strings to strings, got {type(value).__name__}")
    if len(value) > MAX_TAGS:
        raise InvalidInputError(f"{name} has {len(value)} entries; the limit is {MAX_TAGS}")
    tags: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not key or len(key) > MAX_LABEL_CHARS:
            raise InvalidInputError(
                f"{name} keys must be non-empty strings of at most {MAX_LABEL_CHARS} characters, got {key!r}"
            )
        if not isinstance(item, str) or len(item) > MAX_TAG_VALUE_CHARS:
            raise InvalidInputError(
                f"{name}[{key!r}] must be a string of at most {MAX_TAG_VALUE_CHARS} characters, "
                f"got {type(item).__name__}"
            )
        tags[_valid_unicode(key, f"{name} key")] = _valid_unicode(item, f"{name}[{key!r}]")
    return dict(sorted(tags.items()))


def embed_text(title: str | None, content: str) -> str:
    """The text whose vector represents an episode: its title, then its content."""
    text = f"{title}\n\n{content}" if title else content
    return text[:EMBED_CHARS]


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

Scored = list[tuple[int, float, int]]  # (id, score where higher is better, at_us)


def keyword_lists(
    db: Database, query: KeywordQuery, limit: int, conds: Sequence[str], params: Sequence[Any]
) -> list[Scored]:
    """Ranked keyword sub-lists of one store: words by BM25, CJK runs by trigram BM25, short
    CJK runs by LIKE (newest first). Scores of one sub-list compare across stores."""
    if query.empty or limit <= 0:
        return []
    extra = "".join(f" AND {c}" for c in conds)
    out: list[Scored] = []
    weights = ", ".join(str(w) for w in BM25_WEIGHTS)
    if query.words:
        sql = (
            f"SELECT e.id, bm25(episodes_fts, {weights}) AS s, e.at_us FROM episodes_fts "
            f"JOIN episodes e ON e.id = episodes_fts.rowid WHERE episodes_fts MATCH ?{extra} "
            "ORDER BY s LIMIT ?"
        )
        out.append([(int(i), -float(s), int(a)) for i, s, a in db.query(sql, (query.words, *params, limit))])
    if query.cjk:
        sql = (
            "SELECT e.id, bm25(episodes_tri) AS s, e.at_us FROM episodes_tri "
            f"JOIN episodes e ON e.id = episodes_tri.rowid WHERE episodes_tri MATCH ?{extra} "
            "ORDER BY s LIMIT ?"
        )
        out.append([(int(i), -float(s), int(a)) for i, s, a in db.query(sql, (query.cjk, *params, limit))])
    if query.cjk_short:
        likes = " OR ".join("e.content LIKE ? OR e.title LIKE ?" for _ in query.cjk_short)
        like_params = [p for run in query.cjk_short for p in (f"%{run}%", f"%{run}%")]
        sql = (
            f"SELECT e.id, e.at_us FROM episodes e WHERE ({likes}){extra} "
            "ORDER BY e.at_us DESC, e.id DESC LIMIT ?"
        )
        out.append([(int(i), float(a), int(a)) for i, a in db.query(sql, (*like_params, *params, limit))])
    return out
