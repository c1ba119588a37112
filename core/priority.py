"""Integer multifactor priority (Slurm's formula with integer arithmetic; pure)."""
from __future__ import annotations

from typing import NamedTuple

from .events import ClusterConfig, PartitionConfig, QosRecord
from .state import Job


class PriorityContext:
    """Per-cycle constants the priority formula needs: weights, the cluster's size, QOS priorities and
    each association's fair-share factor (parts per million)."""

    __slots__ = ("w", "cluster_cpus", "max_pjf", "qos_prio", "max_qos", "fairshare", "fixed")

    def __init__(self, cfg: ClusterConfig, cluster_cpus: int, qos: dict[str, QosRecord] | None = None,
                 fairshare: dict[tuple[str, str], int] | None = None) -> None:
        self.w = cfg.priority
        self.cluster_cpus = max(1, cluster_cpus)
        self.max_pjf = max((p.priority_job_factor for p in cfg.partitions), default=1) or 1
        # sacctmgr's QOS (the log's) over the configuration's
        self.qos_prio = {q.name: q.priority for q in cfg.qos} | {q.name: q.priority for q in (qos or {}).values()}
        self.max_qos = max(self.qos_prio.values(), default=0) or 1
        self.fairshare = fairshare
        self.fixed: dict[tuple[str, int, str], int] = {}   # (partition, CPUs, QOS) -> their factors' sum


class Factors(NamedTuple):
    """A pending job's priority and each weighted factor in it, as ``sprio`` shows them."""

    priority: int
    age: int
    fairshare: int
    job_size: int
    partition: int
    qos: int
    nice: int


def fairshare_factor(job: Job, ctx: PriorityContext) -> int:
    """The job's association's fair-share factor in parts per million: 1.0 while no accounts are defined,
    0 for a job whose user has no association with its account."""
    if ctx.fairshare is None:
        return 1_000_000
    return ctx.fairshare.get((job.spec.user, job.spec.account), 0)


def _weighted(job: Job, now: int, part: PartitionConfig, job_cpus: int,
              ctx: PriorityContext) -> tuple[int, int, int, int, int]:
    """The job's weighted factors: (age, fair-share, job size, partition, QOS)."""
    return (_age(job, now, ctx), _fairshare(job, ctx), *_fixed(part, job_cpus, job.spec.qos, ctx))


def _age(job: Job, now: int, ctx: PriorityContext) -> int:
    w = ctx.w
    waited = now - job.eligible_time
    return w.age * min(waited, w.max_age) // max(1, w.max_age) if w.age and waited > 0 else 0


def _fairshare(job: Job, ctx: PriorityContext) -> int:
    w = ctx.w.fairshare
    return w * fairshare_factor(job, ctx) // 1_000_000 if w else 0


def _fixed(part: PartitionConfig, job_cpus: int, qos_name: str, ctx: PriorityContext) -> tuple[int, int, int]:
    """The weighted factors every job of this size, partition and QOS shares: (job size, partition, QOS)."""
    w = ctx.w
    size = partition = qos = 0
    if w.job_size:
        cpus = min(job_cpus, ctx.cluster_cpus)
        if w.favor_small:
            size = w.job_size * (ctx.cluster_cpus - cpus) // ctx.cluster_cpus
        else:
            size = w.job_size * cpus // ctx.cluster_cpus
    if w.partition:
        partition = w.partition * part.priority_job_factor // ctx.max_pjf
    if w.qos:
        qos = w.qos * ctx.qos_prio.get(qos_name, 0) // ctx.max_qos
    return size, partition, qos


def priority_factors(job: Job, now: int, part: PartitionConfig, job_cpus: int, ctx: PriorityContext) -> Factors:
    """The job's priority (site weights times factors, minus nice; 0 while held, an administrator's
    value when set) and its parts."""
    weighted = _weighted(job, now, part, job_cpus, ctx)
    age, fairshare, size, partition, qos = weighted
    return Factors(_priority(job, weighted), age, fairshare, size, partition, qos, job.nice)


def job_priority(job: Job, now: int, part: PartitionConfig, job_cpus: int, ctx: PriorityContext) -> int:
    """The job's priority: site weights times factors, minus nice; 0 while held (what
    :func:`priority_factors` sums, with the factors jobs share summed once a cycle)."""
    if job.hold is not None or job.priority_override is not None:
        return _priority(job, ())
    qos = job.spec.qos
    key = (part.name, job_cpus, qos)
    fixed = ctx.fixed.get(key)
    if fixed is None:
        fixed = ctx.fixed[key] = sum(_fixed(part, job_cpus, qos, ctx))
    return _priority(job, (_age(job, now, ctx), _fairshare(job, ctx), fixed))


def _priority(job: Job, weighted: tuple[int, ...]) -> int:
    """0 while held, an administrator's value when set, else the weighted factors less nice (at least 1:
    0 means held, as in Slurm)."""
    if job.hold is not None:
        return 0
    if job.priority_override is not None:
        return job.priority_override
    return max(sum(weighted) - job.nice, 1)
