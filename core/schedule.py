"""The scheduler: ``schedule(state, now, policy) -> Decision`` (pure).

One cycle: compute every pending job's blocking reasons that do not depend on capacity
(:mod:`rota.core.static_reasons`); order the rest by (PriorityTier, priority, submit order, id);
then walk them, starting what fits now and, depending on the policy
(:mod:`rota.core.policies`), reserving the earliest start for what does not.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import count
from typing import Any, Callable, Iterable, Sequence

from . import events as ev
from .cycle import Cycle, NodeBases
from .policies import POLICIES, Policy, make_policy
from .priority import Factors, job_priority, priority_factors
from .profile import INF, UNLIMITED_DURATION, ShapeSearch, Timeline
from .reasons import REQ_NODE_NOT_AVAIL_ALL, Amounts, Reason
from .replan import PlanMemory, Replan
from .request import effective_time_limit
from .sharing import shared_value
from .state import PENDING, RUNNING, Job, State
from .static_reasons import static_reason

__all__ = ["POLICIES", "REQ_NODE_NOT_AVAIL_ALL", "Decision", "Pending", "Reservation", "schedule"]

# the reasons most pending jobs share, made once (a cycle gives one to every pending job)
_RESOURCES, _PRIORITY = Reason("Resources"), Reason("Priority")
_NOT_TESTED = Reason("Priority", note="not tested this cycle (bf_max_job_test reached)")
_BEHIND = Reason("Priority", note="a higher-priority job ahead in its partition is waiting")
_HIGHER_PARTS = Reason("Resources", text="Nodes required for job are DOWN, DRAINED or reserved for jobs in higher "
                                         "priority partitions",
                       note="its partition's nodes are held for blocked jobs of other partitions")


@dataclass(slots=True)
class _Failed:
    """What Slurm's main scheduler sets aside in a cycle: partitions whose first blocked job got Resources (later
    jobs there wait for Priority) and those partitions' nodes (a job of another partition that lacks nodes
    without them waits for Resources, "reserved for jobs in higher priority partitions")."""

    parts: set[str] = field(default_factory=set)
    nodes: set[str] = field(default_factory=set)


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
    """Why a job is still pending after this cycle, and where it stands."""

    why: Reason
    rank: int = 0                    # position in priority order (1-based, 0 = not ranked)
    priority: int = 0
    start: int | None = None         # expected start (reservation), if any
    evaluated: bool = True           # False when the cycle stopped before testing it
    blockers: tuple[int, ...] = ()   # jobs (running or reserved) holding what it needs
    ahead: tuple[int, ...] = ()      # higher-priority pending jobs competing for its nodes
    decisive: tuple[int, ...] = ()   # of those, the ones whose end (by their limit) is its expected start

    @property
    def reason(self) -> str:
        """Slurm's reason code."""
        return self.why.code

    @property
    def display(self) -> str:
        """What squeue's %R shows."""
        return self.why.display

    @property
    def detail(self) -> str:
        """The numbers behind the reason, in words."""
        return self.why.numbers()


@dataclass(slots=True)
class Decision:
    now: int
    policy: str
    cycle: int
    starts: list[ev.Start] = field(default_factory=list)
    reservations: dict[int, Reservation] = field(default_factory=dict)
    pending: dict[int, Pending] = field(default_factory=dict)   # tested or held back before ranking
    untested: dict[int, int] = field(default_factory=dict)      # ranked beyond bf_max_job_test: job -> rank
    order: list[int] = field(default_factory=list)          # ranked job ids, best first
    priorities: dict[int, int] = field(default_factory=dict)
    checked: dict[int, tuple[int, ...]] = field(default_factory=dict)  # backfilled start -> resvs
    preemptions: list[ev.Preemption] = field(default_factory=list)
    shadow: tuple[int, int] | None = None      # easy_strict: the blocked head job and its shadow

    def pending_of(self, job_id: int) -> Pending | None:
        """Why ``job_id`` is still pending after this cycle (None: it starts now, or the cycle did not see it);
        a job ranked beyond ``bf_max_job_test`` gets its :class:`Pending` only when asked."""
        p = self.pending.get(job_id)
        if p is None:
            rank = self.untested.get(job_id)
            if rank is not None:
                return Pending(_NOT_TESTED, rank, self.priorities[job_id], None, False)
        return p

    def event(self) -> ev.JobsStarted | None:
        """The log event for this cycle, or None when it started and preempted nothing."""
        if not self.starts and not self.preemptions:
            return None
        return ev.JobsStarted(cycle=self.cycle, now=self.now, policy=self.policy,
                              starts=tuple(self.starts), preemptions=tuple(self.preemptions), shadow=self.shadow)


