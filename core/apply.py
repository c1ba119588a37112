"""The reducer: ``apply(state, envelope)`` folds one logged event into the state.

It mutates ``state`` in place (and returns it) for speed; it is deterministic and touches
nothing outside ``state``. An event that no longer fits the state (a late report about a job
that already ended, an unknown node) changes nothing: terminal job states are never undone, and
the attempt is counted in the :class:`~rota.core.changes.Changes` the caller passes, which also
records every job and node the events touched (effects and rows are derived from it).
"""
from __future__ import annotations

from bisect import insort
from typing import Any, Callable, Iterable

from . import events as ev
from .arrays import parse_array
from .changes import NOTHING, Changes, EndedRun
from .gpuhealth import gpu_gone
from .sharing import shared_spec
from .request import effective_time_limit, node_request
from .state import (
    CANCELLED, COMPLETED, NODE_FAIL, PENDING, PREEMPTED, RUNNING, SHARED, TERMINAL_STATES, TIMEOUT, Job, Node, State,
    Step,
    job_weight,
    node_from_config,
)
from .steps import worst
from .timeaccuracy import record_run
from .usage import charge

SYSTEM = "rota"
PREEMPT_REQUEUE_DELAY = 121   # a preempted, requeued job waits this long (BeginTime), as Slurm's requeue delay


def apply(state: State, env: ev.Envelope, changes: Changes = NOTHING) -> State:
    """Apply one envelope to ``state`` and return it (recording what changed in ``changes``)."""
    return fold((env,), state, changes)


def fold(envelopes, state: State | None = None, changes: Changes = NOTHING) -> State:
    """Apply every envelope in order, starting from ``state`` (or an empty one).

    An event the reducer cannot apply (it names nodes or GPUs that do not exist, carries a spec
    that no longer parses) changes nothing and is noted in ``state.set_aside`` with its sequence:
    one bad record never stops a replay. Handlers check before they change anything.
    """
    st = State() if state is None else state
    handlers = _HANDLERS
    ch = changes
    for env in envelopes:
        event = env.event
        handler = handlers.get(type(event))
        ch.seq = env.seq
        if handler is not None:
            try:
                handler(st, env, event, ch)
            except Exception as exc:  # noqa: BLE001 - a malformed record: set aside, keep folding
                st.set_aside.append((env.seq, f"{event.type}: {type(exc).__name__}: {exc}"))
        st.seq = env.seq
        if env.ts > st.now:
            st.now = env.ts
        if st.finished and st.min_job_age and st.finished[0][0] + st.min_job_age <= st.now:
            _purge(st)
    return st


def _purge(state: State) -> None:
    """Forget jobs that ended at least MinJobAge ago (an array only once all of it has).

    Like slurmctld: the live state keeps active and recently finished jobs; the log keeps history.
    What dependencies need of a purged job stays in ``state.ended`` while the afterok or afternotok of a job still
    in the state names it (a finished one may be requeued).
    """
    cutoff = state.now - state.min_job_age
    q, jobs = state.finished, state.jobs
    due = []
    while q and q[0][0] <= cutoff:
        due.append(q.popleft())
    due.sort()   # the same order live and after a snapshot (which rebuilds the queue sorted)
    for _end, jid in due:
        job = jobs.get(jid)
        if job is None or job.state not in TERMINAL_STATES or job.end_time > cutoff:
            continue   # requeued since, or already purged with its array
        if job.array_job_id is None:
            del jobs[jid]
            if job.spec.dependency:
                state.reads_outcomes(job.spec.dependency, -1)
            if jid in state.dep_refs:
                state.ended[jid] = (1, 0) if job.state == COMPLETED and job.exit_code == 0 else (0, 1)
            continue
        aid = job.array_job_id
        every = state.members(aid) or [job]
        if any(m.state not in TERMINAL_STATES or m.end_time > cutoff for m in every):
            continue   # the last member to end brings the whole array out
        counted = state.counted_members(aid) or every   # the members a dependency on the array waits for
        good = sum(1 for m in counted if m.state == COMPLETED and m.exit_code == 0)
        for m in every:
            del jobs[m.job_id]
        if job.spec.dependency:     # the array as submitted (its tasks share its spec)
            state.reads_outcomes(job.spec.dependency, -1)
        state.array_tasks.pop(aid, None)
        if aid in state.dep_refs:
            state.ended[aid] = (good, len(counted) - good)


