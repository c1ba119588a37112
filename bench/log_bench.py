"""The log and the controller: submit rate through the API, and rebuilding state from the log.

    python -m rota.bench.log_bench [--events 100000] [--submits 2000] [--runs 3]

Submits: a controller (`rota up --nats`) in its own process on an embedded nats-server with
`sync_interval: always`; clients send `rota.api.submit` requests (1 sequential; 8 concurrent).
Rebuild: N events (the core benchmark's realistic stream) in the stream; time to fold them into
state from zero and from a snapshot, beside the fastest raw read of the same stream measured here.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rota.controller import natsserver
from rota.controller.eventlog import (
    ACTOR_HEADER, STREAM, SUBJECT_PREFIX, TS_HEADER, JetStreamLog, encode_body, subject_for,
)
from rota.controller.service import Controller
from rota.core.apply import fold

from .common import ApiClient, Figure, print_table, write_json
from .core_bench import event_stream

CONF = "GresTypes=gpu\nNodeName=gpu[001-100] CPUs=64 RealMemory=257000 Gres=gpu:a100:8\n" \
       "PartitionName=gpu Nodes=gpu[001-100] Default=YES MaxTime=1-0\n" \
       "MaxJobCount=1000000\nSchedulerParameters=rota_max_submit_per_user=1000000\n"   # every run's held jobs stay queued


async def submit_rate(url: str, n: int, concurrency: int, state: Path) -> float:
    """Submits/s through the API, each request signed as a node's signer signs it (and checked)."""
    api = ApiClient(str(state))
    conns = [await api.connect(url) for _ in range(concurrency)]
    body = {"spec": {"name": "b", "time_limit": 600, "gpus_per_node": 1, "hold": True}}

    async def worker(nc, count):
        for _ in range(count):
            reply = await api.request(nc, "submit", body)
            assert reply["ok"], reply

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(nc, n // concurrency) for nc in conns))
    dt = time.perf_counter() - t0
    for nc in conns:
        await nc.close()
    return (n // concurrency * concurrency) / dt


def bench_submits(n: int, runs: int) -> list[Figure]:
    figures = []
    with tempfile.TemporaryDirectory() as tmp:
        srv = natsserver.start(Path(tmp) / "nats")
        conf = Path(tmp) / "slurm.conf"
        conf.write_text(CONF)
        env = dict(os.environ, ROTA_STATE_DIR=str(Path(tmp) / "state"))
        proc = subprocess.Popen([sys.executable, "-m", "rota.programs.main", "up", "--nats", srv.url,
                                 "--config", str(conf)], env=env, stdout=subprocess.DEVNULL)
        try:
            info = Path(tmp) / "state" / "cluster.json"
            while not info.exists():
                time.sleep(0.05)
            for conc, label in ((1, "1 client, sequential"), (8, "8 concurrent clients")):
                rates = [asyncio.run(submit_rate(srv.url, n, conc, Path(tmp) / "state")) for _ in range(runs)]
                med = statistics.median(rates)
                slurm = 142 if conc == 1 else 294
                figures.append(Figure(f"accepted submits/s, {label}", med, "submits/s",
                                      f">= {2 * slurm} (2x Slurm's {slurm})", med >= 2 * slurm,
                                      f"python -m rota.bench.log_bench --submits {n}",
                                      "fsync on every append (sync_interval: always)"))
        finally:
            proc.terminate()
            proc.wait()
            srv.stop()
    return figures


async def fill(url: str, envelopes) -> None:
    """Publish the stream (pipelined) for the rebuild measurement."""
    lg = await JetStreamLog.connect(url)
    js = lg.js
    batch = []
    for env in envelopes:
        batch.append(js.publish(subject_for(env.event), encode_body(env.event),
                                stream=STREAM, headers={"Nats-Msg-Id": env.idem or f"f{env.seq}",
                                                        TS_HEADER: str(env.ts), ACTOR_HEADER: env.actor}))
        if len(batch) >= 500:
            await asyncio.gather(*batch)
            batch = []
    if batch:
        await asyncio.gather(*batch)
    await lg.close()


async def raw_pull_read(url: str, total: int) -> float:
    """Raw consumption with batched pull requests (the log adapter's reader), no decoding."""
    lg = await JetStreamLog.connect(url)
    t0 = time.perf_counter()
    count = 0
    async for chunk in lg.read_raw(1, total):
        count += len(chunk)
    dt = time.perf_counter() - t0
    await lg.close()
    assert count == total, count
    return total / dt


async def raw_read(url: str, total: int) -> float:
    """Raw consumption with nats-py's ordered push consumer, no decoding."""
    import nats
    from nats.js.api import DeliverPolicy

    nc = await nats.connect(url)
    js = nc.jetstream()
    done = asyncio.Event()
    count = 0

    async def cb(msg):
        nonlocal count
        count += 1
        if count >= total:
            done.set()

    t0 = time.perf_counter()
    sub = await js.subscribe(f"{SUBJECT_PREFIX}.>", stream=STREAM, cb=cb, ordered_consumer=True,
                             deliver_policy=DeliverPolicy.ALL, pending_msgs_limit=1_000_000)
    await done.wait()
    dt = time.perf_counter() - t0
    await sub.unsubscribe()
    await nc.close()
    return total / dt


async def rebuild(url: str, snapshot: bool) -> tuple[float, int]:
    lg = await JetStreamLog.connect(url)
    c = Controller(lg)
    if snapshot:
        await c.load()
        await c.maybe_snapshot(force=True)
        c = Controller(lg)
    t0 = time.perf_counter()
    await c.load()
    dt = time.perf_counter() - t0
    seq = c.state.seq
    await lg.close()
    return dt, seq


async def rebuilt_state(url: str):
    lg = await JetStreamLog.connect(url)
    c = Controller(lg)
    await c.load()
    await lg.close()
    return c.state


def bench_rebuild(n: int, runs: int) -> list[Figure]:
    figures = []
    with tempfile.TemporaryDirectory() as tmp:
        srv = natsserver.start(Path(tmp) / "nats", sync_always=False)   # setup speed only
        try:
            envs = event_stream(n)
            expected = fold(envs)
            asyncio.run(fill(srv.url, envs))
            del envs        # a controller does not hold the log in memory: neither does this process
            gc.collect()
            push = statistics.median(asyncio.run(raw_read(srv.url, n)) for _ in range(runs))
            pull = statistics.median(asyncio.run(raw_pull_read(srv.url, n)) for _ in range(runs))
            raw = max(push, pull)
            t = statistics.median(asyncio.run(rebuild(srv.url, False))[0] for _ in range(runs))
            rate = n / t
            figures.append(Figure(f"raw stream read, {n:,} events (ordered push consumer)", push, "events/s",
                                  "", None, f"python -m rota.bench.log_bench --events {n}"))
            figures.append(Figure(f"raw stream read, {n:,} events (batched pull)", pull, "events/s",
                                  "", None, f"python -m rota.bench.log_bench --events {n}"))
            figures.append(Figure(f"rebuild state from zero, {n:,} events", rate, "events/s",
                                  f">= {raw / 2:,.0f} (50% of raw)", rate >= raw / 2,
                                  f"python -m rota.bench.log_bench --events {n}", f"{t:.2f} s"))
            ts = statistics.median(asyncio.run(rebuild(srv.url, True))[0] for _ in range(runs))
            figures.append(Figure(f"restart to ready from a snapshot, {n:,}-event log", ts, "s", "<= 1 s",
                                  ts <= 1.0, f"python -m rota.bench.log_bench --events {n}"))
            assert asyncio.run(rebuilt_state(srv.url)) == expected
        finally:
            srv.stop()
    return figures


def run(events: int, submits: int, runs: int) -> list[Figure]:
    return (bench_submits(submits, runs) if submits else []) + (bench_rebuild(events, runs) if events else [])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--submits", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    figures = run(args.events, args.submits, args.runs)
    print_table(figures, "rota log and controller benchmark")
    write_json(figures, args.json)


if __name__ == "__main__":
    main()
