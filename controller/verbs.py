"""The API's verbs: one handler per request the front door serves, and the table naming them.

A handler gets the controller's port, the authenticated caller, its validated request and the request id,
and returns the answer. To add a verb: its request model in :mod:`rota.controller.requests`, its handler
here, and one line in ``VERBS`` at the bottom.
"""
from __future__ import annotations

import asyncio
from typing import TypeVar

from rota.core import __version__, commands
from rota.core import events as ev
from rota.core.auth import Caller
from rota.core.state import State

from . import accounting_views, requests as rq
from .eventlog import FencedError, LogUnavailable
from .leadership import controllers_of
from .port import ControllerPort
from .requests import Verb
from .replies import Raw
from .writer import Prepare


def _spec(spec: ev.JobSpec, caller: Caller) -> ev.JobSpec:
    """The job as submitted, with who submitted it taken from the credential (never from the body)."""
    return spec.model_copy(update={"user": caller.user, "uid": caller.uid, "gid": caller.gid,
                                   "submit_host": caller.host or spec.submit_host})


E = TypeVar("E")


def landed(env: ev.Envelope, kind: type[E]) -> E:
    """The event a write appended, as the kind its ``prepare`` builds."""
    if not isinstance(env.event, kind):
        raise TypeError(f"expected {kind.__name__}, the log took {type(env.event).__name__}")
    return env.event


# id(controller) -> (its state, at seq, submit seq -> job): made by a retried request, dropped when it is answered
_BY_SEQ: dict[int, tuple[int, int, dict[int, int]]] = {}


def _made(state: State, job_id: int, seq: int) -> bool:
    """Whether the state holds job ``job_id`` as the submit logged at ``seq`` made it (a submit the reducer
    refused, its id already taken, made none)."""
    job = state.jobs.get(job_id)
    return job is not None and job.submit_seq == seq


def submitted_job(c: ControllerPort, seq: int) -> int | None:
    """The job the submit logged at ``seq`` created (None: none the state holds): from the records this process
    appended lately, else from one pass over the jobs, kept while the state stays where it is (a retried batch
    of a thousand submits makes one pass, not a thousand)."""
    state = c.state
    own = getattr(getattr(c, "log", None), "own", None)
    record = own.records.get(seq) if own is not None else None
    if record is not None and isinstance(record.event, ev.JobSubmitted):
        if _made(state, record.event.job_id, seq):
            return record.event.job_id
    kept = _BY_SEQ.get(id(c))
    if kept is None or kept[0] != id(state) or kept[1] != state.seq:
        by_seq: dict[int, int] = {}
        for jid, j in state.jobs.items():
            by_seq.setdefault(j.submit_seq, jid)       # the first with it: an array's own record before its tasks
        kept = _BY_SEQ[id(c)] = (id(state), state.seq, by_seq)
    return kept[2].get(seq)


async def submit_one(c: ControllerPort, caller: Caller, spec: ev.JobSpec, idem: str) -> int:
    """Append one job's submission (``idem``: a retry of the same request lands once); its id."""
    spec = _spec(spec, caller)
    env, duplicate = await c.write(lambda state: commands.submit(state, spec, state.next_job_id, caller),
                                   caller.actor(), idem)
    if duplicate:                                           # a retried submit: the job its first try created
        job_id = submitted_job(c, env.seq)
        if job_id is None:
            raise commands.Rejected("this request was accepted earlier, but its job is no longer known",
                                    code="duplicate")
        return job_id
    job_id = landed(env, ev.JobSubmitted).job_id
    if not _made(c.state, job_id, env.seq):                 # on the log, refused by the reducer: no job, no ack
        raise commands.Rejected(f"the log holds this submit at sequence {env.seq}, but it made no job (another "
                                "controller's records came first): submit it again", code="refused")
    return job_id