# ---------------------------------------------------------------- helpers


def _release(state: State, job: Job, ts: int, ch: Changes) -> None:
    nodes = state.nodes
    jid = job.job_id
    cpus = 0
    gpus = 0.0
    for a in job.alloc:
        cpus += a.cpus
        node = nodes.get(a.node)
        gpus += len(a.gpus) if not a.shards else a.shards / max(1, node.shards_per_gpu if node is not None else 1)
        if node is None:
            continue
        ch.node(a.node)
        node.alloc_cpus -= a.cpus
        node.alloc_mem -= a.mem
        owner = node.gpu_owner
        if a.shards:
            _release_shards(node, a)
        for g in () if a.shards else a.gpus:
            if 0 <= g < len(owner) and owner[g] == jid:
                owner[g] = 0
        if jid in node.jobs:
            node.jobs.remove(jid)
        node.last_busy = ts
    state.running.pop(jid, None)
    seconds = ts - job.start_time
    if seconds > 0:      # what the run used, charged to its account and association (GrpTRESMins, fair-share)
        half_life = state.config.priority.decay_half_life if state.config is not None else 0
        spec = job.spec
        gpu_s = int(gpus * seconds)      # a shard job: its share of the GPU
        charge(state.usage, spec.account, cpus * seconds, gpu_s, ts, half_life)
        charge(state.assoc_usage, (spec.user, spec.account), cpus * seconds, gpu_s, ts, half_life)


def _release_shards(node: Node, a: ev.NodeAlloc) -> None:
    """A shard job's shards go back to its GPU; the GPU is free again once no shard of it is used."""
    for g in a.gpus[:1]:
        if 0 <= g < len(node.shard_used):
            node.shard_used[g] = max(0, node.shard_used[g] - a.shards)
            if node.shard_used[g] == 0 and node.gpu_owner[g] == SHARED:
                node.gpu_owner[g] = 0


def _end_steps(job: Job, ts: int, ch: Changes) -> None:
    """A run that ends ends its steps: those still running are CANCELLED (their agents are told to stop them)."""
    for step in (job.steps or {}).values():
        ch.step(job.job_id, job.restarts, step)
        step.state, step.end, step.signal = CANCELLED, ts, 9
        step.elapsed = max(0, ts - step.start)
    job.steps = None


def _finish(state: State, job: Job, end_state: str, ts: int, ch: Changes) -> None:
    ch.job(job)
    before = job_weight(job)
    if job.state == RUNNING:
        _release(state, job, ts, ch)
        if job.steps:
            _end_steps(job, ts, ch)
    state.pending.pop(job.job_id, None)
    job.state = end_state
    job.end_time = ts
    state.recount(job, before)
    if job.start_time and not job.elapsed:
        job.elapsed = max(0, ts - job.start_time)
    if end_state in (COMPLETED, TIMEOUT) and job.start_time:
        _record_run(state, job, end_state == TIMEOUT)
    state.finished.append((ts, job.job_id))


def _record_run(state: State, job: Job, timed_out: bool) -> None:
    """How much of its limit a run that ended by itself used (the accuracy factor, ``--time=auto``)."""
    part = state.part_configs.get(job.partition)
    if part is None:
        return
    spec = job.spec
    record_run(state.time_accuracy, state.time_runs, spec.user, spec.account, spec.name or "",
               effective_time_limit(job.time_limit, part), job.elapsed, timed_out)