# ---------------------------------------------------------------- the cycle


def schedule(state: State, now: int, policy: str | None = None, explain: bool = False,
             focus: int | None = None, window: int | None = None, bases: NodeBases | None = None,
             kept_shadow: tuple[int, int] | None = None, give_way: Callable[[], None] | None = None,
             memory: PlanMemory | None = None) -> Decision:
    """Decide which pending jobs start at ``now`` and when the others expect to start.

    ``focus`` (with ``explain``): only that job's situation is wanted (``rota why``): the walk stops
    after it (lower-priority jobs cannot change it) and only it is explained. The decision is then
    partial: use it to explain, never to act. ``window``: the backfill window instead of the configured one.
    ``bases``: node timelines' inputs kept from earlier cycles of a walk (see :class:`NodeBases`).
    ``kept_shadow``: easy_strict's head job and shadow from the previous cycle (the simulator's).
    ``give_way``: called between slices of the pass over every pending job (a cycle run off the event loop
    pauses there while requests are answered); it changes nothing decided.
    ``memory``: what the last conservative cycle planned, kept by the caller between cycles (and updated here): a
    conservative cycle then searches only for jobs whose place may have changed (:mod:`rota.core.replan`); the
    decision is the same."""
    cfg = state.config
    pol = policy or (cfg.scheduler.policy if cfg is not None else "conservative")
    horizon = window if window is not None else cfg.scheduler.bf_window if cfg is not None else 0
    policy_now = make_policy(pol, now, horizon, kept_shadow)
    decision = Decision(now=now, policy=pol, cycle=state.cycle + 1)
    if cfg is None or not state.pending:
        return decision
    cy = Cycle(state, now, pol, explain, bases=bases)
    cut_key = _focus_key(cy, decision, focus) if focus is not None else None
    if cut_key is None and focus is not None:
        return decision          # held back before ranking: nothing else changes that
    ready = _ranked(cy, decision, cut_key, give_way)
    if focus is not None:
        cy.focus = focus
        cut = next((i for i, r in enumerate(ready) if r[1].job_id == focus), None)
        ready = ready[: cut + 1] if cut is not None else []
    rp = None
    if memory is not None and pol == "conservative" and not explain and focus is None and cy.preempter is None:
        rp = Replan(memory, cy, horizon)
    _walk(cy, decision, ready, policy_now, rp)
    if rp is not None:
        rp.commit()
    decision.shadow = policy_now.head
    return decision


def _ranked(cy: Cycle, decision: Decision, cut_key: tuple[int, int, int, int] | None,
            give_way: Callable[[], None] | None) -> list[tuple[tuple[int, int, int, int], Job, Sequence[str]]]:
    """The pending jobs not held back before ranking, in priority order, each with its rank key and usable
    partitions (the others' reasons recorded); with ``cut_key``, only those ranked up to it (a focused pass)."""
    jobs, all_parts = cy.state.jobs, cy.parts
    ready: list[tuple[tuple[int, int, int, int], Job, Sequence[str]]] = []
    pending_out, priorities = decision.pending, decision.priorities
    for i, jid in enumerate(cy.state.pending):
        if give_way is not None and not i & 1023:
            give_way()
        job = jobs[jid]
        parts = cy.job_parts(job)
        key = None
        if cut_key is not None and len(parts) == 1 and parts[0] in all_parts:
            key = _rank_key(cy, job, parts)
            if key > cut_key:
                continue         # walked after the focus job, if at all: cannot change it
        why = static_reason(cy, job, parts)
        if why is not None:
            pending_out[jid] = Pending(why, start=why.at)
            continue
        if key is None:
            key = _rank_key(cy, job, parts)
        priorities[jid] = -key[1]
        ready.append((key, job, parts))
    ready.sort(key=lambda r: r[0])
    return ready


