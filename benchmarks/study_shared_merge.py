"""Study: an agent's knowledge hits merged with the shared store's, against one store holding both.

Not a ``make bench`` module (its name does not start with ``bench_``). Each corpus is split at
random (seed 7) between an agent's store and the shared store, the shared store holding 10, 30,
50 or 90 % of the documents; a third store holds them all. Every query searches each store
(hybrid, top 10, the stores' own fusion) and is scored four ways:

- one store: the store holding everything (the ceiling);
- by score: the two stores' hits ordered by their own normalised scores, the merge memstrata
  used before (ties by cosine similarity, the agent's first);
- re-fused: :func:`memstrata.layers.merge_hits`, the merge it uses now;
- own only: the agent's store alone.

Corpora: prose (the docstring corpora of ``_corpus_docstrings.py`` and the documentation
sections of ``_corpus_sections.py``: MRR@10) and dialogue (three LoCoMo conversations from
``../shared/data/locomo-dev``, every turn an entry, the questions as queries: evidence
recall@10). The real default model, behind ``bench_knowledge``'s embedding cache.

How to run, from the checkout after ``make setup`` (a few minutes, most of it the first
embedding of each corpus)::

    .venv/bin/python benchmarks/study_shared_merge.py [SHARED_FRACTION ...]

Results print as a Markdown table.
"""

from __future__ import annotations

import random
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from _corpus_dialogue import load_conversations
from _corpus_docstrings import packages_corpus, stdlib_corpus
from _corpus_sections import sections_corpus
from bench_knowledge import CachedEmbedder

from memstrata.layers import KnowledgeStore, merge_hits
from memstrata.storage import default_embedder

Query = tuple[str, set[int]]  # the text, the documents that answer it


def by_score(own: Sequence[Any], shared: Sequence[Any], top_k: int) -> list[Any]:
    """The merge before: both stores' hits ordered by their own scores, shared copies dropped."""
    ranked: list[tuple[tuple[float, float, int, int], Any]] = []
    seen: set[tuple[str, str]] = set()
    for source, hits in enumerate((own, shared)):
        for rank, hit in enumerate(hits):
            identity = (str(hit.entry.content), str(hit.entry.category))
            if identity not in seen:
                seen.add(identity)
                similarity = -1.0 if hit.similarity is None else hit.similarity
                ranked.append(((-hit.score, -similarity, source, rank), hit))
    ranked.sort(key=lambda item: item[0])
    return [hit for _, hit in ranked[:top_k]]


def corpora() -> Iterator[tuple[str, list[str], list[Query], str]]:
    for corpus in (stdlib_corpus(1500, 400), packages_corpus(1500, 400), sections_corpus(400, 400)):
        queries = [(q, {r}) for q, r in zip(corpus.queries, corpus.relevant, strict=True)]
        yield f"prose {corpus.name}", list(corpus.docs), queries, "MRR@10"
    loaded, why = load_conversations()
    if loaded is None:
        print(f"dialogue skipped: {why}", file=sys.stderr)
        return
    for conversation in loaded[:3]:
        place = {turn.dia_id: n for n, turn in enumerate(conversation.turns)}
        questions = [(q.text, {place[e] for e in q.evidence if e in place}) for q in conversation.questions]
        docs = [turn.content for turn in conversation.turns]
        yield f"dialogue {conversation.name}", docs, [q for q in questions if q[1]], "recall@10"


def score(metric: str, ranked: Sequence[int], relevant: set[int]) -> float:
    if metric == "MRR@10":
        return next((1.0 / (n + 1) for n, doc in enumerate(ranked[:10]) if doc in relevant), 0.0)
    return len(set(ranked[:10]) & relevant) / len(relevant)


def study(embedder: CachedEmbedder, fractions: Sequence[float], work: Path) -> None:
    ways = ("one store", "by score", "re-fused", "own only")
    print("| corpus | shared | metric | queries | " + " | ".join(ways) + " |")
    print("|---|---|---|---|" + "---|" * len(ways))
    for name, docs, queries, metric in corpora():
        for fraction in fractions:
            rng = random.Random(7)
            shared_docs = {n for n in range(len(docs)) if rng.random() < fraction}
            holds = {
                "all": range(len(docs)),
                "own": [n for n in range(len(docs)) if n not in shared_docs],
                "shared": sorted(shared_docs),
            }
            stores = {}
            for kind, chosen in holds.items():
                path = work / f"{name.replace(' ', '-')}-{fraction}-{kind}.sqlite"
                stores[kind] = KnowledgeStore.open(path, embedder)
                stores[kind].add_many(
                    {"content": docs[n], "category": "note", "tags": {"doc": str(n)}} for n in chosen
                )
            totals = dict.fromkeys(ways, 0.0)
            for text, relevant in queries:
                vector = embedder.embed_query(text)
                hits = {
                    kind: store.search(text, top_k=10, query_vector=vector) for kind, store in stores.items()
                }
                ranked = {
                    "one store": hits["all"],
                    "by score": by_score(hits["own"], hits["shared"], 10),
                    "re-fused": merge_hits(hits["own"], hits["shared"], 10, query=text),
                    "own only": hits["own"],
                }
                for way, found in ranked.items():
                    totals[way] += score(metric, [int(h.entry.tags["doc"]) for h in found], relevant)
            for store in stores.values():
                store.close()
            cells = " | ".join(f"{totals[w] / len(queries):.3f}" for w in ways)
            print(f"| {name} | {fraction:.0%} | {metric} | {len(queries)} | {cells} |", flush=True)


def main() -> None:
    fractions = [float(a) for a in sys.argv[1:]] or [0.1, 0.3, 0.5, 0.9]
    work = Path(tempfile.mkdtemp(prefix="memstrata-merge-"))
    embedder = CachedEmbedder(default_embedder())
    try:
        study(embedder, fractions, work)
    finally:
        embedder.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
