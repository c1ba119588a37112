"""Core benchmark: one scheduling cycle per policy on a 1,000-node GPU cluster, and apply throughput.

    python -m rota.bench.core_bench [--runs 5] [--pending 10000,50000] [--events 1000000]

Cluster: 1,000 nodes x 8 GPUs (a100/h100/l40s) x 64 CPUs x 512 GiB, about 85 % of GPUs busy
with jobs started over the previous day. Pending mix: mostly 1-2 GPU jobs of 1-4 h, some 4 and
8 GPU jobs of 12-24 h, a few 2-4 node x 8 GPU jobs of 24-48 h; 40 % ask for a GPU type. Each cycle runs as
the controller runs one: with Python's cyclic collector paused meanwhile.
"""
from __future__ import annotations

import argparse
from contextlib import contextmanager
import copy
import gc
import random
import statistics
import time
from typing import Any, Iterator

from rota.core import events as ev
from rota.core.apply import apply, fold
from rota.core.replan import PlanMemory
from rota.core.schedule import schedule
from rota.core.state import State
from rota.wire import collector

from .common import Figure, median_time, print_table, write_json

GIB = 1024
TYPES = ("a100", "h100", "l40s")
T0 = 1_800_000_000


def cluster(nodes: int = 1000, params: ev.SchedulerParams | None = None) -> ev.ClusterConfig:
    cfgs = []
    for i in range(nodes):
        gtype = TYPES[0] if i % 10 < 5 else TYPES[1] if i % 10 < 8 else TYPES[2]
        cfgs.append(ev.NodeConfig(name=f"gpu{i:04d}", cpus=64, memory=512 * GIB,
                                  gpus=(ev.GpuConfig(type=gtype, count=8),)))
    names = tuple(c.name for c in cfgs)
    part = ev.PartitionConfig(name="gpu", nodes=names, max_time=3 * 86400, default=True)
    return ev.ClusterConfig(nodes=tuple(cfgs), partitions=(part,),
                            scheduler=params or ev.SchedulerParams(bf_window=3 * 86400))


def random_spec(rng: random.Random, user: int) -> ev.JobSpec:
    r = rng.random()
    if r < 0.60:
        gpus, nodes, limit = 1, 1, rng.choice([3600, 7200, 14400])
    elif r < 0.82:
        gpus, nodes, limit = 2, 1, rng.choice([3600, 7200, 14400])
    elif r < 0.91:
        gpus, nodes, limit = 4, 1, rng.choice([43200, 86400])
    elif r < 0.97:
        gpus, nodes, limit = 8, 1, rng.choice([43200, 86400])
    else:
        gpus, nodes, limit = 8, rng.choice([2, 3, 4]), rng.choice([86400, 172800])
    gtype = rng.choice(TYPES) if rng.random() < 0.4 else None
    return ev.JobSpec(name=f"job{user}", user=f"user{user:03d}", account=f"acct{user % 20:02d}", nodes=nodes,
                      nodes_given=True,
                      ntasks=nodes, cpus_per_task=8 * gpus, gpus_per_node=gpus, gpu_type=gtype,
                      mem_per_node=64 * GIB * gpus, time_limit=limit)


class Builder:
    def __init__(self, config: ev.ClusterConfig) -> None:
        self.state = State()
        self.seq = 0
        self.put(T0 - 86400, ev.ClusterConfigured(config=config))

    def put(self, ts: int, event) -> None:
        self.seq += 1
        apply(self.state, ev.Envelope(seq=self.seq, ts=ts, event=event))

    def submit(self, ts: int, spec: ev.JobSpec) -> int:
        jid = self.state.next_job_id
        self.put(ts, ev.JobSubmitted(job_id=jid, spec=spec))
        return jid


