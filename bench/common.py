"""Shared helpers for benchmarks: medians of repeated runs and one printed table."""
from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Callable


@dataclass
class Figure:
    name: str
    value: float
    unit: str
    target: str = ""
    met: bool | None = None
    command: str = ""
    note: str = ""


def median_time(fn: Callable[[], object], runs: int = 5, setup: Callable[[], object] | None = None) -> tuple[float, list[float]]:
    """Median wall time of ``fn`` over ``runs`` runs (``setup`` untimed before each)."""
    times = []
    for _ in range(runs):
        arg = setup() if setup else None
        t0 = time.perf_counter()
        fn(arg) if setup else fn()  # type: ignore[call-arg]
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def print_table(figures: list[Figure], title: str = "") -> None:
    rows = [("figure", "value", "target", "ok", "reproduce")]
    for f in figures:
        val = f"{f.value:,.3f} {f.unit}" if f.value < 100 else f"{f.value:,.0f} {f.unit}"
        ok = "" if f.met is None else ("yes" if f.met else "NO")
        rows.append((f.name, val, f.target, ok, f.command))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    if title:
        print(title)
    for i, r in enumerate(rows):
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
    for f in figures:
        if f.note:
            print(f"  note: {f.name}: {f.note}")
    sys.stdout.flush()


def write_json(figures: list[Figure], path: str | None) -> None:
    if path:
        with open(path, "w") as fh:
            json.dump([asdict(f) for f in figures], fh, indent=1)
