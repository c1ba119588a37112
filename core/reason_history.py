"""Every job's reason history (pure): the intervals of its pending reasons, kept while the log is
folded, for the projection (``sacct -o Reason``, ``rota history``).

The scheduler is re-run at the moments :func:`rota.core.timetravel.why` evaluates a job (every
recorded cycle, from the state just before it; every change of the state between them that could
matter to the job; its begin time), once for all pending jobs; a job's interval changes when its
reason code does. So the history is what ``why`` derives for each job, interval for interval, by
construction (and tested against it).
"""
from __future__ import annotations

from dataclasses import dataclass
from heapq import heappush
from typing import Callable, Iterable, Iterator

from . import events as ev
from .changes import NOTHING, Changes
from .schedule import Decision, schedule
from .state import PENDING, State
from .timetravel import Moments


@dataclass(slots=True)
class Span:
    """One interval of a job's wait with one reason code: from ``start`` (derived after log sequence
    ``seq``) to ``end`` (None: still open)."""

    job_id: int
    code: str
    start: int
    seq: int
    end: int | None = None


class ReasonHistory:
    """Folds envelopes into a state as :func:`rota.core.apply.fold` does, keeping each job's spans."""

    def __init__(self, give_way: Callable[[], None] | None = None) -> None:
        self.give_way = give_way             # passed to each scheduler run (see rota.core.schedule.schedule)
        self.moments = Moments(None)
        self.open: dict[int, Span] = {}
        self.touched: list[Span] = []        # spans opened or closed since the last :meth:`take`
        # idle nodes the latest evaluation kept for pending jobs (Slurm's PLANNED)
        self.planned: tuple[str, ...] = ()

    def fold(self, st: State, envelopes: Iterable[ev.Envelope], changes: Changes = NOTHING) -> None:
        """Apply ``envelopes`` to ``st`` (noting into ``changes``), evaluating at every moment. The last
        run of events with one timestamp stays open until :meth:`settle` or a later event."""
        for env, now in self.moments.walk(envelopes, st, None, settle=False):
            self._step(st, env, now, changes)

    def settle(self, st: State, until: int | None = None) -> None:
        """No more events with the last timestamp will come (the log ends there, or the clock has passed
        it): evaluate the moments left, up to ``until``."""
        for env, now in self.moments.settle(st, until):
            self._step(st, env, now, NOTHING)

    def resume(self, st: State, open_spans: list[Span]) -> None:
        """Go on from a stored state and the spans still open in it (a projection restarting): the
        next moment evaluates every pending job."""
        self.open = {s.job_id: s for s in open_spans}
        moments = self.moments
        moments.changed = True
        for jid in st.pending:
            begin = st.jobs[jid].spec.begin
            if begin is not None and begin > st.now:
                heappush(moments.begins, (begin, jid))

    def take(self) -> list[Span]:
        """The spans opened or closed since the last call (each once, as it now is)."""
        out = list({id(s): s for s in self.touched}.values())
        self.touched = []
        return out

    def _step(self, st: State, env: ev.Envelope, now: int | None, changes: Changes) -> None:
        if now is not None:
            if st.pending:
                self._moment(st, env.seq, now)
            return
        e = env.event
        if isinstance(e, ev.JobsStarted):
            started = {s.array_job_id or s.job_id for s in e.starts}
            if any(jid not in started for jid in st.pending):   # some stay pending: what did it say of them?
                self._record(st, schedule(st, e.now, e.policy, kept_shadow=e.shadow,
                                                 give_way=self.give_way), e.now, st.seq + 1, None)
        self.moments.apply(st, env, changes if changes is not NOTHING else None)
        if not st.pending:
            self.planned = ()
        if isinstance(e, ev.JobsStarted):
            for s in e.starts:
                for jid in (s.job_id, s.array_job_id):
                    if jid is not None:
                        self._close_if_not_pending(st, jid, e.now)
        else:
            jid = getattr(e, "job_id", None)
            if isinstance(jid, int):
                self._close_if_not_pending(st, jid, env.ts)

    def _moment(self, st: State, seq: int, now: int) -> None:
        """Evaluate at a moment between recorded cycles, for the jobs it concerns (after submits only:
        the new jobs and those they outrank; at a begin time: the jobs it is theirs)."""
        d = schedule(st, now, give_way=self.give_way)
        moments = self.moments
        counts = None if moments.begun is None and moments.only_submitted is None else moments.counting(d.order)
        self._record(st, d, now, seq, counts)

    def _record(self, st: State, d: Decision, now: int, seq: int, counts: Callable[[int], bool] | None) -> None:
        self.planned = planned_nodes(st, d)
        for jid in st.pending:
            if counts is not None and not counts(jid):
                continue          # this moment cannot change what is said of it
            p = d.pending_of(jid)
            if p is None:
                continue          # it would start now
            span = self.open.get(jid)
            if span is not None and span.code == p.reason:
                continue
            if span is not None:
                span.end = now
                self.touched.append(span)
            span = self.open[jid] = Span(jid, p.reason, now, seq)
            self.touched.append(span)

    def _close_if_not_pending(self, st: State, jid: int, when: int) -> None:
        span = self.open.get(jid)
        job = st.jobs.get(jid)
        if span is not None and (job is None or job.state != PENDING):
            job_start = job.start_time if job is not None and job.start_time else None
            span.end = job_start if job_start is not None and job_start >= span.start else when
            del self.open[jid]
            self.touched.append(span)


def planned_nodes(st: State, d: Decision) -> tuple[str, ...]:
    """The idle nodes ``d`` keeps for pending jobs: Slurm 22.05's PLANNED (sinfo's ``planned``; Slurm flags only
    nodes no job holds any of)."""
    names = {n for r in d.reservations.values() for n in r.nodes}
    return tuple(sorted(n for n in names if n in st.nodes and not st.nodes[n].jobs))


def spans_of(envelopes: Iterable[ev.Envelope], job_id: int) -> Iterator[Span]:
    """One job's spans over a whole log (what the projection keeps for it), the open one ended at the
    log's last time."""
    st = State()
    hist = ReasonHistory()
    hist.fold(st, envelopes)
    hist.settle(st)
    mine: dict[tuple[int, int], Span] = {}
    for s in hist.take():
        if s.job_id == job_id:
            mine[(s.start, s.seq)] = s
    for s in sorted(mine.values(), key=lambda s: (s.start, s.seq)):
        if s.end is None:
            s.end = st.now
        yield s
