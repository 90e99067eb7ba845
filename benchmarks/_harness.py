"""The benchmark harness: every ``bench_*.py`` module beside this file contributes rows.

A module defines ``run(ctx: Context) -> list[Row]``. ``make bench`` runs them all at full size,
``make bench-quick`` at small sizes; both print one table and write ``benchmarks/results/*.json``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Row:
    group: str
    name: str
    value: float
    unit: str
    target: str = ""  # e.g. "<= 1.5x numpy"; empty when the row only informs
    baseline: float | None = None
    baseline_name: str = ""
    met: bool | None = None  # None when there is no target
    notes: str = ""

    @property
    def ratio(self) -> float | None:
        if self.baseline in (None, 0):
            return None
        return self.value / self.baseline  # type: ignore[operator]

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["ratio"] = self.ratio
        return data


@dataclass
class Context:
    quick: bool
    workdir: Path
    extra: dict[str, Any] = field(default_factory=dict)
    shared: Path | None = None  # a folder the modules of one run share (stores filled once)

    def size(self, full: int, quick: int) -> int:
        return quick if self.quick else full


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[index]


def time_calls(fn: Callable[[], Any], repeat: int, warmup: int = 3) -> list[float]:
    """Milliseconds per call, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return samples


def p50(samples: list[float]) -> float:
    return statistics.median(samples)


def format_table(rows: list[Row]) -> str:
    header = ("group", "measure", "value", "unit", "target", "baseline", "ratio", "met")
    lines = [header]
    for r in rows:
        baseline = "" if r.baseline is None else f"{r.baseline:.3g} ({r.baseline_name})"
        ratio = "" if r.ratio is None else f"{r.ratio:.2f}"
        met = "" if r.met is None else ("yes" if r.met else "NO")
        lines.append((r.group, r.name, f"{r.value:.4g}", r.unit, r.target, baseline, ratio, met))
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
    out = []
    for n, line in enumerate(lines):
        out.append(" | ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
        if n == 0:
            out.append("-+-".join("-" * w for w in widths))
    return "\n".join(out)
