"""What one durable consumer per node costs a NATS cluster of three servers, by how it is kept.

    python -m rota.bench.consumers_bench [--nodes 1000]

Starts three clustered nats-servers on loopback, makes a stream and ``--nodes`` durable pull consumers on
it (each filtered to one node's subject, 32 requests at a time), then leaves them idle. For each way of
keeping them it gives the time to make them all, the servers' CPU spent meanwhile, and the servers' CPU
while idle (no client pulls):

- replicated as the stream (R3, file): what a work-queue stream requires, as rota's order stream is;
- one copy in memory (R1), which NATS allows only on a stream with limits retention.
"""
from __future__ import annotations

import argparse
import asyncio
import tempfile
import time

from .common import Figure, cpu_seconds, print_table

IDLE = 20.0          # seconds the idle CPU is measured over


def _cpu(pids: list[int]) -> float:
    return sum(cpu_seconds(pid) for pid in pids)


async def _measure(nodes: int, replicated: bool) -> tuple[float, float, float]:
    """(seconds to make the consumers, the servers' CPU seconds meanwhile, their idle share of a core)."""
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, RetentionPolicy, StorageType, StreamConfig

    from rota.controller.natscluster import start_cluster, wait_for_jetstream

    servers = start_cluster(tempfile.mkdtemp(prefix="rota-consumers-"))
    pids = [s.process.pid for s in servers]
    try:
        urls = [s.url for s in servers]
        await wait_for_jetstream(urls)
        nc = await nats.connect(urls)
        js = nc.jetstream(timeout=60)
        retention = RetentionPolicy.WORK_QUEUE if replicated else RetentionPolicy.LIMITS
        await js.add_stream(StreamConfig(name="ORDERS", subjects=["orders.>"], storage=StorageType.FILE,
                                         retention=retention, num_replicas=3))
        gate = asyncio.Semaphore(32)

        async def make(i: int) -> None:
            cfg = ConsumerConfig(durable_name=f"node-{i}", filter_subject=f"orders.node{i}",
                                 ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.ALL,
                                 num_replicas=0 if replicated else 1, mem_storage=not replicated)
            async with gate:
                await js.add_consumer("ORDERS", cfg)

        t0, c0 = time.monotonic(), _cpu(pids)
        await asyncio.gather(*(make(i) for i in range(nodes)))
        made, spent = time.monotonic() - t0, _cpu(pids) - c0
        await asyncio.sleep(5)
        c0, t0 = _cpu(pids), time.monotonic()
        await asyncio.sleep(IDLE)
        idle = (_cpu(pids) - c0) / (time.monotonic() - t0)
        await nc.close()
        return made, spent, idle
    finally:
        for s in servers:
            s.stop()


def run(nodes: int = 1000) -> list[Figure]:
    how = f"python -m rota.bench.consumers_bench --nodes {nodes}"
    figures = []
    for replicated, label in ((True, "R3 on disk (a work-queue stream's)"), (False, "R1 in memory")):
        made, spent, idle = asyncio.run(_measure(nodes, replicated))
        figures += [Figure(f"3 NATS servers: {nodes:,} per-node consumers, {label}: made in", made, "s", "", None, how,
                           f"the servers spent {spent:.1f} CPU seconds making them"),
                    Figure(f"3 NATS servers: {nodes:,} per-node consumers, {label}: servers' CPU idle", idle * 100,
                           "% of a core", "", None, how, "no client connected")]
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    args = ap.parse_args()
    print_table(run(args.nodes), "per-node consumers on a NATS cluster (one run)")


if __name__ == "__main__":
    main()