async def _submit(c: ControllerPort, caller: Caller, request: rq.Submit, rid: str) -> dict:
    try:
        job_id = await submit_one(c, caller, request.spec, f"{caller.uid}:{rid}" if rid else "")
    finally:
        _BY_SEQ.pop(id(c), None)
    job = c.state.jobs.get(job_id)
    hint = commands.time_hint(c.state, job.spec) if job is not None else ""
    return {"ok": True, "job_id": job_id, **({"hint": hint} if hint else {})}


async def _test_submit(c: ControllerPort, caller: Caller, request: rq.Submit, rid: str) -> dict:
    return c.views.test_submit(_spec(request.spec, caller), caller)


async def _write(c: ControllerPort, caller: Caller, rid: str, prepare: Prepare) -> dict:
    await c.write(prepare, caller.actor(), f"{caller.uid}:{rid}" if rid else "")
    return {"ok": True}


async def _cancel(c: ControllerPort, caller: Caller, r: rq.Cancel, rid: str) -> dict:
    return await _write(c, caller, rid, lambda s: commands.cancel(s, r.job_id, caller, r.tasks, r.signal))


async def _signal(c: ControllerPort, caller: Caller, r: rq.Signal, rid: str) -> dict:
    c.send(commands.signal(c.state, r.job_id, r.signal, caller, batch=r.batch, steps=r.steps, step_id=r.step_id))
    return {"ok": True}


STEP_BUSY_WAIT = 1.0    # seconds a step request waits for a running step to end before srun hears "busy"


async def _step_create(c: ControllerPort, caller: Caller, r: rq.StepCreate, rid: str) -> dict:
    from rota.core.steps import StepAsk

    ask = StepAsk(ntasks=r.ntasks, nodes=r.nodes, ntasks_per_node=r.ntasks_per_node, cpus_per_task=r.cpus_per_task,
                  gpus_per_task=r.gpus_per_task, gpus_per_node=r.gpus_per_node, mem=r.mem, nodelist=r.nodelist,
                  overlap=r.overlap, overcommit=r.overcommit)
    fields = {"name": r.name or r.argv[0].rsplit("/", 1)[-1][:200], "argv": r.argv, "workdir": r.workdir,
              "env": r.env, "io": r.io, "io_key": r.io_key, "output": r.output, "error": r.error, "input": r.input,
              "label": r.label}
    warnings: list[str] = []
    # a step that would fit once a running one ends waits for the log to change first: the step before it
    # (srun a; srun b) has ended on its nodes, and its end is on its way through the inbox
    deadline = asyncio.get_running_loop().time() + STEP_BUSY_WAIT
    while True:
        try:
            commands.step_create(c.state, r.job_id, ask, caller, **fields)
            break
        except commands.Rejected as refused:
            left = deadline - asyncio.get_running_loop().time()
            if refused.code != "busy" or left <= 0:
                raise
            await c.changed(left)

    def prepare(state: State) -> ev.StepStarted:
        event, said = commands.step_create(state, r.job_id, ask, caller, **fields)
        warnings[:] = said
        return event

    env, duplicate = await c.write(prepare, caller.actor(), f"{caller.uid}:{rid}" if rid else "")
    if duplicate:
        raise commands.Rejected("this step request was accepted earlier", code="duplicate")
    e = landed(env, ev.StepStarted)
    return {"ok": True, "step_id": e.step_id, "ntasks": e.ntasks, "nodes": [a.node for a in e.alloc],
            "tasks": [list(a.tasks) for a in e.alloc], "cpus": [a.cpus for a in e.alloc], "warnings": warnings}


async def _config(c: ControllerPort, caller: Caller, r: rq.NoArgs, rid: str) -> dict:
    cfg = c.state.config
    return {"ok": True, "config": cfg.model_dump(mode="json") if cfg is not None else None,
            "since": c.state.config_seq, "now": c.now()}


