"""Step launch and a submitit round trip, through the commands as processes against a real ``rota up``.

    python -m rota.bench.step_bench [--runs 20] [--installed VENV]

A two-node cluster on this host (``rota up`` serves n1, a second ``rota agent`` serves n2). Timed:
``srun --jobid=N true`` inside a running job (a 1-task step: the srun process from start to exit,
alternating with a bare ``python -c pass``, the floor every Python command pays), an 8-task step over
both nodes, and submitit's Slurm executor running a trivial function (submit, start, Python start,
result pickle back). ``--installed VENV`` also times the srun of a normal (not editable) install of rota
in VENV (``pip install --no-deps .``), against that interpreter's own floor: an editable install's
import hook costs every command of this checkout about 20 ms before it does anything.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .cli_bench import compile_package, timed
from .common import Figure, print_table, write_json

BIN = Path(sys.executable).parent
CONF = """GresTypes=gpu
NodeName=n[1-2] CPUs=8 RealMemory=4000 Gres=gpu:a100:4
PartitionName=main Nodes=n[1-2] Default=YES MaxTime=1:00:00
"""


def _wait(check, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("the cluster did not come up")
        time.sleep(0.1)


def run(runs: int, installed: str | None = None) -> list[Figure]:
    base = Path(tempfile.mkdtemp(prefix="rota-step-bench-"))
    base.chmod(0o755)
    (base / "slurm.conf").write_text(CONF)
    env = dict(os.environ, ROTA_STATE_DIR=str(base / "state"), PATH=f"{BIN}:{os.environ.get('PATH', '')}")
    env.pop("SLURM_JOB_ID", None)
    procs: list[subprocess.Popen] = []
    figures: list[Figure] = []
    try:
        procs.append(subprocess.Popen([str(BIN / "rota"), "up", "--config", str(base / "slurm.conf"), "--fake-gpus",
                                       "a100:4"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait(lambda: (base / "state" / "cluster.json").exists())
        url = json.loads((base / "state" / "cluster.json").read_text())["nats"]
        subprocess.run([str(BIN / "rota"), "keygen", "--host", "n2", "--out", str(base / "n2.key")], env=env,
                       check=True, capture_output=True)
        procs.append(subprocess.Popen(
            [str(BIN / "rota"), "agent", "--node", "n2", "--nats", url, "--key", str(base / "n2.key"), "--state-dir",
             str(base / "state"), "--fake-gpus", "a100:4", "--cpus", "8", "--memory", "4000", "--socket",
             str(base / "n2.sock")], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait(lambda: subprocess.run([str(BIN / "sinfo"), "-h", "-o", "%T %D"], env=env, capture_output=True,
                                     text=True).stdout.split() == ["idle", "2"])
        compile_package()
        job = subprocess.run([str(BIN / "sbatch"), "--parsable", "-N", "2", "--ntasks-per-node", "4", "-o", "/dev/null",
                              "--wrap", "sleep 600"], env=env, capture_output=True, text=True, check=True).stdout.strip()
        _wait(lambda: subprocess.run([str(BIN / "squeue"), "-h", "-j", job, "-o", "%T"], env=env, capture_output=True,
                                     text=True).stdout.strip() == "RUNNING")
        floor_cmd = [sys.executable, "-c", "pass"]
        one = [str(BIN / "srun"), f"--jobid={job}", "-n", "1", "true"]
        eight = [str(BIN / "srun"), f"--jobid={job}", "-N", "2", "-n", "8", "true"]
        timed(one, env)   # warm up: the first step makes the job's cgroups on the nodes
        floors, ones, eights = [], [], []
        for _ in range(runs):
            floors.append(timed(floor_cmd, env))
            ones.append(timed(one, env))
            eights.append(timed(eight, env))
        floor, t1, t8 = (statistics.median(x) * 1000 for x in (floors, ones, eights))
        figures.append(Figure("bare `python -c pass` (the floor), in alternation", floor, "ms", "", None,
                              "python -m rota.bench.step_bench"))
        figures.append(Figure(f"1-task step launch inside a running job (srun process, median of {runs})", t1, "ms",
                              "<= 50 ms", t1 <= 50, "python -m rota.bench.step_bench",
                              f"{t1 - floor:.0f} ms above the floor; min {min(ones) * 1000:.0f} ms"))
        figures.append(Figure(f"8-task step over 2 nodes (srun process, median of {runs})", t8, "ms", "", None,
                              "python -m rota.bench.step_bench", f"min {min(eights) * 1000:.0f} ms"))
        figures.append(_in_process(job, env, runs))
        if installed:
            figures += _installed(Path(installed), job, env, runs)
        subprocess.run([str(BIN / "scancel"), job], env=env, check=False)
        figures.append(_submitit(base, env, max(3, runs // 4)))
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(base, ignore_errors=True)
    return figures


def _installed(venv: Path, job: str, env: dict, runs: int) -> list[Figure]:
    """The same 1-task step through the srun of a normal install, beside that interpreter's floor."""
    floor_cmd = [str(venv / "bin" / "python"), "-c", "pass"]
    one = [str(venv / "bin" / "srun"), f"--jobid={job}", "-n", "1", "true"]
    timed(one, env)
    floors, ones = [], []
    for _ in range(runs):
        floors.append(timed(floor_cmd, env))
        ones.append(timed(one, env))
    floor, t1 = statistics.median(floors) * 1000, statistics.median(ones) * 1000
    return [Figure("bare `python -c pass` of a normal install (its floor)", floor, "ms", "", None,
                   "python -m rota.bench.step_bench --installed VENV"),
            Figure(f"1-task step launch, srun of a normal install (median of {runs})", t1, "ms", "<= 50 ms", t1 <= 50,
                   "python -m rota.bench.step_bench --installed VENV",
                   f"{t1 - floor:.0f} ms above its floor; min {min(ones) * 1000:.0f} ms")]