def _requeue(state: State, job: Job, ts: int, ch: Changes, hold: bool, user_hold: bool = False,
             run_state: str = "REQUEUED", delay: int = 0) -> None:
    ch.job(job)
    if job.start_time:
        ch.run_ended(EndedRun(job.job_id, job.restarts, job.start_time, job.end_time or ts,
                              tuple(a.node for a in job.alloc), sum(a.cpus for a in job.alloc), job.exit_code,
                              job.signal, sum(len(a.gpus) for a in job.alloc), run_state))
    before = job_weight(job)
    if job.state == RUNNING:
        _release(state, job, ts, ch)
        if job.steps:
            _end_steps(job, ts, ch)
    job.state = PENDING
    state.recount(job, before)
    job.restarts += 1
    job.next_step = 0
    job.alloc = ()
    job.start_time = job.end_time = job.elapsed = 0
    job.exit_code = job.signal = job.max_rss = 0
    job.cancel_by = job.preempted_by = None
    job.preempt_mode = ""
    if hold:
        job.hold = "user" if user_hold else "admin"
    job.eligible_time = ts + delay
    state.pending[job.job_id] = None


def _node_failed(state: State, node: Node, ts: int, ch: Changes) -> None:
    """A DOWN node kills its jobs: NODE_FAIL, or back to the queue when they asked to requeue."""
    ch.node(node.name)
    _fail_jobs(state, node.jobs, ts, ch)


def _fail_jobs(state: State, job_ids: Iterable[int], ts: int, ch: Changes) -> None:
    """Running jobs whose node or GPU failed: NODE_FAIL, or back to the queue when they asked to requeue."""
    for jid in list(job_ids):
        job = state.jobs.get(jid)
        if job is None or job.state != RUNNING:
            continue
        if job.spec.requeue:
            _requeue(state, job, ts, ch, hold=False)
        else:
            _finish(state, job, NODE_FAIL, ts, ch)


# ---------------------------------------------------------------- handlers


def _cluster_configured(state: State, env: ev.Envelope, e: ev.ClusterConfigured, ch: Changes) -> None:
    old = state.nodes
    new: dict[str, Node] = {}
    for i, nc in enumerate(e.config.nodes):
        prev = old.get(nc.name)
        if prev is None:
            node = node_from_config(nc, i, e.config.agents)
        else:
            node = prev
            node.index = i
            node.cpus, node.memory, node.features, node.weight = nc.cpus, nc.memory, nc.features, nc.weight
            types = node_from_config(nc, i).gpu_types
            if len(types) != len(node.gpu_types):
                node.gpu_owner = (node.gpu_owner + [0] * len(types))[: len(types)]
                node.shard_used = (node.shard_used + [0] * len(types))[: len(types)]
            node.gpu_types = types
            node.shards_per_gpu = nc.shards // len(types) if types else 0
        new[nc.name] = node
    for name, node in old.items():
        if name not in new:
            _node_failed(state, node, env.ts, ch)
            for jid in list(node.jobs):
                job = state.jobs.get(jid)
                if job is not None and job.state == RUNNING:
                    _finish(state, job, NODE_FAIL, env.ts, ch)
    state.nodes = new
    state.config = e.config
    state.config_seq = env.seq
    state.refresh_partition_shapes()
    ch.config = True
    for name in new:
        ch.node(name)
    shapes = state.part_shapes
    for jid in state.pending:
        job = state.jobs[jid]
        ch.job(job)
        shape = shapes.get(job.partition)
        job.req = node_request(job.spec, shape) if shape is not None else None


def _controller_started(state: State, env: ev.Envelope, e: ev.ControllerStarted, ch: Changes) -> None:
    state.controller_version = e.version