async def _reconfigure(c: ControllerPort, caller: Caller, r: rq.NoArgs, rid: str) -> dict:
    from rota.core.slurmconf import ConfigError

    if caller.level < 2:
        raise commands.Rejected(commands.INVALID_USER, code="permission")
    if c.reload_config is None:
        raise commands.Rejected("this controller has no configuration file to read again", code="config")
    try:
        config = await asyncio.to_thread(c.reload_config)
    except ConfigError as exc:
        raise commands.Rejected(*[str(d) for d in exc.diagnostics],
                                "the configuration has errors: nothing changed, the cluster runs on", code="config") \
            from None
    except (OSError, ValueError) as exc:
        raise commands.Rejected(f"{exc}: nothing changed, the cluster runs on", code="config") from None
    if config == c.state.config:
        return {"ok": True, "changed": False}
    await c.write(lambda s: commands.reconfigure(s, config, "scontrol reconfigure", caller), caller.actor(),
                  f"{caller.uid}:{rid}" if rid else "")
    return {"ok": True, "changed": True}


async def _acct_change(c: ControllerPort, caller: Caller, r: rq.AccountingChange, rid: str) -> dict:
    done: list[ev.AccountingChanged] = []

    def prepare(state: State) -> ev.AccountingChanged:
        event = commands.change_accounting(state, r.op, r.entity, list(r.names), dict(r.where), dict(r.values), caller)
        done[:] = [event]
        return event

    await c.write(prepare, caller.actor(), f"{caller.uid}:{rid}" if rid else "")
    return {"ok": True, "change": done[0].model_dump(mode="json") if done else None}


async def _acct_show(c: ControllerPort, caller: Caller, r: rq.NoArgs, rid: str) -> dict:
    return {"ok": True, **accounting_views.records(c.state)}


async def _shares(c: ControllerPort, caller: Caller, r: rq.NoArgs, rid: str) -> dict:
    return {"ok": True, **accounting_views.shares(c.state, c.now(), caller)}


async def _priorities(c: ControllerPort, caller: Caller, r: rq.NoArgs, rid: str) -> dict:
    return {"ok": True, **accounting_views.priorities(c.state, c.now(), caller)}


async def _release_allocation(c: ControllerPort, caller: Caller, r: rq.ReleaseAllocation, rid: str) -> dict:
    return await _write(c, caller, rid, lambda s: commands.release_allocation(s, r.job_id, r.exit_code, r.signal,
                                                                               caller))


async def _hold(c: ControllerPort, caller: Caller, r: rq.Hold, rid: str) -> dict:
    return await _write(c, caller, rid, lambda s: commands.hold(s, r.job_id, caller, r.user_hold))


async def _release(c: ControllerPort, caller: Caller, r: rq.JobOnly, rid: str) -> dict:
    return await _write(c, caller, rid, lambda s: commands.release(s, r.job_id, caller))


async def _requeue(c: ControllerPort, caller: Caller, r: rq.Requeue, rid: str) -> dict:
    return await _write(c, caller, rid, lambda s: commands.requeue(s, r.job_id, r.hold, caller))


async def _update_job(c: ControllerPort, caller: Caller, r: rq.UpdateJob, rid: str) -> dict:
    return await _write(c, caller, rid, lambda s: commands.update_job(
        s, r.job_id, time_limit=r.time_limit, priority=r.priority, nice=r.nice, caller=caller))


async def _drain(c: ControllerPort, caller: Caller, r: rq.NodeChange, rid: str) -> dict:
    return await _write(c, caller, rid, lambda s: commands.drain(s, r.node, r.reason, caller))


async def _down(c: ControllerPort, caller: Caller, r: rq.NodeChange, rid: str) -> dict:
    return await _write(c, caller, rid, lambda s: commands.down(s, r.node, r.reason, caller))


async def _resume(c: ControllerPort, caller: Caller, r: rq.NodeChange, rid: str) -> dict:
    return await _write(c, caller, rid, lambda s: commands.resume(s, r.node, caller))


