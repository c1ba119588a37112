"""The scheduler: ``schedule(state, now, policy) -> Decision`` (pure).

One cycle: compute every pending job's blocking reasons that do not depend on capacity
(partition, limits, holds, dependencies, begin time, array throttle); order the rest by
(PriorityTier, priority, submit order, id); then walk them, starting what fits now and,
depending on the policy, reserving the earliest start for what does not:

- ``fifo``: strict priority, no backfill: a blocked job blocks its partitions.
- ``easy``: one reservation, for the first blocked job; later jobs start only if they do not
  disturb it.
- ``easy_strict``: EASY as in the RLScheduler simulator: a later job may start only if it
  ends before the reserved job's start (no use of spare resources beside the reservation).
- ``conservative`` (default): every job gets a reservation at its earliest start within
  ``bf_window``; a job starts now only if that disturbs no reservation of a higher-priority job.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from . import events as ev
from .deps import NEVER, OK, DependencySpecError, parse_dependency, dependency_status
from .hostlist import compress
from .priority import PriorityContext, job_priority
from .profile import INF, UNLIMITED_DURATION, ShapeSearch, Timeline
from .request import NodeRequest, constraint_matches, effective_time_limit, node_request, partition_shape
from .state import RUNNING, Job, Node, State

POLICIES = ("fifo", "easy", "easy_strict", "conservative")

REQ_NODE_NOT_AVAIL_ALL = ("Nodes required for job are DOWN, DRAINED or reserved for jobs in "
                          "higher priority partitions")


@dataclass(slots=True)
class Reservation:
    job_id: int
    start: int
    end: int
    nodes: tuple[str, ...]
    partition: str
    array_task_id: int | None = None


@dataclass(slots=True)
class Pending:
    """Why a job is still pending after this cycle."""

    reason: str                      # Slurm's reason code
    text: str = ""                   # what squeue's %R shows (defaults to the code)
    detail: str = ""                 # numbers behind the reason, in words
    rank: int = 0                    # position in priority order (1-based, 0 = not ranked)
    priority: int = 0
    start: int | None = None         # expected start (reservation), if any
    evaluated: bool = True           # False when the cycle stopped before testing it
    blockers: tuple[int, ...] = ()   # jobs (running or reserved) holding what it needs
    ahead: tuple[int, ...] = ()      # higher-priority pending jobs competing for its nodes

    @property
    def display(self) -> str:
        return self.text or self.reason


@dataclass(slots=True)
class Decision:
    now: int
    policy: str
    cycle: int
    starts: list[ev.Start] = field(default_factory=list)
    reservations: dict[int, Reservation] = field(default_factory=dict)
    pending: dict[int, Pending] = field(default_factory=dict)
    order: list[int] = field(default_factory=list)          # ranked job ids, best first
    priorities: dict[int, int] = field(default_factory=dict)
    checked: dict[int, tuple[int, ...]] = field(default_factory=dict)  # backfilled start -> resvs

    def event(self) -> ev.JobsStarted | None:
        """The log event for this cycle, or None when it started nothing."""
        if not self.starts:
            return None
        return ev.JobsStarted(cycle=self.cycle, now=self.now, policy=self.policy,
                              starts=tuple(self.starts))


# ---------------------------------------------------------------- per-cycle context


class _Cycle:
    def __init__(self, state: State, now: int, policy: str, explain: bool) -> None:
        cfg = state.config
        assert cfg is not None
        self.state, self.now, self.policy, self.explain = state, now, policy, explain
        self.focus: int | None = None
        self.cfg = cfg
        self.params = cfg.scheduler
        self.parts = {p.name: p for p in cfg.partitions}
        self.part_nodes: dict[str, list[Node]] = {
            p.name: [state.nodes[n] for n in p.nodes if n in state.nodes] for p in cfg.partitions
        }
        self.part_shapes = {name: partition_shape(ns) for name, ns in self.part_nodes.items()}
        self.timelines: dict[str, Timeline] = {}
        self._build_timelines()
        self.filters: dict[tuple, tuple[list[Timeline], list[Node]]] = {}
        self.searches: dict[tuple, ShapeSearch] = {}
        self.seeds: dict[tuple, list[tuple]] = {}
        self.requests: dict[str, dict[int, NodeRequest]] = {}
        self.fit_counts: dict[tuple, tuple[int, int]] = {}
        self.verdicts: dict[tuple, tuple[str, str, str] | None] = {}
        self.gpu_owner: dict[str, list[int]] = {}
        self.next_id = state.next_job_id
        self.prio_ctx = PriorityContext(cfg, sum(n.cpus for n in state.nodes.values()))

    def _build_timelines(self) -> None:
        state, now, jobs = self.state, self.now, self.state.jobs
        for node in state.nodes.values():
            if not node.usable:
                continue
            multi = len(set(node.gpu_types)) > 1
            releases: list[tuple[int, int, int, int, dict[str, int] | None]] = []
            for jid in node.jobs:
                job = jobs[jid]
                if job.state != RUNNING or not job.time_limit:
                    continue   # unlimited jobs never give their resources back
                for a in job.alloc:
                    if a.node == node.name:
                        by_type: dict[str, int] | None = None
                        if multi:
                            by_type = {}
                            for gi in a.gpus:
                                t = node.gpu_types[gi]
                                by_type[t] = by_type.get(t, 0) + 1
                        releases.append((job.start_time + job.time_limit, a.cpus, a.mem, len(a.gpus), by_type))
                        break
            free_by_type: dict[str, int] | None = None
            if multi:
                free_by_type = {}
                for t, owner in zip(node.gpu_types, node.gpu_owner):
                    free_by_type[t] = free_by_type.get(t, 0) + (owner == 0)
            tl = Timeline(node.name, node.index, node.weight, node.cpus, node.memory, node.gpu_count,
                          now, node.cpus - node.alloc_cpus, node.memory - node.alloc_mem,
                          node.free_gpus, free_by_type, releases)
            if self.explain:
                tl.items = []
                for jid in node.jobs:
                    job = jobs[jid]
                    end = job.start_time + job.time_limit if job.time_limit else INF
                    tl.items.append((job.start_time, max(end, now + 1), jid, "running"))
            self.timelines[node.name] = tl

    # -- eligibility

    def eligible(self, spec: ev.JobSpec, part: str) -> tuple[list[Timeline], list[Node]]:
        """Usable timelines and all candidate nodes (usable or not) of ``spec`` in ``part``."""
        key = (part, spec.constraint, spec.nodelist, spec.exclude, spec.gpu_type)
        hit = self.filters.get(key)
        if hit is not None:
            return hit
        nodes = self.part_nodes.get(part, [])
        if spec.nodelist:
            wanted = set(spec.nodelist)
            nodes = [n for n in nodes if n.name in wanted]
        if spec.exclude:
            unwanted = set(spec.exclude)
            nodes = [n for n in nodes if n.name not in unwanted]
        if spec.constraint:
            nodes = [n for n in nodes if constraint_matches(spec.constraint, n.features)]
        if spec.gpu_type:
            nodes = [n for n in nodes if spec.gpu_type in n.gpu_types]
        tls = [self.timelines[n.name] for n in nodes if n.name in self.timelines]
        self.filters[key] = (tls, nodes)
        return tls, nodes

    def request(self, job: Job, part: str) -> NodeRequest:
        """The job's per-node request in ``part`` (kept by apply for its first partition)."""
        if job.req is not None and part == job.partition:
            return job.req
        cache = self.requests.get(part)
        if cache is None:
            cache = self.requests[part] = {}
        req = cache.get(job.job_id)
        if req is None:
            shape = self.part_shapes.get(part) or partition_shape([])
            req = cache[job.job_id] = node_request(job.spec, shape)
        return req

    def search(self, job: Job, part: str, d: int, tmax: int) -> ShapeSearch:
        """The earliest-start search for this job's exact shape (created on first use).

        A new duration of a known request starts from the shared lower bounds of a
        one-second job of that request, so only the nodes near the top are evaluated.
        """
        req = self.request(job, part)
        spec = job.spec
        base_key = (part, spec.constraint, spec.nodelist, spec.exclude, req)
        key = (base_key, d, tmax)
        s = self.searches.get(key)
        if s is None:
            tls, _ = self.eligible(spec, part)
            seed = self.seeds.get(base_key)
            if seed is None:
                base = ShapeSearch(tls, req.cpus, req.mem, req.gpus, req.gpu_type, req.whole_cpus,
                                   req.whole_mem, req.whole_gpus, 1, req.nnodes, self.now, INF)
                seed = self.seeds[base_key] = base.seed()
            s = ShapeSearch(tls, req.cpus, req.mem, req.gpus, req.gpu_type, req.whole_cpus,
                            req.whole_mem, req.whole_gpus, d, req.nnodes, self.now, tmax, seed)
            self.searches[key] = s
        return s

    def fit_counts_for(self, spec: ev.JobSpec, part: str, req: NodeRequest) -> tuple[int, int]:
        """How many candidate nodes could ever hold one node's share, and how many are usable."""
        key = (part, spec.constraint, spec.nodelist, spec.exclude, req)
        hit = self.fit_counts.get(key)
        if hit is None:
            _tls, cands = self.eligible(spec, part)
            fit_all = [n for n in cands if _node_can_ever_fit(n, req)]
            hit = (len(fit_all), sum(1 for n in fit_all if n.usable))
            self.fit_counts[key] = hit
        return hit

    def pick_gpus(self, node_name: str, count: int, gpu_type: str | None, job_id: int) -> tuple[int, ...]:
        owner = self.gpu_owner.get(node_name)
        if owner is None:
            owner = list(self.state.nodes[node_name].gpu_owner)
            self.gpu_owner[node_name] = owner
        types = self.state.nodes[node_name].gpu_types
        picked: list[int] = []
        for i, o in enumerate(owner):
            if len(picked) == count:
                break
            if o == 0 and (gpu_type is None or types[i] == gpu_type):
                picked.append(i)
        for i in picked:
            owner[i] = job_id
        return tuple(picked)


