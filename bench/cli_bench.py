"""Whole-command latency of sbatch, squeue and sacct -j, beside a bare ``python -c pass``; and the
projection's catch-up rate from zero.

    python -m rota.bench.cli_bench [--finished 100000] [--pending 10000] [--runs 10]

A log with N finished jobs (submitted, started, exited) and M held pending jobs is written to an
embedded nats-server; `rota up --nats` then loads it and projects it (the catch-up figure); the
commands run against it as separate processes, exactly as a user or a tool would call them.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rota.controller import natsserver
from rota.controller.eventlog import ACTOR_HEADER, STREAM, TS_HEADER, JetStreamLog, encode_body, subject_for
from rota.core import events as ev
from rota.core.slurmconf import make_cluster

from .common import Figure, print_table, write_json

BIN = Path(sys.executable).parent
T0 = 1_800_000_000


def history(finished: int, pending: int):
    """(envelopes) of a cluster with ``finished`` ended jobs and ``pending`` held ones."""
    cfg = make_cluster(nodes=16, gpus=8)
    seq = 0

    def env(ts, event, actor="bench"):
        nonlocal seq
        seq += 1
        return ev.Envelope(seq=seq, ts=ts, actor=actor, idem=f"h{seq}", event=event)

    yield env(T0, ev.ClusterConfigured(config=cfg))
    spec = ev.JobSpec(user="bench", name="done", time_limit=600, gpus_per_node=1, cpus_per_task=8)
    jid, ts, cycle = 1, T0, 0
    for i in range(finished):
        ts += 1
        node = f"gpu{(i % 16) + 1:02d}"
        yield env(ts, ev.JobSubmitted(job_id=jid, spec=spec))
        cycle += 1
        yield env(ts, ev.JobsStarted(cycle=cycle, now=ts, policy="conservative", starts=(ev.Start(
            job_id=jid, partition="short", time_limit=600,
            alloc=(ev.NodeAlloc(node=node, cpus=8, mem=32000, gpus=(0,)),)),)))
        yield env(ts, ev.JobExited(job_id=jid, state="COMPLETED", elapsed=1, max_rss=1000, node=node))
        jid += 1
    held = ev.JobSpec(user="bench", name="waiting", time_limit=600, gpus_per_node=1, hold=True)
    for _ in range(pending):
        yield env(ts, ev.JobSubmitted(job_id=jid, spec=held))
        jid += 1


async def fill(url: str, envelopes) -> int:
    lg = await JetStreamLog.connect(url)
    batch, n = [], 0
    for e in envelopes:
        batch.append(lg.js.publish(subject_for(e.event), encode_body(e.event), stream=STREAM,
                                   headers={"Nats-Msg-Id": e.idem, TS_HEADER: str(e.ts), ACTOR_HEADER: e.actor}))
        if len(batch) >= 2000:
            await asyncio.gather(*batch)
            n += len(batch)
            batch = []
    if batch:
        await asyncio.gather(*batch)
        n += len(batch)
    await lg.close()
    return n


def compile_package() -> None:
    """Write rota's byte code, as pip does when it installs a package. An editable install has none,
    and with PYTHONDONTWRITEBYTECODE set every command would compile rota's modules from source."""
    import compileall

    import rota.cli

    root = Path(rota.cli.__file__).resolve().parent.parent
    for folder in ("cli", "core", "projections", "controller", "agents"):
        compileall.compile_dir(str(root / folder), quiet=1)


def timed_pair(floor_cmd: list[str], cmd: list[str], env: dict, runs: int) -> tuple[float, float]:
    """Medians of ``floor_cmd`` and ``cmd``, run in alternation ``runs`` times each."""
    floor, times = [], []
    for _ in range(runs):
        floor.append(timed(floor_cmd, env))
        times.append(timed(cmd, env))
    return statistics.median(floor), statistics.median(times)


