"""Service under hostile load: root's `sbatch` and `squeue` (the native thin client, as processes) timed while a
second local user (``nobody``, real to the kernel) floods the command server's socket, the signer's socket, or
the controller with bulk submits. Root's commands are timed alternately with and without each flood.

    python -m rota.bench.hostile_bench [--commands 60] [--seconds 20] [--max-job-count N]

``--max-job-count``: slurm.conf's MaxJobCount (default: Slurm's 10,000, of which one user holds half); a large one
lets the submit flood's jobs be accepted, so what is measured is the controller's fairness, not the refusal.

Needs root (to become ``nobody``) and the native client (`rota install-commands`).
"""
from __future__ import annotations

import argparse
import os
import pwd
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import Figure, print_table, stop, write_json

BIN = Path(sys.executable).parent
CONF = "NodeName=n1 CPUs=4 RealMemory=8000\nPartitionName=p Nodes=n1 Default=YES MaxTime=1:00:00\n"   # the default limits


def become(user: str = "nobody") -> None:
    """Become ``user`` for good (in a child)."""
    pw = pwd.getpwnam(user)
    os.setgroups([])
    os.setresgid(pw.pw_gid, pw.pw_gid, pw.pw_gid)
    os.setresuid(pw.pw_uid, pw.pw_uid, pw.pw_uid)


def flood(path: Path, seconds: float, hold: int) -> int:
    """A child, as nobody, that for ``seconds`` keeps ``hold`` silent connections to ``path`` open, opening a new
    one as fast as it can for each the other end closes; its pid."""
    pid = os.fork()
    if pid:
        return pid
    code = 0
    try:
        become()
        held: list[socket.socket] = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            while len(held) < hold and time.monotonic() < end:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.setblocking(False)
                try:
                    s.connect(str(path))
                except OSError:
                    s.close()
                    break
                held.append(s)
            kept = []
            for s in held:
                try:
                    s.recv(4096, socket.MSG_PEEK)
                    s.close()             # answered, or closed: its place goes to a new one
                except BlockingIOError:
                    kept.append(s)
                except OSError:
                    s.close()
            held = kept
            time.sleep(0.005)
    except BaseException:  # noqa: BLE001 - a child: its status says it failed
        code = 1
    finally:
        os._exit(code)


def submit_flood(env: dict[str, str], seconds: float, per_request: int = 5000) -> int:
    """A child, as nobody, submitting held jobs in bulk requests for ``seconds``; its pid."""
    pid = os.fork()
    if pid:
        return pid
    code = 0
    try:
        os.environ.clear()
        os.environ.update(env)
        from rota.client.api import Client, JobError

        become()
        os.chdir("/tmp")
        client = Client()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                client.submit_many(["true"] * per_request, options=["-H", "-o", "/dev/null"])
            except JobError:
                time.sleep(0.05)          # refused past its share: it keeps asking
    except BaseException:  # noqa: BLE001 - a child: its status says it failed
        code = 1
    finally:
        os._exit(code)


def _timed(env: dict[str, str], *cmd: str) -> float:
    t = time.perf_counter()
    r = subprocess.run([str(BIN / cmd[0]), *cmd[1:]], env=env, capture_output=True, text=True, timeout=120, cwd="/tmp")
    took = time.perf_counter() - t
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed under load: {r.stderr.strip()}")
    return took


def _percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def run(commands: int, seconds: float, max_job_count: int | None = None) -> list[Figure]:
    if os.geteuid() != 0:
        raise SystemExit("hostile_bench needs root: it floods as a second local user (nobody)")
    if not (BIN / "sbatch").is_symlink():
        raise SystemExit("the native client is not installed here: run `rota install-commands` first")
    base = Path(tempfile.mkdtemp(prefix="rota-hostile-"))
    base.chmod(0o755)
    (base / "slurm.conf").write_text(CONF if max_job_count is None else f"MaxJobCount={max_job_count}\n{CONF}")
    env = dict(os.environ, ROTA_STATE_DIR=str(base / "state"))
    up = subprocess.Popen([str(BIN / "rota"), "up", "--config", str(base / "slurm.conf"), "--kill-wait", "1"],
                          env=env, stdout=open(base / "up.log", "w"), stderr=subprocess.STDOUT)
    run_dir = base / "state" / "run"
    scenarios = {
        "no flood": lambda: [],
        "connect flood on commands.sock": lambda: [flood(run_dir / "commands.sock", seconds, 800) for _ in range(2)],
        "connect flood on rota.sock": lambda: [flood(run_dir / "rota.sock", seconds, 800) for _ in range(2)],
        "bulk submit flood (5,000 a request, 2 submitters)": lambda: [submit_flood(env, seconds) for _ in range(2)],
    }
    figures: list[Figure] = []
    cmd = f"python -m rota.bench.hostile_bench --commands {commands} --seconds {seconds:g}" + \
        (f" --max-job-count {max_job_count}" if max_job_count is not None else "")
    try:
        for _ in range(300):
            if (run_dir / "commands.sock").exists() and (base / "state" / "cluster.json").exists():
                break
            time.sleep(0.1)
        _timed(env, "squeue", "-h")
        for name, start in scenarios.items():
            children = start()
            time.sleep(1.0 if children else 0)
            times: list[float] = []
            began = time.monotonic()
            try:
                for i in range(commands):
                    if time.monotonic() - began > seconds - 2 and children:
                        break
                    time.sleep(max(0.0, (seconds - 3) / commands - 0.01))   # spread over the flood
                    times.append(_timed(env, "sbatch", "-H", "--parsable", "-o", "/dev/null", "--wrap", "true")
                                 if i % 2 == 0 else _timed(env, "squeue", "-h", "-u", "root", "-t", "PD", "-o", "%i"))
            finally:
                for pid in children:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
            subprocess.run([str(BIN / "scancel"), "-u", "nobody"], env=env, capture_output=True, timeout=300)
            flooded = subprocess.run([str(BIN / "sacct"), "-n", "-X", "-u", "nobody", "-o", "JobID"], env=env,
                                     capture_output=True, text=True, timeout=300).stdout.split()
            note = f"nobody's jobs accepted meanwhile: {len(flooded):,}" if "submit" in name else ""
            p50, p99 = _percentile(times, 50), _percentile(times, 99)
            figures.append(Figure(f"root's sbatch/squeue, {name}: median ({len(times)} commands)", p50 * 1000, "ms",
                                  command=cmd, note=note))
            figures.append(Figure(f"root's sbatch/squeue, {name}: 99th percentile", p99 * 1000, "ms", "< 1000 ms",
                                  p99 < 1.0, cmd))
    finally:
        stop(up)
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commands", type=int, default=60)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--max-job-count", type=int, help="slurm.conf's MaxJobCount (default: Slurm's default)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    figures = run(args.commands, args.seconds, args.max_job_count)
    print_table(figures, "root's commands while another local user floods")
    write_json(figures, args.json)


if __name__ == "__main__":
    main()
