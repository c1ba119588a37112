"""What a job's ``--mail-type`` asks to be told, as notices derived from the log (pure).

Each notice is an effect of an event (a start, an end, a requeue) or of the clock passing a share of a
running job's time limit, keyed so that the notifier (rota.notify) sends each at least once and can tell a
notice it already sent. The subjects are Slurm's, so that mail filters written for Slurm keep working.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import events as ev
from .idle import due_warning
from .mailtypes import MailTypeError, expand
from .state import RUNNING, State
from .timefmt import format_duration

__all__ = ["MailTypeError", "Notice", "expand", "notices", "time_notices"]

SHARES = (("TIME_LIMIT_50", 50), ("TIME_LIMIT_80", 80), ("TIME_LIMIT_90", 90), ("TIME_LIMIT", 100))


@dataclass(frozen=True, slots=True)
class Notice:
    """One message for one job: ``key`` names it once and for all ("12.0.END": job, run, kind)."""

    key: str
    job_id: int
    kind: str
    to: str
    subject: str
    fields: dict[str, Any] = field(default_factory=dict)


def _notice(job: Any, kind: str, subject: str, **fields: Any) -> Notice:
    spec = job.spec
    return Notice(f"{job.job_id}.{job.restarts}.{kind}", job.job_id, kind, spec.mail_user or spec.user,
                  f"Slurm Job_id={job.job_id} Name={spec.name} {subject}",
                  {"job_id": job.job_id, "name": spec.name, "user": spec.user, "kind": kind, "state": job.state,
                   **fields})


def notices(state: State, env: ev.Envelope) -> list[Notice]:
    """The notices an event makes, judged on the state after it (its jobs' ``--mail-type``)."""
    e = env.event
    out: list[Notice] = []
    if isinstance(e, ev.JobsStarted):
        for s in e.starts:
            job = state.jobs.get(s.job_id)
            if job is not None and "BEGIN" in job.spec.mail_type:
                out.append(_notice(job, "BEGIN", f"Began, Queued time {format_duration(e.now - job.submit_time)}",
                                   queued=e.now - job.submit_time, nodes=[a.node for a in s.alloc]))
    elif isinstance(e, ev.JobExited):
        job = state.jobs.get(e.job_id)
        if job is not None and job.state != RUNNING:
            out.extend(_ended(job, e.state, e.exit_code, e.elapsed or max(0, job.end_time - job.start_time)))
    elif isinstance(e, ev.JobRequeued):
        job = state.jobs.get(e.job_id)
        if job is not None and "REQUEUE" in job.spec.mail_type:
            out.append(_notice(job, "REQUEUE", "Requeued"))
    elif isinstance(e, ev.JobCancelled):
        job = state.jobs.get(e.job_id)
        if job is not None and not job.start_time:         # never ran: no exit will follow
            out.extend(_ended(job, "CANCELLED", 0, 0))
    return out


def _ended(job: Any, how: str, exit_code: int, elapsed: int) -> list[Notice]:
    kinds = job.spec.mail_type
    run = f"Run time {format_duration(elapsed)}, {how}, ExitCode {exit_code}"
    if how != "COMPLETED" and "FAIL" in kinds:
        return [_notice(job, "FAIL", f"Failed, {run}", exit_code=exit_code, elapsed=elapsed, end_state=how)]
    if "END" in kinds:
        return [_notice(job, "END", f"Ended, {run}", exit_code=exit_code, elapsed=elapsed, end_state=how)]
    return []


def time_notices(state: State, now: int) -> list[Notice]:
    """TIME_LIMIT_50/80/90 and TIME_LIMIT for the running jobs that asked, once their run has used that share of
    its limit; IDLE_GPU for every job the idle-GPU policy warns (the notifier drops the keys it already sent)."""
    out: list[Notice] = []
    for jid in state.running:
        job = state.jobs[jid]
        if due_warning(state, job, now) and job.idle_since is not None and state.config is not None:
            policy = state.config.idle_gpu
            then = f", {policy.action} at t={job.idle_since + policy.after + policy.grace}" \
                if policy.action != "warn" else ""
            out.append(_notice(job, f"IDLE_GPU.{job.idle_since}", f"GPUs idle since t={job.idle_since}{then}",
                               idle_since=job.idle_since))
        limit = job.time_limit
        if not limit or not any(k.startswith("TIME_LIMIT") for k in job.spec.mail_type):
            continue
        used = now - job.start_time
        for kind, share in SHARES:
            if kind in job.spec.mail_type and used * 100 >= share * limit:
                what = "Reached time limit" if share == 100 else f"Reached {share}% of time limit"
                out.append(_notice(job, kind, f"{what}, Run time {format_duration(used)}", elapsed=used, time_limit=limit))
    return out
