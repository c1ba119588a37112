"""Forgotten GPUs (pure): jobs whose GPUs their agents found idle, what they waste, and what the policy does.

An agent samples the GPUs of each job it runs and reports :class:`~rota.core.events.GpuIdle` (with the
samples) once they have been idle a while, and :class:`~rota.core.events.GpuBusy` when they work again. The
cluster's :class:`~rota.core.events.IdleGpuPolicy` then warns the owner once a job has been idle ``after``
seconds (a notice: rota.core.notify) and, ``grace`` seconds later, cancels or requeues it: an event the
controller appends, derived from the log alone, so a replay makes the same decision at the same moment.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import events as ev
from .state import RUNNING, Job, State


@dataclass(frozen=True, slots=True)
class IdleJob:
    """A running job whose GPUs are idle: since when, for how long, and the GPU-hours that wasted."""

    job_id: int
    user: str
    partition: str
    node: str
    gpus: int
    since: int
    idle_for: int
    gpu_hours: float


def idle_jobs(state: State, now: int) -> list[IdleJob]:
    """Every running job reported idle, longest idle first."""
    out = []
    for jid in state.running:
        job = state.jobs[jid]
        if job.idle_since is None:
            continue
        gpus = sum(len(a.gpus) for a in job.alloc)
        idle_for = max(0, now - job.idle_since)
        out.append(IdleJob(jid, job.spec.user, job.partition, job.alloc[0].node if job.alloc else "", gpus,
                           job.idle_since, idle_for, round(gpus * idle_for / 3600, 2)))
    return sorted(out, key=lambda j: (-j.idle_for, j.job_id))


def governed(policy: ev.IdleGpuPolicy, job: Job) -> bool:
    """Whether the policy applies to ``job`` (its partition, its QOS)."""
    return policy.after > 0 and (not policy.partitions or job.partition in policy.partitions) \
        and job.spec.qos not in policy.exempt_qos


def reason(job: Job, policy: ev.IdleGpuPolicy) -> str:
    """What the cancel or requeue says."""
    return (f"its GPUs were idle from t={job.idle_since} for {policy.after + policy.grace}s "
            f"(RotaIdleGpu after={policy.after}s, grace={policy.grace}s)")


def idle_actions(state: State, now: int) -> list[ev.JobCancelled | ev.JobRequeued]:
    """The cancels or requeues the idle policy owes at ``now`` (none under action=warn)."""
    policy = state.config.idle_gpu if state.config is not None else None
    if policy is None or policy.after <= 0 or policy.action == "warn":
        return []
    out: list[ev.JobCancelled | ev.JobRequeued] = []
    for jid in sorted(state.running):
        job = state.jobs[jid]
        if job.idle_since is None or job.cancel_by is not None or job.state != RUNNING or not governed(policy, job):
            continue
        if now >= job.idle_since + policy.after + policy.grace:
            if policy.action == "requeue":
                out.append(ev.JobRequeued(job_id=jid, reason=reason(job, policy)))
            else:
                out.append(ev.JobCancelled(job_id=jid, by_uid=0, reason=reason(job, policy)))
    return out


def due_warning(state: State, job: Job, now: int) -> bool:
    """Whether ``job``'s owner is owed the idle warning now."""
    policy = state.config.idle_gpu if state.config is not None else None
    return policy is not None and job.idle_since is not None and governed(policy, job) \
        and now >= job.idle_since + policy.after
