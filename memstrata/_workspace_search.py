"""One ranking of the hits of several indexed roots, as if they were one index.

Each root's search normalises its fused scores to its own lists: a root whose keyword search
matched nothing ranks by its vector list alone, so its nearest chunk scores 1.0 however far it is
from the query. Scores of two roots are not on one scale, so the merge does not compare them. It
fuses again, as :func:`memstrata.layers.merge_hits` does for knowledge stores:
- one vector list of the roots' semantic and hybrid hits by cosine similarity (every root of a
  registry embeds with the one model the registry holds);
- one keyword list of their keyword and hybrid hits in which the roots take turns (BM25 scores
  depend on each root's word statistics), each root's in the order it ranked them;
- the same weighted RRF with the search settings and the query's adaptive weight.
Ties keep the roots' order (memory workspaces first, then registration order), then each root's.
A merged hit's ``score`` is that of the merged lists; the hits of a single root keep its ranking.
:func:`ranked_hits` and :func:`fuse_hits` are that rule for any searches' hits (the
``memory_search`` tool merges the files' hits with the saved memories' by it).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from memstrata.core.config import SearchConfig
from memstrata.core.errors import InvalidInputError
from memstrata.storage import fusion_weights, rrf

from ._workspace_results import Workspace, WorkspaceHit, WorkspaceHits, _hit

__all__ = ["Ranked", "fuse_hits", "merge_roots", "missing_warning", "ranked_hits", "search_roots"]

log = logging.getLogger("memstrata.files")

# what each root answered: its registration and its hits (FileHit), best first
RootHits = Sequence[tuple[Workspace, Sequence[Any]]]


@dataclasses.dataclass(frozen=True, slots=True)
class Ranked:
    """A hit of one of the searches merged, with its places in that search's lists."""

    hit: Any  # with ``match_type``, ``similarity`` and ``score``
    source: int  # the search's place among those merged: the earlier wins a tie
    similarity: float | None  # cosine similarity with the query
    vector_rank: int | None  # 1-based place among its search's semantic and hybrid hits
    keyword_rank: int | None  # 1-based place among its search's keyword and hybrid hits


@dataclasses.dataclass(frozen=True, slots=True)
class _Candidate:
    ws: Workspace
    ranked: Ranked  # its hit is a FileHit, its source the root's place among the roots searched
    position: int  # 1-based place in its root's hits

    @property
    def place(self) -> tuple[Path, int, int]:
        hit = self.ranked.hit
        return (self.ws.root / hit.path, hit.start_line, hit.end_line)


def search_roots(
    roots: Sequence[Workspace],
    using: Callable[[Workspace], AbstractContextManager[Any]],
    query: str,
    *,
    limit: int,
    floor: float | None,
    min_score: float | None,
    language: str | None,
    alone: bool,
    search: SearchConfig,
) -> WorkspaceHits:
    """The best ``limit`` hits of ``roots``, each searched through the layer ``using`` opens.

    A root whose folder is gone, or whose index cannot be opened or searched, is skipped and
    named in ``warnings``; unless it is the one root asked for (``alone``), or its layer refuses
    an argument (the same for every root): then the error is raised."""
    answers: list[tuple[Workspace, Any]] = []
    warnings: list[str] = []
    for ws in roots:
        if not ws.root.is_dir():
            warnings.append(missing_warning(ws))
            continue
        opened = False
        try:
            with using(ws) as layer:
                opened = True
                found = _search_layer(layer, ws, query, limit, floor, min_score, language)
                problem = getattr(layer, "sync_error", None)
        except Exception as exc:
            if not ws.root.is_dir():
                warnings.append(missing_warning(ws))  # removed while it was being searched
                continue
            if alone or (opened and isinstance(exc, InvalidInputError)):
                raise
            warnings.append(_skipped_warning(ws, exc))
            continue
        if problem:  # answered from what was indexed before: say so
            warnings.append(f"{ws.root} ({ws.kind}): {problem}")
        answers.append((ws, found))
    return WorkspaceHits(
        merge_roots(answers, limit, query=query, search=search),
        complete=all(bool(getattr(found, "complete", True)) for _, found in answers),
        warnings=warnings,
        degraded=_joined_degraded(answers),
    )


def _search_layer(
    layer: Any,
    ws: Workspace,
    query: str,
    limit: int,
    floor: float | None,
    min_score: float | None,
    language: str | None,
) -> Any:
    """One root's search: a memory workspace with the cosine floor ``floor``; a codebase ranks
    by its lists, with a floor only when the caller gave ``min_score``."""
    if ws.kind == "memory":
        return layer.search(query, max_results=limit, min_score=floor, language=language)
    return layer.search(query, top_k=limit, language=language, min_score=min_score)


