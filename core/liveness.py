"""Liveness over a log (pure): no job waits while the scheduler would start it.

Re-running recorded cycles proves that every start in the log is the one the scheduler makes; it
cannot see a start that never happened. The scheduler is a pure function of (state, now) and the
state only changes at events, so at every change of the state (and every begin time reached) the
decision the controller owed can be re-derived: each job the scheduler would start then must start
(or stop being startable: cancelled, held, overtaken) within the cycle latency the controller
promises, else it is reported as "could have started at T but waited until T2".
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from . import events as ev
from .request import node_request, partition_shape
from .cycle import NodeBases
from .schedule import schedule
from .state import State
from .timetravel import Moments, check_cycle

DEFAULT_LATENCY = 10   # seconds: the controller cycles within its 5 s interval of any change, with margin


@dataclass(frozen=True)
class Late:
    """A job that could have started at ``could_start`` (after log sequence ``seq``) but did not within
    the latency: it started at ``waited_until`` (``outcome`` "started"), or stopped being startable
    then, or was still pending when the log ends."""

    job_id: int
    could_start: int
    seq: int
    waited_until: int
    outcome: str

    def text(self) -> str:
        """The finding in one line."""
        how = {"started": "started", "gone": "stopped being startable",
               "end": "was still pending at the end of the log"}[self.outcome]
        return (f"job {self.job_id} could have started at t={self.could_start} (after log sequence {self.seq}) "
                f"but waited until t={self.waited_until} ({self.waited_until - self.could_start} s), when it {how}")


def anything_fits_now(state: State) -> bool:
    """A cheap necessary condition for a cycle to start something: some unheld pending job's per-node
    request fits in what is free now on enough usable nodes of one of its partitions (node filters
    and GPU types are ignored, so it may say yes when a cycle starts nothing, never no when it would)."""
    cfg = state.config
    if cfg is None or not state.pending:
        return False
    default = cfg.default_partition()
    default_parts = (default.name,) if default is not None else ()
    members = {p.name: p.nodes for p in cfg.partitions}
    seen: set[tuple] = set()
    for jid in state.pending:
        job = state.jobs[jid]
        if job.hold is not None:
            continue
        for pname in job.spec.partitions or default_parts:
            nodes = state.part_nodes.get(pname)
            if nodes is None:
                nodes = [state.nodes[n] for n in members.get(pname, ()) if n in state.nodes]
            shape = state.part_shapes.get(pname) or partition_shape(nodes)
            req = job.req if job.req is not None and pname == job.partition else node_request(job.spec, shape)
            if (pname, req) in seen:
                continue
            seen.add((pname, req))
            fits = 0
            for n in nodes:
                if n.usable and n.cpus - n.alloc_cpus >= (n.cpus if req.whole_cpus else req.cpus) \
                        and n.memory - n.alloc_mem >= (n.memory if req.whole_mem else req.mem) \
                        and n.free_gpus >= (n.gpu_count if req.whole_gpus else req.gpus):
                    fits += 1
                    if fits >= req.nnodes:
                        return True
    return False


def would_start(state: State, now: int, bases: NodeBases | None = None) -> tuple[int, ...]:
    """The jobs (arrays by their own id) a cycle under the configured policy would start at ``now``
    (``bases``: the nodes' timeline inputs kept along a walk)."""
    if not anything_fits_now(state):
        return ()
    d = schedule(state, now, bases=bases)
    return tuple(sorted({s.array_job_id or s.job_id for s in d.starts}))


def startable(envelopes: Iterable[ev.Envelope], to_seq: int | None = None, pick: Any = None
              ) -> dict[tuple[int, int], tuple[int, ...]]:
    """:func:`would_start` at every moment :func:`late_starts` looks at (the ``k``-th only when
    ``pick(k)``), keyed by (log sequence, moment): the expensive part, to be shared out."""
    return checked_and_startable(envelopes, to_seq=to_seq, pick=pick, cycles=False)[1]


@dataclass(slots=True)
class Walked:
    """What :func:`late_from` reads of a walk of the log, so that it need not walk it again: in log order, each
    moment as (log sequence, moment, None, allowance) and each recorded cycle as (sequence, its now, the jobs it
    started, allowance); then the log's last time and allowance. The allowance is what a job waits beyond the
    latency before it is late: the backfill interval under Slurm's cadence (a job only backfill starts waits
    for the next backfill cycle), else 0."""

    marks: list[tuple[int, int, "tuple[int, ...] | None", int]] = field(default_factory=list)
    end: int = 0
    end_allowance: int = 0


def _allowance(st: State) -> int:
    sched = st.config.scheduler if st.config is not None else None
    return sched.bf_interval if sched is not None and sched.cadence == "slurm" else 0


def checked_and_startable(envelopes: Iterable[ev.Envelope], from_seq: int = 1, to_seq: int | None = None,
                          pick: Any = None, cycles: bool = True, walked: Walked | None = None,
                          known: dict[tuple[int, int], tuple[int, ...]] | None = None
                          ) -> tuple[list[tuple[int, Any]], dict[tuple[int, int], tuple[int, ...]]]:
    """:func:`rota.core.timetravel.verify`'s results (from ``from_seq``; none unless ``cycles``) and
    :func:`startable`'s, in one walk of the log (the ``k``-th cycle and the ``k``-th moment only when
    ``pick(k)``; a moment in ``known`` is not evaluated again), noting into ``walked`` what :func:`late_from`
    reads."""
    st = State()
    checked: list[tuple[int, Any]] = []
    out: dict[tuple[int, int], tuple[int, ...]] = {}
    moments = Moments(None)
    marks = walked.marks if walked is not None else None
    kc = km = 0
    for env, now in moments.walk(envelopes, st, to_seq):
        if now is not None:
            if (pick is None or pick(km)) and (known is None or (env.seq, now) not in known):
                out[(env.seq, now)] = would_start(st, now, moments.bases)
            if marks is not None:
                marks.append((env.seq, now, None, _allowance(st)))
            km += 1
            continue
        e = env.event
        if isinstance(e, ev.JobsStarted):
            if cycles and env.seq >= from_seq:
                if pick is None or pick(kc):
                    checked.append((env.seq, check_cycle(st, env.seq, e, moments.bases)))
                kc += 1
            if marks is not None:
                marks.append((env.seq, e.now, tuple({s.array_job_id or s.job_id for s in e.starts}), _allowance(st)))
        moments.apply(st, env)
    if walked is not None:
        walked.end, walked.end_allowance = st.now, _allowance(st)
    return checked, out


def late_starts(envelopes: Iterable[ev.Envelope], latency: int = DEFAULT_LATENCY, to_seq: int | None = None,
                known: dict[tuple[int, int], tuple[int, ...]] | None = None) -> list[Late]:
    """Every job that the scheduler would have started but that waited longer than ``latency`` seconds
    for it, in the order found. ``known``: :func:`startable`'s results, e.g. from other processes."""
    walked = Walked()
    found = checked_and_startable(envelopes, to_seq=to_seq, cycles=False, walked=walked, known=known)[1]
    return late_from(walked, {**found, **known} if known else found, latency)


def late_from(walked: Walked, known: dict[tuple[int, int], tuple[int, ...]], latency: int = DEFAULT_LATENCY
              ) -> list[Late]:
    """:func:`late_starts` from a walk's notes and every moment's evaluation (no walk of the log)."""
    since: dict[int, tuple[int, int]] = {}     # startable job -> (since when, after which sequence)
    late: list[Late] = []

    def settle(jid: int, until: int, outcome: str, allowance: int) -> None:
        t, seq = since.pop(jid)
        if until - t > latency + allowance:
            late.append(Late(jid, t, seq, until, outcome))

    for seq, now, started, allowance in walked.marks:
        if started is None:
            ids = known[(seq, now)]
            for jid in [j for j in since if j not in ids]:
                settle(jid, now, "gone", allowance)
            for jid in ids:
                since.setdefault(jid, (now, seq))
        elif since:
            for jid in list(since):
                settle(jid, now, "started" if jid in started else "gone", allowance)
    for jid in list(since):
        settle(jid, walked.end, "end", walked.end_allowance)
    return late