def _job_submitted(state: State, env: ev.Envelope, e: ev.JobSubmitted, ch: Changes) -> None:
    if e.job_id < state.next_job_id:     # ids are handed out in order (every job in the state is below), never again
        ch.ignored(f"job {e.job_id} was already submitted")
        return
    spec = shared_spec(e.spec)
    cfg = state.config
    partition = spec.partitions[0] if spec.partitions else state.default_part
    job = Job(job_id=e.job_id, spec=spec, submit_seq=env.seq, submit_time=env.ts,
              hold="user" if spec.hold else None, nice=spec.nice, time_limit=spec.time_limit,
              partition=partition, eligible_time=max(env.ts, spec.begin or 0))
    shape = state.part_shapes.get(partition)
    if shape is not None:
        job.req = node_request(spec, shape)
    if spec.array:
        max_size = cfg.scheduler.max_array_size if cfg is not None else 1001
        arr = parse_array(spec.array, max_size)
        job.array_job_id = e.job_id
        job.array_pending = list(arr.indices)
        job.array_throttle = arr.throttle
    state.jobs[e.job_id] = job
    if spec.dependency:
        state.reads_outcomes(spec.dependency, 1)
    state.pending[e.job_id] = None
    state.recount(job, 0)
    ch.new_job(job)
    state.next_job_id = e.job_id + 1


def _job_cancelled(state: State, env: ev.Envelope, e: ev.JobCancelled, ch: Changes) -> None:
    job = state.jobs.get(e.job_id)
    if job is None:
        ch.ignored(f"job {e.job_id} does not exist")
        return
    if e.tasks is not None and job.array_pending is not None:
        drop = set(e.tasks)
        ch.job(job)
        before = job_weight(job)
        job.array_pending = [i for i in job.array_pending if i not in drop]
        state.recount(job, before)
        for tid in state.array_tasks.get(e.job_id, ()):
            task = state.jobs[tid]
            if task.array_task_id in drop and task.state == RUNNING:
                _stop_running(task, e, ch)
        if not job.array_pending:
            job.cancel_by = e.by_uid
            _finish(state, job, CANCELLED, env.ts, ch)
        return
    for member in state.members(e.job_id):
        if member.state == PENDING:
            member.cancel_by = e.by_uid
            _finish(state, member, CANCELLED, env.ts, ch)
        elif member.state == RUNNING:
            _stop_running(member, e, ch)


def _stop_running(job: Job, e: ev.JobCancelled, ch: Changes) -> None:
    """A cancelled running job stays RUNNING on the log until its agent has killed it and reports."""
    ch.job(job)
    job.cancel_by = e.by_uid
    ch.cancelled(job.job_id, e.signal)


def _job_held(state: State, env: ev.Envelope, e: ev.JobHeld, ch: Changes) -> None:
    for member in state.members(e.job_id):
        if member.state == PENDING:
            ch.job(member)
            member.hold = "admin" if e.admin else "user"


def _job_released(state: State, env: ev.Envelope, e: ev.JobReleased, ch: Changes) -> None:
    for member in state.members(e.job_id):
        if member.state == PENDING and member.hold is not None:
            ch.job(member)
            member.hold = None
            member.eligible_time = max(env.ts, member.spec.begin or 0)


def _job_updated(state: State, env: ev.Envelope, e: ev.JobUpdated, ch: Changes) -> None:
    for member in state.members(e.job_id):
        if member.state in TERMINAL_STATES:
            continue
        ch.job(member)
        if e.time_limit is not None:
            member.time_limit = e.time_limit
        if e.priority is not None:
            member.priority_override = e.priority
        if e.nice is not None:
            member.nice = e.nice


def _job_requeued(state: State, env: ev.Envelope, e: ev.JobRequeued, ch: Changes) -> None:
    job = state.jobs.get(e.job_id)
    if job is None or job.state == PENDING or job.array_pending is not None:
        ch.ignored(f"job {e.job_id} cannot be requeued (it does not exist, is pending or is an array's remainder)")
        return
    _requeue(state, job, env.ts, ch, e.hold, e.user_hold)


