"""The registry's result types (roots, hits, file text) and row/JSON conversions, apart from its logic."""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import orjson

from memstrata.layers import SearchHits

if TYPE_CHECKING:
    from memstrata.layers import FileHit

__all__ = ["KINDS", "FileText", "Kind", "Workspace", "WorkspaceHit", "WorkspaceHits"]

Kind = Literal["memory", "code"]
KINDS: tuple[Kind, ...] = ("memory", "code")


class _Record:
    """A result whose ``as_dict`` is its fields as JSON-ready values, in their order."""

    __slots__ = ()

    def as_dict(self) -> dict[str, Any]:
        plain: dict[str, Any] = _plain(self)
        return plain


@dataclass(frozen=True, slots=True)
class Workspace(_Record):
    """One indexed root."""

    root: Path
    kind: Kind
    db_path: Path
    added_at: dt.datetime
    last_sync_at: dt.datetime | None
    last_stats: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class WorkspaceHit(_Record):
    """A file-search hit with the root it came from (``path`` is relative to ``root``)."""

    root: Path
    kind: Kind
    path: str
    start_line: int
    end_line: int
    score: float
    snippet: str
    match_type: str
    language: str | None = None
    similarity: float | None = None  # cosine similarity with the query, when known

    @property
    def absolute_path(self) -> Path:
        return self.root / self.path


@dataclass(frozen=True, slots=True)
class FileText(_Record):
    """Lines read back from an indexed file: ``lines`` counts the lines in ``text`` (a blank
    line counts), so ``0`` says ``from_line`` is past the end of the file."""

    root: Path
    kind: Kind
    path: str
    from_line: int
    lines: int
    text: str


class WorkspaceHits(SearchHits[WorkspaceHit]):
    """Hits across roots, best first. ``complete`` is False when some root's sync ran out of its
    budget before the search (files not indexed yet were not searched); ``warnings`` names the
    roots that were skipped (a folder that is gone, an index that cannot be opened or searched)
    and why a root's hits may be stale; ``degraded`` says why some root's ranking is not the
    hybrid one (e.g. the query embedding failed: ranked by keywords), the distinct reasons of the
    roots joined by ``; ``, else ``None``."""


def _row_to_workspace(row: Any) -> Workspace:
    root, kind, db_path, added_at, last_sync_at, last_stats = row
    return Workspace(
        root=Path(root),
        kind=kind,
        db_path=Path(db_path),
        added_at=dt.datetime.fromisoformat(added_at),
        last_sync_at=dt.datetime.fromisoformat(last_sync_at) if last_sync_at else None,
        last_stats=orjson.loads(last_stats) if last_stats else None,
    )


def _hit(ws: Workspace, hit: FileHit) -> WorkspaceHit:
    return WorkspaceHit(
        ws.root,
        ws.kind,
        hit.path,
        hit.start_line,
        hit.end_line,
        hit.score,
        hit.snippet,
        hit.match_type,
        hit.language,
        hit.similarity,
    )


def _stats_dict(stats: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(stats) and not isinstance(stats, type):
        return _plain(stats)  # type: ignore[no-any-return]
    if isinstance(stats, dict):
        return stats
    return {"value": str(stats)}


def _plain(value: Any) -> Any:
    """Dataclasses, paths and datetimes as plain JSON-ready values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    return value