# ---------------------------------------------------------------- static reasons


def _partition_reason(cy: _Cycle, job: Job, pname: str) -> Pending | None:
    """Why ``job`` cannot run in partition ``pname`` whatever the load; None if it can."""
    p = cy.parts.get(pname)
    if p is None:
        return Pending("PartitionConfig", detail=f"partition {pname} no longer exists")
    if p.state == "DOWN":
        return Pending("PartitionDown", detail=f"partition {pname} is DOWN")
    if p.state == "INACTIVE":
        return Pending("PartitionInactive", detail=f"partition {pname} is INACTIVE")
    limit = job.time_limit
    if p.max_time and limit is not None and (limit == 0 or limit > p.max_time):
        return Pending("PartitionTimeLimit",
                       detail=f"time limit {limit}s exceeds partition {pname} MaxTime {p.max_time}s")
    spec = job.spec
    req = cy.request(job, pname)
    key = (pname, spec.constraint, spec.nodelist, spec.exclude, req)
    if key not in cy.verdicts:
        cy.verdicts[key] = _capacity_verdict(cy, spec, pname, p, req)
    verdict = cy.verdicts[key]
    return None if verdict is None else Pending(*verdict)


def _capacity_verdict(cy: _Cycle, spec: ev.JobSpec, pname: str, p: ev.PartitionConfig,
                      req: NodeRequest) -> tuple[str, str, str] | None:
    """(reason, text, detail) when no set of usable nodes can ever hold this request."""
    nodes_in_part = cy.part_nodes[pname]
    if req.nnodes > len(nodes_in_part) or (p.max_nodes and req.nnodes > p.max_nodes) \
            or req.nnodes < p.min_nodes:
        return ("PartitionNodeLimit", "",
                f"needs {req.nnodes} nodes; partition {pname} has {len(nodes_in_part)}")
    if spec.constraint and not any(constraint_matches(spec.constraint, n.features) for n in nodes_in_part):
        return ("BadConstraints", "", f"no node in {pname} has features {spec.constraint}")
    if spec.nodelist:
        _tls, cands = cy.eligible(spec, pname)
        names = {c.name for c in cands}
        bad = [n.name for n in cands if not n.usable] + [n for n in spec.nodelist if n not in names]
        if bad:
            listed = compress(bad)
            return ("ReqNodeNotAvail", "ReqNodeNotAvail, UnavailableNodes:" + listed,
                    f"required nodes {listed} are not available")
    n_fit, n_usable = cy.fit_counts_for(spec, pname, req)
    if n_usable < req.nnodes:
        if n_fit >= req.nnodes:
            return ("ReqNodeNotAvail", REQ_NODE_NOT_AVAIL_ALL,
                    f"needs {req.nnodes} node(s) able to hold it; {n_usable} of {n_fit} are usable "
                    "(the rest are down or drained)")
        return ("Resources", "", "no node in the partition is large enough")
    return None


