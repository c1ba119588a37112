"""Integer multifactor priority (Slurm's formula with integer arithmetic; pure)."""
from __future__ import annotations

from .events import ClusterConfig, PartitionConfig, QosRecord
from .state import Job


class PriorityContext:
    """Per-cycle constants the priority formula needs."""

    __slots__ = ("w", "cluster_cpus", "max_pjf", "qos_prio", "max_qos")

    def __init__(self, cfg: ClusterConfig, cluster_cpus: int, qos: dict[str, QosRecord] | None = None) -> None:
        self.w = cfg.priority
        self.cluster_cpus = max(1, cluster_cpus)
        self.max_pjf = max((p.priority_job_factor for p in cfg.partitions), default=1) or 1
        # sacctmgr's QOS (the log's) over the configuration's
        self.qos_prio = {q.name: q.priority for q in cfg.qos} | {q.name: q.priority for q in (qos or {}).values()}
        self.max_qos = max(self.qos_prio.values(), default=0) or 1


def fairshare_factor(job: Job) -> int:
    """Fair-share factor in parts per million; a slot for the fair-share policy (1.0 until then)."""
    return 1_000_000


def job_priority(job: Job, now: int, part: PartitionConfig, job_cpus: int, ctx: PriorityContext) -> int:
    """The job's priority: site weights times factors, minus nice; 0 while held."""
    if job.hold is not None:
        return 0
    if job.priority_override is not None:
        return job.priority_override
    w = ctx.w
    prio = 0
    if w.age:
        age = now - job.eligible_time
        if age > 0:
            prio += w.age * min(age, w.max_age) // max(1, w.max_age)
    if w.job_size:
        size = min(job_cpus, ctx.cluster_cpus)
        if w.favor_small:
            prio += w.job_size * (ctx.cluster_cpus - size) // ctx.cluster_cpus
        else:
            prio += w.job_size * size // ctx.cluster_cpus
    if w.partition:
        prio += w.partition * part.priority_job_factor // ctx.max_pjf
    if w.qos:
        prio += w.qos * ctx.qos_prio.get(job.spec.qos, 0) // ctx.max_qos
    if w.fairshare:
        prio += w.fairshare * fairshare_factor(job) // 1_000_000
    prio -= job.nice
    return max(prio, 1)   # 0 means held, as in Slurm
