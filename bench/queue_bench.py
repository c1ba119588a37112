"""A queue that grows: submit latency, `squeue` time and the scheduling cycle with 1k, 10k and 100k
pending jobs in a live `rota up` (Slurm's MaxJobCount defaults to 10,000; Flux's rate halves at 16K).

    python -m rota.bench.queue_bench [--levels 1000,10000,100000] [--runs 15]

This machine, as one node, is filled by a job that sleeps; every other job asks for one CPU and waits (Resources for
the first, Priority for the rest), as a queue behind a full cluster does. The queue is filled through
`Client.submit_many`; the figures are taken through the commands as processes (the native thin client)
and the controller's own cycle timings (`ping`). What is held to the 1,000-job figures is what a user asks
of a long queue (one sbatch; squeue of what runs, of one job); a listing of every job grows with its rows,
and is given per row.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .common import Figure, print_table, stop, write_json

BIN = Path(sys.executable).parent
CONF = ("MaxJobCount=1000000\nSchedulerParameters=rota_max_submit_per_user=1000000\n"
        "NodeName=gpu01 CPUs={cpus} RealMemory={memory}\nPartitionName=short Nodes=gpu01 Default=YES MaxTime=1-0\n")
BATCH = 1000


def timed(argv: list[str], env: dict) -> tuple[float, str]:
    t = time.perf_counter()
    r = subprocess.run(argv, env=env, capture_output=True, text=True, cwd="/tmp")
    dt = time.perf_counter() - t
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")
    return dt, r.stdout


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def measure(level: int, runs: int, env: dict, client, up_pid: int) -> dict[str, float]:
    time.sleep(3)                            # a few cycles over the whole queue
    submit, job_id = [], ""
    for _ in range(runs):
        dt, job_id = timed([str(BIN / "sbatch"), "--parsable", "-o", "/dev/null", "--wrap=true"], env)
        submit.append(dt)
    listing = []
    for _ in range(max(3, runs // 3)):
        dt, out = timed([str(BIN / "squeue")], env)
        listing.append(dt)
    rows = out.count("\n") - 1
    running = [timed([str(BIN / "squeue"), "-t", "R"], env)[0] for _ in range(runs)]
    one = [timed([str(BIN / "squeue"), "-j", job_id.strip()], env)[0] for _ in range(runs)]
    time.sleep(2)
    ping = client._call("ping", {})
    return {"pending": ping.get("pending", level), "rows": rows, "submit_ms": statistics.median(submit) * 1000,
            "squeue_ms": statistics.median(listing) * 1000, "squeue_running_ms": statistics.median(running) * 1000,
            "squeue_job_ms": statistics.median(one) * 1000,
            "row_us": statistics.median(listing) * 1e6 / max(1, rows),
            "cycle_mean_ms": ping.get("cycle_mean_ms", 0.0), "cycle_max_ms": ping.get("cycle_max_ms", 0.0),
            "rss_mib": rss_mib(up_pid)}


def start_queue(prefix: str, *options: str) -> tuple[Path, dict, subprocess.Popen, Any]:
    """A `rota up` (``options`` added) on this machine as the one node of CONF (as its agent finds it, so the
    node is not drained for less than configured), filled by a job that sleeps on every CPU: its directory,
    the commands' environment, its process and a client."""
    from rota.agents.agent import mem_total_mib
    from rota.client import Client

    base = Path(tempfile.mkdtemp(prefix=prefix))
    base.chmod(0o755)
    cpus = os.cpu_count() or 1
    (base / "slurm.conf").write_text(CONF.format(cpus=cpus, memory=mem_total_mib()))
    env = dict(os.environ, ROTA_STATE_DIR=str(base / "state"))
    up = subprocess.Popen([str(BIN / "rota"), "up", "--config", str(base / "slurm.conf"), "--agent-node", "gpu01",
                           *options], env=env, stdout=open(base / "up.log", "w"), stderr=subprocess.STDOUT)
    for _ in range(300):
        if (base / "state" / "run" / "commands.sock").exists() and (base / "state" / "cluster.json").exists():
            break
        time.sleep(0.1)
    client = Client(socket=str(base / "state" / "run" / "rota.sock"), timeout=600)
    client.submit(wrap="sleep 100000", options=["-c", str(cpus), "-o", "/dev/null"])
    return base, env, up, client


def run(levels: list[int], runs: int) -> list[Figure]:
    cmd = f"python -m rota.bench.queue_bench --levels {','.join(map(str, levels))} --runs {runs}"
    results: dict[int, dict[str, float]] = {}
    fill_rates: dict[int, float] = {}
    base, env, up, client = start_queue("rota-queue-")
    try:
        submitted = 1
        for level in levels:
            t = time.perf_counter()
            n0 = submitted
            while submitted < level:
                k = min(BATCH, level - submitted)
                client.submit_many(["true"] * k, options=["-o", "/dev/null"])
                submitted += k
            fill_rates[level] = (submitted - n0) / (time.perf_counter() - t)
            results[level] = measure(level, runs, env, client, up.pid)
            submitted += runs                 # the timed sbatch runs added jobs too
            print(f"{level:>7} pending: {results[level]}", file=sys.stderr, flush=True)
    finally:
        stop(up, 60)
        shutil.rmtree(base, ignore_errors=True)
    first = levels[0]
    figures = []
    for level, r in results.items():
        for key, label, unit, gated in (("submit_ms", "one sbatch (median)", "ms", True),
                                        ("squeue_running_ms", "squeue -t R (the running job)", "ms", True),
                                        ("squeue_job_ms", "squeue -j <the last sbatch's job>", "ms", True),
                                        ("squeue_ms", f"squeue listing every job ({r['rows']:,.0f} rows)", "ms", False),
                                        ("row_us", "  the same, per row listed", "us", False),
                                        ("cycle_mean_ms", "scheduling cycle, mean of the latest", "ms", False),
                                        ("cycle_max_ms", "scheduling cycle, longest of the latest", "ms", False),
                                        ("rss_mib", "rota up resident memory", "MiB", False)):
            value = r[key]
            ratio = value / results[first][key] if results[first][key] else 0.0
            target, met = ("", None)
            if gated and level != first:
                target, met = f"<= 2 x the {first:,} value", ratio <= 2.0
            figures.append(Figure(f"{level:,} pending: {label}", value, unit, target, met, cmd,
                                  f"{ratio:.2f} x at {first:,}" if level != first else ""))
        if level in fill_rates:
            figures.append(Figure(f"{level:,} pending: filling the queue with submit_many", fill_rates[level],
                                  "jobs/s", "", None, cmd))
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", default="1000,10000,100000")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    figures = run([int(x) for x in args.levels.split(",")], args.runs)
    print_table(figures, "a queue that grows")
    write_json(figures, args.json)


if __name__ == "__main__":
    main()