def _static_reason(cy: _Cycle, job: Job, parts: list[str]) -> Pending | None:
    """The reason a job cannot be considered this cycle, before capacity; None if it can.

    Narrows ``parts`` to the partitions the job can use. A hold comes first: slurmctld sets it when the
    job is held and does not evaluate a held job against nodes or partitions.
    """
    if job.hold is not None:
        if job.hold == "admin":
            return Pending("JobHeldAdmin", detail="held by an administrator")
        return Pending("JobHeldUser", detail="held by its owner")
    if len(parts) == 1:
        why = _partition_reason(cy, job, parts[0])
        if why is not None:
            return why
    else:
        first: Pending | None = None
        usable_parts = []
        for pname in parts:
            why = _partition_reason(cy, job, pname)
            if why is None:
                usable_parts.append(pname)
            elif first is None:
                first = why
        if not usable_parts:
            return first
        parts[:] = usable_parts
    spec = job.spec
    if spec.dependency:
        try:
            status = dependency_status(cy.state, parse_dependency(spec.dependency), job.job_id, cy.now)
        except DependencySpecError:   # validated at submit; a record from elsewhere can never be met
            status = NEVER
        if status == NEVER:
            return Pending("DependencyNeverSatisfied", detail=f"dependency {spec.dependency} can never be met")
        if status != OK:
            return Pending("Dependency", detail=f"waiting for {spec.dependency}")
    if spec.begin and spec.begin > cy.now:
        return Pending("BeginTime", detail=f"not before {spec.begin} ({spec.begin - cy.now}s from now)",
                       start=spec.begin)
    if job.array_pending is not None and job.array_throttle:
        state = cy.state
        running = sum(1 for t in state.array_tasks.get(job.job_id, ()) if state.jobs[t].state == RUNNING)
        if running >= job.array_throttle:
            return Pending("JobArrayTaskLimit",
                           detail=f"{running} tasks running, array limit %{job.array_throttle}")
    return None


