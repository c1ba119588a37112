"""Integer multifactor priority (Slurm's formula with integer arithmetic; pure)."""
from __future__ import annotations

from typing import NamedTuple

from .events import ClusterConfig, PartitionConfig, QosRecord
from .state import Job
from .timeaccuracy import accuracy_ppm


M = 1_000_000    # weighted factors are kept in millionths: Slurm sums them as doubles and truncates the sum


class JobSize(NamedTuple):
    """What the job-size factor reads: the nodes and CPUs the job will hold, and its time limit in minutes
    (``PriorityFlags=SMALL_RELATIVE_TO_TIME``)."""

    nodes: int
    cpus: int
    minutes: int = 0


class PriorityContext:
    """Per-cycle constants the priority formula needs: weights, the cluster's size, QOS priorities and
    each association's fair-share factor (parts per million) and how accurate its runs' limits were
    (``State.time_accuracy``)."""

    __slots__ = ("w", "cluster_cpus", "node_count", "max_pjf", "qos_prio", "max_qos", "fairshare", "fixed", "accuracy")

    def __init__(self, cfg: ClusterConfig, cluster_cpus: int, qos: dict[str, QosRecord] | None = None,
                 fairshare: dict[tuple[str, str], int] | None = None, node_count: int | None = None,
                 accuracy: dict[tuple[str, str], list[int]] | None = None) -> None:
        self.w = cfg.priority
        self.cluster_cpus = max(1, cluster_cpus)
        self.node_count = max(1, node_count if node_count is not None else len(cfg.nodes))
        self.max_pjf = max((p.priority_job_factor for p in cfg.partitions), default=1) or 1
        # sacctmgr's QOS (the log's) over the configuration's
        self.qos_prio = {q.name: q.priority for q in cfg.qos} | {q.name: q.priority for q in (qos or {}).values()}
        self.max_qos = max(self.qos_prio.values(), default=0) or 1
        self.fairshare = fairshare
        self.fixed: dict[tuple[str, JobSize, str], int] = {}   # (partition, size, QOS) -> their factors' sum
        self.accuracy = accuracy or {}


class Factors(NamedTuple):
    """A pending job's priority and each weighted factor in it, as ``sprio`` shows them (each rounded, as
    sprio prints them; the priority truncates their exact sum, as Slurm's does)."""

    priority: int
    age: int
    fairshare: int
    job_size: int
    partition: int
    qos: int
    nice: int
    accuracy: int = 0      # rota's factor for accurate limits (RotaPriorityWeightAccuracy; 0 when off)


def fairshare_factor(job: Job, ctx: PriorityContext) -> int:
    """The job's association's fair-share factor in parts per million: 1.0 while no accounts are defined,
    0 for a job whose user has no association with its account."""
    if ctx.fairshare is None:
        return 1_000_000
    return ctx.fairshare.get((job.spec.user, job.spec.account), 0)


def _weighted(job: Job, now: int, part: PartitionConfig, size: JobSize,
              ctx: PriorityContext) -> tuple[int, int, int, int, int, int]:
    """The job's weighted factors in millionths: (age, fair-share, job size, partition, QOS, accuracy)."""
    return (_age(job, now, ctx), _fairshare(job, ctx), *_fixed(part, size, job.spec.qos, ctx), _accuracy(job, ctx))


def _age(job: Job, now: int, ctx: PriorityContext) -> int:
    w = ctx.w
    waited = now - job.eligible_time
    return w.age * M * min(waited, w.max_age) // max(1, w.max_age) if w.age and waited > 0 else 0


def _fairshare(job: Job, ctx: PriorityContext) -> int:
    w = ctx.w.fairshare
    return w * fairshare_factor(job, ctx) if w else 0


def _accuracy(job: Job, ctx: PriorityContext) -> int:
    """rota's factor for honest limits: how much of their limits the association's runs used, times its weight."""
    w = ctx.w.accuracy
    return w * accuracy_ppm(ctx.accuracy, job.spec.user, job.spec.account) if w else 0


def _job_size(size: JobSize, ctx: PriorityContext) -> int:
    """Slurm 22.05's job-size factor times its weight, in millionths: the share of the cluster's nodes and of
    its CPUs the job holds, averaged (``PriorityFavorSmall``: what it leaves free); with
    ``SMALL_RELATIVE_TO_TIME``, its CPUs (at least its nodes' average share) per minute of its time limit."""
    w = ctx.w
    n, c = ctx.node_count, ctx.cluster_cpus
    if w.small_relative_to_time:
        minutes = max(1, size.minutes)
        num, den = max(size.nodes * c, size.cpus * n), n * minutes * c     # CPUs / minutes / cluster CPUs
        if w.favor_small:
            num = den - num
    elif w.favor_small:
        num, den = (n - size.nodes) * c + (c - size.cpus) * n, 2 * n * c
    else:
        num, den = size.nodes * c + size.cpus * n, 2 * n * c
    num = min(max(num, 0), den)
    return w.job_size * M * num // den


def _fixed(part: PartitionConfig, size: JobSize, qos_name: str, ctx: PriorityContext) -> tuple[int, int, int]:
    """The weighted factors (millionths) every job of this size, partition and QOS shares: (job size,
    partition, QOS)."""
    w = ctx.w
    js = _job_size(size, ctx) if w.job_size else 0
    partition = w.partition * M * part.priority_job_factor // ctx.max_pjf if w.partition else 0
    qos = w.qos * M * ctx.qos_prio.get(qos_name, 0) // ctx.max_qos if w.qos else 0
    return js, partition, qos


def priority_factors(job: Job, now: int, part: PartitionConfig, size: JobSize, ctx: PriorityContext) -> Factors:
    """The job's priority (site weights times factors, minus nice; 0 while held, an administrator's
    value when set) and its parts."""
    weighted = _weighted(job, now, part, size, ctx)
    age, fairshare, js, partition, qos, accuracy = (_rounded(f) for f in weighted)
    return Factors(_priority(job, weighted), age, fairshare, js, partition, qos, job.nice, accuracy)


def _rounded(millionths: int) -> int:
    """A weighted factor as sprio prints it (``%.0f``: to the nearest, a half to even)."""
    q, r = divmod(millionths, M)
    return q + 1 if 2 * r > M or (2 * r == M and q % 2) else q


def job_priority(job: Job, now: int, part: PartitionConfig, size: JobSize, ctx: PriorityContext) -> int:
    """The job's priority: site weights times factors, minus nice; 0 while held (what
    :func:`priority_factors` sums, with the factors jobs share summed once a cycle)."""
    if job.hold is not None or job.priority_override is not None:
        return _priority(job, ())
    qos = job.spec.qos
    key = (part.name, size, qos)
    fixed = ctx.fixed.get(key)
    if fixed is None:
        fixed = ctx.fixed[key] = sum(_fixed(part, size, qos, ctx))
    return _priority(job, (_age(job, now, ctx), _fairshare(job, ctx), fixed, _accuracy(job, ctx)))


def _priority(job: Job, weighted: tuple[int, ...]) -> int:
    """0 while held, an administrator's value when set, else the weighted factors (millionths) summed and
    truncated, less nice (at least 1: 0 means held, as in Slurm)."""
    if job.hold is not None:
        return 0
    if job.priority_override is not None:
        return job.priority_override
    return max(sum(weighted) // M - job.nice, 1)