def _gpu_use(state: State, env: ev.Envelope, e: ev.GpuIdle | ev.GpuBusy, ch: Changes) -> None:
    """A run's GPUs found idle since a moment, or busy again."""
    job = state.jobs.get(e.job_id)
    if job is None or job.state != RUNNING or job.restarts != e.restarts:
        ch.ignored(f"job {e.job_id} is not running that run")
        return
    ch.job(job)
    job.idle_since = e.since if isinstance(e, ev.GpuIdle) else None


def _misfit(nodes: dict[str, Node], start: ev.Start) -> str | None:
    """What makes an allocation impossible to apply (a node or GPU that does not exist), if anything."""
    for a in start.alloc:
        node = nodes.get(a.node)
        if node is None:
            return f"node {a.node!r} does not exist"
        gpus = a.gpus
        if a.cpus < 0 or a.mem < 0 or gpus and (min(gpus) < 0 or max(gpus) >= len(node.gpu_owner)):
            return f"{a.node} has no such CPUs, memory or GPUs {list(a.gpus)}"
        if a.shards and (len(gpus) != 1 or a.shards < 0 or node.gpu_owner[gpus[0]] not in (0, SHARED)
                         or node.shard_used[gpus[0]] + a.shards > node.shards_per_gpu):
            return f"{a.node} has no room for {a.shards} shard(s) on GPU {list(gpus)}"
    return None


def _preempted(state: State, e: ev.JobsStarted, p: ev.Preemption, v: ev.Victim, ch: Changes) -> None:
    """A victim of a preemption: stopped now, or told with SIGTERM and given until its grace time runs out."""
    job = state.jobs.get(v.job_id)
    if job is None or job.state != RUNNING or job.restarts != v.restarts:
        ch.ignored(f"job {v.job_id} cannot be preempted: that run is not running")
        return
    ch.job(job)
    job.preempted_by, job.preempt_mode = p.by, v.mode
    if v.grace <= 0:
        _stop_preempted(state, job, e.now, ch)
        return
    job.time_limit = max(1, e.now - job.start_time + v.grace)
    ch.warned(job.job_id, 15)


def _stop_preempted(state: State, job: Job, ts: int, ch: Changes) -> None:
    """A preempted run ends, however it ended: requeued (the job keeps its id; the run is PREEMPTED in
    ``sacct -D``; eligible again after Slurm's requeue delay, so the preemptor gets what it freed) when its
    mode says so and the job may be requeued, else PREEMPTED."""
    if job.preempt_mode == "requeue" and job.spec.requeue:
        _requeue(state, job, ts, ch, hold=False, run_state=PREEMPTED, delay=PREEMPT_REQUEUE_DELAY)
    else:
        _finish(state, job, PREEMPTED, ts, ch)


def _jobs_started(state: State, env: ev.Envelope, e: ev.JobsStarted, ch: Changes) -> None:
    jobs, nodes = state.jobs, state.nodes
    now = e.now
    for p in e.preemptions:
        for v in p.victims:
            _preempted(state, e, p, v, ch)
    for s in e.starts:
        jid = s.job_id
        misfit = _misfit(nodes, s)
        if misfit is not None:
            state.set_aside.append((env.seq, f"jobs.started: job {jid} cannot start there: {misfit}"))
            continue
        if s.array_job_id is not None:
            task = _array_task_started(state, s, ch)
            if task is None:
                continue
            job = task
        else:
            found = jobs.get(jid)
            if found is None or found.state != PENDING:
                ch.ignored(f"job {jid} is not pending")
                continue
            job = found
            ch.job(job)
        job.state = RUNNING
        job.partition = s.partition
        job.time_limit = s.time_limit
        job.start_time = now
        job.alloc = s.alloc
        job.backfilled = s.backfilled
        job.start_cycle = e.cycle
        job.idle_since = None
        for a in s.alloc:
            node = nodes[a.node]
            ch.node(a.node)
            node.alloc_cpus += a.cpus
            node.alloc_mem += a.mem
            owner = node.gpu_owner
            if a.shards:
                owner[a.gpus[0]] = SHARED
                node.shard_used[a.gpus[0]] += a.shards
            else:
                for g in a.gpus:
                    owner[g] = jid
            node.jobs.append(jid)
        state.pending.pop(jid, None)
        state.running[jid] = None
    state.cycle = e.cycle