def _node_can_ever_fit(n: Node, req: NodeRequest) -> bool:
    if req.gpu_type is not None:
        gpus = sum(1 for t in n.gpu_types if t == req.gpu_type)
    else:
        gpus = n.gpu_count
    return n.cpus >= req.cpus and n.memory >= req.mem and gpus >= req.gpus


# ---------------------------------------------------------------- the cycle


def schedule(state: State, now: int, policy: str | None = None, explain: bool = False,
             focus: int | None = None) -> Decision:
    """Decide which pending jobs start at ``now`` and when the others expect to start.

    ``focus`` (with ``explain``): only that job's situation is wanted (``rota why``): the walk stops
    after it (lower-priority jobs cannot change it) and only it is explained. The decision is then
    partial: use it to explain, never to act."""
    cfg = state.config
    pol = policy or (cfg.scheduler.policy if cfg is not None else "conservative")
    if pol not in POLICIES:
        raise ValueError(f"unknown scheduling policy {pol!r}; choose one of {', '.join(POLICIES)}")
    decision = Decision(now=now, policy=pol, cycle=state.cycle + 1)
    if cfg is None or not state.pending:
        return decision
    cy = _Cycle(state, now, pol, explain)
    jobs = state.jobs
    default_part = cfg.default_partition()
    ready: list[tuple[tuple[int, int, int, int], Job, list[str]]] = []
    default_parts = [default_part.name] if default_part else []
    pending_out, priorities = decision.pending, decision.priorities
    all_parts, prio_ctx = cy.parts, cy.prio_ctx
    for jid in state.pending:
        job = jobs[jid]
        parts = list(job.spec.partitions) if job.spec.partitions else list(default_parts)
        why = _static_reason(cy, job, parts)
        if why is not None:
            pending_out[jid] = why
            continue
        part0 = all_parts[parts[0]]
        tier = part0.priority_tier if len(parts) == 1 else max(all_parts[p].priority_tier for p in parts)
        prio = job_priority(job, now, part0, cy.request(job, parts[0]).total_cpus, prio_ctx)
        priorities[jid] = prio
        ready.append(((-tier, -prio, job.submit_seq, jid), job, parts))
    ready.sort(key=lambda r: r[0])
    if focus is not None:
        cy.focus = focus
        cut = next((i for i, r in enumerate(ready) if r[1].job_id == focus), None)
        ready = ready[: cut + 1] if cut is not None else []
    _walk(cy, decision, ready)
    return decision


