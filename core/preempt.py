"""Preemption by QOS (``PreemptType=preempt/qos``; pure): which running jobs a pending job that cannot
start may stop to start sooner.

A job may preempt running jobs whose QOS is in its own QOS's ``Preempt`` list and whose preempt mode
(the QOS's PreemptMode, else the cluster's) is not OFF. The victims are chosen deterministically, and
the log keeps them with every candidate they were chosen from:

1. on each node the job could use, candidates are tried in order (the lowest QOS priority first, then
   the youngest run, then the highest job id) until, with what is free there over the job's whole time
   limit, the node can hold the job's share;
2. the job's nodes are those needing the fewest new victims (then the lowest QOS priority among them,
   then the node's order in the configuration);
3. runs already preempted for this job (still in their grace time) count as freed and cost nothing, so
   a later cycle does not preempt more for it; runs preempted for another job are not candidates.
"""
from __future__ import annotations

from bisect import bisect_right

from . import events as ev
from .profile import INF, Timeline
from .request import NodeRequest
from .state import Job, Node, State

_VictimOrder = tuple[int, int, int]


class Preempter:
    """What one cycle needs to choose victims: the preemptable running jobs, per node, in the order tried."""

    __slots__ = ("state", "now", "modes", "qos_prio", "by_node", "taken")

    def __init__(self, state: State, now: int) -> None:
        cfg = state.config
        assert cfg is not None
        self.state, self.now = state, now
        self.qos_prio = {q.name: q.priority for q in cfg.qos} | {q.name: q.priority for q in state.qos.values()}
        self.modes: dict[str, str] = {}
        for q in state.qos.values():
            mode = q.preempt_mode if q.preempt_mode != "cluster" else cfg.preempt_mode
            self.modes[q.name] = mode
        self.modes.setdefault("normal", cfg.preempt_mode)
        self.by_node: dict[str, list[Job]] = {}
        jobs = state.jobs
        for jid in state.running:
            job = jobs[jid]
            for a in job.alloc:
                self.by_node.setdefault(a.node, []).append(job)
        for victims in self.by_node.values():
            victims.sort(key=self._order)
        self.taken: set[int] = set()        # chosen this cycle for some job

    def _order(self, job: Job) -> _VictimOrder:
        return (self.qos_prio.get(job.spec.qos, 0), -job.start_time, -job.job_id)

    def may_preempt(self, job: Job) -> tuple[str, ...]:
        """The QOS whose jobs ``job`` may preempt (empty: none)."""
        q = self.state.qos.get(job.spec.qos)
        return q.preempt if q is not None else ()

    def choose(self, job: Job, req: NodeRequest, timelines: list[Timeline], duration: int
               ) -> ev.Preemption | None:
        """The preemption that lets ``job`` (``req`` per node, for ``duration`` seconds) start now on
        ``timelines``; one without victims when those already preempted for it are enough; None when
        no choice of candidates would do."""
        allowed = set(self.may_preempt(job))
        nodes = self.state.nodes
        options: list[tuple[tuple, Timeline, list[Job]]] = []
        candidates: list[int] = []
        for tl in timelines:
            node = nodes[tl.name]
            pool = [v for v in self.by_node.get(tl.name, ())
                    if v.spec.qos in allowed and self.modes.get(v.spec.qos, "off") != "off"
                    and v.job_id != job.job_id and v.cancel_by is None
                    and (v.preempted_by is None or v.preempted_by == job.job_id) and v.job_id not in self.taken]
            candidates.extend(v.job_id for v in pool if v.job_id not in candidates)
            pool.sort(key=lambda v: (v.preempted_by != job.job_id, self._order(v)))
            picked = _pick(tl, node, req, pool, self.now, duration)
            if picked is None:
                continue
            new = [v for v in picked if v.preempted_by != job.job_id]
            cost = (len(new), max((self.qos_prio.get(v.spec.qos, 0) for v in new), default=-(1 << 62)), node.index)
            options.append((cost, tl, picked))
        if len(options) < req.nnodes:
            return None
        options.sort(key=lambda o: o[0])
        victims: dict[int, Job] = {}
        for _cost, _tl, picked in options[: req.nnodes]:
            for v in picked:
                victims[v.job_id] = v
        new = [v for v in victims.values() if v.preempted_by != job.job_id]
        self.taken.update(victims)
        if not new:
            return ev.Preemption(by=job.job_id, victims=())
        qos = self.state.qos
        out = []
        for v in sorted(new, key=lambda v: v.job_id):
            mode = self.modes.get(v.spec.qos, "cancel")
            grace = qos[v.spec.qos].grace_time if v.spec.qos in qos else 0
            out.append(ev.Victim(job_id=v.job_id, restarts=v.restarts, mode="requeue" if mode == "requeue" else "cancel",
                                 grace=grace))
        return ev.Preemption(by=job.job_id, victims=tuple(out), candidates=tuple(candidates[:64]))


def _pick(tl: Timeline, node: Node, req: NodeRequest, pool: list[Job], now: int, duration: int) -> list[Job] | None:
    """The fewest of ``pool`` (taken in order) whose stop lets the node hold one node's share of ``req`` from
    ``now`` for ``duration`` ([] when it fits already), or None when even all of them would not."""
    c, m, g = req.on_node(tl.cap_c, tl.cap_m, tl.cap_g)
    garr = tl.gpu_array(req.gpu_type)
    freed: list[tuple[int, int, int, int]] = []     # (end on the timeline, CPUs, MiB, GPUs)
    picked: list[Job] = []
    if _fits(tl, garr, c, m, g, now, duration, freed):
        return picked
    for v in pool:
        here = next(a for a in v.alloc if a.node == tl.name)
        gpus = len(here.gpus) if req.gpu_type is None else \
            sum(1 for i in here.gpus if 0 <= i < len(node.gpu_types) and node.gpu_types[i] == req.gpu_type)
        end = v.start_time + v.time_limit if v.time_limit else INF
        freed.append((max(end, now + 1), here.cpus, here.mem, gpus))
        picked.append(v)
        if _fits(tl, garr, c, m, g, now, duration, freed):
            return picked
    return None


def _fits(tl: Timeline, garr: list[int], c: int, m: int, g: int, now: int, duration: int,
          freed: list[tuple[int, int, int, int]]) -> bool:
    """Whether [now, now + duration) holds c CPUs, m MiB and g GPUs once the ``freed`` runs stop now (each
    still counted by the timeline until its own end)."""
    times, fc, fm = tl.times, tl.fc, tl.fm
    i = bisect_right(times, now) - 1
    end = now + duration
    n = len(times)
    while True:
        t = max(times[i], now)
        xc = xm = xg = 0
        for v_end, vc, vm, vg in freed:
            if v_end > t:
                xc += vc
                xm += vm
                xg += vg
        if fc[i] + xc < c or fm[i] + xm < m or garr[i] + xg < g:
            return False
        i += 1
        if i >= n or times[i] >= end:
            return True
