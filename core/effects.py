"""What the agents must be told, derived from what the reducer changed (pure).

Keyed on each job's state before and after (Flux's transition -> action): a run that ended or was
requeued without its agent reporting it is killed ("stopped"); a job that became RUNNING, or runs
again after a requeue, is launched; a running job that was cancelled is killed with the cancel's
signal; a running job whose time limit changed is updated; a running job preempted with a grace time
is sent SIGTERM on each of its nodes (its steps, as Slurm). Each order goes to the job's batch host,
the first node of its allocation (as in Slurm).
"""
from __future__ import annotations

from .arrays import array_summary
from .changes import Before, Changes
from .orders import Kill, Launch, Order, Signal, StepKill, StepLaunch, Update
from .state import RUNNING, Job, State, Step
from .steps import job_tasks


def orders(state: State, changes: Changes) -> list[tuple[str, Order]]:
    """(node, order) for every agent that must act on ``changes``, kills before launches per job."""
    out: list[tuple[str, Order]] = []
    for jid, before in changes.jobs.items():
        _job_orders(jid, before, changes, out)
    for (jid, restarts, sid), (step, new) in changes.steps.items():
        owner = state.jobs.get(jid)
        if step.state == RUNNING and new and owner is not None and owner.state == RUNNING and owner.restarts == restarts:
            out.extend(_step_launches(owner, restarts, sid, step))
        elif step.state != RUNNING and not new:
            out.extend((n, StepKill(job_id=jid, restarts=restarts, step_id=sid)) for n in step.nodes
                       if n not in step.ended)
    return out


def _job_orders(jid: int, before: Before, changes: Changes, out: list[tuple[str, Order]]) -> None:
    """What one changed job's agents must do: stop a run that ended, launch a new one, pass on a cancel's
    signal, a new time limit or a preemption's warning."""
    job = before.job
    ran_on = before.node if before.state == RUNNING else None
    running = job.state == RUNNING and bool(job.alloc)
    same_run = ran_on is not None and running and job.restarts == before.restarts
    if ran_on is not None and not same_run:
        stop = Kill(job_id=jid, restarts=before.restarts, reason="stopped")
        if jid not in changes.reported:
            out.append((ran_on, stop))
        out.extend((n, stop) for n in before.nodes[1:])     # its other nodes hold what its steps left there
    if not same_run:
        if running:
            out.append((job.alloc[0].node, launch(job)))
        return
    node = job.alloc[0].node
    signal = changes.signals.get(jid)
    if signal is not None and job.cancel_by is not None:
        out.append((node, Kill(job_id=jid, restarts=job.restarts, reason="cancelled", signal=signal)))
    elif job.time_limit != before.time_limit:
        out.append((node, Update(job_id=jid, restarts=job.restarts, time_limit=job.time_limit or 0)))
    warn = changes.warnings.get(jid)
    if warn is not None and job.cancel_by is None:     # preempted: told now, stopped at its new limit
        # as Slurm's: the job's steps are told, not its batch script (which runs on to the end of its grace)
        out.extend((a.node, Signal(job_id=jid, restarts=job.restarts, signal=warn, batch=False, steps=True))
                   for a in job.alloc)


def _step_launches(owner: Job, restarts: int, sid: int, step: Step) -> list[tuple[str, Order]]:
    """A new step's launch on each of its nodes, with the job's facts there."""
    base = launch(owner)
    out: list[tuple[str, Order]] = []
    for a in step.started.alloc:
        here = next(x for x in owner.alloc if x.node == a.node)
        facts = base.model_copy(update={"node_index": owner.alloc.index(here), "cpus": here.cpus,
                                        "mem": here.mem, "gpus": here.gpus})
        out.append((a.node, StepLaunch(job_id=owner.job_id, restarts=restarts, step_id=sid, job=facts,
                                       step=step.started)))
    return out


def launches(state: State) -> list[tuple[str, Order]]:
    """A launch for every running job (after a restart or a rebuild: agents ignore repeats)."""
    jobs = state.jobs
    return [(jobs[j].alloc[0].node, launch(jobs[j])) for j in state.running if jobs[j].alloc]


def launch(job: Job) -> Launch:
    """Everything the batch host's agent needs to run ``job`` (which is RUNNING)."""
    spec, alloc = job.spec, job.alloc
    first = alloc[0]
    ntasks = job_tasks(job)
    base, extra = divmod(ntasks, len(alloc))
    count = low = high = step = None
    if job.array_task_id is not None and spec.array:
        # validated at submit; a launch never fails over it
        count, low, high, step = array_summary(spec.array) or (None, None, None, None)
    return Launch(job_id=job.job_id, restarts=job.restarts, name=spec.name, user=spec.user, partition=job.partition,
                  nodes=tuple(a.node for a in alloc), cpus=first.cpus, mem=first.mem, gpus=first.gpus,
                  cpus_per_node=tuple(a.cpus for a in alloc), tasks_per_node=tuple(base + (i < extra) for i in range(len(alloc))),
                  ntasks=ntasks, time_limit=job.time_limit or 0, start_time=job.start_time,
                  array_job_id=job.array_job_id, array_task_id=job.array_task_id, array_count=count,
                  array_min=low, array_max=high, array_step=step, spec=spec)
