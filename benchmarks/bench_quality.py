"""Retrieval quality of vector, keyword and hybrid search on three kinds of real text.

* conversations: LoCoMo (``_corpus_dialogue.py``), every turn an episode of its session's task
  run, searched through :meth:`EpisodicMemory.search`; evidence recall@5 and @10.
* prose: the documentation corpora of ``bench_knowledge`` through :class:`KnowledgeStore`; MRR@10.
* code: released packages in Python, Rust, JavaScript and Go (``_corpus_code``, fetched by
  ``make bench-data``) with their doc comments blanked, searched through :class:`Codebase`,
  each removed summary a query; MRR@10. Besides the 150 queries per language, up to 300 others
  of the same sources ("held out") are searched on the same index: they take no part in the
  grid or the leave-one-corpus-out choice, so they check that the chosen settings carry over.

For each corpus "hybrid - best single mode" comes with a paired bootstrap 95 % interval
(``_stats.py``). The vector and keyword lists (50 deep, as hybrid search fuses them) are kept per
query, so other fusions are scored on exactly the same lists: the textbook RRF (k = 60, equal
weights) that hybrid used before, and a small grid from which the settings are chosen
leave-one-corpus-out (each corpus scored with the settings that won on the others).
The real default model is used; embeddings are cached on disk (``bench_knowledge``'s cache).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from _corpus_dialogue import load_conversations
from _corpus_docstrings import packages_corpus, stdlib_corpus
from _corpus_sections import sections_corpus
from _harness import Context, Row
from _stats import paired_bootstrap
from bench_knowledge import CachedEmbedder, with_cached_model

from memstrata import Codebase, Config
from memstrata.layers import EpisodicMemory, KnowledgeStore
from memstrata.storage import rrf

GROUP = "retrieval quality"
DEPTH = 50
GRID_K = (1, 2, 5, 10, 20, 60)
GRID_KEYWORD_WEIGHT = (1.0, 1.25, 1.5, 2.0, 3.0)
SHIPPED = (5, 1.5)  # storage DEFAULT_RRF_K, DEFAULT_KEYWORD_WEIGHT (vector weight 1)
PLAIN = (60, 1.0)


@dataclass
class Measured:
    """One corpus: per query, the vector and keyword lists, the shipped hybrid's top 10 and a
    scorer of a ranked key list (higher is better)."""

    name: str
    metric: str
    vector: list[list[Hashable]] = field(default_factory=list)
    keyword: list[list[Hashable]] = field(default_factory=list)
    hybrid: list[list[Hashable]] = field(default_factory=list)
    scorers: list[Callable[[Sequence[Hashable]], float]] = field(default_factory=list)
    notes: str = ""
    held_out: bool = False  # queries kept out of the choice of the fusion settings (grid, LOCO)
    _fused: dict[tuple[int, float], list[float]] = field(default_factory=dict, repr=False)

    def scores(self, lists: Sequence[Sequence[Hashable]]) -> list[float]:
        return [score(keys) for score, keys in zip(self.scorers, lists, strict=True)]

    def fused(self, k: int, keyword_weight: float) -> list[float]:
        """Per query, the score of the vector and keyword lists fused with these settings (kept:
        the grid and the leave-one-corpus-out choice score the same settings)."""
        kept = self._fused.get((k, keyword_weight))
        if kept is not None:
            return kept
        out = []
        for vec, kw, score in zip(self.vector, self.keyword, self.scorers, strict=True):
            if vec and kw:
                keys = [f.key for f in rrf([vec, kw], k=k, weights=[1.0, keyword_weight], limit=10)]
            else:
                keys = (vec or kw)[:10]
            out.append(score(keys))
        self._fused[(k, keyword_weight)] = out
        return out


def _mrr(relevant: Callable[[Hashable], bool]) -> Callable[[Sequence[Hashable]], float]:
    def score(keys: Sequence[Hashable]) -> float:
        for rank, key in enumerate(keys[:10], start=1):
            if relevant(key):
                return 1.0 / rank
        return 0.0

    return score


def _recall(
    evidence: frozenset[str], names: dict[Hashable, str], at: int
) -> Callable[[Sequence[Hashable]], float]:
    def score(keys: Sequence[Hashable]) -> float:
        found = {names.get(key) for key in keys[:at]}
        return len(evidence & found) / len(evidence)

    return score


# -- corpora -------------------------------------------------------------------------------------


def conversations(ctx: Context, embedder: CachedEmbedder) -> list[Measured]:
    loaded, why = load_conversations()
    if loaded is None:
        print(f"bench_quality: conversations skipped: {why}", file=sys.stderr)
        return []
    at5 = Measured("conversations", "evidence recall@5", notes=why)
    at10 = Measured("conversations", "evidence recall@10", notes=why)
    for conversation in loaded[: ctx.size(len(loaded), 1)]:
        path = ctx.workdir / f"conversation-{conversation.name}.sqlite"
        with EpisodicMemory.open(path, embedder) as memory:
            ids = memory.record_many(
                {"content": t.content, "at": t.at, "task_run_id": t.session, "kind": "turn"}
                for t in conversation.turns
            )
            names: dict[Hashable, str] = {i: t.dia_id for i, t in zip(ids, conversation.turns, strict=True)}
            for question in conversation.questions:
                lists = {
                    mode: [
                        h.episode.id
                        for h in memory.search(
                            question.text,
                            top_k=DEPTH if mode != "hybrid" else 10,
                            mode=mode,
                            recency_half_life=None,
                        )
                    ]
                    for mode in ("vector", "keyword", "hybrid")
                }
                for measured, at in ((at5, 5), (at10, 10)):
                    measured.vector.append(lists["vector"])
                    measured.keyword.append(lists["keyword"])
                    measured.hybrid.append(lists["hybrid"])
                    measured.scorers.append(_recall(question.evidence, names, at))
    count = len(at5.scorers)
    at5.notes = at10.notes = f"{count} questions, {why}"
    return [at5, at10]


def prose(ctx: Context, embedder: CachedEmbedder) -> list[Measured]:
    out = []
    corpora = [
        stdlib_corpus(ctx.size(1500, 600), ctx.size(400, 300)),
        packages_corpus(ctx.size(1500, 600), ctx.size(400, 300)),
        sections_corpus(400, 400),
    ]
    for corpus in corpora:
        measured = Measured(f"prose {corpus.name}", "MRR@10")
        with KnowledgeStore.open(ctx.workdir / f"prose-{corpus.name}.sqlite", embedder) as store:
            ids = store.add_many({"content": d, "category": "pattern"} for d in corpus.docs)
            for query, relevant in zip(corpus.queries, corpus.relevant, strict=True):
                vector = embedder.embed_query(query)
                lists = {
                    mode: [
                        h.entry.id
                        for h in store.search(
                            query, top_k=DEPTH if mode != "hybrid" else 10, mode=mode, query_vector=vector
                        )
                    ]
                    for mode in ("vector", "keyword", "hybrid")
                }
                measured.vector.append(lists["vector"])
                measured.keyword.append(lists["keyword"])
                measured.hybrid.append(lists["hybrid"])
                target = ids[relevant]
                measured.scorers.append(_mrr(lambda key, target=target: key == target))
        measured.notes = f"{len(corpus.docs)} docs, {len(corpus.queries)} queries"
        out.append(measured)
    return out


class _CodeEmbedder(CachedEmbedder):
    """The cached embedder plus the token counter code chunking asks for."""

    def count_tokens(self, text: str) -> int:
        return int(self.inner.count_tokens(text))  # type: ignore[attr-defined]


def _code_lists(
    measured: Measured,
    root: Path,
    data: Path,
    coder: _CodeEmbedder,
    queries: Sequence[Any],
    more: Sequence[tuple[Measured, Sequence[Any]]] = (),
) -> None:
    """Index ``root`` and keep the lists of every query; ``q.relevant(path, start, end)``.
    ``more``: other query sets searched on the same index."""
    with Codebase.open(root, embedder=coder, config=Config(data_dir=data)) as cb:
        cb.sync()
        for m, q in [(measured, q) for q in queries] + [(m, q) for m, qs in more for q in qs]:
            lists = {
                mode: [
                    (h.path, h.start_line, h.end_line)
                    for h in cb.search(q.text, top_k=DEPTH if mode != "hybrid" else 10, mode=mode)
                ]
                for mode in ("vector", "keyword", "hybrid")
            }
            m.vector.append(lists["vector"])  # type: ignore[arg-type]
            m.keyword.append(lists["keyword"])  # type: ignore[arg-type]
            m.hybrid.append(lists["hybrid"])  # type: ignore[arg-type]
            m.scorers.append(_mrr(lambda key, q=q: bool(q.relevant(*key))))  # type: ignore[misc]


@dataclass(frozen=True)
class _CodeQuery:
    text: str
    path: str
    start: int
    end: int

    def relevant(self, path: str, start: int, end: int) -> bool:
        return path == self.path and start <= self.end and self.start <= end


def code(ctx: Context, embedder: CachedEmbedder) -> list[Measured]:
    """Python, Rust, JavaScript and Go packages (``_corpus_code``, fetched by ``make bench-data``)
    and C++ headers where the system has them; where none is there, the Python libraries
    installed with memstrata (``bench_files``)."""
    from _corpus_code import FETCHED, SOURCES, load

    coder = _CodeEmbedder(embedder.inner)
    out: list[Measured] = []
    try:
        for language in SOURCES:
            corpus = load(language, max_queries=ctx.size(150, 40))
            if corpus is None:
                why = "run `make bench-data`" if language in FETCHED else f"{SOURCES[language][1]} absent"
                print(f"bench_quality: no {language} sources ({why}); skipped", file=sys.stderr)
                continue
            root = ctx.workdir / f"code-{language}"
            for rel, text in corpus.files.items():
                target = root / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text, encoding="utf-8")
            queries = [_CodeQuery(q.text, q.path, q.line, q.line) for q in corpus.queries]
            measured = Measured(f"code {language}", "MRR@10")
            # more queries of the same sources, disjoint from those the fusion was chosen on
            rest = load(language, max_queries=ctx.size(300, 40), offset=len(corpus.queries))
            held_queries = [_CodeQuery(q.text, q.path, q.line, q.line) for q in rest.queries] if rest else []
            held = Measured(f"code {language} held out", "MRR@10", held_out=True)
            more = [(held, held_queries)] if held_queries else []
            _code_lists(measured, root, ctx.workdir / f"code-{language}-data", coder, queries, more)
            where = SOURCES[language][0] or SOURCES[language][1]
            measured.notes = f"{len(queries)} doc-comment first sentences, {where}"
            out.append(measured)
            if held_queries:
                held.notes = f"{len(held_queries)} other doc-comment first sentences (not used to choose)"
                out.append(held)
        if not out:
            from bench_files import build_corpus

            packages = ("click", "httpx") if not ctx.quick else ("click",)
            tree = ctx.workdir / "code"
            found = build_corpus(tree, packages, max_files=None if not ctx.quick else 6)
            queries = [_CodeQuery(q.text, q.path, q.start, q.end) for q in found]
            measured = Measured("code python", "MRR@10")
            _code_lists(measured, tree, ctx.workdir / "code-data", coder, queries)
            measured.notes = f"{len(queries)} docstring summaries over {'+'.join(packages)}"
            out.append(measured)
    finally:
        coder.close()
    return out


# -- report --------------------------------------------------------------------------------------


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if values else float("nan")


def _gain(m: Measured, scores: Sequence[float]) -> float:
    """Mean score above the better single mode on this corpus."""
    return _mean(scores) - max(_mean(m.scores(m.vector)), _mean(m.scores(m.keyword)))


def leave_one_out(measured: Sequence[Measured]) -> dict[str, tuple[tuple[int, float], float]]:
    """For each corpus: the (k, keyword weight) with the best worst-case gain on the *other*
    corpora, and the gain it then gets on this one."""
    grid = [(k, w) for k in GRID_K for w in GRID_KEYWORD_WEIGHT]
    gains = {m.name + m.metric: {p: _gain(m, m.fused(*p)) for p in grid} for m in measured}
    out = {}
    for m in measured:
        others = [g for name, g in gains.items() if name != m.name + m.metric and not name.startswith(m.name)]
        if not others:
            continue
        chosen = max(grid, key=lambda p: (min(g[p] for g in others), sum(g[p] for g in others)))
        out[m.name + " " + m.metric] = (chosen, gains[m.name + m.metric][chosen])
    return out


def print_grid(measured: Sequence[Measured]) -> None:
    """Gain over the best single mode of every (k, keyword weight), per corpus (to stderr)."""
    names = [f"{m.name} {m.metric}"[:24] for m in measured]
    print("k  kw_w  " + "  ".join(f"{n:>24}" for n in names) + "       min", file=sys.stderr)
    for k in GRID_K:
        for w in GRID_KEYWORD_WEIGHT:
            gains = [_gain(m, m.fused(k, w)) for m in measured]
            cells = "  ".join(f"{g:>+24.4f}" for g in gains)
            print(f"{k:<3}{w:<6}{cells}  {min(gains):+.4f}", file=sys.stderr)


def rows_for(m: Measured) -> list[Row]:
    vector, keyword, hybrid = m.scores(m.vector), m.scores(m.keyword), m.scores(m.hybrid)
    plain = m.fused(*PLAIN)
    best_name, best = max((("vector", vector), ("keyword", keyword)), key=lambda x: _mean(x[1]))
    diff, low, high = paired_bootstrap(hybrid, best)
    name = f"{m.name} {m.metric}"
    rows = [
        Row(GROUP, f"{name} vector", _mean(vector), "", notes=m.notes),
        Row(GROUP, f"{name} keyword", _mean(keyword), "", notes=m.notes),
        Row(
            GROUP,
            f"{name} hybrid",
            _mean(hybrid),
            "",
            target=">= best single + 0.01",
            baseline=_mean(best),
            baseline_name=best_name,
            met=_mean(hybrid) >= _mean(best) + 0.01,
            notes=f"weighted RRF k={SHIPPED[0]}, keyword weight {SHIPPED[1]} (1.0 for a query that is "
            "no question)",
        ),
        Row(
            GROUP,
            f"{name} hybrid - best single",
            diff,
            f"CI [{low:+.3f}, {high:+.3f}]",
            target="95% CI above 0",
            met=low > 0,
            notes=f"paired bootstrap 95% CI [{low:+.3f}, {high:+.3f}] over {len(hybrid)} queries",
        ),
        Row(
            GROUP,
            f"{name} plain RRF k=60 (before)",
            _mean(plain),
            "",
            baseline=_mean(best),
            baseline_name=best_name,
            notes="same lists, textbook RRF (the fusion before)",
        ),
    ]
    return rows


def run_quality(ctx: Context) -> list[Row]:
    return with_cached_model(GROUP, lambda embedder: _run(ctx, embedder))


def _run(ctx: Context, embedder: CachedEmbedder) -> list[Row]:
    measured: list[Measured] = []
    for build in (conversations, prose, code):
        try:
            measured.extend(build(ctx, embedder))
        except Exception as exc:  # one corpus failing must not hide the others
            print(f"bench_quality: {build.__name__} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            raise
    rows: list[Row] = []
    for m in measured:
        rows.extend(rows_for(m))
    selection = [m for m in measured if m.metric != "evidence recall@10" and not m.held_out]
    print_grid(selection)
    for name, ((k, w), gain) in leave_one_out(selection).items():
        rows.append(
            Row(
                GROUP,
                f"{name} leave-one-corpus-out",
                gain,
                "gain",
                target="> 0",
                met=gain > 0,
                notes=f"k={k}, keyword weight {w} chosen on the other corpora (best worst-case gain)",
            )
        )
    return rows


if __name__ == "__main__":
    import tempfile

    from _harness import format_table

    with tempfile.TemporaryDirectory() as tmp:
        result = run_quality(Context(quick="--quick" in sys.argv, workdir=Path(tmp)))
    print(format_table(result))
