"""One ranking of an agent's knowledge hits and the shared store's, as if both were one store.

Each store normalises its fused scores to its own searches: a shared store whose keyword
search matched nothing ranks by its vector list alone, so its first hit scores 1.0 however far
it is from the query, and would tie the agent's best hit. Scores of two stores are not on one
scale, so the merge does not compare them. It fuses again, the way one store would have:
- one vector list of both stores' vector candidates by cosine similarity when one model made
  both stores' vectors (an agent with a model of its own: the stores take turns, as below);
- one keyword list that alternates the two stores' keyword ranks (BM25 scores depend on each
  store's word statistics, so the stores take turns);
- the same weighted RRF with the search settings and the query's adaptive weight
  (:func:`memstrata.storage.fusion_weights`).
A hit keeps its entry and similarity. Its score and ranks become those of the merged lists.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from memstrata.core.config import SearchConfig
from memstrata.storage import fusion_weights, rrf

__all__ = ["merge_hits"]


def _identity(hit: Any) -> tuple[str, str, str]:
    entry = hit.entry
    return (str(entry.content), str(entry.category), str(entry.scope))


def merge_hits(
    own: Sequence[Any],
    shared: Sequence[Any],
    top_k: int,
    *,
    query: str | None = None,
    search: SearchConfig | None = None,
    one_model: bool = True,
) -> list[Any]:
    """The best ``top_k`` of ``own`` and ``shared`` hits (one search's, with the same
    parameters) ranked as one store would rank them (see the module).

    A shared entry with the content, category and scope of one of the agent's own hits is left
    out (the agent's copy stands for both); the agent's own hits are all kept, whatever their
    scopes. Without shared hits the agent's hits are returned as they are. ``query`` gives the
    fusion its adaptive keyword weight; ``search`` its ``rrf_k`` and weights (the defaults when
    ``None``); ``one_model``: one model made both stores' vectors."""
    own = list(own)
    held = {_identity(hit) for hit in own}
    others = [hit for hit in shared if _identity(hit) not in held]
    if not others:
        return own[:top_k]
    pool = [*own, *others]
    store = [0] * len(own) + [1] * len(others)  # the agent's own first among equals
    by_vector = sorted(
        (n for n, hit in enumerate(pool) if hit.vector_rank is not None),
        key=(lambda n: (-(pool[n].similarity or 0.0), store[n], pool[n].vector_rank))
        if one_model
        else (lambda n: (pool[n].vector_rank, store[n])),
    )
    by_keyword = sorted(
        (n for n, hit in enumerate(pool) if hit.keyword_rank is not None),
        key=lambda n: (pool[n].keyword_rank, store[n]),
    )
    rule = search or SearchConfig()
    lists = [ranked for ranked in (by_vector, by_keyword) if ranked]
    weights = fusion_weights(
        bool(by_vector), bool(by_keyword), rule.vector_weight, rule.keyword_weight, query=query, k=rule.rrf_k
    )
    merged = []
    for fused in rrf(lists, k=rule.rrf_k, weights=weights, limit=top_k):
        merged.append(
            dataclasses.replace(
                pool[fused.key],
                score=fused.score,
                vector_rank=fused.ranks[0] if by_vector else None,
                keyword_rank=fused.ranks[-1] if by_keyword else None,
            )
        )
    return merged