def _focus_key(cy: Cycle, decision: Decision, focus: int) -> tuple[int, int, int, int] | None:
    """The focus job's rank key; None (its reason recorded) when a static reason holds it back."""
    job = cy.state.jobs.get(focus)
    if job is None or job.state != PENDING:
        return None
    parts = cy.job_parts(job)
    why = static_reason(cy, job, parts)
    if why is not None:
        decision.pending[focus] = Pending(why, start=why.at)
        return None
    return _rank_key(cy, job, parts)


PLAN_WINDOW = 10 * 365 * 86400     # the plan looks this far ahead: in practice, without limit


def plan(state: State, now: int, focus: int | None = None) -> dict[int, int]:
    """An estimated start for each pending job (only ``focus`` and those ahead of it, when given) from the
    current plan: every job placed in priority order at the earliest time it fits, as conservative
    backfill places them, beyond any backfill window, assuming every running job uses its whole time
    limit. Jobs held back before ranking (holds, dependencies...) have none."""
    d = schedule(state, now, "conservative", focus=focus, window=PLAN_WINDOW)
    out = {r.job_id: r.start for r in d.reservations.values()}
    for s in d.starts:
        out.setdefault(s.array_job_id or s.job_id, now)
    return out


def _rank_key(cy: Cycle, job: Job, parts: Sequence[str]) -> tuple[int, int, int, int]:
    """The job's place in priority order (smaller first): PriorityTier, priority, submit order, id."""
    part0 = cy.parts[parts[0]]
    tier = part0.priority_tier if len(parts) == 1 else max(cy.parts[p].priority_tier for p in parts)
    prio = job_priority(job, cy.now, part0, cy.job_size(job, parts[0]), cy.prio_ctx)
    return (-tier, -prio, job.submit_seq, job.job_id)


def _rank_keys(state: State, now: int, job_ids: Iterable[int]) -> dict[int, tuple[int, int, int, int] | None]:
    """The rank key each of these pending jobs has at ``now`` (None: held back before ranking)."""
    cfg = state.config
    assert cfg is not None
    cy = Cycle(state, now, cfg.scheduler.policy, False, timelines=False)
    keys: dict[int, tuple[int, int, int, int] | None] = {}
    for jid in job_ids:
        job = state.jobs[jid]
        parts = cy.job_parts(job)
        keys[jid] = None if static_reason(cy, job, parts) is not None else _rank_key(cy, job, parts)
    return keys


def outranks(mine: Any, theirs: Iterable[Any]) -> bool:
    """Whether any of ``theirs`` (rank keys or positions; None: not ranked) is walked before ``mine``,
    or ``mine`` is not ranked at all (and so cannot be compared)."""
    return mine is None or any(t is not None and t < mine for t in theirs)


def outranked(state: State, now: int, job_id: int, others: list[int]) -> bool:
    """Whether any of the pending jobs ``others`` would be walked before pending job ``job_id`` at
    ``now`` (or whether ``job_id`` is held back before ranking, and so cannot be compared)."""
    if state.config is None:
        return True
    keys = _rank_keys(state, now, [job_id, *others])
    return outranks(keys[job_id], (keys[j] for j in others if j != job_id))


def priority_of(state: State, now: int, job_id: int) -> int:
    """A pending job's priority at ``now`` as a cycle computes it, even while a dependency or a begin time
    keeps it out of the ranking (0 while it is held, as Slurm shows a held job)."""
    cfg = state.config
    job = state.jobs.get(job_id)
    if cfg is None or job is None:
        return 0
    cy = Cycle(state, now, cfg.scheduler.policy, False, timelines=False)
    parts = cy.job_parts(job)
    if not parts or parts[0] not in cy.parts:
        return 0
    return -_rank_key(cy, job, parts)[1]