def _walk(cy: _Cycle, decision: Decision, ready: list) -> None:
    now, pol = cy.now, cy.policy
    window_end = now + cy.params.bf_window
    max_test = cy.params.bf_max_job_test
    blocked_parts: set[str] = set()       # fifo: partitions behind a blocked job
    resources_given: set[str] = set()     # partitions whose first blocked job got "Resources"
    shadow = INF                          # easy/easy_strict: the reserved job's start
    resv_made = False
    tested = 0
    state = cy.state
    for rank, (_key, job, parts) in enumerate(ready, start=1):
        jid = job.job_id
        decision.order.append(jid)
        prio = decision.priorities[jid]
        if max_test and tested >= max_test:
            decision.pending[jid] = Pending("Priority", rank=rank, priority=prio, evaluated=False,
                                            detail="not tested this cycle (bf_max_job_test reached)")
            continue
        tested += 1
        if pol == "fifo" and all(p in blocked_parts for p in parts):
            decision.pending[jid] = Pending("Priority", rank=rank, priority=prio,
                                            detail="a higher-priority job ahead in its partition is waiting")
            continue
        tasks: list[int | None]
        if job.array_pending is not None:
            tasks = list(job.array_pending)
            running_tasks = sum(1 for t in state.array_tasks.get(jid, ()) if state.jobs[t].state == RUNNING)
        else:
            tasks = [None]
            running_tasks = 0
        for ti, task in enumerate(tasks):
            if job.array_throttle and running_tasks >= job.array_throttle:
                decision.pending[jid] = Pending("JobArrayTaskLimit", rank=rank, priority=prio,
                                                detail=f"{running_tasks} tasks running, array limit "
                                                       f"%{job.array_throttle}")
                break
            # choose tmax for this policy
            if pol == "conservative":
                tmax = window_end
            elif pol in ("easy", "easy_strict") and not resv_made:
                tmax = INF
            else:
                tmax = now
            best: tuple[int, list[Timeline], str, int, ShapeSearch] | None = None
            for pname in parts:
                if pol == "fifo" and pname in blocked_parts:
                    continue
                part = cy.parts[pname]
                limit = effective_time_limit(job.time_limit, part)
                d = limit if limit else UNLIMITED_DURATION
                if pol == "easy_strict" and resv_made and now + d > shadow:
                    continue
                s = cy.search(job, pname, d, tmax)
                found = s.find()
                if found is not None and (best is None or found[0] < best[0]):
                    best = (found[0], found[1], pname, limit, s)
            if best is not None and best[0] == now:
                t, tls, pname, limit, s = best
                _start(cy, decision, job, task, tasks, ti, tls, pname, limit, s, resv_made or bool(decision.reservations))
                running_tasks += 1
                continue
            # cannot start now
            for pname in parts:
                if pol == "fifo":
                    blocked_parts.add(pname)
            pend = Pending("Resources", rank=rank, priority=prio)
            if parts[0] in resources_given or (len(parts) > 1 and not resources_given.isdisjoint(parts)):
                pend.reason = "Priority"
            else:
                resources_given.update(parts)
            if best is not None and pol != "fifo":
                t, tls, pname, limit, s = best
                d = limit if limit else UNLIMITED_DURATION
                resv = Reservation(jid, t, t + d, tuple(tl.name for tl in tls), pname, task)
                for tl in tls:
                    c, m, g = s.request_on(tl)
                    tl.reserve(t, t + d, c, m, g, s.gtype, jid, "resv")
                s.placed(t)
                decision.reservations[jid] = resv
                pend.start = t
                if not resv_made:
                    resv_made = True
                    shadow = t
            if cy.explain and cy.focus in (None, jid):
                _explain_pending(cy, job, parts, pend, decision.reservations.get(jid))
            decision.pending[jid] = pend
            break
        else:
            continue