def timed(cmd: list[str], env: dict) -> float:
    """Seconds one run of ``cmd`` takes, as a separate process (it must succeed)."""
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    elapsed = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {r.stderr.decode()}")
    return elapsed


def _rebuild(tmp: Path, env: dict[str, str], total: int) -> Figure:
    """The projector alone, from zero: `rota projections rebuild`, median of 3."""
    rates = []
    for i in range(3):
        r = subprocess.run([str(BIN / "rota"), "projections", "rebuild", "--db", str(tmp / f"re{i}.sqlite")],
                           env=env, capture_output=True, text=True, check=True)
        m = re.search(r"\(([\d,]+) events/s\)", r.stdout)
        assert m is not None, r.stdout
        rates.append(int(m.group(1).replace(",", "")))
    catch_up = statistics.median(rates)
    return Figure(f"projection catch-up from zero, {total:,} events", catch_up, "events/s", ">= 20,000",
                  catch_up >= 20_000, "python -m rota.bench.cli_bench", "rota projections rebuild, median of 3")


def run(finished: int, pending: int, runs: int) -> list[Figure]:
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory() as tmp:
        srv = natsserver.start(Path(tmp) / "nats", sync_always=False)   # setup speed only
        env = dict(os.environ, ROTA_STATE_DIR=str(Path(tmp) / "state"))
        up = None
        try:
            total = asyncio.run(fill(srv.url, history(finished, pending)))
            t0 = time.perf_counter()
            up = subprocess.Popen([str(BIN / "rota"), "up", "--nats", srv.url, "--no-agent"], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            db = Path(tmp) / "state" / "projections.sqlite"
            seq = 0
            while seq < total:
                time.sleep(0.05)
                try:
                    row = sqlite3.connect(db).execute("SELECT value FROM meta WHERE key = 'seq'").fetchone()
                    seq = row[0] if row else 0
                except sqlite3.Error:
                    pass
            with_up = total / (time.perf_counter() - t0)
            figures.append(Figure(f"rota up start to projection caught up, {total:,} events", with_up, "events/s",
                                  "", None, "python -m rota.bench.cli_bench",
                                  "controller load and projector share one process"))
            while not (Path(tmp) / "state" / "cluster.json").exists():
                time.sleep(0.05)
            figures.append(_rebuild(Path(tmp), env, total))
            compile_package()
            floor_cmd = [sys.executable, "-c", "pass"]
            floors: list[float] = []
            rows = []
            for label, cmd, factor in (
                    ("sbatch (one held submit)", [str(BIN / "sbatch"), "--hold", "--wrap", "true"], 1.5),
                    (f"squeue, {pending:,} pending", [str(BIN / "squeue")], 2.0),
                    (f"sacct -j, {finished:,} finished in the projection", [str(BIN / "sacct"), "-j", str(finished // 2)],
                     2.0)):
                # the floor is timed in alternation with the command: the machine's drift hits both alike
                floor, t = timed_pair(floor_cmd, cmd, env, runs)
                floors.append(floor)
                rows.append(Figure(f"{label}", t * 1000, "ms", f"<= {factor} x floor ({factor * floor * 1000:.0f} ms)",
                                   t <= factor * floor, "python -m rota.bench.cli_bench",
                                   f"{t / floor:.2f} x its floor of {floor * 1000:.1f} ms"))
            figures.append(Figure("bare `python -c pass` (the floor), median over the three pairings",
                                  statistics.median(floors) * 1000, "ms", "", None, "python -m rota.bench.cli_bench"))
            figures += rows
        finally:
            if up is not None:
                up.terminate()
                up.wait(30)
            srv.stop()
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--finished", type=int, default=100_000)
    ap.add_argument("--pending", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    figures = run(args.finished, args.pending, args.runs)
    print_table(figures, "rota command latency benchmark (medians)")
    write_json(figures, args.json)


if __name__ == "__main__":
    main()