def loaded_state(pending: int, seed: int = 1, busy: float = 0.85, nodes: int = 1000) -> State:
    """A cluster with a day of history (GPUs ~``busy`` used) and ``pending`` queued jobs."""
    rng = random.Random(seed)
    b = Builder(cluster(nodes))
    target = busy * nodes * 8
    # a day of history: each hour, jobs past their limit end and the cluster is topped up
    for hour in range(25):
        ts = T0 - 86400 + hour * 3600
        for jid in list(b.state.running):
            job = b.state.jobs[jid]
            if job.start_time + (job.time_limit or 0) <= ts:
                b.put(ts, ev.JobExited(job_id=jid, state="COMPLETED", elapsed=job.time_limit or 0))
        for _attempt in range(6):
            used = sum(len(n.gpu_owner) - n.gpu_owner.count(0) for n in b.state.nodes.values())
            while used < target:
                spec = random_spec(rng, rng.randrange(200))
                b.submit(ts, spec)
                used += spec.gpus_per_node * spec.nodes
            d = schedule(b.state, ts, "easy")
            event = d.event()
            if event is not None:
                b.put(ts, event)
            for jid in list(b.state.pending):   # whatever did not fit is dropped from the history
                b.put(ts, ev.JobCancelled(job_id=jid))
    for i in range(pending):
        b.submit(T0 + i // 100, random_spec(rng, rng.randrange(200)))
    return b.state


def gpus_busy(state: State) -> float:
    total = sum(len(n.gpu_owner) for n in state.nodes.values())
    return sum(len(n.gpu_owner) - n.gpu_owner.count(0) for n in state.nodes.values()) / total


def event_stream(n_events: int, seed: int = 2, nodes: int = 1000) -> list[ev.Envelope]:
    """A realistic stream: submits, cycles that start jobs with full allocations, exits."""
    rng = random.Random(seed)
    config = cluster(nodes)
    out = [ev.Envelope(seq=1, ts=T0, event=ev.ClusterConfigured(config=config))]
    free: list[list[list[int]]] = [[list(range(8))] for _ in range(nodes)]   # each node's free GPUs
    queue: list[tuple[int, int]] = []
    running: list[tuple[int, int, tuple[int, ...], int]] = []
    jid, seq, ts, cycle = 1, 1, T0, 0

    def add(event) -> None:
        nonlocal seq
        seq += 1
        out.append(ev.Envelope(seq=seq, ts=ts, actor="bench", idem=f"b{seq}", event=event))

    while len(out) < n_events:
        ts += 1
        for _ in range(4):
            gpus = rng.choice([1, 1, 1, 2, 2, 4, 8])
            add(ev.JobSubmitted(job_id=jid, spec=ev.JobSpec(user=f"u{rng.randrange(50)}", gpus_per_node=gpus,
                                                            cpus_per_task=gpus * 8, time_limit=3600)))
            queue.append((jid, gpus))
            jid += 1
        starts: list[ev.Start] = []
        while queue and len(starts) < 4:
            j, g = queue[0]
            node = rng.randrange(nodes)
            if len(free[node][0]) < g:
                break
            queue.pop(0)
            got = tuple(free[node][0][:g])
            del free[node][0][:g]
            starts.append(ev.Start(job_id=j, partition="gpu", time_limit=3600,
                                   alloc=(ev.NodeAlloc(node=f"gpu{node:04d}", cpus=g * 8, mem=0, gpus=got),)))
            running.append((j, node, got, ts))
        if starts:
            cycle += 1
            add(ev.JobsStarted(cycle=cycle, now=ts, policy="conservative", starts=tuple(starts)))
        while len(running) > 3000 or (running and len(starts) == 0):
            j, node, got, _st = running.pop(0)
            free[node][0].extend(got)
            free[node][0].sort()
            add(ev.JobExited(job_id=j, state="COMPLETED", elapsed=100))
        for _ in range(min(4, len(running))):
            j, node, got, _st = running.pop(0)
            free[node][0].extend(got)
            free[node][0].sort()
            add(ev.JobExited(job_id=j, state="COMPLETED", elapsed=100))
    return out[:n_events]


def cycle(state: State, now: int, policy: str, **kw: Any) -> Any:
    """One scheduling cycle as the controller runs one: the collector paused meanwhile (``Controller.cycle``)."""
    with collector.paused():
        return schedule(state, now, policy, **kw)


TARGETS = {"conservative": (10000, 1.0), "easy": (50000, 1.0)}


@contextmanager
def _accounting(state: State) -> Iterator[None]:
    """Fair-share and limits on the state while in the block: 200 users in 20 accounts under 4 departments
    (shares, usage from the day of history, Fair Tree, PriorityWeightFairshare), per-user QOS limits
    (MaxJobsPerUser, MaxTRESPerUser) and departments' GrpTRES, enforced on every job."""
    saved = state.config, state.qos, state.accounts, state.associations
    config = saved[0]
    assert config is not None
    prio = config.priority.model_copy(update={"fairshare": 10000})
    state.config = config.model_copy(update={"accounting_enforce": ("associations", "limits"), "priority": prio})
    state.qos = {"normal": ev.QosRecord(name="normal", max_jobs_per_user=30, max_tres_per_user={"gres/gpu": 48})}
    state.accounts = {f"dept{d}": ev.AccountRecord(name=f"dept{d}", fairshare=1 + d, grp_tres={"gres/gpu": 2400})
                      for d in range(4)}
    state.accounts.update({f"acct{a:02d}": ev.AccountRecord(name=f"acct{a:02d}", parent=f"dept{a % 4}",
                                                            fairshare=1 + a % 3) for a in range(20)})
    state.associations = {(f"user{u:03d}", f"acct{u % 20:02d}"): ev.Association(user=f"user{u:03d}",
                                                                                account=f"acct{u % 20:02d}")
                          for u in range(200)}
    try:
        yield
    finally:
        state.config, state.qos, state.accounts, state.associations = saved


def _with_accounting(state: State, pending: int, runs: int, cmd: str) -> Figure:
    """The conservative cycle with fair-share and limits (:func:`_accounting`)."""
    with _accounting(state):
        gc.collect()
        med, _ = median_time(lambda: cycle(state, T0 + 600, "conservative"), runs)
        d = schedule(state, T0 + 600, "conservative")
    held = sum(1 for p in d.pending.values() if p.reason.startswith(("QOS", "Assoc")))
    target, met = ("<= 1.0 s", med <= 1.0) if pending in (10000, 50000) else ("", None)
    return Figure(f"cycle conservative with fair-share and limits, {pending:,} pending", med, "s", target, met,
                  f"{cmd} --pending {pending}", f"{len(d.starts)} starts, {held} held by a QOS or association limit")


def _put(state: State, ts: int, event: Any) -> None:
    apply(state, ev.Envelope(seq=state.seq + 1, ts=ts, event=event))


def _kept_plan(state: State, pending: int, runs: int, cmd: str) -> list[Figure]:
    """The cycle with fair-share and limits as the controller runs it, with the plan kept from the last cycle
    (rota.core.replan), after three changes: a minute passes; another, and ten jobs are submitted; then one
    running job ends early. Each next cycle, full and kept, must decide the same. Leaves the state changed."""
    rng = random.Random(3)
    figures = []
    with _accounting(state):
        now = T0 + 600
        memory = PlanMemory()
        for _ in range(2):          # the second finds the first's starts running, as a steady queue does
            event = schedule(state, now, "conservative", memory=memory).event()
            if event is not None:
                _put(state, now, event)
        now += 60
        figures.append(_next_cycle(state, now, memory, runs, f"a minute later, {pending:,} pending",
                                   f"{cmd} --pending {pending}"))
        now += 60
        for _ in range(10):
            _put(state, now, ev.JobSubmitted(job_id=state.next_job_id, spec=random_spec(rng, rng.randrange(200))))
        figures.append(_next_cycle(state, now, memory, runs, f"a minute later, 10 jobs submitted, {pending:,} pending",
                                   f"{cmd} --pending {pending}"))
        _put(state, now, ev.JobExited(job_id=min(state.running), state="COMPLETED", elapsed=600))
        figures.append(_next_cycle(state, now, memory, runs, f"a job ended early, {pending:,} pending",
                                   f"{cmd} --pending {pending}"))
    return figures


def _next_cycle(state: State, now: int, memory: PlanMemory, runs: int, what: str, cmd: str) -> Figure:
    """The cycle at ``now`` with the plan kept in ``memory`` (left as that cycle leaves it), against the full plan."""
    gc.collect()
    fulls, kepts = [], []
    for _ in range(runs):           # alternating, so both see the same machine
        began = time.perf_counter()
        cycle(state, now, "conservative")
        fulls.append(time.perf_counter() - began)
        again = copy.copy(memory)
        began = time.perf_counter()
        cycle(state, now, "conservative", memory=again)
        kepts.append(time.perf_counter() - began)
    full_s, kept_s = statistics.median(fulls), statistics.median(kepts)
    full = schedule(state, now, "conservative")
    kept = schedule(state, now, "conservative", memory=memory)
    event = kept.event()
    if event is not None:
        _put(state, now, event)
    same = (kept.starts, kept.reservations, kept.pending) == (full.starts, full.reservations, full.pending)
    return Figure(f"next cycle with fair-share and limits, plan kept: {what}", kept_s, "s", "", None, cmd,
                  f"full plan {full_s:.3f} s ({kept_s / full_s:.2f}x); {memory.reused:,} placements kept, "
                  f"{memory.searched:,} searched; same decision as the full plan: {'yes' if same else 'NO'}")


def run(runs: int, pendings: list[int], n_events: int) -> list[Figure]:
    figures: list[Figure] = []
    cmd = "python -m rota.bench.core_bench"
    for pending in pendings:
        t = time.perf_counter()
        state = loaded_state(pending)
        build = time.perf_counter() - t
        print(f"built state: {pending} pending, {len(state.running)} running, "
              f"{gpus_busy(state):.0%} GPUs busy ({build:.1f}s)", flush=True)
        for policy in ("fifo", "easy", "conservative"):
            gc.collect()
            med, _ = median_time(lambda state=state, policy=policy: cycle(state, T0 + 600, policy), runs)
            d = schedule(state, T0 + 600, policy)
            target = ""
            met = None
            tp = TARGETS.get(policy)
            if tp and tp[0] == pending:
                target, met = f"<= {tp[1]:.1f} s", med <= tp[1]
            figures.append(Figure(f"cycle {policy}, {pending:,} pending", med, "s", target, met,
                                  f"{cmd} --pending {pending}",
                                  f"{len(d.starts)} starts, {len(d.reservations)} reservations"))
        figures.append(_with_accounting(state, pending, runs, cmd))
        figures.extend(_kept_plan(state, pending, runs, cmd))
    if n_events:
        t = time.perf_counter()
        stream = event_stream(n_events)
        print(f"built stream of {len(stream):,} events ({time.perf_counter() - t:.1f}s)", flush=True)
        gc.collect()
        gc.disable()
        try:
            med, _ = median_time(lambda: fold(stream), runs)
        finally:
            gc.enable()
        rate = len(stream) / med
        figures.append(Figure(f"apply, {len(stream):,} events", rate, "events/s", ">= 250,000", rate >= 250_000,
                              f"{cmd} --events {n_events}", f"median fold time {med:.2f} s"))
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--pending", default="10000,50000")
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--json", default=None, help="also write the figures as JSON to this file")
    args = ap.parse_args()
    pendings = [int(x) for x in args.pending.split(",") if x]
    figures = run(args.runs, pendings, args.events)
    print_table(figures, "rota core benchmark (medians of %d runs)" % args.runs)
    write_json(figures, args.json)


if __name__ == "__main__":
    main()