def _start(cy: _Cycle, decision: Decision, job: Job, task: int | None, tasks: list, ti: int,
           tls: list[Timeline], pname: str, limit: int, s: ShapeSearch, backfilled: bool) -> None:
    now = cy.now
    if task is None:
        run_id = job.job_id
    elif ti == len(tasks) - 1:
        run_id = job.job_id          # the last pending task keeps the array's own id
    else:
        run_id = cy.next_id
        cy.next_id += 1
    d = limit if limit else UNLIMITED_DURATION
    allocs = []
    for tl in tls:
        c, m, g = s.request_on(tl)
        gpus = cy.pick_gpus(tl.name, g, s.gtype, run_id) if g else ()
        allocs.append(ev.NodeAlloc(node=tl.name, cpus=c, mem=m, gpus=gpus))
        tl.reserve(now, now + d, c, m, g, s.gtype, run_id, "start")
    s.placed(now)
    decision.starts.append(ev.Start(
        job_id=run_id, array_job_id=job.job_id if task is not None else None, array_task_id=task,
        partition=pname, alloc=tuple(allocs), time_limit=limit, backfilled=backfilled))
    if backfilled and cy.explain:
        names = {tl.name for tl in tls}
        decision.checked[run_id] = tuple(r.job_id for r in decision.reservations.values()
                                         if names.intersection(r.nodes))


def _explain_pending(cy: _Cycle, job: Job, parts: list[str], pend: Pending,
                     resv: Reservation | None) -> None:
    """Fill in the numbers: what is free now versus what the job needs, and who holds it."""
    pname = parts[0]
    req = cy.request(job, pname)
    tls, _ = cy.eligible(job.spec, pname)
    best_free = max((tl.free_at(cy.now) for tl in tls), key=lambda f: (f[2], f[0], f[1]), default=(0, 0, 0))
    need = f"{req.nnodes} node(s) with {req.cpus} CPUs, {req.mem} MiB"
    if req.gpus:
        need += f", {req.gpus} GPU(s)" + (f" of type {req.gpu_type}" if req.gpu_type else "")
    pend.detail = (f"needs {need}; the freest usable node now has {best_free[0]} CPUs, "
                   f"{best_free[1]} MiB, {best_free[2]} GPU(s) free")
    until = pend.start if pend.start is not None else INF
    blockers: list[int] = []
    ahead: list[int] = []
    if resv is not None:   # only what stands on the nodes it is waiting for
        tls = [cy.timelines[n] for n in resv.nodes]
    for tl in tls:
        for (s, e, jid, kind) in tl.items or ():
            if jid == job.job_id or s >= until or e <= cy.now:
                continue
            if kind == "resv":
                if jid not in ahead:
                    ahead.append(jid)
            elif jid not in blockers:
                blockers.append(jid)
    pend.blockers = tuple(sorted(blockers))
    pend.ahead = tuple(sorted(ahead))