def factors_of(state: State, now: int, job_ids: Iterable[int]) -> dict[int, tuple[str, Factors]]:
    """Each pending job's partition and priority factors at ``now``, as a cycle computes them (``sprio``)."""
    cfg = state.config
    if cfg is None:
        return {}
    cy = Cycle(state, now, cfg.scheduler.policy, False, timelines=False)
    out: dict[int, tuple[str, Factors]] = {}
    for jid in job_ids:
        job = state.jobs.get(jid)
        if job is None or job.state != PENDING:
            continue
        parts = cy.job_parts(job)
        if not parts or parts[0] not in cy.parts:
            continue
        out[jid] = (parts[0], priority_factors(job, now, cy.parts[parts[0]], cy.job_size(job, parts[0]), cy.prio_ctx))
    return out


def _walk(cy: Cycle, decision: Decision, ready: list, policy: Policy, rp: Replan | None = None) -> None:
    """Start or place each ranked job in turn, as ``policy`` allows (``rp``: keeping what the last plan
    placed where nothing changed, :mod:`rota.core.replan`)."""
    max_test = cy.params.bf_max_job_test
    failed = _Failed()
    tested = 0
    for rank, (_key, job, parts) in enumerate(ready, start=1):
        if max_test and tested >= max_test:
            _not_tested(decision, ready, rank)
            break
        jid = job.job_id
        decision.order.append(jid)
        tested += 1
        if not policy.considers(parts):
            decision.pending[jid] = Pending(_BEHIND, rank=rank, priority=decision.priorities[jid])
            continue
        if rp is not None:
            rp.enter(jid)
        _walk_job(cy, decision, job, parts, rank, policy, failed, rp)
        if rp is not None:
            rp.leave(job)


def _walk_job(cy: Cycle, decision: Decision, job: Job, parts: Sequence[str], rank: int, policy: Policy,
              failed: _Failed, rp: Replan | None) -> None:
    """Start what of the job can start now; place (or hold back) the rest."""
    now, jid = cy.now, job.job_id
    prio = decision.priorities[jid]
    tasks, running_tasks = _tasks_of(cy.state, job)
    for ti, task in enumerate(tasks):
        if job.array_throttle and running_tasks >= job.array_throttle:
            decision.pending[jid] = Pending(Reason("JobArrayTaskLimit", asked=running_tasks,
                                                   limit=job.array_throttle), rank=rank, priority=prio)
            return
        if cy.limit_use is not None:
            over = cy.limit_use.blocking(job, cy.request(job, parts[0]),
                                         effective_time_limit(job.time_limit, cy.parts[parts[0]]))
            if over is not None:
                decision.pending[jid] = Pending(over, rank=rank, priority=prio)
                return
        best = _kept(cy, rp, job, parts, task) if rp is not None and ti == 0 else None
        if best is None:
            best = _earliest(cy, job, parts, policy)
            if rp is not None and best is not None:
                rp.placed(task, job, best.partition, best.duration, best.start, best.timelines, False)
        if best is not None and best.start == now:
            _start(cy, decision, job, task, tasks, ti, best, policy.reserved or bool(decision.reservations), rp)
            if cy.limit_use is not None:
                cy.limit_use.add(job, cy.request(job, best.partition), best.limit)
            running_tasks += 1
            continue
        decision.pending[jid] = _blocked(cy, decision, job, parts, task, best, policy, failed,
                                         Pending(_RESOURCES, rank=rank, priority=prio), rp)
        return


def _kept(cy: Cycle, rp: Replan, job: Job, parts: Sequence[str], task: int | None) -> _Place | None:
    """The last plan's placement, where the search would find it again (its search object only books it)."""
    kept = rp.reuse(job, parts, task)
    if kept is None:
        return None
    t, tls, part, limit = kept
    req = cy.request(job, part)
    d = limit if limit else UNLIMITED_DURATION
    s = ShapeSearch(tls, req.cpus, req.mem, req.gpus, req.gpu_type, req.whole_cpus, req.whole_mem,
                    req.whole_gpus, d, req.nnodes, cy.now, t, seed=[])
    rp.placed(task, job, part, d, t, tls, True)
    return _Place(t, tls, part, limit, s)


