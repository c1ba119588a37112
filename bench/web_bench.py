"""The web view's figures, over HTTP from a real `rota up` (its own `rota web` child): the queue page and
``/metrics`` with 10,000 pending jobs.

    python -m rota.bench.web_bench [--jobs 10000] [--runs 7]

One node with 4 GPUs is held by a running job; ``--jobs`` jobs each wanting the whole node wait behind it
(Resources and Priority), submitted in one `rota submit`. Each figure is the median time of a GET, after one
untimed GET, signed in as root with a token from `rota web login`.
"""
from __future__ import annotations

import argparse
import http.cookiejar
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from rota.controller.natsserver import free_port

from .common import Figure, print_table

BIN = Path(sys.executable).parent
CONF = """GresTypes=gpu
NodeName=gpu01 CPUs=8 RealMemory=16000 Gres=gpu:a100:4
PartitionName=gpu Nodes=gpu01 Default=YES MaxTime=1:00:00
MaxJobCount=100000
"""


def _wait(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"web_bench: {what} did not happen in {timeout:.0f} s")
        time.sleep(0.2)


def _timed(opener, url: str, runs: int) -> tuple[float, int]:
    opener.open(url, timeout=60).read()
    times, size = [], 0
    for _ in range(runs):
        t = time.perf_counter()
        size = len(opener.open(url, timeout=60).read())
        times.append(time.perf_counter() - t)
    return statistics.median(times), size


def run(jobs: int = 10_000, runs: int = 7) -> list[Figure]:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        (base / "slurm.conf").write_text(CONF)
        port = free_port()
        env = dict(os.environ, ROTA_STATE_DIR=str(base / "state"), ROTA_WEB_PORT=str(port))
        cmd = lambda *a: subprocess.run([str(BIN / a[0]), *a[1:]], env=env, capture_output=True, text=True)  # noqa: E731
        with open(base / "up.log", "w") as fh:
            up = subprocess.Popen([str(BIN / "rota"), "up", "--config", str(base / "slurm.conf"), "--fake-gpus",
                                   "a100:4"], env=env, stdout=fh, stderr=subprocess.STDOUT)
        try:
            _wait(lambda: (base / "state" / "cluster.json").exists(), 60, "rota up")
            cmd("sbatch", "--gres=gpu:4", "-t", "60", "-o", "/dev/null", "--wrap", "sleep 3600")
            (base / "jobs.txt").write_text("true\n" * jobs)
            r = cmd("rota", "submit", "--file", str(base / "jobs.txt"), "--gres=gpu:4", "-t", "10", "-o", "/dev/null")
            if r.returncode:
                raise SystemExit(f"web_bench: rota submit failed: {r.stderr}")
            _wait(lambda: len(cmd("squeue", "-h", "-t", "PD", "-o", "%i").stdout.split()) >= jobs, 300, "the queue")
            token = cmd("rota", "web", "login").stdout.strip()
            opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
            opener.open(token, timeout=30).read()
            url = f"http://127.0.0.1:{port}"
            page, size = _timed(opener, url + "/", runs)
            rows, _ = _timed(opener, url + "/queue/rows", runs)
            metrics, _ = _timed(opener, url + "/metrics", runs)
        finally:
            up.send_signal(signal.SIGINT)
            up.wait(60)
    how = f"python -m rota.bench.web_bench --jobs {jobs}"
    return [Figure(f"web: the queue page, {jobs:,} pending jobs (GET /, {size / 1e6:.1f} MB of HTML)", page * 1000, "ms",
                   "<= 300 ms", page <= 0.3, how, f"median of {runs} GETs over HTTP, after one untimed"),
            Figure(f"web: the queue's rows as the page refreshes them ({jobs:,} pending)", rows * 1000, "ms", "", None, how),
            Figure(f"web: /metrics with {jobs:,} jobs", metrics * 1000, "ms", "<= 50 ms", metrics <= 0.05, how,
                   f"median of {runs} scrapes")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    print_table(run(args.jobs, args.runs), "the web view")


if __name__ == "__main__":
    main()
