"""Before/after in one run: a git revision of memstrata against the working tree, measured
alternately on the same machine (issue 16: ratios "measured in one run").

Three measurements, each in a fresh child process per revision and round, the revisions taking
turns (load from elsewhere hits both alike):

- ``search``: hybrid ``KnowledgeStore.search`` p50 at 100k entries (the side-by-side's entries and
  vectors, ``benchmarks/bench_peers.py``; query vectors given, so no model runs);
- ``pretask``: ``agent.begin_task`` p50 through the actors with that store as the agent's
  knowledge (the real model embeds every query);
- ``writeback``: 8 agents completing 120 tasks each at once, until every write is stored with its
  vector (real model); tasks/s.

The revision is extracted with ``git archive <rev> | tar -x`` into a temporary directory (the
working tree and the git index are never touched) and imported through ``PYTHONPATH``: its
``pyproject.toml``'s ``package-dir`` is rebuilt as a ``memstrata`` package of links. The working
tree is the installed package. Both use this interpreter's installed dependencies, offline.
Each revision loads its own 100k store through its own ``add_many`` (their schemas differ).

Usage: python benchmarks/compare_revisions.py [--rev 5ceb41f] [--rounds 2] [--entries 100000]
[--old-kernel]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
AGENT = "bench"
MEASURES = ("search", "pretask", "writeback")


# -- the revision, extracted beside the working tree -------------------------------------------


def extract(rev: str, into: Path) -> Path:
    """``rev``'s files under ``into/src``; returns a directory to put on ``PYTHONPATH``."""
    src = into / "src"
    src.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)
    config = tomllib.loads((src / "pyproject.toml").read_text(encoding="utf-8"))
    package_dir: dict[str, str] = config["tool"]["setuptools"]["package-dir"]
    site = into / "site"
    package = site / "memstrata"
    shutil.copytree(src / package_dir["memstrata"], package, symlinks=True)
    for name, folder in package_dir.items():
        if name != "memstrata":
            link = package / name.removeprefix("memstrata.")
            if link.is_symlink():  # a revision whose package holds links to the source folders
                link.unlink()
            link.symlink_to(src / folder, target_is_directory=True)
    _missing_dependencies(config["project"]["dependencies"], site)
    return site


def _missing_dependencies(requirements: list[str], site: Path) -> None:
    """The revision's dependencies this interpreter lacks (or holds at another pinned version),
    installed with ``pip install --no-deps --target`` beside the revision, never into the venv."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.requirements import Requirement

    wanted = []
    for text in requirements:
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        try:
            have = version(requirement.name)
        except PackageNotFoundError:
            wanted.append(text)
            continue
        if requirement.specifier and have not in requirement.specifier:
            wanted.append(text)
    if wanted:
        print(f"installing beside the revision: {', '.join(wanted)}", file=sys.stderr, flush=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), *wanted],
            check=True,
        )


# -- the children --------------------------------------------------------------------------------


class LookupEmbedder:
    """The default model's id and dimension; documents get their precomputed vectors."""

    def __init__(self, texts: list[str], vectors: Any) -> None:
        from memstrata.storage import DEFAULT_MODEL_ID

        self.model_id = DEFAULT_MODEL_ID
        self.dim = int(vectors.shape[1])
        self._vectors = vectors
        self._index = {t[:200]: i for i, t in enumerate(texts)}

    def embed_documents(self, texts: list[str]) -> Any:
        return self._vectors[[self._index[t[:200]] for t in texts]]

    def embed_query(self, text: str) -> Any:
        raise RuntimeError("queries pass their vectors")


def _data(entries: int) -> Any:
    sys.path.insert(0, str(HERE))
    from bench_peers import make_data

    return make_data(entries, 50)


def child_fill(data_dir: Path, entries: int) -> dict[str, Any]:
    from memstrata.layers import KnowledgeStore

    data = _data(entries)
    path = data_dir / "knowledge" / f"{AGENT}.sqlite"
    path.parent.mkdir(parents=True, exist_ok=True)
    items = [{"content": t, "category": c} for t, c in zip(data.texts, data.categories, strict=True)]
    started = time.perf_counter()
    with KnowledgeStore.open(path, LookupEmbedder(data.texts, data.vectors)) as store:  # type: ignore[arg-type]
        store.add_many(items)
    import memstrata

    return {"seconds": time.perf_counter() - started, "package": str(Path(memstrata.__file__).parent)}


def child_search(data_dir: Path, entries: int) -> dict[str, Any]:
    from memstrata.layers import KnowledgeStore

    data = _data(entries)
    path = data_dir / "knowledge" / f"{AGENT}.sqlite"
    samples = []
    with KnowledgeStore.open(path, LookupEmbedder(data.texts, data.vectors)) as store:  # type: ignore[arg-type]
        for i in range(len(data.queries)):  # the mirror and every query's postings, loaded once
            store.search(data.queries[i], query_vector=data.query_vectors[i])
        for _ in range(4):
            for i in range(len(data.queries)):
                started = time.perf_counter()
                store.search(data.queries[i], query_vector=data.query_vectors[i])
                samples.append((time.perf_counter() - started) * 1000)
    return {"p50_ms": statistics.median(samples), "queries": len(samples)}


def _tasks(n: int, seed: int) -> list[str]:
    import random

    words = ["payment", "retry", "cache", "index", "deploy", "queue", "login", "refund", "export"]
    rng = random.Random(seed)
    return [f"Fix the {rng.choice(words)} {rng.choice(words)} issue #{i}" for i in range(n)]


