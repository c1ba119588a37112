"""Jobs launched and completed per second: N trivial jobs on 4 agents (fake GPUs), submit to COMPLETED.

    python -m rota.bench.agent_bench [--jobs 1000] [--runs 3]

A controller (`rota up --no-agent`, embedded nats-server, fsync on every append) and four
`rota agent` processes on this machine; the jobs are `true` batch scripts submitted by 8 concurrent
clients; the clock stops when the last job's COMPLETED is on the log. Slurm 22.05 on this machine
(4 nodes on one host) reaches 30.4 jobs/s.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import ApiClient, Figure, print_table, write_json

SLURM_RATE = 30.4
CONF = """GresTypes=gpu
NodeName=n[1-4] CPUs=16 RealMemory=16000 Gres=gpu:a100:4
PartitionName=main Nodes=n[1-4] Default=YES MaxTime=1:00:00
"""
BIN = Path(sys.executable).parent


def _wait_for(path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear")
        time.sleep(0.05)


async def _run_jobs(url: str, n: int, workdir: str, state: Path) -> float:
    api = ApiClient(str(state))
    nc = await api.connect(url)
    done = asyncio.Event()
    states: dict[str, int] = {}

    async def on_exit(msg) -> None:
        data = json.loads(msg.data)
        state = data["state"]
        if state != "COMPLETED":
            print("not completed:", data, file=sys.stderr)
        states[state] = states.get(state, 0) + 1
        if sum(states.values()) >= n:
            done.set()

    await nc.subscribe("rota.ev.job.exited", cb=on_exit)
    spec = {"name": "trivial", "time_limit": 600, "script": "#!/bin/sh\ntrue\n",
            "workdir": workdir, "output": "/dev/null"}

    async def client(count: int) -> None:
        for _ in range(count):
            reply = await api.request(nc, "submit", {"spec": spec})
            assert reply["ok"], reply

    t0 = time.perf_counter()
    await asyncio.gather(*(client(n // 8 + (1 if i < n % 8 else 0)) for i in range(8)))
    await asyncio.wait_for(done.wait(), timeout=600)
    dt = time.perf_counter() - t0
    await nc.close()
    assert states == {"COMPLETED": n}, states
    return n / dt


def bench(jobs: int, runs: int) -> list[Figure]:
    rates = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            state = Path(tmp) / "state"
            conf = Path(tmp) / "slurm.conf"
            conf.write_text(CONF)
            env = dict(os.environ, ROTA_STATE_DIR=str(state))
            procs = [subprocess.Popen([str(BIN / "rota"), "up", "--config", str(conf), "--no-agent"], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
            try:
                _wait_for(state / "cluster.json")
                url = json.loads((state / "cluster.json").read_text())["nats"]
                for i in range(1, 5):
                    procs.append(subprocess.Popen(
                        [str(BIN / "rota"), "agent", "--node", f"n{i}", "--nats", url, "--state-dir", str(state),
                         "--fake-gpus", "a100:4", "--cpus", "16", "--memory", "16000"],
                        env=env, stdout=open(Path(tmp) / f"agent-n{i}.log", "w"), stderr=subprocess.STDOUT))
                time.sleep(2)   # the agents register
                rates.append(asyncio.run(_run_jobs(url, jobs, tmp, state)))
            finally:
                for p in reversed(procs):
                    p.terminate()
                for p in procs:
                    p.wait(30)
    med = statistics.median(rates)
    return [Figure(f"{jobs:,} trivial jobs on 4 agents, submit to COMPLETED", med, "jobs/s",
                   f">= {2 * SLURM_RATE:.1f} (2x Slurm's {SLURM_RATE})", med >= 2 * SLURM_RATE,
                   f"python -m rota.bench.agent_bench --jobs {jobs}",
                   "runs: " + ", ".join(f"{r:.1f}" for r in rates))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    figures = bench(args.jobs, args.runs)
    print_table(figures, "rota agent launch benchmark")
    write_json(figures, args.json)


if __name__ == "__main__":
    main()
