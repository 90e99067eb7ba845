"""Recency-decayed search does not depend on how deep it read: a smaller ``top_k`` returns a
prefix of a larger one, with the same scores and ranks."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

from memstrata.layers import EpisodeHit, EpisodicMemory
from tests.fakes import FakeEmbedder

NOW = datetime(2024, 9, 17, tzinfo=UTC)


def _facts(hits: list[EpisodeHit]) -> list[tuple[int, float, int | None, int | None]]:
    return [(h.episode.id, round(h.score, 12), h.vector_rank, h.keyword_rank) for h in hits]


def test_smaller_top_k_is_a_prefix_of_a_larger_one(tmp_path: Path) -> None:
    # few words over many episodes: keyword hits far down the vector list, and tied similarities
    rng = random.Random(5)
    vocab = ["".join(rng.choice("bcdfghjklmnpqrtvwxz") for _ in range(5)) for _ in range(40)]
    start = NOW - timedelta(days=200)
    with EpisodicMemory.open(tmp_path / "e.sqlite", FakeEmbedder(), clock=lambda: NOW) as ep:
        ep.record_many(
            [
                {
                    "content": " ".join(rng.choice(vocab) for _ in range(rng.randint(2, 6))) + f" e{i}",
                    "at": start + timedelta(days=rng.randint(0, 180)),
                }
                for i in range(900)
            ]
        )
        for _ in range(12):
            query = " ".join(rng.sample(vocab, 2))
            half_life = timedelta(days=rng.choice([1, 7, 30]))
            deep = _facts(ep.search(query, top_k=50, recency_half_life=half_life))
            for k in (1, 5, 20):
                assert _facts(ep.search(query, top_k=k, recency_half_life=half_life)) == deep[:k], (query, k)
