"""The commands as users run them: one held `sbatch`, `squeue -r` with 2,000 pending array tasks,
submit loops (1 and 8 submitters running `sbatch` one after another), trivial jobs submitted one by
one until all ended, one trivial job at a time until it has gone, an array's launch rate on 4 nodes,
and bulk submission through the Python API, against a live `rota up` with four agents (gpu01-04, as
slurmd x 4 on one host); the held sbatch also through the Python entry point and in its own process
(``ROTA_THIN=0``). With ``--slurm``, Slurm's own commands (a running Slurm: ops/slurm/setup.sh) in the
same run, alternating, with the ratios.

    python -m rota.bench.thin_bench [--runs 15] [--loop 300] [--e2e 200] [--array 500] [--slurm]

Every figure is a process started and waited for, as a shell or a workflow engine does.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field
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
CONF = ("GresTypes=gpu\nMaxArraySize=10001\nMaxJobCount=1000000\n"
        "NodeName=gpu[01-04] CPUs=64 RealMemory=257000 Gres=gpu:a100:8\n"
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


def drained(squeue: str, env: dict, *select: str, poll: float = 0.05, timeout: float = 600) -> None:
    """Wait until ``squeue -h [select...]`` lists nothing (every job of the run, or those selected, ended)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not subprocess.run([squeue, "-h", *select], env=env, capture_output=True, text=True,
                              cwd="/tmp").stdout.strip():
            return
        time.sleep(poll)
    raise RuntimeError(f"{squeue}: jobs still listed after {timeout:.0f} s")


def end_to_end(bin_dir: str, env: dict, jobs: int) -> float:
    """Jobs per second: ``jobs`` trivial jobs submitted one by one, until the last has ended."""
    t = time.perf_counter()
    for _ in range(jobs):
        subprocess.run([f"{bin_dir}/sbatch", "-o", "/dev/null", "--wrap=true"], env=env, check=True,
                       stdout=subprocess.DEVNULL, cwd="/tmp")
    drained(f"{bin_dir}/squeue", env)
    return jobs / (time.perf_counter() - t)


def one_at_a_time(bin_dir: str, env: dict, jobs: int) -> float:
    """Milliseconds from submitting a trivial job until ``squeue`` no longer lists it, one job after the
    other (the median of ``jobs``): what someone waiting on a short job waits."""
    waits = []
    for _ in range(jobs):
        t = time.perf_counter()
        jid = subprocess.run([f"{bin_dir}/sbatch", "--parsable", "-o", "/dev/null", "--wrap=true"], env=env,
                             check=True, capture_output=True, text=True, cwd="/tmp").stdout.strip().split(";")[0]
        drained(f"{bin_dir}/squeue", env, "-j", jid, poll=0.002, timeout=60)
        waits.append((time.perf_counter() - t) * 1000)
    return statistics.median(waits)


def launch_rate(bin_dir: str, env: dict, jobs: int) -> float:
    """Jobs per second: an array of ``jobs`` trivial tasks (one request), until the last has ended."""
    t = time.perf_counter()
    subprocess.run([f"{bin_dir}/sbatch", "-o", "/dev/null", f"--array=0-{jobs - 1}", "--wrap=true"], env=env,
                   check=True, stdout=subprocess.DEVNULL, cwd="/tmp")
    drained(f"{bin_dir}/squeue", env)
    return jobs / (time.perf_counter() - t)


def side_by_side(name: str, measure: dict, repeats: int, cmd: str, higher_is_better: bool, unit: str,
                 target: float | None = None) -> list[Figure]:
    """Run each way's ``measure`` ``repeats`` times, alternating; medians, and rota's ratio to Slurm's."""
    values: dict[str, list[float]] = {k: [] for k in measure}
    for _ in range(repeats):
        for k, fn in measure.items():
            values[k].append(fn())
    med = {k: statistics.median(v) for k, v in values.items()}
    out = []
    for k, v in med.items():
        note, met, tgt = "", None, ""
        if "Slurm" in med and k != "Slurm":
            ratio = v / med["Slurm"]
            note = f"{ratio:.2f} x Slurm's" + ("" if higher_is_better else " time")
            if target is not None:
                tgt = (f">= {target} x Slurm" if higher_is_better else f"<= {target} x Slurm")
                met = ratio >= target if higher_is_better else ratio <= target
        out.append(Figure(f"{name}: {k}", v, unit, tgt, met, cmd,
                          note + f" (runs {', '.join(f'{x:.1f}' for x in values[k])})"))
    return out