def _in_process(job: str, env: dict, runs: int) -> Figure:
    """The step's own path, without the interpreter's start: srun's request, the log, the agent's launch,
    the task's run and its end back at srun (srun's code, driven in one process)."""
    script = f"""
import io, os, statistics, sys, time
from rota.cli import srun
ts = []
for _ in range({runs}):
    t0 = time.perf_counter()
    code = srun.Step({job}, srun.step_body({{"ntasks": "1"}}, ["true"], {job}), io.BytesIO(), io.StringIO(), {{}}).run()
    ts.append(time.perf_counter() - t0)
    assert code == 0
print(statistics.median(ts) * 1000, min(ts) * 1000)
"""
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    median, low = map(float, out.stdout.split())
    return Figure(f"1-task step launch inside a running job, srun's path without the interpreter (median of {runs})",
                  median, "ms", "<= 50 ms", median <= 50, "python -m rota.bench.step_bench",
                  f"min {low:.0f} ms: request, log append, order to the agent, task start, its end back at srun")


def _submitit(base: Path, env: dict, runs: int) -> Figure:
    try:
        import submitit  # noqa: F401 - installed with the test extras
    except ImportError:
        return Figure("submitit round trip, trivial function", float("nan"), "s", "<= 2 s", None,
                      "python -m rota.bench.step_bench", "submitit is not installed")
    script = f"""
import time, statistics, submitit
ex = submitit.SlurmExecutor(folder={str(base / 'submitit')!r})
ex.update_parameters(time=5)
ts = []
for _ in range({runs}):
    t0 = time.perf_counter()
    assert ex.submit(int, "41").result() == 41
    ts.append(time.perf_counter() - t0)
print(statistics.median(ts), min(ts))
"""
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True, cwd=base)
    median, low = map(float, out.stdout.split())
    return Figure(f"submitit round trip, trivial function (median of {runs})", median, "s", "<= 2 s", median <= 2,
                  "python -m rota.bench.step_bench", f"min {low:.2f} s; submit, start, Python start, result back")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--installed", default=None, help="a virtual environment with rota installed normally")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    figures = run(args.runs, args.installed)
    print_table(figures, "rota step launch benchmark (medians)")
    write_json(figures, args.json)


if __name__ == "__main__":
    main()