def _tasks_of(state: State, job: Job) -> tuple[list[int | None], int]:
    """What of the job may start (its pending array tasks, else itself) and how many of its tasks run."""
    if job.array_pending is None:
        return [None], 0
    return list(job.array_pending), sum(1 for t in state.array_tasks.get(job.job_id, ())
                                        if state.jobs[t].state == RUNNING)


def _blocked(cy: Cycle, decision: Decision, job: Job, parts: Sequence[str], task: int | None, best: _Place | None,
             policy: Policy, failed: _Failed, pend: Pending, rp: Replan | None = None) -> Pending:
    """A job that cannot start now: preempt for it where it may, say Resources (the first blocked in its
    partitions) or Priority, and reserve its earliest start where the policy books one."""
    jid = job.job_id
    if cy.preempter is not None and cy.focus is None and cy.preempter.may_preempt(job):
        _preempt(cy, decision, job, parts)
    if parts[0] in failed.parts or (len(parts) > 1 and not failed.parts.isdisjoint(parts)):
        pend.why = _PRIORITY
    else:
        if failed.nodes and all(_left(cy, p, failed.nodes) < cy.request(job, p).nnodes for p in parts):
            pend.why = _HIGHER_PARTS
        failed.parts.update(parts)
        for p in parts:
            failed.nodes.update(n.name for n in cy.part_nodes.get(p, ()))
    if policy.blocked(parts, best.start if best is not None else None, jid) and best is not None:
        if cy.params.reserve == "nodes" and best.start > cy.now:
            best = _first_nodes(cy, job, best)
        # the focus job is the last walked: nothing is placed after it, its nodes need no booking
        pend.start = _reserve(decision, jid, task, best, book=cy.focus != jid and policy.book,
                              whole=cy.params.reserve == "nodes", rp=rp).start
    if cy.explain and cy.focus in (None, jid):
        _explain_pending(cy, job, parts, pend, decision.reservations.get(jid))
    return pend


def _left(cy: Cycle, part: str, failed_nodes: set[str]) -> int:
    """How many of ``part``'s usable nodes are not set aside for blocked jobs of other partitions."""
    return sum(1 for n in cy.part_nodes.get(part, ()) if n.usable and n.name not in failed_nodes)


def _not_tested(decision: Decision, ready: list, first: int) -> None:
    """The jobs ranked ``first`` and after, beyond ``bf_max_job_test``: ranked, not tested (their
    :class:`Pending` is made when asked: :meth:`Decision.pending_of`)."""
    ids = [r[1].job_id for r in ready[first - 1:]]
    decision.order.extend(ids)
    decision.untested = dict(zip(ids, count(first)))


def _preempt(cy: Cycle, decision: Decision, job: Job, parts: Sequence[str]) -> None:
    """Preempt what lets ``job`` start soonest in the first of its partitions where it can (rota.core.preempt);
    it starts in a later cycle, once its victims have stopped."""
    assert cy.preempter is not None
    for pname in parts:
        limit = effective_time_limit(job.time_limit, cy.parts[pname])
        tls, _ = cy.eligible(job.spec, pname)
        chosen = cy.preempter.choose(job, cy.request(job, pname), tls, limit or UNLIMITED_DURATION)
        if chosen is not None:
            if chosen.victims:
                decision.preemptions.append(chosen)
            return


@dataclass(slots=True)
class _Place:
    """Where and when a job could start: the earliest over its partitions."""

    start: int
    timelines: list[Timeline]
    partition: str
    limit: int                       # its effective time limit there (0 = UNLIMITED)
    search: ShapeSearch
    shared_gpu: int | None = None    # a --gres=shard job put beside others on this already shared GPU

    @property
    def duration(self) -> int:
        return self.limit if self.limit else UNLIMITED_DURATION