def start_agents(base: Path, env: dict) -> list[subprocess.Popen]:
    """The four emulated nodes' agents, each a process of its own as slurmd x 4 on one host (``rota up``
    runs the controller, as slurmctld)."""
    procs = []
    for node in ("gpu01", "gpu02", "gpu03", "gpu04"):
        procs.append(subprocess.Popen(
            [str(BIN / "rota"), "agent", "--node", node, "--fake-gpus", "a100:8", "--cpus", "64", "--memory", "257000",
             "--socket",
             str(base / f"{node}.sock")], env=env, stdout=open(base / f"{node}.log", "w"), stderr=subprocess.STDOUT))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        idle = subprocess.run([str(BIN / "sinfo"), "-h", "-N", "-o", "%N %t"], env=env, capture_output=True,
                              text=True).stdout.split()
        if idle.count("idle") == 4:
            return procs
        time.sleep(0.2)
    raise RuntimeError("the four nodes did not come up idle")


@dataclass
class _Sides:
    """What one run compares: rota's commands (and Slurm's, with ``slurm``) and how each is reached."""

    env: dict[str, str]
    slurm: bool
    runs: int
    cmd: str
    slurm_env: dict[str, str] = field(default_factory=lambda: dict(os.environ))

    def bins(self) -> dict[str, tuple[str, dict[str, str]]]:
        return {"native": (str(BIN), self.env), **({"Slurm": ("/usr/bin", self.slurm_env)} if self.slurm else {})}

    def cancel_all(self) -> None:
        for b, e in self.bins().values():
            subprocess.run([f"{b}/scancel", "-u", "root"], env=e, check=False, cwd="/tmp")


HELD = ["--parsable", "--hold", "-o", "/dev/null", "--wrap=true"]


def run(runs: int, loop: int, slurm: bool, e2e: int = 200, array: int = 500) -> list[Figure]:
    if not (BIN / "sbatch").is_symlink():
        raise SystemExit("the native client is not installed here: run `rota install-commands` first")
    base = Path(tempfile.mkdtemp(prefix="rota-thin-"))
    base.chmod(0o755)
    (base / "slurm.conf").write_text(CONF)
    env = dict(os.environ, ROTA_STATE_DIR=str(base / "state"))
    up = subprocess.Popen([str(BIN / "rota"), "up", "--config", str(base / "slurm.conf"), "--fake-gpus", "a100:8",
                           "--no-agent"],
                          env=env, stdout=open(base / "up.log", "w"), stderr=subprocess.STDOUT)
    agents: list[subprocess.Popen] = []
    sides = _Sides(env, slurm, runs, f"python -m rota.bench.thin_bench --runs {runs} --loop {loop}"
                   + (" --slurm" if slurm else ""))
    try:
        for _ in range(300):
            if (base / "state" / "run" / "commands.sock").exists() and (base / "state" / "cluster.json").exists():
                break
            time.sleep(0.1)
        agents = start_agents(base, env)
        figures = _one_sbatch(sides) + _squeue(sides)
        sides.cancel_all()         # the held jobs go: the loops and the runs below start from an empty queue
        looped, rows = _loops(sides, loop)
        figures += rows + _ends(sides, e2e, array)
        figures.append(_bulk(base, loop, looped, sides.cmd))
    finally:
        for p in agents:
            p.send_signal(signal.SIGINT)
        up.send_signal(signal.SIGINT)
        for p in [*agents, up]:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        if slurm:
            subprocess.run(["/usr/bin/scancel", "-u", "root"], check=False, cwd="/tmp")
        shutil.rmtree(base, ignore_errors=True)
    return figures


def _one_sbatch(sides: _Sides) -> list[Figure]:
    """One held sbatch, each way a command can start, side by side with Slurm's."""
    direct = dict(sides.env, ROTA_THIN="0")
    py_entry = [sys.executable, "-c", "from rota.cli.thin import sbatch; sbatch()"]
    ways = {"native": [str(BIN / "sbatch"), *HELD], "python entry point": [*py_entry, *HELD],
            "in its own process": [*py_entry, *HELD], "python -c pass": [sys.executable, "-c", "pass"],
            "python -I -S -c pass": [sys.executable, "-I", "-S", "-c", "pass"]}
    envs = {k: direct if k == "in its own process" else sides.env for k in ways}
    if sides.slurm:
        ways["Slurm"] = ["/usr/bin/sbatch", *HELD]
        envs["Slurm"] = sides.slurm_env
    times = alternate(ways, envs, sides.runs)
    figures = []
    for k, ts in times.items():
        note, met, tgt = "", None, ""
        if sides.slurm and k != "Slurm":
            ratio = statistics.median([a / b for a, b in zip(ts, times["Slurm"])])
            note = f"{ratio:.2f} x Slurm's time"
            if k == "native":
                tgt, met = "<= 1.0 x Slurm", ratio <= 1.0
        figures.append(Figure(f"one held sbatch: {k}" if "pass" not in k else k, statistics.median(ts) * 1000, "ms",
                              tgt, met, sides.cmd, note))
    return figures