def _array_task_started(state: State, s: ev.Start, ch: Changes) -> Job | None:
    """The job an array task starts as: the array's own record for its last task, else a new job taking the
    task from the array's remainder (None: the task is not pending, or its id is taken)."""
    jobs, jid = state.jobs, s.job_id
    master = jobs.get(s.array_job_id) if s.array_job_id is not None else None
    if master is None or master.array_pending is None or s.array_task_id not in master.array_pending:
        ch.ignored(f"array task {s.array_job_id}_{s.array_task_id} is not pending")
        return None
    if jid != master.job_id and jid in jobs:
        ch.ignored(f"array task {s.array_job_id}_{s.array_task_id}: job id {jid} is taken")
        return None
    ch.job(master)
    before = job_weight(master)
    master.array_pending.remove(s.array_task_id)
    if jid == master.job_id:
        job = master
        job.array_pending = None
        state.recount(job, before)      # its last task: it counts 1, running, from here
    else:
        state.recount(master, before)
        job = Job(job_id=jid, spec=master.spec, submit_seq=master.submit_seq,
                  submit_time=master.submit_time, nice=master.nice,
                  priority_override=master.priority_override,
                  eligible_time=master.eligible_time, array_job_id=master.job_id,
                  array_throttle=master.array_throttle, partition=master.partition,
                  req=master.req)
        jobs[jid] = job
        state.recount(job, 0)         # the task it takes left its remainder's count
        ch.new_job(job)
    job.array_task_id = s.array_task_id
    insort(state.array_tasks.setdefault(master.job_id, []), jid)   # by id, as a rebuild lists them
    if jid >= state.next_job_id:
        state.next_job_id = jid + 1
    return job


def _job_exited(state: State, env: ev.Envelope, e: ev.JobExited, ch: Changes) -> None:
    job = state.jobs.get(e.job_id)
    if job is not None and job.state == NODE_FAIL and e.node and any(a.node == e.node for a in job.alloc) \
            and not job.exit_code and not job.signal:
        ch.job(job)         # its node was declared dead first: the late report keeps how it really ended
        job.exit_code, job.signal, job.max_rss = e.exit_code, e.signal, e.max_rss
        return
    if job is None or job.state != RUNNING:
        ch.ignored(f"job {e.job_id} is not running")
        return
    ch.job(job)
    job.exit_code, job.signal, job.max_rss = e.exit_code, e.signal, e.max_rss
    job.elapsed = e.elapsed or max(0, env.ts - job.start_time)
    if not e.released:
        ch.exited(job.job_id)
    if job.preempted_by is not None:      # within or at the end of its grace time: as its preemption says
        _stop_preempted(state, job, env.ts, ch)
        return
    _finish(state, job, e.state, env.ts, ch)


def _step_started(state: State, env: ev.Envelope, e: ev.StepStarted, ch: Changes) -> None:
    job = state.jobs.get(e.job_id)
    if job is None or job.state != RUNNING or job.restarts != e.restarts or e.step_id != job.next_step:
        ch.ignored(f"step {e.job_id}.{e.step_id} cannot start (the job's run is not running, or the step id is not next)")
        return
    held = {a.node for a in job.alloc}
    if not e.alloc or any(a.node not in held for a in e.alloc):
        ch.ignored(f"step {e.job_id}.{e.step_id} names nodes outside its job's allocation")
        return
    step = Step(e, env.ts)
    if job.steps is None:
        job.steps = {}
    job.steps[e.step_id] = step
    job.next_step = e.step_id + 1
    ch.step(e.job_id, e.restarts, step, new=True)


