"""Run every benchmark in bench/ and print one table: figure, target, whether met, how to reproduce.

    python -m rota.bench.run_all [--quick] [--json FILE]
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from . import (agent_bench, cli_bench, core_bench, fleet_bench, fuzz_bench, gpuops_bench, log_bench, memory_bench,
               sim_bench, step_bench, timetravel_bench, web_bench)
from .common import Figure, print_table, write_json


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer runs and smaller sizes (a smoke run)")
    ap.add_argument("--json", default=None, help="also write all figures as JSON")
    args = ap.parse_args()
    runs = 2 if args.quick else 5
    figures: list[Figure] = []
    figures += core_bench.run(runs, [10000] if args.quick else [10000, 50000],
                              200_000 if args.quick else 1_000_000)
    figures += sim_bench.run(2 if args.quick else 3, sim_bench.default_traces(), quick=args.quick)
    figures += log_bench.run(20_000 if args.quick else 100_000, 500 if args.quick else 2000, 2 if args.quick else 3)
    figures += agent_bench.bench(200 if args.quick else 1000, 1 if args.quick else 3)
    figures += cli_bench.run(10_000 if args.quick else 100_000, 1_000 if args.quick else 10_000, 3 if args.quick else 10)
    figures += step_bench.run(5 if args.quick else 20)
    figures += timetravel_bench.run(3_000 if args.quick else 12_000, 1 if args.quick else 3)
    figures += fuzz_bench.run(1_000 if args.quick else 10_000)
    figures += gpuops_bench.run(20_000 if args.quick else 100_000, 1 if args.quick else 3)
    figures += web_bench.run(2_000 if args.quick else 10_000, 3 if args.quick else 7)
    figures += memory_bench.run([10_000] if args.quick else [10_000, 100_000], ["alike", "distinct"])
    figures += fleet_bench.run(100 if args.quick else 1000, 2 if args.quick else 4, 1_000 if args.quick else 10_000)
    print()
    print_table(figures, f"rota benchmarks (medians of {runs} runs unless noted)")
    found = shutil.which("sbatch")
    if found is None or Path(found).parent == Path(sys.executable).parent:   # none, or rota's own
        print("  Slurm is not installed on this machine: no side-by-side Slurm figures in this run.")
    write_json(figures, args.json)


if __name__ == "__main__":
    main()
