"""``make bench``: run every ``bench_*.py`` module, print a table, write JSON.

Usage: python benchmarks/run.py [--quick] [--only NAME ...] [--json PATH]
"""

from __future__ import annotations

import argparse
import importlib
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path

import orjson

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _harness import Context, Row, format_table  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a fast check")
    parser.add_argument("--only", nargs="*", default=None, help="run only these modules (e.g. storage)")
    parser.add_argument("--json", type=Path, default=None, help="where to write the JSON results")
    args = parser.parse_args(argv)
    modules = sorted(p.stem for p in HERE.glob("bench_*.py"))
    if args.only:
        modules = [m for m in modules if m.removeprefix("bench_") in args.only or m in args.only]
    rows: list[Row] = []
    failures: list[str] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="memstrata-bench-") as tmp:
        for name in modules:
            print(f"running {name} ...", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            try:
                module = importlib.import_module(name)
                workdir = Path(tmp) / name
                workdir.mkdir()
                rows.extend(module.run(Context(quick=args.quick, workdir=workdir)))
            except Exception:
                failures.append(name)
                traceback.print_exc()
            print(f"  {name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - started
    print(format_table(rows))
    print(f"\n{len(rows)} figures in {elapsed:.0f} s ({'quick' if args.quick else 'full'})")
    out = args.json or HERE / "results" / ("latest-quick.json" if args.quick else "latest.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(
        orjson.dumps(
            {
                "quick": args.quick,
                "seconds": elapsed,
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
