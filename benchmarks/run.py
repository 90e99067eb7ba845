"""``make bench``: run every ``bench_*.py`` module, print a table, write JSON.

``--scale`` (``make bench-scale``) runs instead the 1M-entry parts: each module's ``run_scale``
(modules without one are skipped). ``make bench`` keeps the 100k figures and must finish within
10 minutes on the 2-core development machine; the wall and CPU seconds of every module end the
table (``runtime`` rows) and are kept in the JSON, so that a module that grows is seen. Modules
that only measure retrieval quality run beside a single-threaded one (:data:`BESIDE`).

Usage: python benchmarks/run.py [--quick] [--scale] [--only NAME ...] [--json PATH] [--sequential]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import platform
import resource
import subprocess
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


def _results_name(quick: bool, scale: bool) -> str:
    return f"latest{'-scale' if scale else ''}{'-quick' if quick else ''}.json"


def _cpu_seconds() -> float:
    """CPU time of this process and its waited-for children: unlike wall time, it does not grow
    when other work shares the machine, so it tells whether a module grew or the machine is busy."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


BUDGET_SECONDS = 600  # `make bench` on the 2-core development machine

# Modules whose figures do not depend on the machine's load (retrieval quality: MRR, recall, their
# intervals; no timings) run in a second process while the host module runs, on the core it
# leaves free: the host is single-threaded Python and SQLite, and its timed figures are ratios
# to floors measured interleaved with them. `--sequential` runs every module alone.
BESIDE: dict[str, tuple[str, ...]] = {"bench_episodic": ("bench_quality", "bench_code_quality")}


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


def _start_lane(
    args: argparse.Namespace, names: list[str], host: str, tmp: Path
) -> tuple[subprocess.Popen[bytes], Path, tuple[str, ...], str]:
    """``names`` in a child ``run.py`` (its progress on our stderr, its table discarded)."""
    out = tmp / f"beside-{host}.json"
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--sequential",
        "--json",
        str(out),
        "--only",
        *names,
    ]
    command += ["--quick"] * args.quick + ["--scale"] * args.scale
    print(f"running {', '.join(names)} beside {host} ...", file=sys.stderr, flush=True)
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    return child, out, tuple(names), host


def _join_lane(
    child: subprocess.Popen[bytes],
    out: Path,
    names: tuple[str, ...],
    host: str,
    rows_of: dict[str, list[Row]],
    seconds: dict[str, float],
    cpu: dict[str, float],
    failures: list[str],
) -> None:
    """Wait for a lane and take its rows, seconds and failures as if they were run here."""
    code = child.wait()
    try:
        data = orjson.loads(out.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        failures.extend(names)
        print(f"  modules beside {host} left no results (exit {code})", file=sys.stderr, flush=True)
        return
    fields = {f.name for f in dataclasses.fields(Row)}
    for name, found in data.get("module_rows", {}).items():
        rows_of[name] = [Row(**{k: v for k, v in r.items() if k in fields}) for r in found]
    for name in names:
        if name in data["module_seconds"]:
            seconds[f"{name} (beside {host.removeprefix('bench_')})"] = data["module_seconds"][name]
            cpu[f"{name} (beside {host.removeprefix('bench_')})"] = data["module_cpu_seconds"][name]
    failures.extend(data.get("failures", []))
    if code != 0 and not data.get("failures"):
        failures.extend(names)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a fast check")
    parser.add_argument("--scale", action="store_true", help="the 1M-entry runs (modules' run_scale)")
    parser.add_argument("--only", nargs="*", default=None, help="run only these modules (e.g. storage)")
    parser.add_argument("--json", type=Path, default=None, help="where to write the JSON results")
    parser.add_argument("--sequential", action="store_true", help="no module runs beside another")
    args = parser.parse_args(argv)
    modules = sorted(p.stem for p in HERE.glob("bench_*.py"))
    if args.only:
        modules = [m for m in modules if m.removeprefix("bench_") in args.only or m in args.only]
    rows_of: dict[str, list[Row]] = {}
    failures: list[str] = []
    seconds: dict[str, float] = {}
    cpu: dict[str, float] = {}
    entry = "run_scale" if args.scale else "run"
    lanes: list[tuple[subprocess.Popen[bytes], Path, tuple[str, ...], str]] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="memstrata-bench-") as tmp:
        beside = {} if args.sequential else {h: [m for m in g if m in modules] for h, g in BESIDE.items()}
        beside = {h: g for h, g in beside.items() if h in modules and g}
        for name in modules:
            if any(name in group for group in beside.values()):
                continue  # runs beside its host, below
            if name in beside:
                lanes.append(_start_lane(args, beside[name], name, Path(tmp)))
            t0, c0 = time.perf_counter(), _cpu_seconds()
            try:
                module = importlib.import_module(name)
                if not hasattr(module, entry):
                    continue
                print(f"running {name} ...", file=sys.stderr, flush=True)
                workdir = Path(tmp) / name
                workdir.mkdir()
                rows_of[name] = list(getattr(module, entry)(Context(quick=args.quick, workdir=workdir)))
            except Exception:
                failures.append(name)
                traceback.print_exc()
            seconds[name], cpu[name] = time.perf_counter() - t0, _cpu_seconds() - c0
            print(f"  {name}: {seconds[name]:.1f} s ({cpu[name]:.0f} CPU s)", file=sys.stderr, flush=True)
        for lane in lanes:
            _join_lane(*lane, rows_of, seconds, cpu, failures)
    elapsed = time.perf_counter() - started
    rows = [row for name in sorted(rows_of) for row in rows_of[name]]
    rows.extend(_runtime_rows(seconds, cpu, elapsed, full=not (args.quick or args.scale or args.only)))
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
