"""Incremental conservative planning (pure): a cycle re-plans only what changed since the last one.

A conservative cycle places every ranked job, in order, at its earliest start on node timelines that carry
the reservations of the jobs before it. A :class:`PlanMemory`, kept by the caller between cycles, holds what
the last walk saw: each node's timeline before any reservation, the rank order, and for each job where it
was placed and what it booked.

The next walk keeps a set of *dirty* nodes: those whose timeline may differ from the last walk's at the same
point of the order. It starts with the nodes whose timeline changed (a job ended, started or was requeued, a
node changed), and grows with the nodes of every job booked differently from last time, and of every job
walked last time that is not (yet) walked at that point now (it left the queue or moved in the order). Every
other node holds exactly what it held at that point of the last walk.

A one-node job keeps its last placement ``(t, node)``, without a search, when its shape and time limit are
unchanged, ``t`` is still in the future, neither its node nor anything it booked is dirty, and no dirty node
could start it by ``t``: the clean nodes offer it what they offered last time, and the dirty ones nothing
better, so the search would find the same node at the same time. Anything else is searched as in a full
cycle. Once too many nodes are dirty, checking them costs more than searching, and the rest of the walk
searches. The decision is the full plan's, which the property tests check cycle after cycle.
"""
from __future__ import annotations

from bisect import bisect_right
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from .profile import UNLIMITED_DURATION, Timeline
from .request import effective_time_limit

if TYPE_CHECKING:
    from .cycle import Cycle
    from .request import NodeRequest
    from .state import Job

# (start, end, node names, whole nodes held)
Booking = tuple[int, int, tuple[str, ...], bool]
# a job the walk placed: (its place in the walk's order of placed jobs, then where its first search put it: array
# task, spec, request, partition, duration, start, nodes; then what it booked, None for just that place)
Record = tuple[int, Any, Any, Any, str, int, int, tuple[str, ...], "tuple[Booking, ...] | None"]

DIRTY_SHARE = 8        # past 1/8 of the nodes dirty (and more than DIRTY_MIN), checking them costs more than a search
DIRTY_MIN = 16
TRIAL, KEPT_SHARE = 64, 2        # past TRIAL checks, keeping fewer than 1 in KEPT_SHARE stops checking


class PlanMemory:
    """What the last conservative cycle planned, kept by its caller for the next (one per state it follows)."""

    __slots__ = ("now", "config", "horizon", "nodes", "order", "records", "reused", "searched")

    def __init__(self) -> None:
        self.config: Any = None
        self.now = 0
        self.horizon = 0                       # the backfill window's length
        self.nodes: dict[str, tuple] = {}      # node -> (identity, times, CPUs, MiB, GPUs, GPUs by type)
        self.order: list[int] = []             # the jobs placed, in the walk's order
        self.records: dict[int, Record] = {}
        self.reused = 0                        # the last cycle's placements kept, and searched
        self.searched = 0


def _bookings(rec: Record) -> tuple[Booking, ...]:
    """What a placed job booked."""
    if rec[8] is not None:
        return rec[8]
    t, d, names = rec[6], rec[5], rec[7]
    return ((t, t + d, names, False),)


def _booked_nodes(rec: Record) -> Iterable[tuple[str, ...]]:
    """The nodes of each of a placed job's bookings."""
    return (rec[7],) if rec[8] is None else (b[2] for b in rec[8])


def _node_view(cy: Cycle, tl: Timeline) -> tuple:
    node = cy.state.nodes[tl.name]
    ident = (tl.idx, tl.weight, tl.cap_c, tl.cap_m, tl.cap_g, node.features, node.gpu_types, node.shards_per_gpu)
    fgt = None if tl.fgt is None else {t: a.copy() for t, a in tl.fgt.items()}
    return ident, tl.times.copy(), tl.fc.copy(), tl.fm.copy(), tl.fg.copy(), fgt


def _same_from(old: tuple, new: tuple, now: int) -> bool:
    """Whether a node's timeline as the last cycle built it, read from ``now`` on, is the one built now."""
    ident, times, fc, fm, fg, fgt = old
    nident, ntimes, nfc, nfm, nfg, nfgt = new
    i = bisect_right(times, now) - 1
    if ident != nident or i < 0 or len(times) - i != len(ntimes) or times[i + 1:] != ntimes[1:]:
        return False
    if fc[i:] != nfc or fm[i:] != nfm or fg[i:] != nfg:
        return False
    if fgt is None or nfgt is None:
        return fgt is nfgt
    return fgt.keys() == nfgt.keys() and all(fgt[t][i:] == nfgt[t] for t in fgt)