def _earliest(cy: Cycle, job: Job, parts: Sequence[str], policy: Policy) -> _Place | None:
    """The earliest start within the policy's horizon over the partitions it may try (None: none); a shard job
    goes beside others on a GPU already shared where one has room now."""
    horizon = policy.horizon()
    if job.spec.shards_per_node:
        packed = _beside(cy, job, parts, policy, horizon)
        if packed is not None:
            return packed
    best: _Place | None = None
    for pname in parts:
        limit = effective_time_limit(job.time_limit, cy.parts[pname])
        d = limit if limit else UNLIMITED_DURATION
        if not policy.may_try(pname, d):
            continue
        s = cy.search(job, pname, d, horizon)
        found = s.find()
        if found is not None and (best is None or found[0] < best.start):
            best = _Place(found[0], found[1], pname, limit, s)
    return best


def _beside(cy: Cycle, job: Job, parts: Sequence[str], policy: Policy, horizon: int) -> _Place | None:
    """A one-node shard job's place now beside other shard jobs: a shared GPU with room for its shards, on a node
    whose CPUs and memory it fits (it takes no GPU of its own, so nothing any plan holds)."""
    n = job.spec.shards_per_node
    for pname in parts:
        limit = effective_time_limit(job.time_limit, cy.parts[pname])
        d = limit if limit else UNLIMITED_DURATION
        req = cy.request(job, pname)
        if req.nnodes != 1 or not policy.may_try(pname, d):
            continue
        tls, _ = cy.eligible(job.spec, pname)
        s = cy.search(job, pname, d, horizon)
        for tl in tls:
            g = cy.shared_gpu(tl, n, req.gpu_type, cy.now + d)
            c, m, _g = s.request_on(tl)
            if g is not None and tl.fits_at(c, m, 0, tl.gpu_array(None), d, cy.now):
                return _Place(cy.now, [tl], pname, limit, s, shared_gpu=g)
    return None


def _first_nodes(cy: Cycle, job: Job, place: _Place) -> _Place:
    """Under Slurm's whole-node reservations, the nodes Slurm's backfill plans a job on: of all the nodes free for
    it at its start, the lightest by weight, then first in the configuration (not the first to become free)."""
    s, t, d = place.search, place.start, place.duration
    tls, _ = cy.eligible(job.spec, place.partition)
    fit = []
    for tl in tls:
        c, m, g = s.request_on(tl)
        if tl.fits_at(c, m, g, tl.gpu_array(s.gtype), d, t):
            fit.append(tl)
    fit.sort(key=lambda tl: (tl.weight, tl.idx))
    return replace(place, timelines=fit[:len(place.timelines)]) if len(fit) >= len(place.timelines) else place


def _reserve(decision: Decision, job_id: int, task: int | None, place: _Place, book: bool = True,
             whole: bool = False, rp: Replan | None = None) -> Reservation:
    """Hold ``place`` for the job: later jobs are placed around it (``book``: on its nodes' timelines; ``whole``:
    its nodes whole, as Slurm's backfill does, else only what it needs there)."""
    t, d, s = place.start, place.duration, place.search
    resv = Reservation(job_id, t, t + d, tuple(tl.name for tl in place.timelines), place.partition, task)
    if book:
        for tl in place.timelines:
            if whole:
                tl.hold(t, t + d, job_id)
                continue
            c, m, g = s.request_on(tl)
            tl.reserve(t, t + d, c, m, g, s.gtype, job_id, "resv")
        s.placed(t)
        if rp is not None:
            rp.booked(t, t + d, resv.nodes, whole)
    decision.reservations[job_id] = resv
    return resv


