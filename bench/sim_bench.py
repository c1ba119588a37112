"""Simulation speed and scaling.

    python -m rota.bench.sim_bench [--runs 3] [--traces DIR] [--quick]

Figures: simulated jobs/s on the KTH-SP2 trace (28,467 jobs, EASY) and on the whole Philly GPU
trace (30,940 jobs on 160 x 8 GPUs, conservative) with its peak memory; how one cycle's time
grows with pending jobs (1k, 10k, 50k on 1,000 nodes) and with nodes (100, 1k, 5k, 10k pending).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time

from rota.core.schedule import schedule

from .common import Figure, median_time, print_table, write_json
from .core_bench import T0, gpus_busy, loaded_state



def default_traces() -> str:
    """Where the whole traces are (``--traces`` or ``ROTA_TRACES``; tests/fixtures/traces/SOURCES.md says
    where to get them): the repository holds only slices, and whole-trace figures are skipped without them."""
    return os.environ.get("ROTA_TRACES", "")


def simulate_json(trace: str, policy: str, extra: list[str] | None = None) -> dict:
    """Run ``rota simulate --json`` in a fresh process (so peak memory is its own)."""
    cmd = [sys.executable, "-m", "rota.cli.main", "simulate", trace, "--policy", policy, "--json"] + (extra or [])
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def run(runs: int, traces: str, quick: bool = False) -> list[Figure]:
    figures: list[Figure] = []
    kth = os.path.join(traces, "KTH-SP2-1996-2.1-cln.swf.gz")
    philly = os.path.join(traces, "chronus_philly_MIX1.csv.gz")
    if os.path.exists(kth):
        results = [simulate_json(kth, "easy") for _ in range(runs)]
        rate = sorted(r["jobs_per_s"] for r in results)[len(results) // 2]
        figures.append(Figure("simulate KTH-SP2, 28,467 jobs, EASY", rate, "jobs/s", "", None,
                              "rota simulate $ROTA_TRACES/KTH-SP2-1996-2.1-cln.swf.gz --policy easy",
                              f"peak {results[0]['peak_rss_mib']:.0f} MiB, {int(results[0]['cycles'])} cycles"))
    if os.path.exists(philly) and not quick:
        r = simulate_json(philly, "conservative")
        figures.append(Figure("simulate Philly MIX1 in full, 30,940 jobs, conservative", r["jobs_per_s"],
                              "jobs/s", "", None,
                              "rota simulate $ROTA_TRACES/chronus_philly_MIX1.csv.gz --policy conservative",
                              f"1 run: {r['wall_s']:.0f} s, peak {r['peak_rss_mib']:.0f} MiB, "
                              f"{int(r['cycles'])} cycles, GPU utilisation {r['gpu_util']:.3f}"))
    scale_runs = max(1, min(runs, 3))
    pendings = [1000, 10000] if quick else [1000, 10000, 50000]
    for pending in pendings:
        state = loaded_state(pending)
        for policy in ("easy", "conservative"):
            gc.collect()
            med, _ = median_time(lambda state=state, policy=policy: schedule(state, T0 + 600, policy), scale_runs)
            figures.append(Figure(f"scaling: {policy} cycle, 1,000 nodes, {pending:,} pending", med, "s", "", None,
                                  "python -m rota.bench.sim_bench (scaling)"))
    for nodes in ([100, 1000] if quick else [100, 1000, 5000]):
        t = time.perf_counter()
        state = loaded_state(10000, nodes=nodes)
        note = f"{len(state.running)} running, {gpus_busy(state):.0%} GPUs busy, built in {time.perf_counter() - t:.0f} s"
        for policy in ("easy", "conservative"):
            gc.collect()
            med, _ = median_time(lambda state=state, policy=policy: schedule(state, T0 + 600, policy), scale_runs)
            figures.append(Figure(f"scaling: {policy} cycle, {nodes:,} nodes, 10,000 pending", med, "s", "", None,
                                  "python -m rota.bench.sim_bench (scaling)", note))
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--traces", default=default_traces())
    ap.add_argument("--quick", action="store_true", help="skip the longest runs")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    figures = run(args.runs, args.traces, args.quick)
    print_table(figures, "rota simulation benchmark")
    write_json(figures, args.json)


if __name__ == "__main__":
    main()
