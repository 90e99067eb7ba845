"""``make bench``: run every ``bench_*.py`` module, print a table, write JSON.

``--scale`` (``make bench-scale``) runs instead the 1M-entry parts: each module's ``run_scale``
(modules without one are skipped). ``make bench`` keeps the 100k figures and must finish within
10 minutes on the 2-core development machine; the seconds of every module are printed and kept
in the JSON, so that a module that grows is seen.

Usage: python benchmarks/run.py [--quick] [--scale] [--only NAME ...] [--json PATH]
"""

from __future__ import annotations

import argparse
import importlib
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

from _harness import Context, Row, format_table  # noqa: E402


def _results_name(quick: bool, scale: bool) -> str:
    return f"latest{'-scale' if scale else ''}{'-quick' if quick else ''}.json"


def _cpu_seconds() -> float:
    """CPU time of this process and its waited-for children: unlike wall time, it does not grow
    when other work shares the machine, so it tells whether a module grew or the machine is busy."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a fast check")
    parser.add_argument("--scale", action="store_true", help="the 1M-entry runs (modules' run_scale)")
    parser.add_argument("--only", nargs="*", default=None, help="run only these modules (e.g. storage)")
    parser.add_argument("--json", type=Path, default=None, help="where to write the JSON results")
    args = parser.parse_args(argv)
    modules = sorted(p.stem for p in HERE.glob("bench_*.py"))
    if args.only:
        modules = [m for m in modules if m.removeprefix("bench_") in args.only or m in args.only]
    rows: list[Row] = []
    failures: list[str] = []
    seconds: dict[str, float] = {}
    cpu: dict[str, float] = {}
    entry = "run_scale" if args.scale else "run"
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
                rows.extend(getattr(module, entry)(Context(quick=args.quick, workdir=workdir)))
            except Exception:
                failures.append(name)
                traceback.print_exc()
            seconds[name], cpu[name] = time.perf_counter() - t0, _cpu_seconds() - c0
            print(f"  {name}: {seconds[name]:.1f} s ({cpu[name]:.0f} CPU s)", file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - started
    print(format_table(rows))
    kind = ("scale " if args.scale else "") + ("quick" if args.quick else "full")
    print(f"\n{len(rows)} figures in {elapsed:.0f} s ({kind})")
    print(
        "seconds per module: " + ", ".join(f"{m.removeprefix('bench_')} {s:.0f}" for m, s in seconds.items())
    )
    print(f"CPU seconds: {sum(cpu.values()):.0f} (this process and its finished child processes)")
    out = args.json or HERE / "results" / _results_name(args.quick, args.scale)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(
        orjson.dumps(
            {
                "quick": args.quick,
                "scale": args.scale,
                "seconds": elapsed,
                "module_seconds": seconds,
                "module_cpu_seconds": cpu,
                "machine": {"python": platform.python_version(), "platform": platform.platform()},
                "rows": [r.as_dict() for r in rows],
                "failures": failures,
            },
            option=orjson.OPT_INDENT_2,
        )
    )
    print(f"JSON written to {out}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
