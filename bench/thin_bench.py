"""The commands as users run them: one held `sbatch`, `squeue -r` with 2,000 pending array tasks, and
submit loops (1 and 8 submitters running `sbatch` one after another), through the native thin client,
the Python entry point (thin), and the command in its own process (``ROTA_THIN=0``), against a live
`rota up`; with ``--slurm``, Slurm's own commands (a running Slurm: ../shared/slurm-anchor or
ops/slurm) in the same run, alternating, with the ratios.

    python -m rota.bench.thin_bench [--runs 15] [--loop 300] [--slurm]

Every figure is a process started and waited for, as a shell or a workflow engine does.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from .common import Figure, print_table, write_json

BIN = Path(sys.executable).parent
CONF = ("GresTypes=gpu\nMaxArraySize=10001\nNodeName=gpu[01-04] CPUs=64 RealMemory=257000 Gres=gpu:a100:8\n"
        "PartitionName=short Nodes=gpu[01-04] Default=YES MaxTime=1:00:00\n")


def timed(argv: list[str], env: dict) -> float:
    t = time.perf_counter()
    r = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd="/tmp")
    dt = time.perf_counter() - t
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.decode().strip()}")
    return dt


def alternate(ways: dict[str, list[str]], envs: dict[str, dict], runs: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {k: [] for k in ways}
    for _ in range(2):
        for k, argv in ways.items():
            timed(argv, envs[k])
    for _ in range(runs):
        for k, argv in ways.items():
            times[k].append(timed(argv, envs[k]))
    return times


def loop_rate(argv: list[str], env: dict, total: int, submitters: int) -> float:
    """Submits per second with ``submitters`` shells each running ``argv`` one after another."""
    def one(n: int) -> None:
        for _ in range(n):
            subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, cwd="/tmp")
    threads = [threading.Thread(target=one, args=(total // submitters,)) for _ in range(submitters)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return (total // submitters * submitters) / (time.perf_counter() - t)


def run(runs: int, loop: int, slurm: bool) -> list[Figure]:
    if not (BIN / "sbatch").is_symlink():
        raise SystemExit("the native client is not installed here: run `rota install-commands` first")
    base = Path(tempfile.mkdtemp(prefix="rota-thin-"))
    base.chmod(0o755)
    (base / "slurm.conf").write_text(CONF)
    env = dict(os.environ, ROTA_STATE_DIR=str(base / "state"))
    up = subprocess.Popen([str(BIN / "rota"), "up", "--config", str(base / "slurm.conf"), "--fake-gpus", "a100:8"],
                          env=env, stdout=open(base / "up.log", "w"), stderr=subprocess.STDOUT)
    figures = []
    cmd = f"python -m rota.bench.thin_bench --runs {runs} --loop {loop}" + (" --slurm" if slurm else "")
    try:
        for _ in range(300):
            if (base / "state" / "run" / "commands.sock").exists() and (base / "state" / "cluster.json").exists():
                break
            time.sleep(0.1)
        direct = dict(env, ROTA_THIN="0")
        py_entry = [sys.executable, "-c", "from rota.cli.thin import sbatch; sbatch()"]
        held = ["--parsable", "--hold", "-o", "/dev/null", "--wrap=true"]
        ways = {"native": [str(BIN / "sbatch"), *held], "python entry point": [*py_entry, *held],
                "in its own process": [*py_entry, *held], "python -c pass": [sys.executable, "-c", "pass"],
                "python -I -S -c pass": [sys.executable, "-I", "-S", "-c", "pass"]}
        envs = {k: direct if k == "in its own process" else env for k in ways}
        if slurm:
            ways["Slurm"] = ["/usr/bin/sbatch", *held]
            envs["Slurm"] = dict(os.environ)
        times = alternate(ways, envs, runs)
        for k, ts in times.items():
            med = statistics.median(ts)
            note = ""
            if slurm and k != "Slurm":
                note = f"{statistics.median([a / b for a, b in zip(ts, times['Slurm'])]):.2f} x Slurm's"
            figures.append(Figure(f"one held sbatch: {k}" if "pass" not in k else k, med * 1000, "ms", "", None,
                                  cmd, note))
        subprocess.run([str(BIN / "sbatch"), "--hold", "-o", "/dev/null", "--array=0-1999", "--wrap=true"], env=env,
                       check=True, stdout=subprocess.DEVNULL, cwd="/tmp")
        sq = {"native": [str(BIN / "squeue"), "-r"]}
        sq_envs = {"native": env}
        if slurm:
            subprocess.run(["/usr/bin/sbatch", "--hold", "-o", "/dev/null", "--array=0-1999", "--wrap=true"],
                           check=True, stdout=subprocess.DEVNULL, cwd="/tmp")
            sq["Slurm"] = ["/usr/bin/squeue", "-r"]
            sq_envs["Slurm"] = dict(os.environ)
        times = alternate(sq, sq_envs, runs)
        lines = subprocess.run(sq["native"], env=env, capture_output=True, text=True).stdout.count("\n")
        for k, ts in times.items():
            figures.append(Figure(f"squeue -r, 2,000 pending array tasks: {k}", statistics.median(ts) * 1000, "ms", "",
                                  None, cmd, f"{lines} lines" if k == "native" else ""))
        for submitters in (1, 8):
            rates = {"native": loop_rate([str(BIN / "sbatch"), *held], env, loop, submitters)}
            if slurm:
                rates["Slurm"] = loop_rate(["/usr/bin/sbatch", *held], dict(os.environ), loop, submitters)
            for k, rate in rates.items():
                figures.append(Figure(f"{loop} held submits, {submitters} submitter(s) looping sbatch: {k}", rate,
                                      "/s", "", None, cmd))
            if submitters == 8:
                looped = rates["native"]
        from rota.client import Client

        client = Client(socket=str(base / "state" / "run" / "rota.sock"))
        bulk = []
        for _ in range(3):
            t = time.perf_counter()
            client.submit_many(["true"] * (loop * 5), options=["--hold", "-o", "/dev/null"])
            bulk.append(loop * 5 / (time.perf_counter() - t))
        rate = statistics.median(bulk)
        figures.append(Figure(f"{loop * 5} held submits in one Client.submit_many (median of 3)", rate, "/s",
                              ">= 5 x the 8-submitter loop", rate >= 5 * looped, cmd,
                              f"{rate / looped:.1f} x the 8-submitter sbatch loop"))
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(30)
        except subprocess.TimeoutExpired:
            up.kill()
        shutil.rmtree(base, ignore_errors=True)
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--loop", type=int, default=300)
    ap.add_argument("--slurm", action="store_true", help="also Slurm's commands (/usr/bin), alternating")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    figures = run(args.runs, args.loop, args.slurm)
    print_table(figures, "the commands as processes")
    write_json(figures, args.json)


if __name__ == "__main__":
    main()
