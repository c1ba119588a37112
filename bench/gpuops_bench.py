"""GPU operations' figures: the time-accuracy report on a large history, and the cost of sampling GPU use.

    python -m rota.bench.gpuops_bench [--jobs 100000] [--runs 3]

The report runs as users run it (``rota report time-accuracy`` as a process) over a projection holding
``--jobs`` ended jobs; the sampler is the agent's (GpuUse over the fake NVML), 8 GPUs of 4 jobs, timed per
sample and given as the share of one CPU at a sample every 10 s.
"""
from __future__ import annotations

import argparse
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from .common import Figure, median_time, print_table

BIN = Path(sys.executable).parent


def projection(path: Path, jobs: int) -> None:
    """A projection with ``jobs`` ended jobs of 40 users in 8 accounts, limits padded as people pad them."""
    from rota.projections.schema import SCHEMA

    rng = random.Random(7)
    conn = sqlite3.connect(path)
    conn.executescript(SCHEMA)
    rows = []
    for i in range(1, jobs + 1):
        limit = rng.choice([3600, 4 * 3600, 24 * 3600, 72 * 3600])
        used = int(limit * rng.betavariate(1.2, 4))
        start = 1_700_000_000 + i * 30
        rows.append((i, f"u{i % 40}", f"acct{i % 8}", "COMPLETED", start - 60, start, start + used, limit, used))
    conn.executemany("INSERT INTO jobs (job_id, user, account, state, submit, start, end_time, time_limit, elapsed) "
                     "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    conn.commit()
    conn.close()


def report_seconds(jobs: int, runs: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "projections.sqlite"
        projection(db, jobs)
        env = dict(os.environ, ROTA_PROJECTIONS=str(db))

        def once() -> None:
            r = subprocess.run([str(BIN / "rota"), "report", "time-accuracy", "-P"], env=env, capture_output=True,
                               text=True, check=False)
            if r.returncode or len(r.stdout.splitlines()) != 41:
                raise SystemExit(f"report failed: {r.stderr or r.stdout[:300]}")
        return median_time(once, runs)[0]


def sampling_share(samples: int = 2000) -> float:
    """One CPU's share spent sampling 8 GPUs every 10 s (each sample: NVML reads and the verdicts)."""
    from rota.agents.gpu import FakeNvml, Gpus
    from rota.agents.gpuuse import GpuUse

    gpus = Gpus(FakeNvml("a100", 8, None, "bench"), "a100")
    use = GpuUse("bench", gpus.utilisation, 60)
    runs = {j: SimpleNamespace(order=SimpleNamespace(gpus=(2 * j, 2 * j + 1), restarts=0)) for j in range(4)}
    t0 = time.process_time()
    for k in range(samples):
        use.sample(runs, k * 10)
    per_sample = (time.process_time() - t0) / samples
    return per_sample / 10.0


def run(jobs: int = 100_000, runs: int = 3) -> list[Figure]:
    secs = report_seconds(jobs, runs)
    share = sampling_share()
    return [Figure(f"time-accuracy report, {jobs:,} ended jobs", secs, "s", "<= 5 s", secs <= 5.0,
                   "python -m rota.bench.gpuops_bench"),
            Figure("GPU-use sampling, 8 GPUs (one sample)", share * 10 * 1e6, "us CPU", "<= 100,000 us (1 % at 10 s)",
                   share <= 0.01, "python -m rota.bench.gpuops_bench",
                   f"{share * 100:.4f} % of one CPU at a sample every 10 s; the fake NVML's reads (pynvml adds the "
                   "driver's time)")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    print_table(run(a.jobs, a.runs), "GPU operations")


if __name__ == "__main__":
    main()
