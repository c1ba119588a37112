"""Commands: check a request against the current state and return the events it causes (pure).

A rejected request raises :class:`Rejected` carrying Slurm's error text, so the CLI can print
exactly what ``sbatch`` or ``scontrol`` would.
"""
from __future__ import annotations

from typing import Any

from . import accounting
from . import events as ev
from .arrays import ArraySpecError, parse_array
from .auth import ROOT, Caller
from .deps import DependencySpecError, parse_dependency
from .limits import MAX_COUNT, MAX_NICE, MAX_TIME, spec_problems
from .orders import Signal
from .request import (constraint_matches, effective_time_limit, node_request, over_node_limits, over_time_limit,
                      partition_shape)
from .state import NODE_FAIL, PENDING, RUNNING, TERMINAL_STATES, Job, State
from .usage_limits import limits_enforced
from .steps import StepAsk, StepRefused, layout
from .timeaccuracy import hint, suggested_limit


class Rejected(Exception):
    """A request the controller refuses. ``lines`` are Slurm-style error lines, last = summary."""

    def __init__(self, *lines: str, code: str = "invalid") -> None:
        super().__init__(lines[-1])
        self.lines = lines
        self.code = code


NODE_CONFIG_UNAVAILABLE = "Requested node configuration is not available"
ACCESS_DENIED = "Access/permission denied"
INVALID_USER = "Invalid user id"     # what slurmctld answers a user who tries to change a node


def denied(caller: Caller, verb: str, target: str, reason: str) -> ev.RequestDenied:
    """The audit record of a refused request (appended by the front door, so attempts are on the log)."""
    return ev.RequestDenied(verb=verb, uid=caller.uid, user=caller.user, host=caller.host, target=target,
                            reason=reason)


def submit(state: State, spec: ev.JobSpec, job_id: int, caller: Caller = ROOT) -> ev.JobSubmitted:
    """Validate a submission; return its event or raise :class:`Rejected`."""
    cfg = state.config
    if cfg is None:
        raise Rejected("the cluster has no configuration yet", code="unconfigured")
    _check_request(spec, caller)
    names = _partition_names(cfg, spec)
    _check_forms(state, cfg, spec)
    if spec.time_auto:
        spec = _auto_time(state, spec, [p for p in cfg.partitions if p.name in names])
    enforce = cfg.scheduler.enforce_part_limits
    parts_by_name = {p.name: p for p in cfg.partitions}
    refusals: list[Rejected] = []
    for n in names:
        try:
            _check_partition(state, spec, parts_by_name[n], enforce)
        except Rejected as r:
            refusals.append(r)
    if refusals and (enforce == "ALL" or len(refusals) == len(names)):
        raise refusals[0]
    if accounting.enforced(state):
        spec = _with_account_and_qos(state, spec)
        _submit_limit(state, spec)
    _job_count_limits(state, spec, cfg.scheduler)
    return ev.JobSubmitted(job_id=job_id, spec=spec)


def _auto_time(state: State, spec: ev.JobSpec, parts: list[ev.PartitionConfig]) -> ev.JobSpec:
    """``--time=auto``: the limit the user's own completed runs of jobs with this name suggest, within the
    partitions' MaxTime; the partition's default without such runs."""
    suggested, _runs = suggested_limit(state.time_runs, spec.user, spec.name or "")
    if not suggested:
        return spec.model_copy(update={"time_limit": None})
    most = min((p.max_time for p in parts if p.max_time), default=0)
    return spec.model_copy(update={"time_limit": min(suggested, most) if most else suggested})


def time_hint(state: State, spec: ev.JobSpec) -> str:
    """A hint for the submitter when the limit asked (or the partition's default) is far over what their own
    completed runs of jobs with this name suggest ('' otherwise)."""
    if spec.time_auto or state.config is None:
        return ""
    part = next((p for p in state.config.partitions if p.name in spec.partitions), None) \
        or state.config.default_partition()
    if part is None:
        return ""
    return hint(state.time_runs, spec.user, spec.name or "", effective_time_limit(spec.time_limit, part) or None)


