"""Time travel on a long log: `why` for a job that waited through >= 1,000 cycles, `replay --at`, and
`verify` over the whole log.

    python -m rota.bench.timetravel_bench [--jobs 300000] [--runs 3]

The log is made by the simulator (so every decision in it is the scheduler's own): a 64-node x 8-GPU
cluster under a steady stream of small jobs, and a 60-node job submitted early that must wait for
a large part of the cluster to drain. Snapshots are taken every 50,000 events, as the controller
keeps them; `why` and `replay --at` start from the nearest one, as `rota why` does on a cluster.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

from rota.core import events as ev
from rota.core.apply import apply
from rota.core.sim import Simulator, TraceJob
from rota.core.state import State, dump_snapshot, load_snapshot
from rota.core.timetravel import replay_to, verify, why
from rota.core.traces import gpu_cluster

from .common import Figure, print_table, write_json

SNAPSHOT_EVERY = 50_000


def make_log(jobs: int, seed: int = 5) -> tuple[list[ev.Envelope], int]:
    rng = random.Random(seed)
    cfg = gpu_cluster(64)
    trace, t = [], 0
    big_id = 0
    for i in range(jobs):
        t += rng.randint(0, 12)   # a start every few seconds; about 70 % of the GPUs busy
        if i == 2000:
            spec = ev.JobSpec(user="big", name="big-eval", nodes=60, nodes_given=True, gpus_per_node=8,
                              time_limit=4 * 3600)
            trace.append(TraceJob(t, spec, 3 * 3600, trace_id=i + 1))
            big_id = i + 1
            continue
        g = rng.choice([1, 1, 1, 2])
        limit = rng.choice([600, 1800, 3600, 7200])
        spec = ev.JobSpec(user=f"u{rng.randrange(40)}", name=f"j{i}", gpus_per_node=g, cpus_per_task=g * 4,
                          time_limit=limit)
        trace.append(TraceJob(t, spec, rng.randint(60, limit), trace_id=i + 1))
    sim = Simulator(cfg, "conservative", record_log=True)
    sim.run(trace)
    return sim.log, big_id


def snapshots(log: list[ev.Envelope]) -> dict[int, bytes]:
    st = State()
    out = {}
    for env in log:
        apply(st, env)
        if env.seq % SNAPSHOT_EVERY == 0:
            out[env.seq] = dump_snapshot(st)
    return out


def nearest(snaps: dict[int, bytes], seq: int) -> State | None:
    best = max((s for s in snaps if s <= seq), default=None)
    return load_snapshot(snaps[best]) if best is not None else None


def run(jobs: int, runs: int) -> list[Figure]:
    t0 = time.perf_counter()
    log, big = make_log(jobs)
    made = time.perf_counter() - t0
    snaps = snapshots(log)
    by_job_id = {}
    for env in log:
        if isinstance(env.event, ev.JobSubmitted):
            by_job_id[env.event.job_id] = env.seq
    # the simulator numbers jobs in submit order: the big job's id is its position
    submit_seq = by_job_id[big]
    cycles_waited = 0
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        state = nearest(snaps, submit_seq - 1)
        rep = why(log[state.seq if state else 0:], big, None, state)
        times.append(time.perf_counter() - t)
    cycles_waited = sum(iv.cycles for iv in rep.intervals)
    waited_h = ((rep.start_time or 0) - rep.submit_time) / 3600
    figures = [Figure(f"rota why, a job that waited {cycles_waited:,} cycles ({waited_h:.1f} h), {len(log):,}-event log",
                      statistics.median(times), "s", "<= 2 s", statistics.median(times) <= 2.0,
                      f"python -m rota.bench.timetravel_bench --jobs {jobs}",
                      f"log made by the simulator in {made:.0f} s")]
    mid = log[len(log) * 3 // 4].seq
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        state = nearest(snaps, mid)
        st = replay_to(log[state.seq if state else 0:], mid, None, state)
        times.append(time.perf_counter() - t)
    assert st.seq == mid
    figures.append(Figure(f"rota replay --at (sequence {mid:,} of {len(log):,})", statistics.median(times), "s",
                          "<= 1 s", statistics.median(times) <= 1.0, f"python -m rota.bench.timetravel_bench --jobs {jobs}"))
    t = time.perf_counter()
    results = list(verify(log))
    dt = time.perf_counter() - t
    assert all(d is None for _s, d in results)
    figures.append(Figure(f"rota verify over the whole log ({len(results):,} cycles)", dt, "s", "", None,
                          f"python -m rota.bench.timetravel_bench --jobs {jobs}", "all decisions reproduced"))
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=300_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    figures = run(args.jobs, args.runs)
    print_table(figures, "rota time-travel benchmark (medians)")
    write_json(figures, args.json)


if __name__ == "__main__":
    main()
