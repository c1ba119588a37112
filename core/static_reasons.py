"""The reasons a pending job cannot be considered in a cycle whatever the load (pure): holds, its
partitions' state and limits, what no usable node can ever hold, dependencies, begin time and
array limits. Each partition is judged on its own; when none is usable, the most severe reason
(:func:`~rota.core.reasons.most_severe`) is the job's."""
from __future__ import annotations

from typing import Sequence, cast

from . import events as ev
from .cycle import Cycle, search_key
from .deps import NEVER, OK, DependencySpecError, dependency_status, parse_dependency, singletons
from .hostlist import compress
from .reasons import REQ_NODE_NOT_AVAIL_ALL, Amounts, Reason, most_severe
from .usage_limits import wall_reason
from .request import NodeRequest, constraint_matches, effective_time_limit, over_node_limits, over_time_limit
from .sharing import shared_value
from .state import RUNNING, Job, State


_HELD_BY_ADMIN, _HELD_BY_USER = Reason("JobHeldAdmin"), Reason("JobHeldUser")
_UNKNOWN = object()            # a verdict not made yet this cycle


def reasons_now(state: State, jobs: list[Job], now: int) -> dict[int, Reason | None]:
    """The static reason each of ``jobs`` has at ``now`` (None: only capacity or priority holds it
    back), as the scheduler would give it: what the projection records for a job that ends without
    running, so that ``sacct`` says what ``squeue`` said."""
    cfg = state.config
    if cfg is None or not jobs:
        return {job.job_id: None for job in jobs}
    cy = Cycle(state, now, cfg.scheduler.policy, False, timelines=False)
    return {job.job_id: static_reason(cy, job, cy.job_parts(job)) for job in jobs}


def partition_reason(cy: Cycle, job: Job, pname: str) -> Reason | None:
    """Why ``job`` cannot run in partition ``pname`` whatever the load; None if it can."""
    p = cy.parts.get(pname)
    if p is None:
        return Reason("PartitionConfig", about=pname)
    if p.state == "DOWN":
        return Reason("PartitionDown", about=pname)
    if p.state == "INACTIVE":
        return Reason("PartitionInactive", about=pname)
    if over_time_limit(p, job.time_limit):
        return Reason("PartitionTimeLimit", about=pname, asked=job.time_limit, limit=p.max_time)
    spec = job.spec
    req = cy.request(job, pname)
    key = search_key(pname, spec, req)
    verdicts = cy.verdicts
    why = verdicts.get(key, _UNKNOWN)
    if why is _UNKNOWN:
        why = verdicts[key] = capacity_verdict(cy, spec, pname, p, req)
    return cast("Reason | None", why)


def capacity_verdict(cy: Cycle, spec: ev.JobSpec, pname: str, p: ev.PartitionConfig,
                     req: NodeRequest) -> Reason | None:
    """The reason no set of usable nodes can ever hold this request (None: some can)."""
    nodes_in_part = cy.part_nodes[pname]
    if over_node_limits(p, req.nnodes, len(nodes_in_part)):
        return Reason("PartitionNodeLimit", about=pname, asked=req.nnodes, limit=len(nodes_in_part))
    if spec.constraint and not any(constraint_matches(spec.constraint, n.features) for n in nodes_in_part):
        return Reason("BadConstraints", about=pname, note=spec.constraint)
    if spec.nodelist:
        _tls, cands = cy.eligible(spec, pname)
        names = {c.name for c in cands}
        bad = [n.name for n in cands if not n.usable] + [n for n in spec.nodelist if n not in names]
        if bad:
            listed = compress(bad)
            return Reason("ReqNodeNotAvail", text="ReqNodeNotAvail, UnavailableNodes:" + listed, about=listed)
    n_fit, n_usable = cy.fit_counts_for(spec, pname, req)
    if n_usable < req.nnodes:
        if n_fit >= req.nnodes:
            return Reason("ReqNodeNotAvail", text=REQ_NODE_NOT_AVAIL_ALL, about=pname,
                          needs=shared_value(Amounts(nodes=req.nnodes)), free=shared_value(Amounts(nodes=n_usable)),
                          limit=n_fit)
        return Reason("Resources", about=pname, note="no node in the partition is large enough")
    return None


def static_reason(cy: Cycle, job: Job, parts: Sequence[str]) -> Reason | None:
    """The reason a job cannot be considered this cycle, before capacity; None if it can.

    Narrows ``parts`` to the partitions the job can use. The checks run in rank order (the first
    that holds is the most severe): a hold comes first, as slurmctld does not evaluate a held job
    against nodes or partitions.
    """
    if job.hold is not None:
        return _HELD_BY_ADMIN if job.hold == "admin" else _HELD_BY_USER
    why = _narrow_partitions(cy, job, parts)
    if why is not None:
        return why
    if cy.limit_use is not None:
        why = wall_reason(cy.state, job, effective_time_limit(job.time_limit, cy.parts[parts[0]]))
        if why is not None:
            return why
    return _waiting_reason(cy, job)


def _narrow_partitions(cy: Cycle, job: Job, parts: Sequence[str]) -> Reason | None:
    """Narrow ``parts`` to those the job can use; the most severe reason when there is none."""
    if len(parts) == 1:
        return partition_reason(cy, job, parts[0])
    refused: list[Reason] = []
    usable_parts = []
    for pname in parts:
        why = partition_reason(cy, job, pname)
        if why is None:
            usable_parts.append(pname)
        else:
            refused.append(why)
    if not usable_parts:
        return most_severe(refused)
    assert isinstance(parts, list)    # several partitions come as a list of the job's own
    parts[:] = usable_parts
    return None


def _waiting_reason(cy: Cycle, job: Job) -> Reason | None:
    """What the job waits for besides nodes: its dependency, its begin time, its array's throttle."""
    spec = job.spec
    if spec.dependency:
        try:
            dep = parse_dependency(spec.dependency)
            if cy.singletons is None and any(t.kind == "singleton" for t in dep.terms):
                cy.singletons = singletons(cy.state)
            status = dependency_status(cy.state, dep, job.job_id, cy.now, cy.singletons)
        except DependencySpecError:   # validated at submit; a record from elsewhere can never be met
            status = NEVER
        if status == NEVER:
            return Reason("DependencyNeverSatisfied", about=spec.dependency)
        if status != OK:
            return Reason("Dependency", about=spec.dependency)
    begin = max(spec.begin or 0, job.eligible_time)    # a requeued job's eligible time may be later
    if begin > cy.now:
        return Reason("BeginTime", at=begin, asked=begin - cy.now)
    if job.array_pending is not None and job.array_throttle:
        state = cy.state
        running = sum(1 for t in state.array_tasks.get(job.job_id, ()) if state.jobs[t].state == RUNNING)
        if running >= job.array_throttle:
            return Reason("JobArrayTaskLimit", asked=running, limit=job.array_throttle)
    return None
