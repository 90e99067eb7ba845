"""``memstrata status`` and ``memstrata query`` as processes, at 100k entries, and where the time goes.

The stores are :mod:`bench_system`'s: the agent's 100k entries (10k quick), a 1k shared store
and 500 episodes, loaded with ``add_many`` and the real model's vectors of the base sentences (the
close writes the BM25 index file of every posting). Their case numbers and names give the agent's
index ~200k distinct words, as real text does; the side-by-side's entries are combinations of a
small pool of sentences, whose few words hid what a fresh process paid per word of the index
(:mod:`bench_peers` still measures its command on them, with a long code snippet). A first
``memstrata query`` writes the vector index file beside them (as any first search does), then
every figure is a fresh process:

- wall time of ``memstrata status --json`` and ``memstrata query TEXT --agent bench --json``
  (new text each run, so the real model embeds it), p50 of a few runs; baseline: ``python -c
  pass`` in the same run;
- the parts of a query process, measured one after the other in one fresh process (so they add
  up; the command overlaps the model load with the imports and the store's open, and loads
  numpy's OpenBLAS with one thread, as here): importing
  the command line, importing the layers, loading the model, opening the store (its
  consistency check), loading its vector index (mapping and checking the index files, as the
  command does while the model loads), the query's embedding, the first search (the keyword
  side reads its postings), a second one;
- what ``status`` imports: it must not import numpy, onnxruntime or fastembed;
- the floor of any query process: a fresh process that imports numpy, onnxruntime and
  tokenizers, makes the model's session and embeds one query, and nothing else; ``memstrata
  query`` is reported against it too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from _harness import Context, Row, percentile
from bench_system import AGENT, _queries, fill_from_bases

from memstrata.storage import default_embedder

GROUP = "startup"
QUERY_RUNS = 5  # `memstrata query` and the floor, in turn

# Run in a fresh process: the parts of `memstrata query`, one after the other.
_PARTS = r"""
import json, sys, time
marks = [("start", time.perf_counter())]
def mark(name):
    marks.append((name, time.perf_counter()))
import memstrata.bridges.cli
mark("import the command line")
from memstrata.layers import KnowledgeStore
mark("import the layers")
from memstrata.storage import load_embedder
model = load_embedder(None)
mark("load the model")
store = KnowledgeStore.open(sys.argv[1], model, defer_vectors=True)
mark("open the store")
store.load_vector_index()
mark("load the vector index")
vector = model.embed_query(sys.argv[2])
mark("embed the query")
store.search(sys.argv[2], query_vector=vector)
mark("first search")
store.search(sys.argv[2] + " again", query_vector=vector)
mark("second search")
print(json.dumps({"parts": [(b[0], (b[1] - a[1]) * 1000) for a, b in zip(marks, marks[1:])]}))
"""

# Run in a fresh process: the least any query process does, with no store and no memstrata
# beyond finding the model's file (the floor of `memstrata query`).
_MODEL_ONLY = r"""
import os
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as the command loads numpy
import numpy, onnxruntime
from tokenizers import Tokenizer
from memstrata.storage._default_model import _int8_model, default_model_dir
folder = default_model_dir()
options = onnxruntime.SessionOptions()
options.intra_op_num_threads = 1
options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
session = onnxruntime.InferenceSession(str(_int8_model(folder)), options, ["CPUExecutionProvider"])
tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
tokenizer.no_padding()  # as the model's runner: the file pads every text to 128 tokens
ids = numpy.array([tokenizer.encode("parse the config").ids])
feed = {"input_ids": ids, "attention_mask": numpy.ones_like(ids), "token_type_ids": numpy.zeros_like(ids)}
session.run(None, feed)
"""

_STATUS_IMPORTS = r"""
import sys
from memstrata.bridges.cli import main
sys.argv = ["memstrata", "--data-dir", sys.argv[1], "status", "--json"]
try:
    main()
except SystemExit:
    pass