def _check_request(spec: ev.JobSpec, caller: Caller) -> None:
    """What is wrong with the request itself, or with who asks for it."""
    problems = spec_problems(spec)
    if problems:
        raise Rejected(*problems, code="invalid")
    if spec.uid != caller.uid and caller.level < 2:
        raise Rejected(ACCESS_DENIED, code="permission")
    if spec.nice < 0 and not caller.operator:
        raise Rejected("Access/permission denied: only operators and administrators may set a negative nice",
                       code="permission")


def _partition_names(cfg: ev.ClusterConfig, spec: ev.JobSpec) -> list[str]:
    """The partitions the job asks for (the default one when it names none), each of them known."""
    names = list(spec.partitions)
    if not names:
        dp = cfg.default_partition()
        if dp is None:
            raise Rejected("No partition specified or system default partition", code="partition")
        names = [dp.name]
    known = {p.name for p in cfg.partitions}
    for n in names:
        if n not in known:
            raise Rejected(f"invalid partition specified: {n}", "Invalid partition name specified",
                           code="partition")
    return names


def _check_forms(state: State, cfg: ev.ClusterConfig, spec: ev.JobSpec) -> None:
    """The array, the dependency and the GPU type, each of a form that can be met."""
    if spec.array:
        try:
            parse_array(spec.array, cfg.scheduler.max_array_size)
        except ArraySpecError:
            raise Rejected("Invalid job array specification", code="array") from None
    if spec.dependency:
        try:
            dep = parse_dependency(spec.dependency)
        except DependencySpecError:
            raise Rejected("Job dependency problem", code="dependency") from None
        for term in dep.terms:   # Slurm: these targets must be active or ended less than MinJobAge ago
            if term.kind in ("afterok", "afternotok") and term.job_id not in state.jobs:
                raise Rejected("Job dependency problem", code="dependency")
    if spec.gpu_type is not None and spec.gpu_type == "":
        raise Rejected("Invalid generic resource (gres) specification", code="gres")


def _with_account_and_qos(state: State, spec: ev.JobSpec) -> ev.JobSpec:
    """The job under the account and QOS the associations give it (AccountingStorageEnforce)."""
    try:
        account, qos = accounting.check_submit(state, spec.user, spec.account, spec.qos, spec.qos_given)
    except accounting.AccountingError as exc:
        raise Rejected(str(exc), code="account" if str(exc) == accounting.INVALID_ACCOUNT else "qos") from None
    if (account, qos) != (spec.account, spec.qos):
        spec = spec.model_copy(update={"account": account, "qos": qos})
    return spec


def count_limits_refusal(state: State, spec: ev.JobSpec) -> Rejected | None:
    """The refusal any job of ``spec``'s user would get now from MaxJobCount or rota's default share of it (None:
    one more may still fit): a bulk request refuses all of its jobs at once with it instead of one by one."""
    if state.config is None or limits_enforced(state):    # an association's own limit may differ: job by job
        return None
    try:
        _job_count_limits(state, spec.model_copy(update={"array": None}), state.config.scheduler)
    except Rejected as r:
        return r
    return None