async def _job(c: ControllerPort, caller: Caller, r: rq.JobOnly, rid: str) -> dict:
    return {"ok": True, "job": c.views.job(r.job_id, caller), "now": c.now()}


async def _jobs(c: ControllerPort, caller: Caller, r: rq.Jobs, rid: str) -> dict:
    return {"ok": True, "jobs": c.views.jobs(caller, r.array_job_id), "now": c.now()}


async def _queue(c: ControllerPort, caller: Caller, r: rq.NoArgs, rid: str) -> dict:
    return {"ok": True, "jobs": Raw(c.views.queue_json(caller)), "now": c.now()}


async def _squeue(c: ControllerPort, caller: Caller, r: rq.Squeue, rid: str) -> Raw:
    return Raw(c.views.squeue_reply(r.model_dump(), caller))


async def _nodes(c: ControllerPort, caller: Caller, r: rq.NoArgs, rid: str) -> dict:
    return {"ok": True, "nodes": c.views.nodes()}


async def _accounting(c: ControllerPort, caller: Caller, r: rq.Accounting, rid: str) -> dict:
    return await c.views.accounting(r.command, list(r.argv), caller)


async def _timetravel(c: ControllerPort, caller: Caller, r: rq.TimeTravel, rid: str) -> dict:
    return await c.views.timetravel(r.command, list(r.argv), caller)


async def _ping(c: ControllerPort, caller: Caller, r: rq.NoArgs, rid: str) -> dict:
    return {"ok": True, "seq": c.state.seq, "leader": c.leader, "version": __version__, "pending": len(c.state.pending),
            "user": caller.user, "uid": caller.uid, "level": caller.level, **c.cycle_figures(), **await controllers_of(c)}


async def _submit_many(c: ControllerPort, caller: Caller, request: rq.SubmitMany, rid: str) -> dict:
    """Many jobs in one request: each checked and appended as a submit of its own (one refused does not
    stop the others), all at once, so the log's group commit makes them few fsyncs. ``job_ids`` in the
    order given, None where refused; ``errors``: [index, why]."""
    async def one(i: int, spec: ev.JobSpec) -> int:
        return await submit_one(c, caller, spec, f"{caller.uid}:{rid}:{i}" if rid else "")
    # a user who may hold no more jobs gets every one refused at once, not one by one (the writer's time is
    # everyone's)
    full = commands.count_limits_refusal(c.state, request.specs[0].model_copy(update={"user": caller.user})) \
        if request.specs else None
    try:
        results: list = [full] * len(request.specs) if full is not None else \
            await asyncio.gather(*(one(i, s) for i, s in enumerate(request.specs)), return_exceptions=True)
    finally:
        _BY_SEQ.pop(id(c), None)
    for r in results:
        if isinstance(r, (FencedError, LogUnavailable)):
            raise r                       # the whole request is retried (each item lands once)
        if isinstance(r, BaseException) and not isinstance(r, commands.Rejected):
            raise r
    return {"ok": True, "job_ids": [r if isinstance(r, int) else None for r in results],
            "errors": [[i, r.lines[-1]] for i, r in enumerate(results) if isinstance(r, commands.Rejected)]}


async def _idle(c: ControllerPort, caller: Caller, r: rq.NoArgs, rid: str) -> dict:
    """The running jobs whose GPUs are idle (rota.core.idle), the caller's own when jobs are private."""
    from dataclasses import asdict

    from rota.core.idle import idle_jobs

    from .views import private_jobs

    mine = private_jobs(c.state, caller)
    now = c.now()
    return {"ok": True, "now": now, "policy": c.state.config.idle_gpu.model_dump() if c.state.config else None,
            "jobs": [asdict(j) for j in idle_jobs(c.state, now) if not mine or c.state.jobs[j.job_id].spec.uid == caller.uid]}