heavy = [m for m in ("numpy", "onnxruntime", "fastembed", "tokenizers", "sqlite_vec") if m in sys.modules]
print("HEAVY " + ",".join(heavy), file=sys.stderr)
"""


def _command() -> list[str]:
    exe = Path(sys.executable).with_name("memstrata")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "memstrata"]


def _wall(args: list[str], repeat: int) -> list[float]:
    walls = []
    for n in range(repeat):
        run = [a.replace("{n}", str(n)) for a in args]
        started = time.perf_counter()
        done = subprocess.run(run, capture_output=True, text=True, timeout=300)
        walls.append((time.perf_counter() - started) * 1000)
        if done.returncode != 0:
            raise RuntimeError(
                f"{' '.join(run[:4])} failed ({done.returncode}): {done.stderr.strip()[-300:]}"
            )
    return walls


def _parts_env() -> dict[str, str]:
    """The parts run as the command runs them: numpy's OpenBLAS with one thread (see
    ``bridges/_cli_query.py``), unless this environment sets its threads."""
    env = dict(os.environ)
    if not any(name in env for name in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")):
        env["OPENBLAS_NUM_THREADS"] = "1"
    return env


def _load() -> str:
    return f"load average {os.getloadavg()[0]:.1f}"


def run(ctx: Context) -> list[Row]:
    n = ctx.size(100_000, 10_000)
    work = ctx.workdir / "startup"
    shutil.rmtree(work, ignore_errors=True)
    fill_from_bases(default_embedder(), work, n, ctx.shared)
    queries = _queries(3, 57)
    store = work / "knowledge" / f"{AGENT}.sqlite"
    base = [*_command(), "--data-dir", str(work)]
    _wall([*base, "query", queries[0], "--agent", AGENT, "--json"], 1)  # writes the vector index file
    repeat = 3
    at = f"@{n // 1000}k"
    load = _load()
    bare = percentile(_wall([sys.executable, "-c", "pass"], repeat), 50)
    status = _wall([*base, "status", "--json"], repeat)
    query: list[float] = []
    floor: list[float] = []
    for n in range(QUERY_RUNS):  # in turn with the floor: a busy spell slows both alike
        query += _wall([*base, "query", f"{queries[1]} {n}", "--agent", AGENT, "--json"], 1)
        floor += _wall([sys.executable, "-c", _MODEL_ONLY], 1)
    model_only = percentile(floor, 50)
    done = subprocess.run(
        [sys.executable, "-c", _PARTS, str(store), queries[2]],
        capture_output=True,
        text=True,
        timeout=300,
        env=_parts_env(),
    )
    if done.returncode != 0:
        raise RuntimeError(f"the parts of a query failed: {done.stderr.strip()[-300:]}")
    parts = dict(json.loads(done.stdout.strip().splitlines()[-1])["parts"])
    probe = subprocess.run(
        [sys.executable, "-c", _STATUS_IMPORTS, str(work)], capture_output=True, text=True, timeout=300
    )
    heavy = next((ln[6:] for ln in probe.stderr.splitlines() if ln.startswith("HEAVY ")), "?")
    full = not ctx.quick
    breakdown = ", ".join(f"{name} {ms:.0f}" for name, ms in parts.items())
    rows = [
        Row(
            GROUP,
            f"`memstrata {command}` process wall p50 {at}",
            percentile(walls, 50),
            "ms",
            "<= 300 ms",
            baseline=bare,
            baseline_name="python -c pass",
            met=percentile(walls, 50) <= 300 if full else None,
            notes=f"{len(walls)} runs, max {max(walls):.0f} ms; {note}",
        )
        for command, walls, note in (
            (
                "status",
                status,
                f"imported of numpy/onnxruntime/fastembed/tokenizers/sqlite_vec: {heavy or 'none'}; {load}",
            ),
            ("query", query, "new text each run (the real model embeds it), in turn with the floor below"),
        )
    ]
    rows.append(
        Row(
            GROUP,
            f"`memstrata query` against a process that only loads the model and embeds {at}",
            percentile(query, 50),
            "ms",
            baseline=model_only,
            baseline_name="numpy, onnxruntime and tokenizers imported, the session made, one query embedded",
            notes=f"the floor of any fresh query process on this machine, p50 of {QUERY_RUNS} runs",
        )
    )
    rows.append(
        Row(
            GROUP,
            f"query process, parts one after the other {at}",
            sum(v for k, v in parts.items() if k != "second search"),
            "ms",
            notes=f"ms: {breakdown} (the command overlaps the model load with the imports and the open)",
        )
    )
    for name, ms in parts.items():
        rows.append(Row(GROUP, f"query process part: {name} {at}", ms, "ms"))
    shutil.rmtree(work, ignore_errors=True)
    return rows