def child_pretask(data_dir: Path, entries: int) -> dict[str, Any]:
    from memstrata import Config, MemorySystem

    samples = []
    with MemorySystem.start(Config(data_dir=data_dir)) as system:
        agent = system.agent(AGENT)
        for n, text in enumerate(_tasks(5, 99)):
            agent.begin_task(f"warm{n}", text)
        for n, text in enumerate(_tasks(100, 4)):
            started = time.perf_counter()
            agent.begin_task(f"q{n}", text)
            samples.append((time.perf_counter() - started) * 1000)
    return {"p50_ms": statistics.median(samples), "queries": len(samples)}


def child_writeback(data_dir: Path, entries: int) -> dict[str, Any]:
    from memstrata import Config, MemorySystem

    agents, per_agent = 8, 120
    with MemorySystem.start(Config(data_dir=data_dir)) as system:
        system.agent("warm").complete_task("w0", "warm the model up")
        system.wait_idle(120)
        started = time.perf_counter()

        def work(i: int) -> None:
            agent = system.agent(f"a{i}")
            for n, text in enumerate(_tasks(per_agent, i)):
                agent.complete_task(f"t{n}", f"{text}: done by batching the writes")

        threads = [threading.Thread(target=work, args=(i,)) for i in range(agents)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if not system.wait_idle(600):
            raise RuntimeError("write-back did not finish")
        seconds = time.perf_counter() - started
    return {"tasks_per_s": agents * per_agent / seconds, "tasks": agents * per_agent}


CHILDREN = {
    "fill": child_fill,
    "search": child_search,
    "pretask": child_pretask,
    "writeback": child_writeback,
}


# set for the working tree's children by --old-kernel (a MEMSTRATA_* name would be read as config)
_OLD_KERNEL_ENV = "COMPARE_REVISIONS_OLD_KERNEL"


def _old_kernel() -> None:
    """The working tree's model on the int8 products the older revisions ran everywhere (int8
    weights, ONNX Runtime's u8 x s8 kernels), instead of the exact kernel it picks on a CPU where
    those saturate (x86 without VNNI: uint8 weights, 8-12 % slower per text): the code compared
    alone. Here only, never in the package."""
    import memstrata.storage._default_model as default_model

    default_model.signed_products_exact = lambda *args, **kwargs: True  # type: ignore[assignment]


def _run_child(
    site: Path | None, measure: str, data_dir: Path, entries: int, *, old_kernel: bool = False
) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.pop(_OLD_KERNEL_ENV, None)
    if site is not None:
        env["PYTHONPATH"] = str(site)
    if old_kernel:
        env[_OLD_KERNEL_ENV] = "1"
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", measure, str(data_dir), str(entries)],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(data_dir.parent),  # not the checkout: ``import memstrata`` must not find it by cwd
        timeout=1800,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{measure} failed ({done.returncode}): {done.stderr.strip()[-600:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


# -- the run -------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rev", default="5ceb41f", help="the revision to compare with (before)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument(
        "--old-kernel",
        action="store_true",
        help="run the working tree's model on the int8 kernel older revisions used everywhere, "
        "to compare the code alone on a CPU without VNNI (see _old_kernel)",
    )
    parser.add_argument(
        "--child", nargs=3, metavar=("MEASURE", "DATA_DIR", "ENTRIES"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.child:
        measure, data_dir, entries = args.child
        if os.environ.get(_OLD_KERNEL_ENV) == "1":
            _old_kernel()
        print(json.dumps(CHILDREN[measure](Path(data_dir), int(entries))))
        return 0
    with tempfile.TemporaryDirectory(prefix="memstrata-compare-") as tmp:
        work = Path(tmp)
        sites: dict[str, Path | None] = {"before": extract(args.rev, work / "rev"), "after": None}
        results: dict[str, dict[str, list[float]]] = {label: {m: [] for m in MEASURES} for label in sites}
        for label, site in sites.items():
            fill = _run_child(site, "fill", work / label, args.entries)
            print(
                f"{label}: {args.entries:,} entries loaded in {fill['seconds']:.1f} s by {fill['package']}",
                file=sys.stderr,
            )
        for round_ in range(args.rounds):
            for measure in MEASURES:
                order = list(sites) if round_ % 2 == 0 else list(reversed(sites))
                for label in order:
                    data_dir = work / label if measure != "writeback" else work / f"{label}-wb{round_}"
                    old_kernel = args.old_kernel and label == "after"
                    out = _run_child(sites[label], measure, data_dir, args.entries, old_kernel=old_kernel)
                    value = out.get("p50_ms", out.get("tasks_per_s"))
                    results[label][measure].append(float(value))
                    print(f"round {round_}: {label} {measure} {value:.2f}", file=sys.stderr, flush=True)
        kernel = " (its model on the older int8 kernel: --old-kernel)" if args.old_kernel else ""
        print(f"\nrevision {args.rev} (before) against the working tree{kernel} (after),", end=" ")
        print(f"{args.rounds} rounds each:")
        print("| measure | before | after | after / before |")
        print("|---|---|---|---|")
        units = {"search": "ms p50", "pretask": "ms p50", "writeback": "tasks/s"}
        for measure in MEASURES:
            before = statistics.median(results["before"][measure])
            after = statistics.median(results["after"][measure])
            label = {"search": "hybrid search @100k", "pretask": "pre-task retrieval @100k",
                     "writeback": "write-back, 8 agents"}[measure]  # fmt: skip
            print(f"| {label} ({units[measure]}) | {before:.2f} | {after:.2f} | {after / before:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