async def _web_token(c: ControllerPort, caller: Caller, r: rq.NoArgs, rid: str) -> dict:
    """A short-lived token naming the caller, for ``rota web login`` (rota.wire.webtoken)."""
    from rota.wire import webtoken

    key = c.keyring.purpose_key(webtoken.PURPOSE) if c.keyring is not None else None
    if key is None:
        raise commands.Rejected("this controller holds no cluster key: it cannot vouch for web logins", code="no_key")
    return {"ok": True, "token": webtoken.issue(key, caller.user, caller.uid, caller.operator, c.now()),
            "ttl": webtoken.LOGIN_TTL}


async def _metrics(c: ControllerPort, caller: Caller, r: rq.NoArgs, rid: str) -> dict:
    """The figures /metrics shows (operators: they name every user's jobs)."""
    from .metrics_view import figures

    if not caller.operator:
        raise commands.Rejected(commands.ACCESS_DENIED, code="permission")
    return figures(c)


async def _gpu_grid(c: ControllerPort, caller: Caller, r: rq.NoArgs, rid: str) -> dict:
    """Each node's GPU slots and who holds them; another user's jobs unnamed when jobs are private."""
    from .metrics_view import gpu_grid, hide_others
    from .views import private_jobs

    nodes = gpu_grid(c)
    if private_jobs(c.state, caller):
        hide_others(nodes, caller.uid, {j: job.spec.uid for n in nodes for j in n["jobs"]
                                        if (job := c.state.jobs.get(j)) is not None})
    return {"ok": True, "nodes": nodes}


async def _job_states(c: ControllerPort, caller: Caller, request: rq.JobStates, rid: str) -> dict:
    return {"ok": True, "jobs": c.views.job_states(request.job_ids, caller)}


# ---------------------------------------------------------------- the table the front door serves

VERBS: dict[str, Verb] = {v.name: v for v in (
    Verb("submit", rq.Submit, _submit, writes=True),
    Verb("test_submit", rq.Submit, _test_submit),
    Verb("cancel", rq.Cancel, _cancel, writes=True),
    Verb("signal", rq.Signal, _signal),
    Verb("step_create", rq.StepCreate, _step_create, writes=True),
    Verb("config", rq.NoArgs, _config),
    Verb("reconfigure", rq.NoArgs, _reconfigure, writes=True),
    Verb("acct_change", rq.AccountingChange, _acct_change, writes=True),
    Verb("acct_show", rq.NoArgs, _acct_show),
    Verb("shares", rq.NoArgs, _shares),
    Verb("priorities", rq.NoArgs, _priorities),
    Verb("release_allocation", rq.ReleaseAllocation, _release_allocation, writes=True),
    Verb("hold", rq.Hold, _hold, writes=True),
    Verb("release", rq.JobOnly, _release, writes=True),
    Verb("requeue", rq.Requeue, _requeue, writes=True),
    Verb("update_job", rq.UpdateJob, _update_job, writes=True),
    Verb("drain", rq.NodeChange, _drain, writes=True),
    Verb("down", rq.NodeChange, _down, writes=True),
    Verb("resume", rq.NodeChange, _resume, writes=True),
    Verb("job", rq.JobOnly, _job),
    Verb("jobs", rq.Jobs, _jobs),
    Verb("queue", rq.NoArgs, _queue),
    Verb("squeue", rq.Squeue, _squeue),
    Verb("nodes", rq.NoArgs, _nodes),
    Verb("accounting", rq.Accounting, _accounting, elsewhere=True),
    Verb("timetravel", rq.TimeTravel, _timetravel, elsewhere=True),
    Verb("ping", rq.NoArgs, _ping),
    Verb("submit_many", rq.SubmitMany, _submit_many, writes=True),
    Verb("job_states", rq.JobStates, _job_states),
    Verb("idle", rq.NoArgs, _idle),
    Verb("web_token", rq.NoArgs, _web_token),
    Verb("metrics", rq.NoArgs, _metrics),
    Verb("gpu_grid", rq.NoArgs, _gpu_grid),
)}
