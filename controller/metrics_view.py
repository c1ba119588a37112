"""What an operator scrapes: the controller's figures for ``/metrics`` (``rota web`` renders them in
Prometheus's format) and the grid of GPU slots the web view draws."""
from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING

from rota.core.idle import idle_jobs
from rota.core.state import PENDING, RUNNING, SHARED, Job

if TYPE_CHECKING:
    from .port import ControllerPort

# upper bounds (seconds) of the cycle-duration histogram's buckets, as Prometheus's defaults
CYCLE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class CycleHistogram:
    """Cycle durations as a cumulative histogram (counts per upper bound, the sum, the count)."""

    __slots__ = ("counts", "sum", "count")

    def __init__(self) -> None:
        self.counts = [0] * len(CYCLE_BUCKETS)
        self.sum = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        for i, bound in enumerate(CYCLE_BUCKETS):
            if seconds <= bound:
                self.counts[i] += 1
        self.sum += seconds
        self.count += 1


def _partition(c: ControllerPort, job: Job) -> str:
    """The partition a pending job is counted under: its own, those it asked for, or the default."""
    part = job.partition or ",".join(job.spec.partitions)
    if part:
        return part
    cfg = c.state.config
    default = cfg.default_partition() if cfg is not None else None
    return default.name if default is not None else ""


def figures(c: ControllerPort) -> dict:
    """The controller's figures now: the queue by partition and reason, GPUs by what they do, running jobs
    and GPUs held per user and account, cycles, the log's sequence and each agent's heartbeat age."""
    state = c.state
    queue: Counter[tuple[str, str]] = Counter()
    for row in c.views.queue_view():
        if row["state"] == PENDING:
            queue[(_partition(c, state.jobs[row["job_id"]]), row["reason"])] += 1
    running: Counter[tuple[str, str]] = Counter()
    held: Counter[tuple[str, str]] = Counter()
    for jid in state.running:
        job = state.jobs[jid]
        key = (job.spec.user, job.spec.account)
        running[key] += 1
        held[key] += sum(len(a.gpus) for a in job.alloc if not a.shards)
    gpus = Counter({"allocated": 0, "idle": 0, "drained": 0, "down": 0})
    for node in state.nodes.values():
        busy = sum(1 for o in node.gpu_owner if o)
        gpus["allocated"] += busy
        free = node.gpu_count - busy
        gpus["down" if node.down or node.not_responding else "drained" if node.drain else "idle"] += free
    unused = sum(j.gpus for j in idle_jobs(state, c.now()))
    hist = c.cycle_hist
    mono = time.monotonic()
    return {
        "ok": True, "now": c.now(), "seq": state.seq, "log_time": state.now, "leader": c.leader,
        "pending": len(state.pending), "running": len(state.running),
        "queue": [[p, r, n] for (p, r), n in sorted(queue.items())],
        "gpus": dict(gpus), "gpus_allocated_unused": unused,
        "running_by": [[u, a, n, held[(u, a)]] for (u, a), n in sorted(running.items())],
        "cycle": {"buckets": list(CYCLE_BUCKETS), "counts": hist.counts, "sum": hist.sum, "count": hist.count},
        "heartbeat_age": {node: round(mono - seen, 3) for node, seen in sorted(c.agent_seen.items())},
    }


def gpu_grid(c: ControllerPort) -> list[dict]:
    """Each node and each of its GPU slots: the job holding it (0: free; -1: shared by shard jobs), its type."""
    state = c.state
    out = []
    for n in state.nodes.values():
        holders = []
        for g, owner in enumerate(n.gpu_owner):
            job = state.jobs.get(owner) if owner > 0 else None
            holders.append({"index": g, "type": n.gpu_types[g] if g < len(n.gpu_types) else "",
                            "job_id": owner if owner > 0 else (SHARED if owner == SHARED else 0),
                            "user": job.spec.user if job is not None and job.state == RUNNING else "",
                            "uid": job.spec.uid if job is not None else None})
        out.append({"name": n.name, "state": n.display_state(), "reason": n.reason, "reason_by": n.reason_by,
                    "reason_time": n.reason_time, "cpus": n.cpus, "alloc_cpus": n.alloc_cpus, "memory": n.memory,
                    "alloc_mem": n.alloc_mem, "gpus": holders, "jobs": list(n.jobs)})
    return out


def hide_others(nodes: list[dict], uid: int, owners: dict[int, int]) -> None:
    """Under ``PrivateData=jobs``: another user's jobs left out of a grid from :func:`gpu_grid`, their GPUs shown
    held by someone (job id -2) and unnamed; ``owners``: job id -> uid."""
    for n in nodes:
        n["jobs"] = [j for j in n["jobs"] if owners.get(j) == uid]
        for g in n["gpus"]:
            if g["job_id"] > 0 and g["uid"] != uid:
                g.update(job_id=-2, user="", uid=None)