def _step_ended(state: State, env: ev.Envelope, e: ev.StepEnded, ch: Changes) -> None:
    job = state.jobs.get(e.job_id)
    step = job.steps.get(e.step_id) if job is not None and job.steps and job.restarts == e.restarts else None
    if job is None or job.steps is None or step is None or e.node not in step.nodes or e.node in step.ended:
        ch.ignored(f"step {e.job_id}.{e.step_id} is not running on {e.node}")
        return
    ch.step(job.job_id, job.restarts, step)
    step.ended[e.node] = (e.state, e.exit_code, e.signal, e.max_rss)
    step.elapsed = max(step.elapsed, e.elapsed)
    if len(step.ended) == len(step.started.alloc):
        step.state, step.exit_code, step.signal, step.max_rss = worst(list(step.ended.values()))
        step.end = env.ts
        step.elapsed = step.elapsed or max(0, env.ts - step.start)
        del job.steps[e.step_id]


def _accounting_changed(state: State, env: ev.Envelope, e: ev.AccountingChanged, ch: Changes) -> None:
    for name in e.deleted_accounts:
        state.accounts.pop(name, None)
    for key in e.deleted_associations:
        state.associations.pop((key[0], key[1]), None)
    for name in e.deleted_qos:
        state.qos.pop(name, None)
    for record in e.accounts:
        state.accounts[record.name] = record
    for assoc in e.associations:
        state.associations[(assoc.user, assoc.account)] = assoc
    for user, default in e.default_accounts.items():
        state.default_accounts[user] = default
    for user in [u for u, a in state.default_accounts.items() if (u, a) not in state.associations]:
        del state.default_accounts[user]
    for qos in e.qos:
        state.qos[qos.name] = qos
    ch.config = True


def _set_reason(node: Node, reason: str, by: str, ts: int) -> None:
    node.reason, node.reason_by, node.reason_time = reason, by, ts


def _node_registered(state: State, env: ev.Envelope, e: ev.NodeRegistered, ch: Changes) -> None:
    node = state.nodes.get(e.node)
    if node is None:
        ch.ignored(f"node {e.node!r} does not exist")
        return
    ch.node(e.node)
    node.registered = True
    node.awaiting_agent = False
    node.boot_time = e.boot_time
    node.reported_gpus = len(e.gpus)
    if node.not_responding:
        node.not_responding = False
    if node.down and node.reason == "Not responding":
        node.down = False
        node.reason = node.reason_by = None
    problems = _registration_problems(node, e)
    if problems:
        node.invalid_reg = True
        if not node.drain:
            node.drain = True
            _set_reason(node, ", ".join(problems), SYSTEM, env.ts)
    else:
        node.invalid_reg = False
    if e.running is not None:
        _lost_jobs(state, node, set(e.running), env.ts, ch)


def _registration_problems(node: Node, e: ev.NodeRegistered) -> list[str]:
    """Where a node's agent reports less than the configuration says it has (slurmctld's words)."""
    problems: list[str] = []
    if len(e.gpus) < node.gpu_count:
        problems.append(f"gres/gpu count reported lower than configured ({len(e.gpus)} < {node.gpu_count})")
    if e.memory < node.memory:
        problems.append(f"Low RealMemory (reported:{e.memory} < 100.00% of configured:{node.memory})")
    if e.cpus < node.cpus:
        problems.append("Low CPUs")
    return problems


def _lost_jobs(state: State, node: Node, reported: set[int], ts: int, ch: Changes) -> None:
    """Jobs the log has running on a node whose agent, registering again, does not run them: requeued, or NODE_FAIL."""
    for jid in list(node.jobs):
        if jid not in reported:
            job = state.jobs.get(jid)
            if job is not None and job.state == RUNNING:
                if job.spec.requeue:
                    _requeue(state, job, ts, ch, hold=False)
                else:
                    _finish(state, job, NODE_FAIL, ts, ch)