def _squeue(sides: _Sides) -> list[Figure]:
    """squeue -r over 2,000 pending array tasks, side by side."""
    sq, sq_envs = {}, {}
    for k, (b, e) in sides.bins().items():
        subprocess.run([f"{b}/sbatch", "--hold", "-o", "/dev/null", "--array=0-1999", "--wrap=true"], env=e,
                       check=True, stdout=subprocess.DEVNULL, cwd="/tmp")
        sq[k], sq_envs[k] = [f"{b}/squeue", "-r"], e
    times = alternate(sq, sq_envs, sides.runs)
    lines = {k: subprocess.run(a, env=sq_envs[k], capture_output=True, text=True).stdout.count("\n")
             for k, a in sq.items()}
    figures = []
    for k, ts in times.items():
        note, met, tgt = f"{lines[k]} lines", None, ""
        if sides.slurm and k != "Slurm":
            ratio = statistics.median([a / b for a, b in zip(ts, times["Slurm"])])
            note += f"; {ratio:.2f} x Slurm's time"
            tgt, met = "<= 1.0 x Slurm", ratio <= 1.0
        figures.append(Figure(f"squeue -r, 2,000 pending array tasks: {k}", statistics.median(ts) * 1000, "ms",
                              tgt, met, sides.cmd, note))
    return figures


def _loops(sides: _Sides, loop: int) -> tuple[dict[int, dict[str, float]], list[Figure]]:
    """Held submits by 1 and 8 submitters looping sbatch; the rates by side, and the figures."""
    looped: dict[int, dict[str, float]] = {}
    figures: list[Figure] = []
    for submitters in (1, 8):
        measure = {k: (lambda b=b, e=e, n=submitters: loop_rate([f"{b}/sbatch", *HELD], e, loop, n))
                   for k, (b, e) in sides.bins().items()}
        rows = side_by_side(f"{loop} held submits, {submitters} submitter(s) looping sbatch", measure, 3, sides.cmd,
                            True, "/s", 1.0 if submitters == 8 else None)
        figures += rows
        looped[submitters] = {r.name.rsplit(": ", 1)[1]: r.value for r in rows}
        sides.cancel_all()
    return looped, figures


def _ends(sides: _Sides, e2e: int, array: int) -> list[Figure]:
    """Jobs that run: submitted one by one until all ended, one at a time until gone, an array's launch rate."""
    for b, e in sides.bins().values():
        drained(f"{b}/squeue", e)
    bins, cmd = sides.bins(), sides.cmd
    return (side_by_side(f"{e2e} trivial jobs submitted one by one until all ended",
                         {k: (lambda b=b, e=e: end_to_end(b, e, e2e)) for k, (b, e) in bins.items()}, 3,
                         cmd, True, "jobs/s", 1.5)
            + side_by_side("one trivial job at a time, submit until squeue no longer lists it (median of 5)",
                           {k: (lambda b=b, e=e: one_at_a_time(b, e, 5)) for k, (b, e) in bins.items()}, 3,
                           cmd, False, "ms")
            + side_by_side(f"job launch rate, an array of {array} trivial tasks on 4 nodes until all ended",
                           {k: (lambda b=b, e=e: launch_rate(b, e, array)) for k, (b, e) in bins.items()}, 3,
                           cmd, True, "jobs/s"))


def _bulk(base: Path, loop: int, looped: dict[int, dict[str, float]], cmd: str) -> Figure:
    """Many held submits in one Client.submit_many, against the 8-submitter loops."""
    from rota.client import Client

    client = Client(socket=str(base / "state" / "run" / "rota.sock"))
    bulk = []
    for _ in range(3):
        t = time.perf_counter()
        client.submit_many(["true"] * (loop * 5), options=["--hold", "-o", "/dev/null"])
        bulk.append(loop * 5 / (time.perf_counter() - t))
    rate = statistics.median(bulk)
    peer = looped[8].get("Slurm")
    return Figure(f"{loop * 5} held submits in one Client.submit_many (median of 3)", rate, "/s",
                  ">= 5 x Slurm's 8-submitter loop" if peer else ">= 5 x the 8-submitter loop",
                  rate >= 5 * (peer or looped[8]["native"]), cmd,
                  f"{rate / looped[8]['native']:.1f} x rota's 8-submitter sbatch loop"
                  + (f", {rate / peer:.1f} x Slurm's" if peer else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--loop", type=int, default=300)
    ap.add_argument("--slurm", action="store_true", help="also Slurm's commands (/usr/bin), alternating")
    ap.add_argument("--e2e", type=int, default=200, help="jobs submitted one by one until all ended")
    ap.add_argument("--array", type=int, default=500, help="array tasks for the launch rate")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    figures = run(args.runs, args.loop, args.slurm, args.e2e, args.array)
    print_table(figures, "the commands as processes")
    write_json(figures, args.json)


if __name__ == "__main__":
    main()