def _job_count_limits(state: State, spec: ev.JobSpec, sched: ev.SchedulerParams) -> None:
    """MaxJobCount (every user's active jobs) and rota's default share of it for one user, counted as
    MaxSubmitJobs counts (each pending array task) from the state's running tally: a flood of submits by one
    user is refused job by job once it holds its share, and the others still submit."""
    adding = len(parse_array(spec.array, 1 << 30).indices) if spec.array else 1
    if state.active_jobs() + adding > sched.max_job_count:
        raise Rejected(f"MaxJobCount: {sched.max_job_count} jobs are pending or running",
                       "Slurm temporarily unable to accept job, sleeping and retrying", code="busy")
    share = sched.max_submit_per_user or max(1, sched.max_job_count // 2)
    mine = state.active_jobs(spec.user)
    if mine + adding > share and not _own_limit_set(state, spec):
        raise Rejected(f"MaxSubmitJobsPerUser: you have {mine} jobs pending or running, at most {share} "
                       "(SchedulerParameters=rota_max_submit_per_user)", QOS_POLICY, code="qos_limit")


def _own_limit_set(state: State, spec: ev.JobSpec) -> bool:
    """Whether the job's QOS or association sets the user's submit limit (which then replaces rota's default)."""
    return limits_enforced(state) and _submit_limits(state, spec) != (None, None)


def _submit_limits(state: State, spec: ev.JobSpec) -> tuple[int | None, int | None]:
    """MaxSubmitJobsPerUser of the job's QOS and MaxSubmitJobs of its association (None: not set)."""
    q = state.qos.get(spec.qos)
    assoc = state.associations.get((spec.user, spec.account))
    return (q.max_submit_jobs_per_user if q is not None else None,
            assoc.max_submit_jobs if assoc is not None else None)


QOS_POLICY = "Job violates accounting/QOS policy (job submit limit, user's size and/or time limits)"


def _submit_limit(state: State, spec: ev.JobSpec) -> None:
    """MaxSubmitJobsPerUser of the job's QOS and MaxSubmitJobs of its association
    (AccountingStorageEnforce=limits): pending and running jobs, each pending array task counted, as
    slurmctld counts them."""
    q_limit, a_limit = _submit_limits(state, spec)
    if (q_limit is None and a_limit is None) or not limits_enforced(state):
        return
    in_qos = in_assoc = 0
    for (qos, account), n in state.active_in.get(spec.user, {}).items():
        in_qos += n if qos == spec.qos else 0
        in_assoc += n if account == spec.account else 0
    adding = len(parse_array(spec.array, 1 << 30).indices) if spec.array else 1
    if q_limit is not None and in_qos + adding > q_limit:
        raise Rejected("QOSMaxSubmitJobPerUserLimit", QOS_POLICY, code="qos_limit")
    if a_limit is not None and in_assoc + adding > a_limit:
        raise Rejected("AssocMaxSubmitJobLimit", QOS_POLICY, code="assoc_limit")


def change_accounting(state: State, op: str, entity: str, names: list[str], where: dict[str, str],
                      values: dict[str, str], caller: Caller = ROOT) -> ev.AccountingChanged:
    """``sacctmgr add|modify|delete account|user|qos``: administrators only; the new records as one event."""
    if caller.level < 2:
        raise Rejected(ACCESS_DENIED, code="permission")
    try:
        return accounting.plan(state, op, entity, names, where, values, by=caller.user)
    except accounting.AccountingError as exc:
        raise Rejected(str(exc), code="accounting") from None


def _gpus_of(node, gpu_type: str | None) -> int:
    return len(node.gpu_types) if gpu_type is None else node.gpu_types.count(gpu_type)


def _check_partition(state: State, spec: ev.JobSpec, part: ev.PartitionConfig, enforce: str) -> None:
    """Why ``part`` can never run the job (raises), under the partition limits ``enforce`` says to apply."""
    if part.state in ("DRAIN", "INACTIVE"):
        raise Rejected("Required partition not available (inactive or drain)", code="partition")
    if spec.account and "ALL" not in part.allow_accounts and spec.account not in part.allow_accounts:
        raise Rejected("Invalid account or account/partition combination specified", code="account")
    shape = state.part_shapes.get(part.name)
    nodes: list = []
    if shape is None or spec.nodelist or spec.exclude:   # named nodes: look at each of them
        nodes = [state.nodes[n] for n in part.nodes if n in state.nodes]
        shape = shape or partition_shape(nodes, part)
    else:                                                # otherwise each kind of node will do
        nodes = list(shape.kinds)
    req = node_request(spec, shape)
    if enforce != "NO":
        if over_time_limit(part, spec.time_limit):
            raise Rejected("Requested time limit is invalid (missing or exceeds some limit)", code="time")
        if over_node_limits(part, req.nnodes, shape.count):
            raise Rejected("Node count specification invalid", code="nodes")
    _check_nodes(state, spec, req, nodes)


def _check_nodes(state: State, spec: ev.JobSpec, req: Any, nodes: list) -> None:
    """Why none of ``nodes`` (a partition's, or one of each kind) can ever hold the request (raises)."""
    nodes = _candidates(state, spec, nodes)
    if spec.shards_per_node:
        nodes = _shard_nodes(spec, nodes)
    if req.gpus or spec.gpu_type:
        typed = [n for n in nodes if spec.gpu_type is None or spec.gpu_type in n.gpu_types]
        if not typed or not any(_gpus_of(n, spec.gpu_type) >= req.gpus for n in typed):
            raise Rejected(NODE_CONFIG_UNAVAILABLE, code="gres")
        nodes = typed
    if not any(n.cpus >= req.cpus for n in nodes):
        raise Rejected("CPU count per node can not be satisfied", NODE_CONFIG_UNAVAILABLE, code="cpus")
    if not any(n.memory >= req.mem for n in nodes):
        raise Rejected("Memory specification can not be satisfied", NODE_CONFIG_UNAVAILABLE, code="memory")
    if not any(n.cpus >= req.cpus and n.memory >= req.mem and _gpus_of(n, spec.gpu_type) >= req.gpus
               for n in nodes):
        raise Rejected(NODE_CONFIG_UNAVAILABLE, code="nodes")


def _candidates(state: State, spec: ev.JobSpec, nodes: list) -> list:
    """``nodes`` narrowed by the job's --constraint, --nodelist and --exclude (raises where they name nothing)."""
    if spec.constraint and not any(constraint_matches(spec.constraint, n.features) for n in nodes):
        raise Rejected("Invalid feature specification", code="constraint")
    if spec.nodelist:
        unknown = [n for n in spec.nodelist if n not in state.nodes]
        if unknown:
            raise Rejected(f"Invalid node name specified: {unknown[0]}", code="nodelist")
        nodes = [n for n in nodes if n.name in set(spec.nodelist)]
        if not nodes:
            raise Rejected("Requested node configuration is not available", code="nodelist")
    if spec.exclude:
        nodes = [n for n in nodes if n.name not in set(spec.exclude)]
    if spec.constraint:
        nodes = [n for n in nodes if constraint_matches(spec.constraint, n.features)]
    return nodes


def _shard_nodes(spec: ev.JobSpec, nodes: list) -> list:
    """The nodes whose GPUs have as many shards as ``--gres=shard:N`` asks (raises when none, or with GPUs too)."""
    if spec.gpus_per_node or spec.gpus_total:
        raise Rejected("Invalid generic resource (gres) specification: a job asks for GPUs or for shards of one",
                       code="gres")
    fit = [n for n in nodes if n.shards_per_gpu >= spec.shards_per_node]
    if not fit:
        raise Rejected(NODE_CONFIG_UNAVAILABLE, code="gres")
    return fit


def _job(state: State, job_id: int) -> Job:
    job = state.jobs.get(job_id)
    if job is None:
        raise Rejected("Invalid job id specified", code="no_job")
    return job


def _own_job(state: State, caller: Caller, job_id: int) -> Job:
    """The job, if ``caller`` may act on it (its owner, an operator or an administrator)."""
    job = _job(state, job_id)
    if not caller.may_touch(job.spec.uid):
        raise Rejected(ACCESS_DENIED, code="permission")
    return job


def cancel(state: State, job_id: int, caller: Caller = ROOT, tasks: tuple[int, ...] | None = None,
           signal: int = 15) -> ev.JobCancelled:
    job = _own_job(state, caller, job_id)
    if job.state in TERMINAL_STATES and job.array_pending is None:
        raise Rejected("Job/step already completing or completed", code="finished")
    return ev.JobCancelled(job_id=job_id, by_uid=caller.uid, tasks=tasks, signal=signal)


def signal(state: State, job_id: int, signum: int, caller: Caller = ROOT, batch: bool = True,
           steps: bool = False, step_id: int | None = None) -> list[tuple[str, Signal]]:
    """``scancel --signal``: the orders that deliver ``signum`` to the running job's batch shell (on its
    batch host) and/or its steps' tasks (on every node they run on); a signal changes nothing the log knows."""
    job = _own_job(state, caller, job_id)
    if job.state != RUNNING or not job.alloc:
        raise Rejected("Job is not running", code="not_running")
    if step_id is not None and step_id not in (job.steps or {}):
        raise Rejected("Invalid job id specified", code="no_step")
    nodes = [a.node for a in job.alloc] if steps else []
    if batch and job.alloc[0].node not in nodes:
        nodes.insert(0, job.alloc[0].node)
    first = job.alloc[0].node
    return [(n, Signal(job_id=job_id, restarts=job.restarts, signal=signum, batch=batch and n == first, steps=steps,
                       step_id=step_id)) for n in nodes]


def release_allocation(state: State, job_id: int, exit_code: int, signal: int = 0,
                       caller: Caller = ROOT) -> ev.JobExited | ev.JobCancelled:
    """``srun``/``salloc`` giving back an allocation it asked for: the job ends COMPLETED (or FAILED, with
    the exit code of what ran in it)."""
    job = _own_job(state, caller, job_id)
    if not job.spec.allocation:
        raise Rejected("Only an allocation made by srun or salloc can be released this way", code="invalid")
    if job.state == PENDING:
        return ev.JobCancelled(job_id=job_id, by_uid=caller.uid)   # given back before it started
    if job.state != RUNNING or not job.alloc:
        raise Rejected("Job/step already completing or completed", code="finished")
    failed = exit_code != 0 or signal != 0
    return ev.JobExited(job_id=job_id, state="FAILED" if failed else "COMPLETED", exit_code=exit_code, signal=signal,
                        node=job.alloc[0].node, released=True)


def step_create(state: State, job_id: int, ask: StepAsk, caller: Caller = ROOT, **step: Any) -> tuple[ev.StepStarted,
                                                                                                    list[str]]:
    """``srun`` inside an allocation: the step's event (its id, tasks and share of each node) and the
    warnings ``srun`` prints; raises :class:`Rejected` with Slurm's words (code ``busy`` when it would fit
    once a running step ends). ``step`` holds the event's other fields (name, argv, io, ...)."""
    job = _job(state, job_id)
    if job.spec.uid != caller.uid and caller.level < 2:
        raise Rejected(ACCESS_DENIED, code="permission")
    if job.state == PENDING:
        raise Rejected("Job is pending execution", code="pending")
    if job.state != RUNNING or not job.alloc:
        raise Rejected("Job/step already completing or completed", code="finished")
    try:
        alloc, warnings = layout(job, ask)
    except StepRefused as r:
        raise Rejected(r.words, code="busy" if r.busy else "step") from None
    ntasks = sum(len(a.tasks) for a in alloc)
    cpt = alloc[0].cpus // len(alloc[0].tasks)
    return ev.StepStarted(job_id=job_id, restarts=job.restarts, step_id=job.next_step, ntasks=ntasks,
                          cpus_per_task=cpt, alloc=alloc, **step), warnings


def requeue(state: State, job_id: int, hold: bool = False, caller: Caller = ROOT) -> ev.JobRequeued:
    """``scontrol requeue``: a running or finished batch job goes back to the queue (same id)."""
    job = _own_job(state, caller, job_id)
    if job.state == PENDING:
        raise Rejected("Job is pending execution", code="pending")
    return ev.JobRequeued(job_id=job_id, hold=hold, user_hold=hold and not caller.operator)


def hold(state: State, job_id: int, caller: Caller = ROOT, user_hold: bool = False) -> ev.JobHeld:
    """``scontrol hold`` (an administrator's hold when an operator asks) or ``uhold`` (always the user's)."""
    job = _own_job(state, caller, job_id)
    if job.state != PENDING:
        raise Rejected("Job is no longer pending execution", code="not_pending")
    return ev.JobHeld(job_id=job_id, admin=caller.operator and not user_hold)


def release(state: State, job_id: int, caller: Caller = ROOT) -> ev.JobReleased:
    job = _own_job(state, caller, job_id)
    if job.state != PENDING:
        raise Rejected("Job is no longer pending execution", code="not_pending")
    if job.hold == "admin" and not caller.operator:
        raise Rejected(ACCESS_DENIED, code="permission")
    return ev.JobReleased(job_id=job_id)


def _current_limit(state: State, job: Job) -> int:
    if job.state == RUNNING or job.time_limit is not None:
        return job.time_limit or 0
    part = state.partition(job.partition)
    return effective_time_limit(None, part) if part is not None else 0


def update_job(state: State, job_id: int, *, time_limit: int | None = None, priority: int | None = None,
               nice: int | None = None, caller: Caller = ROOT) -> ev.JobUpdated:
    """``scontrol update JobId=``: owners may only lower a limit or raise nice; operators anything."""
    job = _own_job(state, caller, job_id)
    if time_limit is not None and not 0 <= time_limit <= MAX_TIME:
        raise Rejected(f"Invalid TimeLimit value: it must be between 0 and {MAX_TIME} seconds", code="invalid")
    if priority is not None and not 0 <= priority <= MAX_COUNT:
        raise Rejected(f"Invalid Priority value: it must be between 0 and {MAX_COUNT}", code="invalid")
    if nice is not None and not -MAX_NICE <= nice <= MAX_NICE:
        raise Rejected(f"Invalid nice value, must be between -{MAX_NICE} and {MAX_NICE}", code="invalid")
    if job.state in TERMINAL_STATES:
        raise Rejected("Job has already finished", code="finished")
    if not caller.operator:
        current = _current_limit(state, job)
        if time_limit is not None and current and (time_limit == 0 or time_limit > current):
            raise Rejected(ACCESS_DENIED, code="permission")
        if priority is not None or (nice is not None and nice < 0):
            raise Rejected(ACCESS_DENIED, code="permission")
    return ev.JobUpdated(job_id=job_id, time_limit=time_limit, priority=priority, nice=nice)


def _node(state: State, name: str):
    node = state.nodes.get(name)
    if node is None:
        raise Rejected(f"Invalid node name specified: {name}", code="no_node")
    return node


def _operator(caller: Caller) -> None:
    if not caller.operator:
        raise Rejected(INVALID_USER, code="permission")


def _node_with_reason(state: State, node: str, reason: str) -> None:
    _node(state, node)
    if not reason.strip():
        raise Rejected("You must specify a reason when DOWNING or DRAINING a node. Request denied",
                       code="reason")


def reconfigure(state: State, config: ev.ClusterConfig, source: str, caller: Caller = ROOT) -> ev.ClusterConfigured:
    """``scontrol reconfigure``: the configuration as read again, as an event (administrators only; one that
    changes nothing is not logged)."""
    if caller.level < 2:
        raise Rejected(INVALID_USER, code="permission")
    if state.config == config:
        raise Rejected("the configuration has not changed", code="noop")
    return ev.ClusterConfigured(config=config, source=source)


def drain(state: State, node: str, reason: str, caller: Caller = ROOT) -> ev.NodeDrained:
    _operator(caller)
    _node_with_reason(state, node, reason)
    return ev.NodeDrained(node=node, reason=reason, by=caller.user)


def down(state: State, node: str, reason: str, caller: Caller = ROOT) -> ev.NodeDown:
    _operator(caller)
    _node_with_reason(state, node, reason)
    return ev.NodeDown(node=node, reason=reason, by=caller.user)


def resume(state: State, node: str, caller: Caller = ROOT, undrain_only: bool = False) -> ev.NodeResumed:
    _operator(caller)
    n = _node(state, node)
    if not (n.drain or n.down or n.invalid_reg):
        raise Rejected(f"Invalid node state transition requested: {node} is not drained or down",
                       code="state")
    return ev.NodeResumed(node=node, by=caller.user, undrain_only=undrain_only)


# ---------------------------------------------------------------- agents and silent nodes

AGENT_REPORTS = (ev.NodeRegistered, ev.JobExited, ev.HealthFault, ev.StepEnded, ev.GpuIdle, ev.GpuBusy)
"""What an agent may report, and only about its own node."""


def check_report(state: State, node: str, event: ev.Event) -> ev.Event:
    """An agent's report checked against the state: the event to append, or :class:`Rejected`."""
    if not isinstance(event, AGENT_REPORTS):
        raise Rejected(f"agents may not report {event.type!r}", code="forbidden")
    if event.node not in ("", node):
        raise Rejected(f"agent {node} reported for node {event.node!r}", code="forbidden")
    n = state.nodes.get(node)
    if n is None:
        raise Rejected(f"unknown node {node!r}: not in the cluster configuration", code="node")
    if isinstance(event, ev.JobExited):
        job = state.jobs.get(event.job_id)
        late = job is not None and job.state == NODE_FAIL and not (job.exit_code or job.signal)
        if job is None or (job.state != RUNNING and not late) or not job.alloc or job.alloc[0].node != node:
            raise Rejected(f"job {event.job_id} is not running on {node}", code="stale")
        # (a late report, after its node was declared dead, is kept with the job: how it really ended)
        return event.model_copy(update={"node": node, "released": False})
    if isinstance(event, (ev.GpuIdle, ev.GpuBusy)):
        job = state.jobs.get(event.job_id)
        if job is None or job.state != RUNNING or job.restarts != event.restarts or not job.alloc \
                or job.alloc[0].node != node:
            raise Rejected(f"job {event.job_id} is not running on {node}", code="stale")
        return event.model_copy(update={"node": node})
    if isinstance(event, ev.StepEnded):
        job = state.jobs.get(event.job_id)
        step = job.steps.get(event.step_id) if job is not None and job.steps and job.restarts == event.restarts \
            else None
        if step is None or node not in step.nodes or node in step.ended:
            raise Rejected(f"step {event.job_id}.{event.step_id} is not running on {node}", code="stale")
        return event
    if isinstance(event, ev.HealthFault) and n.drain and event.drains:
        raise Rejected(f"{node} is already drained", code="noop")
    return event


def undeliverable_launch(state: State, node: str, job_id: int, restarts: int, why: str) -> ev.JobExited:
    """A launch that never reached its node: the job ends FAILED with the reason (if it still waits for it)."""
    job = state.jobs.get(job_id)
    if job is None or job.state != RUNNING or job.restarts != restarts or not job.alloc or job.alloc[0].node != node:
        raise Rejected("noop", code="noop")
    return ev.JobExited(job_id=job_id, state="FAILED", exit_code=1, node=node, reason=why[:1000])


def silent_node_down(state: State, node: str) -> ev.NodeDown:
    """A node whose agent stayed silent past the timeout goes DOWN (its jobs fail or requeue)."""
    n = state.nodes.get(node)
    if n is None or n.down:
        raise Rejected("noop", code="noop")
    return ev.NodeDown(node=node, reason="Not responding", by="rota")


def silent_node_not_responding(state: State, node: str) -> ev.NodeNotResponding:
    """A node whose agent stayed silent half the timeout is NOT_RESPONDING (no new work)."""
    n = state.nodes.get(node)
    if n is None or n.not_responding or n.down:
        raise Rejected("noop", code="noop")
    return ev.NodeNotResponding(node=node)