def _node_drained(state: State, env: ev.Envelope, e: ev.NodeDrained, ch: Changes) -> None:
    node = state.nodes.get(e.node)
    if node is None:
        ch.ignored(f"node {e.node!r} does not exist")
        return
    ch.node(e.node)
    node.drain = True
    _set_reason(node, e.reason, e.by, env.ts)


def _node_resumed(state: State, env: ev.Envelope, e: ev.NodeResumed, ch: Changes) -> None:
    node = state.nodes.get(e.node)
    if node is None:
        ch.ignored(f"node {e.node!r} does not exist")
        return
    ch.node(e.node)
    node.drain = False
    node.invalid_reg = False
    if not e.undrain_only:
        node.down = False
    if not node.down:
        node.reason = node.reason_by = None
        node.reason_time = 0


def _node_down(state: State, env: ev.Envelope, e: ev.NodeDown, ch: Changes) -> None:
    node = state.nodes.get(e.node)
    if node is None:
        ch.ignored(f"node {e.node!r} does not exist")
        return
    ch.node(e.node)
    node.down = True
    _set_reason(node, e.reason, e.by, env.ts)
    _node_failed(state, node, env.ts, ch)


def _node_not_responding(state: State, env: ev.Envelope, e: ev.NodeNotResponding, ch: Changes) -> None:
    node = state.nodes.get(e.node)
    if node is None:
        ch.ignored(f"node {e.node!r} does not exist")
        return
    ch.node(e.node)
    node.not_responding = True


def _health_fault(state: State, env: ev.Envelope, e: ev.HealthFault, ch: Changes) -> None:
    node = state.nodes.get(e.node)
    if node is None:
        ch.ignored(f"node {e.node!r} does not exist")
        return
    if not e.drains:
        return           # a warning: kept in the log, the node's state is unchanged
    ch.node(e.node)
    if not node.drain:
        node.drain = True
        _set_reason(node, e.reason, SYSTEM, env.ts)
    if gpu_gone(e.code):
        _gpu_failed(state, node, e.gpu_index, env.ts, ch)


def _gpu_failed(state: State, node: Node, index: int | None, ts: int, ch: Changes) -> None:
    """A GPU gone from under its job (``index`` None: any of the node's): the job ends NODE_FAIL, or goes back to
    the queue when it asked to requeue."""
    owners = node.gpu_owner if index is None else node.gpu_owner[index:index + 1] if 0 <= index < len(node.gpu_owner) \
        else []
    sharing = {jid for jid in node.jobs for a in state.jobs[jid].alloc
               if a.node == node.name and a.shards and (index is None or a.gpus[:1] == (index,))}
    _fail_jobs(state, sorted({j for j in owners if j > 0} | sharing), ts, ch)


_HANDLERS: dict[type, Callable[[State, ev.Envelope, Any, Changes], None]] = {
    ev.ClusterConfigured: _cluster_configured,
    ev.ControllerStarted: _controller_started,
    ev.JobSubmitted: _job_submitted,
    ev.JobCancelled: _job_cancelled,
    ev.JobHeld: _job_held,
    ev.JobReleased: _job_released,
    ev.JobUpdated: _job_updated,
    ev.JobRequeued: _job_requeued,
    ev.JobsStarted: _jobs_started,
    ev.JobExited: _job_exited,
    ev.StepStarted: _step_started,
    ev.StepEnded: _step_ended,
    ev.AccountingChanged: _accounting_changed,
    ev.NodeRegistered: _node_registered,
    ev.NodeDrained: _node_drained,
    ev.NodeResumed: _node_resumed,
    ev.NodeDown: _node_down,
    ev.NodeNotResponding: _node_not_responding,
    ev.HealthFault: _health_fault,
    ev.GpuIdle: _gpu_use,
    ev.GpuBusy: _gpu_use,
}
