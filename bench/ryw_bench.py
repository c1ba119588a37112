"""Read-your-writes through the commands as processes, against a live ``rota up`` (one node, the host).

Each round drains the node and runs ``sinfo -R`` at once, resumes it and runs ``sinfo -R`` again, submits
a held job and runs ``sacct`` for it, cancels it and runs ``sacct`` and ``squeue``: every read must show the
change just made (a stale read is counted). The same reads, run again with nothing changed in between,
give the baseline: the difference of the medians is what waiting for the projection adds.

    python -m bench.ryw_bench --rounds 1000
"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import Figure, cpu_seconds, print_table, stop

BIN = Path(sys.executable).parent


class Reads:
    """Timed command runs, by kind, and the stale ones."""

    def __init__(self, env: dict) -> None:
        self.env = env
        self.times: dict[str, list[float]] = {}
        self.stale: list[str] = []

    def run(self, kind: str, *argv: str) -> str:
        t0 = time.perf_counter()
        out = subprocess.run([str(BIN / argv[0]), *argv[1:]], env=self.env, capture_output=True, text=True,
                             timeout=60).stdout
        self.times.setdefault(kind, []).append(time.perf_counter() - t0)
        return out

    def check(self, ok: bool, what: str) -> None:
        if not ok:
            self.stale.append(what)


def one_round(r: Reads, node: str, i: int) -> None:
    r.run("write", "scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason=bench{i}")
    out = r.run("sinfo -R after a write", "sinfo", "-R", "-h")
    r.check(f"bench{i} " in out, f"round {i}: sinfo -R after drain: {out!r}")
    r.run("sinfo -R, nothing changed", "sinfo", "-R", "-h")
    r.run("write", "scontrol", "update", f"NodeName={node}", "State=RESUME")
    out = r.run("sinfo -R after a write", "sinfo", "-R", "-h")
    r.check(node not in out, f"round {i}: sinfo -R after resume: {out!r}")
    job = r.run("write", "sbatch", "--parsable", "--hold", "--wrap", "true").strip()
    out = r.run("sacct after a write", "sacct", "-n", "-X", "-P", "-j", job, "--format=JobID,State")
    r.check(out == f"{job}|PENDING\n", f"round {i}: sacct after submit: {out!r}")
    r.run("sacct, nothing changed", "sacct", "-n", "-X", "-P", "-j", job, "--format=JobID,State")
    r.run("write", "scancel", job)
    out = r.run("sacct after a write", "sacct", "-n", "-X", "-P", "-j", job, "--format=JobID,State")
    r.check(out.startswith(f"{job}|CANCELLED"), f"round {i}: sacct after cancel: {out!r}")
    out = r.run("squeue after a write", "squeue", "-h", "-j", job, "-o", "%i")
    r.check(out == "", f"round {i}: squeue after cancel: {out!r}")


def run(rounds: int) -> list[Figure]:
    base = Path(tempfile.mkdtemp(prefix="rota-ryw-"))
    base.chmod(0o755)
    env = dict(os.environ, ROTA_STATE_DIR=str(base / "state"))
    up = subprocess.Popen([str(BIN / "rota"), "up", "--fake-gpus", "a100:4"], env=env,
                          stdout=open(base / "up.log", "w"), stderr=subprocess.STDOUT)
    try:
        for _ in range(300):
            if (base / "state" / "run" / "rota.sock").exists() and (base / "state" / "cluster.json").exists():
                break
            time.sleep(0.1)
        time.sleep(1)
        r = Reads(env)
        node = socket.gethostname().split(".")[0]
        started = time.perf_counter()
        for i in range(rounds):
            one_round(r, node, i)
        took = time.perf_counter() - started
        cpu = cpu_seconds(up.pid)
    finally:
        stop(up)
        shutil.rmtree(base, ignore_errors=True)
    return figures(r, rounds, took) + [Figure("rota up's CPU over the rounds", cpu / took * 100, "% of a core",
                                              command=f"python -m bench.ryw_bench --rounds {rounds}")]


def figures(r: Reads, rounds: int, took: float) -> list[Figure]:
    cmd = f"python -m bench.ryw_bench --rounds {rounds}"
    ms = {kind: statistics.median(t) * 1000 for kind, t in r.times.items()}
    out = [Figure(f"stale reads of {rounds * 5:,}", len(r.stale), "reads", "0", len(r.stale) == 0, cmd),
           Figure(f"{rounds:,} rounds took", took, "s", command=cmd)]
    for kind in ("sinfo -R after a write", "sinfo -R, nothing changed", "sacct after a write",
                 "sacct, nothing changed", "squeue after a write", "write"):
        out.append(Figure(f"{kind}, median", ms[kind], "ms", command=cmd))
    out.append(Figure("added by waiting (sinfo -R)", ms["sinfo -R after a write"] - ms["sinfo -R, nothing changed"],
                      "ms", command=cmd))
    out.append(Figure("added by waiting (sacct)", ms["sacct after a write"] - ms["sacct, nothing changed"], "ms",
                      command=cmd))
    for what in r.stale[:10]:
        print("stale:", what)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=1000)
    args = ap.parse_args()
    print_table(run(args.rounds), "read-your-writes through the commands")


if __name__ == "__main__":
    main()