def merge_roots(found: RootHits, limit: int, *, query: str, search: SearchConfig) -> list[WorkspaceHit]:
    """The best ``limit`` hits of the roots ranked as one index would rank them (see the module).
    Lines that roots inside one another (or one folder of both kinds) both hold come once."""
    pool = _distinct(_candidates(found))
    roots = {c.ranked.source: c.ws for c in pool}
    fused = fuse_hits([c.ranked for c in pool], limit, query=query, search=search)
    return [dataclasses.replace(_hit(roots[r.source], r.hit), score=score) for r, score in fused]


def ranked_hits(hits: Sequence[Any], source: int, *, by_ranks: bool = False) -> list[Ranked]:
    """One search's hits (best first, each with ``match_type`` and ``similarity``) with their
    places among its semantic and among its keyword hits: in its order or, ``by_ranks``, in
    the order of their own ``vector_rank`` and ``keyword_rank`` (a store's lists before fusion)."""
    semantic = [n for n, hit in enumerate(hits) if hit.match_type != "keyword"]
    keyword = [n for n, hit in enumerate(hits) if hit.match_type != "semantic"]
    if by_ranks:
        semantic.sort(key=lambda n: hits[n].vector_rank or 0)
        keyword.sort(key=lambda n: hits[n].keyword_rank or 0)
    vector_rank = {n: rank for rank, n in enumerate(semantic, 1)}
    keyword_rank = {n: rank for rank, n in enumerate(keyword, 1)}
    return [
        Ranked(hit, source, hit.similarity, vector_rank.get(n), keyword_rank.get(n))
        for n, hit in enumerate(hits)
    ]


def fuse_hits(
    pool: Sequence[Ranked], limit: int, *, query: str, search: SearchConfig, one_model: bool = True
) -> list[tuple[Ranked, float]]:
    """The best ``limit`` of several searches' hits with their merged scores (see the module):
    the vector list by similarity when ``one_model`` embedded every search (else the searches
    take turns, as in the keyword list), ties in source order. The hits of a single search keep
    its order and scores."""
    if len({r.source for r in pool}) <= 1:
        return [(r, float(r.hit.score)) for r in pool[:limit]]
    by_vector = sorted(
        (n for n, r in enumerate(pool) if r.vector_rank is not None),
        key=(lambda n: (-(pool[n].similarity or 0.0), pool[n].source, pool[n].vector_rank))
        if one_model
        else (lambda n: (pool[n].vector_rank, pool[n].source)),
    )
    by_keyword = sorted(
        (n for n, r in enumerate(pool) if r.keyword_rank is not None),
        key=lambda n: (pool[n].keyword_rank, pool[n].source),
    )
    lists = [ranked for ranked in (by_vector, by_keyword) if ranked]
    weights = fusion_weights(
        bool(by_vector),
        bool(by_keyword),
        search.vector_weight,
        search.keyword_weight,
        query=query,
        k=search.rrf_k,
    )
    return [(pool[f.key], f.score) for f in rrf(lists, k=search.rrf_k, weights=weights, limit=limit)]


def _candidates(found: RootHits) -> list[_Candidate]:
    """Every root's hits in root order, each with its places in its root's lists."""
    out = []
    for root_order, (ws, hits) in enumerate(found):
        for position, ranked in enumerate(ranked_hits(hits, root_order), 1):
            out.append(_Candidate(ws, ranked, position))
    return out


def _distinct(pool: list[_Candidate]) -> list[_Candidate]:
    """Each file's lines once: the copy its root ranked higher (the first root's on a tie)."""
    first: dict[tuple[Path, int, int], int] = {}
    for n in sorted(range(len(pool)), key=lambda n: (pool[n].position, pool[n].ranked.source)):
        first.setdefault(pool[n].place, n)
    kept = set(first.values())
    return [c for n, c in enumerate(pool) if n in kept]


def _joined_degraded(found: RootHits) -> str | None:
    """Why some root's ranking is not the hybrid one: the distinct reasons, in root order."""
    reasons = dict.fromkeys(str(why) for _, hits in found if (why := getattr(hits, "degraded", None)))
    return "; ".join(reasons) or None


def missing_warning(ws: Workspace) -> str:
    return (
        f"{ws.kind} root {str(ws.root)!r} is missing (deleted or not mounted): skipped "
        "(forget_root removes it from the index)"
    )


def _skipped_warning(ws: Workspace, exc: BaseException) -> str:
    """A root that could not be opened or searched, named with why. The result carries it, as
    it does a missing folder (the command line prints it once); the log has the traceback."""
    warning = f"{ws.kind} root {str(ws.root)!r} cannot be searched: skipped ({type(exc).__name__}: {exc})"
    log.debug("%s", warning, exc_info=exc)
    return warning
