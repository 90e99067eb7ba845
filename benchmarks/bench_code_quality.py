"""Code retrieval quality per language: vector, keyword and hybrid search over real sources.

Corpora come from :mod:`_corpus_code` (``make bench-data`` fetches them; a language without data
is skipped with a message). Each corpus is indexed three ways with the real default model:
``before`` (the line-aware / ``ast`` chunkers, chunk text embedded alone, as before syntax-tree
chunking), ``after`` at 400/80 tokens and ``after`` at 256/50 tokens (the model reads at most 256
tokens). Reported per language and mode: MRR@10 and recall@10, and "hybrid - best single mode"
with a paired bootstrap 95 % interval. Embeddings are cached like bench_knowledge's.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from _corpus_code import FETCHED, SOURCES, CodeCorpus, load
from _harness import Context, Row
from _stats import paired_bootstrap

from memstrata import Codebase, Config
from memstrata.config import ChunkingConfig

GROUP = "code"
MODES = ("vector", "keyword", "hybrid")


class _Embedder:
    """The cached real embedder, with the model's token counter (chunk budgets in model tokens)."""

    def __init__(self, cached: Any, inner: Any) -> None:
        self.cached = cached
        self.inner = inner
        self.model_id = cached.model_id
        self.dim = cached.dim

    def count_tokens(self, text: str) -> int:
        return int(self.inner.count_tokens(text))

    def embed_documents(self, texts: Any) -> Any:
        return self.cached.embed_documents(texts)

    def embed_query(self, text: str) -> Any:
        return self.cached.embed_query(text)


@contextmanager
def _legacy() -> Iterator[None]:
    """Index as before syntax-tree chunking: old chunkers, chunk text embedded alone."""
    import memstrata.layers._index_db as index_db
    import memstrata.layers._index_writes as writes
    from memstrata.layers._chunk_file import chunker_for, language_for
    from memstrata.storage import identifier_words

    def chunk_file(path: str, text: str, **kw: Any) -> Any:
        language = language_for(path)
        return language, chunker_for(language)(text, **kw)

    saved = (index_db.chunk_file, writes.chunk_embedding_text, writes.chunk_keyword_text)
    index_db.chunk_file = chunk_file
    writes.chunk_embedding_text = lambda path, language, chunk: chunk.text
    writes.chunk_keyword_text = lambda language, chunk: identifier_words(chunk.text)
    try:
        yield
    finally:
        index_db.chunk_file, writes.chunk_embedding_text, writes.chunk_keyword_text = saved


def _scores(cb: Codebase, corpus: CodeCorpus, mode: str) -> tuple[list[float], list[float]]:
    rr, hit = [], []
    for q in corpus.queries:
        r = 0.0
        for rank, h in enumerate(cb.search(q.text, top_k=10, mode=mode), start=1):
            if h.path == q.path and h.start_line <= q.line <= h.end_line:
                r = 1.0 / rank
                break
        rr.append(r)
        hit.append(1.0 if r else 0.0)
    return rr, hit


def _measure(
    ctx: Context, corpus: CodeCorpus, embedder: _Embedder, variant: str, tokens: int, overlap: int
) -> dict[str, tuple[list[float], list[float]]]:
    root = ctx.workdir / corpus.language / "src"
    if not root.exists():
        for rel, text in corpus.files.items():
            out = root / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text, encoding="utf-8")
    config = Config(
        data_dir=ctx.workdir / corpus.language / f"{variant}-{tokens}",
        chunking=ChunkingConfig(tokens=tokens, overlap=overlap),
    )
    with Codebase.open(root, embedder=embedder, config=config) as cb:  # type: ignore[arg-type]
        if variant == "before":
            with _legacy():
                cb.sync()
        else:
            cb.sync()
        return {mode: _scores(cb, corpus, mode) for mode in MODES}


def run_quality(ctx: Context) -> list[Row]:
    from bench_knowledge import CachedEmbedder

    from memstrata.storage import default_embedder

    inner = default_embedder()
    embedder = _Embedder(CachedEmbedder(inner), inner)
    rows: list[Row] = []
    variants = [("before", 400, 80), ("after", 400, 80), ("after", 256, 50)]
    for language in FETCHED:  # C++ (large, read in place) only in bench_quality
        corpus = load(language, max_queries=ctx.size(150, 40))
        if corpus is None:
            print(
                f"  code quality: no {language} sources under benchmarks/.data (run `make bench-data`); "
                "skipped",
                file=sys.stderr,
            )
            continue
        hybrid: dict[str, list[float]] = {}
        for variant, tokens, overlap in variants:
            scores = _measure(ctx, corpus, embedder, variant, tokens, overlap)
            hybrid[f"{variant} {tokens}/{overlap}"] = scores["hybrid"][0]
            label = f"{language} {variant} {tokens}/{overlap}"
            mrr = {m: float(np.mean(scores[m][0])) for m in MODES}
            for mode in MODES:
                rows.append(
                    Row(
                        GROUP,
                        f"{label} MRR@10 {mode}",
                        mrr[mode],
                        "MRR",
                        notes=f"recall@10 {np.mean(scores[mode][1]):.3f}; {len(corpus.queries)} queries, "
                        f"{len(corpus.files)} files ({', '.join(SOURCES[language][0])})",
                    )
                )
            best = max(("vector", "keyword"), key=lambda m: mrr[m])
            diff, lo, hi = paired_bootstrap(scores["hybrid"][0], scores[best][0])
            rows.append(
                Row(
                    GROUP,
                    f"{label} hybrid - best single ({best})",
                    diff,
                    "MRR",
                    target=">= 0.01" if variant == "after" else "",
                    met=(diff >= 0.01) if variant == "after" else None,
                    notes=f"paired bootstrap 95% CI [{lo:+.3f}, {hi:+.3f}]",
                )
            )
        for a, b in (("after 400/80", "before 400/80"), ("after 256/50", "after 400/80")):
            diff, lo, hi = paired_bootstrap(hybrid[a], hybrid[b])
            rows.append(
                Row(
                    GROUP,
                    f"{language} hybrid MRR@10, {a} - {b}",
                    diff,
                    "MRR",
                    notes=f"paired bootstrap 95% CI [{lo:+.3f}, {hi:+.3f}]",
                )
            )
    embedder.cached.close()
    return rows


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        from _harness import format_table

        print(format_table(run_quality(Context(quick="--quick" in sys.argv, workdir=Path(tmp)))))