def _start(cy: Cycle, decision: Decision, job: Job, task: int | None, tasks: list, ti: int, place: _Place,
           backfilled: bool, rp: Replan | None = None) -> None:
    now = cy.now
    tls, pname, limit, s = place.timelines, place.partition, place.limit, place.search
    if task is None:
        run_id = job.job_id
    elif ti == len(tasks) - 1:
        run_id = job.job_id          # the last pending task keeps the array's own id
    else:
        run_id = cy.next_id
        cy.next_id += 1
    d = limit if limit else UNLIMITED_DURATION
    allocs = []
    shards = job.spec.shards_per_node
    for tl in tls:
        c, m, g = s.request_on(tl)
        if place.shared_gpu is not None:          # beside other shard jobs: their GPU, held as long as it must be
            cy.share(tl, place.shared_gpu, shards, now + d, s.gtype, run_id)
            allocs.append(ev.NodeAlloc(node=tl.name, cpus=c, mem=m, gpus=(place.shared_gpu,), shards=shards))
            tl.reserve(now, now + d, c, m, 0, s.gtype, run_id, "start")
            continue
        gpus = cy.pick_gpus(tl.name, g, s.gtype, run_id) if g else ()
        if shards:                                 # a GPU of its own to share from now on
            cy.share(tl, gpus[0], shards, now + d, s.gtype, run_id, fresh=True)
        allocs.append(ev.NodeAlloc(node=tl.name, cpus=c, mem=m, gpus=gpus, shards=shards))
        tl.reserve(now, now + d, c, m, g, s.gtype, run_id, "start")
    s.placed(now)
    if rp is not None:
        rp.booked(now, now + d, tuple(tl.name for tl in tls), False)
    decision.starts.append(ev.Start(
        job_id=run_id, array_job_id=job.job_id if task is not None else None, array_task_id=task,
        partition=pname, alloc=tuple(allocs), time_limit=limit, backfilled=backfilled))
    if backfilled and cy.explain:
        names = {tl.name for tl in tls}
        decision.checked[run_id] = tuple(r.job_id for r in decision.reservations.values()
                                         if names.intersection(r.nodes))


def _explain_pending(cy: Cycle, job: Job, parts: Sequence[str], pend: Pending,
                     resv: Reservation | None) -> None:
    """Fill in the numbers: what is free now versus what the job needs, and who holds it."""
    pname = parts[0]
    req = cy.request(job, pname)
    tls, _ = cy.eligible(job.spec, pname)
    now = cy.now
    best_free, most = (0, 0, 0), (-1, 0, 0)     # the node with the most GPUs free now (then CPUs, memory)
    fit = 0            # nodes that could hold one node's share now (after what higher-ranked jobs hold)
    on_node, gpu_type = req.on_node, req.gpu_type
    fixed = None if req.whole_cpus or req.whole_mem or req.whole_gpus else (req.cpus, req.mem, req.gpus)
    for tl in tls:     # a cycle's timelines start now: their first segment is what is free now
        fc, fm, fg = tl.fc[0], tl.fm[0], tl.fg[0]
        if fg >= most[0] and (fg, fc, fm) > most:
            most, best_free = (fg, fc, fm), (fc, fm, fg)
        c, m, g = fixed or on_node(tl.cap_c, tl.cap_m, tl.cap_g)
        fit += fc >= c and fm >= m and tl.gpu_array(gpu_type)[0] >= g
    pend.why = replace(pend.why, needs=shared_value(Amounts(req.nnodes, req.cpus, req.mem, req.gpus, req.gpu_type,
                                                            req.whole_cpus)),
                       free=shared_value(Amounts(fit, *best_free)), limit=len(tls))
    until = pend.start if pend.start is not None else INF
    blockers: set[int] = set()
    ahead: set[int] = set()
    decisive: set[int] = set()   # those whose end is its expected start: what it really waits for
    if resv is not None:   # only what stands on the nodes it is waiting for
        tls = [cy.timelines[n] for n in resv.nodes]
    me = job.job_id
    for tl in tls:
        for (s, e, jid, kind) in tl.items or ():
            if jid == me or s >= until or e <= now:
                continue
            if e == until:
                decisive.add(jid)
            (ahead if kind == "resv" else blockers).add(jid)
    pend.blockers = tuple(sorted(blockers))
    pend.ahead = tuple(sorted(ahead))
    pend.decisive = tuple(sorted(decisive))
