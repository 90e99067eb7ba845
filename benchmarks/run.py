"""``make bench``: run every ``bench_*.py`` module, print a table, write JSON.

A module takes part in a run through its entry point: ``run`` for ``make bench`` (the 100k
figures), ``run_scale`` for ``--scale`` (``make bench-scale``, the 1M-entry parts) and
``run_quality`` for ``--quality`` (``make bench-quality``: retrieval quality on real corpora, MRR
and recall, no timings; they do not depend on the machine or its load, and took as long as the
rest of ``make bench`` together on the 2-core development machine). Modules without the entry are
skipped. ``make bench`` must finish within 10 minutes on that machine; the wall and CPU seconds of
every module end the table (``runtime`` rows) and are kept in the JSON, so that a module that
grows is seen.

Usage: python benchmarks/run.py [--quick] [--scale | --quality] [--only NAME ...] [--json PATH]
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import resource
import sys
import tempfile
import time
import traceback
from pathlib import Path

import orjson

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
# the processes measured here (``memstrata query``, ``status``, ...) run as an installed package
# runs: with its bytecode cached (an environment that forbids writing it recompiles every module
# of every process: ~70 ms more per ``memstrata query``)
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

from _harness import Context, Row, format_table  # noqa: E402


def _results_name(quick: bool, scale: bool, quality: bool) -> str:
    return f"latest{'-scale' if scale else ''}{'-quality' if quality else ''}{'-quick' if quick else ''}.json"


def _cpu_seconds() -> float:
    """CPU time of this process and its waited-for children: unlike wall time, it does not grow
    when other work shares the machine, so it tells whether a module grew or the machine is busy."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


BUDGET_SECONDS = 600  # `make bench` on the 2-core development machine


def _runtime_rows(
    seconds: dict[str, float], cpu: dict[str, float], elapsed: float, *, full: bool
) -> list[Row]:
    """The run's own cost in the table: wall and CPU seconds per module, and the total against
    the 10-minute budget of `make bench` (judged only for a full default run)."""
    rows = [
        Row(
            "runtime",
            f"module {name.removeprefix('bench_')}",
            value,
            "s",
            notes=f"{cpu[name]:.0f} CPU s ({cpu[name] / value:.1f} cores busy)" if value > 0 else "",
        )
        for name, value in seconds.items()
    ]
    rows.append(
        Row(
            "runtime",
            "whole run",
            elapsed,
            "s",
            target=f"<= {BUDGET_SECONDS} s" if full else "",
            met=elapsed <= BUDGET_SECONDS if full else None,
            notes=f"{sum(cpu.values()):.0f} CPU s; load average at the end {os.getloadavg()[0]:.1f}",
        )
    )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a fast check")
    parser.add_argument("--scale", action="store_true", help="the 1M-entry runs (modules' run_scale)")
    parser.add_argument("--quality", action="store_true", help="the retrieval quality modules alone")
    parser.add_argument("--only", nargs="*", default=None, help="run only these modules (e.g. storage)")
    parser.add_argument("--json", type=Path, default=None, help="where to write the JSON results")
    args = parser.parse_args(argv)
    if args.scale and args.quality:
        parser.error("--scale and --quality are separate runs")
    modules = sorted(p.stem for p in HERE.glob("bench_*.py"))
    if args.only:
        modules = [m for m in modules if m.removeprefix("bench_") in args.only or m in args.only]
    rows_of: dict[str, list[Row]] = {}
    failures: list[str] = []
    seconds: dict[str, float] = {}
    cpu: dict[str, float] = {}
    entry = "run_scale" if args.scale else "run_quality" if args.quality else "run"
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="memstrata-bench-") as tmp:
        for name in modules:
            t0, c0 = time.perf_counter(), _cpu_seconds()
            try:
                module = importlib.import_module(name)
                if not hasattr(module, entry):
                    continue
                print(f"running {name} ...", file=sys.stderr, flush=True)
                workdir = Path(tmp) / name
                workdir.mkdir()
                context = Context(quick=args.quick, workdir=workdir, shared=Path(tmp) / "shared")
                rows_of[name] = list(getattr(module, entry)(context))
            except Exception:
                failures.append(name)
                traceback.print_exc()
            seconds[name], cpu[name] = time.perf_counter() - t0, _cpu_seconds() - c0
            print(f"  {name}: {seconds[name]:.1f} s ({cpu[name]:.0f} CPU s)", file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - started
    rows = [row for name in sorted(rows_of) for row in rows_of[name]]
    full = not (args.quick or args.scale or args.quality or args.only)
    rows.extend(_runtime_rows(seconds, cpu, elapsed, full=full))
    print(format_table(rows))
    kind = (
        ("scale " if args.scale else "")
        + ("quality " if args.quality else "")
        + ("quick" if args.quick else "full")
    )
    print(f"\n{len(rows)} figures in {elapsed:.0f} s ({kind})")
    print(
        "seconds per module: " + ", ".join(f"{m.removeprefix('bench_')} {s:.0f}" for m, s in seconds.items())
    )
    print(f"CPU seconds: {sum(cpu.values()):.0f} (this process and its finished child processes)")
    out = args.json or HERE / "results" / _results_name(args.quick, args.scale, args.quality)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(
        orjson.dumps(
            {
                "quick": args.quick,
                "scale": args.scale,
                "quality": args.quality,
                "seconds": elapsed,
                "module_seconds": seconds,
                "module_cpu_seconds": cpu,
                "machine": {"python": platform.python_version(), "platform": platform.platform()},
                "rows": [r.as_dict() for r in rows],
                "module_rows": {name: [r.as_dict() for r in found] for name, found in rows_of.items()},
                "failures": failures,
            },
            option=orjson.OPT_INDENT_2,
        )
    )
    print(f"JSON written to {out}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