class Replan:
    """One conservative walk's use of a :class:`PlanMemory`: the dirty nodes, the old placements still valid,
    and what this walk leaves for the next."""

    def __init__(self, memory: PlanMemory, cy: Cycle, horizon: int) -> None:
        self.memory, self.cy, self.now = memory, cy, cy.now
        self.views = {name: _node_view(cy, tl) for name, tl in cy.timelines.items()}
        old = memory
        self.on = old.config is cy.cfg and old.horizon == horizon and old.now <= cy.now and bool(old.records)
        self.horizon = horizon
        self.old_order, self.old_records = old.order, old.records
        self.limit = max(DIRTY_MIN, len(cy.timelines) // DIRTY_SHARE)
        self.dirty: set[str] = set()
        if self.on:
            for name in old.nodes.keys() | self.views.keys():
                o, n = old.nodes.get(name), self.views.get(name)
                if o is None or n is None or not _same_from(o, n, cy.now):
                    self.dirty.add(name)
            self._check_limit()
        self.frontier = 0
        self.aligned = False                 # the job being walked is at its place in the last order
        self.order: list[int] = []
        self.records: dict[int, Record] = {}
        self.found: tuple | None = None       # (task, spec, request, partition, duration, start, nodes)
        self.bookings: list[Booking] = []
        self.reused = self.searched = self.tried = 0

    def _check_limit(self) -> None:
        if len(self.dirty) > self.limit:
            self.on = False

    def _dirty(self, names: Iterable[str]) -> None:
        self.dirty.update(names)
        self._check_limit()

    def enter(self, job_id: int) -> None:
        """The walk takes ``job_id`` next: the jobs the last walk placed before it and this one has not are
        missing from the timelines here, so their nodes are dirty."""
        self.found, self.bookings, self.aligned = None, [], False
        if not self.on:
            return
        records = self.old_records
        rec = records.get(job_id)
        if rec is None or rec[0] < self.frontier:
            return
        self.aligned = True
        order = self.old_order
        for k in range(self.frontier, rec[0]):
            for names in _booked_nodes(records[order[k]]):
                self._dirty(names)
        self.frontier = rec[0] + 1

    def reuse(self, job: Job, parts: Sequence[str], task: int | None) -> tuple[int, list[Timeline], str, int] | None:
        """The job's last placement ``(start, timelines, partition, limit)`` when a search would find it again;
        None: search."""
        if not (self.on and self.aligned) or len(parts) != 1 or job.spec.shards_per_node:
            return None
        rec = self.old_records.get(job.job_id)
        if rec is None:
            return None
        _rank, rtask, spec, req, part, d, t, names, _bookings = rec
        cy = self.cy
        if rtask != task or spec is not job.spec or part != parts[0] or t <= cy.now or req.nnodes != 1:
            return None
        limit = effective_time_limit(job.time_limit, cy.parts[part])
        if (limit or UNLIMITED_DURATION) != d or cy.request(job, part) != req:
            return None
        dirty = self.dirty
        self.tried += 1
        if any(n in dirty for booked in _booked_nodes(rec) for n in booked) or \
                (dirty and self._offers(job, part, req, d, t)):
            if self.tried >= TRIAL and self.reused * KEPT_SHARE < self.tried:
                self.on = False          # most of the plan moved: checking costs more than it saves
            return None
        return t, [cy.timelines[n] for n in names], part, limit

    def _offers(self, job: Job, part: str, req: NodeRequest, d: int, t: int) -> bool:
        """Whether a dirty node could start a job of this shape by ``t``."""
        cy = self.cy
        eligible = cy.eligible_names(job.spec, part)
        for name in self.dirty:
            if name not in eligible:
                continue
            tl = cy.timelines[name]
            c, m, g = req.on_node(tl.cap_c, tl.cap_m, tl.cap_g)
            if c <= tl.cap_c and m <= tl.cap_m and g <= tl.cap_g and \
                    tl.earliest(c, m, g, tl.gpu_array(req.gpu_type), d, cy.now, t) >= 0:
                return True
        return False

    def placed(self, task: int | None, job: Job, part: str, d: int, t: int, tls: Sequence[Timeline],
               reused: bool) -> None:
        """Where the walk's search (or the last plan) put the job's task (kept for the next cycle when it is the
        job's first: a later task's place depends on what the earlier ones took)."""
        if self.found is None and not self.bookings:
            self.found = (task, job.spec, self.cy.request(job, part), part, d, t, tuple(tl.name for tl in tls))
        if reused:
            self.reused += 1
        else:
            self.searched += 1

    def booked(self, start: int, end: int, names: tuple[str, ...], whole: bool) -> None:
        self.bookings.append((start, end, names, whole))

    def leave(self, job: Job) -> None:
        """The walk is done with the job: a booking unlike the last walk's makes its nodes dirty."""
        found, bookings = self.found, tuple(self.bookings)
        if found is not None:
            t, d, names = found[5], found[4], found[6]
            plain = len(bookings) == 1 and bookings[0] == (t, t + d, names, False)
            self.records[job.job_id] = (len(self.order), *found, None if plain else bookings)
            self.order.append(job.job_id)
        if not self.on:
            return
        rec = self.old_records.get(job.job_id) if self.aligned else None
        if rec is not None and _bookings(rec) == bookings and not job.spec.shards_per_node:
            return
        if rec is not None:
            for names in _booked_nodes(rec):
                self._dirty(names)
        for b in bookings:
            self._dirty(b[2])

    def commit(self) -> None:
        """Leave this walk in the memory for the next cycle."""
        m = self.memory
        m.config, m.now, m.horizon, m.nodes = self.cy.cfg, self.now, self.horizon, self.views
        m.order, m.records = self.order, self.records
        m.reused, m.searched = self.reused, self.searched
