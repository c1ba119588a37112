"""Time travel over a log (pure): why a job waited, the state at any moment, verification of every
recorded decision, and "what if" replays of the recorded inputs under other settings.

Everything here is a fold of envelopes: the same log gives the same answers on any machine.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from heapq import heappop, heappush
from typing import Any, Callable, Iterable, Iterator

from . import events as ev
from .apply import apply, fold
from .changes import Changes
from .cycle import NodeBases
from .replan import PlanMemory
from .policies import slurm_differences
from .schedule import factors_of, outranked, plan, schedule
from .state import PENDING, RUNNING, TERMINAL_STATES, State


def replay_to(envelopes: Iterable[ev.Envelope], at_seq: int | None = None, at_time: int | None = None,
              state: State | None = None) -> State:
    """The state after the last event at or before ``at_seq`` / ``at_time`` (all of it when neither)."""
    st = state if state is not None else State()
    for env in envelopes:
        if (at_seq is not None and env.seq > at_seq) or (at_time is not None and env.ts > at_time):
            break
        apply(st, env)
    return st


# ---------------------------------------------------------------- why

@dataclass
class Interval:
    start: int                       # log time the interval began
    end: int                         # log time it ended (the next change, the start, or the end of the log)
    first_seq: int
    last_seq: int
    reason: str                      # Slurm reason code
    text: str                        # what squeue showed
    detail: str                      # the numbers behind it
    rank: int
    priority: int
    expected_start: int | None
    blockers: tuple[int, ...]
    ahead: tuple[int, ...]
    evaluated: bool
    cycles: int = 1                  # recorded cycles this interval spans
    derived: int = 0                 # evaluations between recorded cycles (at state changes) it spans
    decisive: tuple[int, ...] = ()   # blockers whose end (by their limit) is the expected start (the latest)
    at_cycle: bool = True            # its first evaluation was a recorded cycle (else a moment between)
    estimated: bool = False          # expected_start is the plan's estimate (no reservation was held for it)
    # its priority factors and the first job ahead's, (job id, factors), when jobs ahead of it competed
    factors: tuple[int, ...] = ()
    ahead_factors: tuple[int, tuple[int, ...]] | None = None

    def key(self) -> tuple:
        return (self.reason, self.text, self.blockers, self.ahead, self.evaluated)


@dataclass
class WhyReport:
    job_id: int
    name: str = ""
    user: str = ""
    partition: str = ""
    submit_time: int = 0
    submit_seq: int = 0
    start_time: int | None = None
    start_seq: int | None = None
    nodes: tuple[str, ...] = ()
    backfilled: bool = False
    end_state: str | None = None
    intervals: list[Interval] = field(default_factory=list)
    # (time, expected start, whether only estimated from the plan) each time it moved
    estimates: list[tuple[int, int | None, bool]] = field(default_factory=list)
    backfilled_past: list[dict] = field(default_factory=list)    # jobs started around it, checked against it
    actions: list[dict] = field(default_factory=list)            # holds, releases, drains, updates that touched it
    blocker_ends: dict[int, int] = field(default_factory=dict)   # blocking job -> when it ended
    log_range: tuple[int, int] = (0, 0)
    config_seq: int = 0
    versions: tuple[str, ...] = ()
    policy: str = ""
    found: bool = True
    from_snapshot: int = 0            # the replay started from a snapshot at this sequence (0: from the start)
    preempted: list[dict] = field(default_factory=list)          # each time it was preempted: by whom, why it
    preempting: list[dict] = field(default_factory=list)         # each time it preempted others
    # settings under which Slurm could have decided otherwise about this job's backfilling (rota.core.policies)
    slurm_differences: list[str] = field(default_factory=list)


Key = tuple[int, "int | None"]     # a moment of why: (log sequence, None) at a recorded cycle, (sequence, time) between
MISSING = object()     # what ``others`` gives for a moment it has no evaluation of (why then makes it)


def why(envelopes: Iterable[ev.Envelope], job_id: int, at_seq: int | None = None, state: State | None = None,
        pick: Callable[[Key], bool] | None = None, others: Callable[[Key], Any] | None = None) -> WhyReport:
    """Explain job ``job_id``'s wait: re-run the scheduler in explain mode, focused on the job, at every
    moment its fate could change while it was pending (see :class:`Moments`): at each recorded cycle
    (the state just before its decision) and after every other change of the state (a submit, an end,
    a drain, a hold...) or moment of time (its begin time), and collect what touched it.
    ``state``: a snapshot taken before the job's submission to start from (``envelopes`` follow it).
    ``pick``, ``others``: the moment of key ``key`` is evaluated here only when ``pick(key)``; else
    ``others(key)`` gives it (or MISSING: made here after all), e.g. as workers walking the same envelopes with
    :func:`cycle_samples` stream theirs."""
    st = state if state is not None else State()
    story = _Story(job_id, st.seq)
    exits: dict[int, list[tuple[int, int]]] = {}      # job -> (time, sequence) of each of its ends
    first_seq = last_seq = 0
    head, envelopes = before_submit(envelopes, st, job_id, at_seq)
    for env in head:
        e = env.event
        if isinstance(e, ev.JobExited):
            exits.setdefault(e.job_id, []).append((env.ts, env.seq))
        elif isinstance(e, ev.ControllerStarted):
            story.saw_version(e.version)
    if head:
        first_seq, last_seq = head[0].seq, head[-1].seq
    moments = Moments(job_id)
    bases = moments.bases

    def given(key: Key) -> Any:
        """The moment's evaluation if made elsewhere (MISSING: make it here)."""
        if others is not None and pick is not None and not pick(key):
            return others(key)
        return MISSING

    for env, after in moments.walk(envelopes, st, at_seq):
        if after is not None:        # a moment between recorded cycles, the state as it then was
            sample = given((env.seq, after))
            story.sample(evaluate(st, after, job_id, bases) if sample is MISSING else sample)
            continue
        first_seq, last_seq = first_seq or env.seq, env.seq
        e = env.event
        if isinstance(e, ev.JobsStarted) and story.pending(st):
            sample = given((env.seq, None))
            story.sample(cycle_sample(st, e, job_id, bases) if sample is MISSING else sample)
        story.before(st, env)
        moments.apply(st, env)
        if isinstance(e, ev.JobExited):
            exits.setdefault(e.job_id, []).append((env.ts, env.seq))
        if story.after(st, env) and at_seq is None:
            break   # nothing later changes its story
    return story.report(st, (first_seq, last_seq), exits)


_JOB_ACTIONS = (ev.JobHeld, ev.JobReleased, ev.JobUpdated)                       # on the job itself
_NODE_ACTIONS = (ev.NodeDrained, ev.NodeDown, ev.NodeResumed, ev.HealthFault)     # on a node it may use
# what happened to its run that a policy acts on: idle GPUs (with the samples) and what the policy did
_RUN_ACTIONS = (ev.GpuIdle, ev.GpuBusy, ev.JobCancelled, ev.JobRequeued)
_ACTIONS = _JOB_ACTIONS + _NODE_ACTIONS + _RUN_ACTIONS + (ev.ClusterConfigured, ev.ControllerStarted)


def before_submit(envelopes: Iterable[ev.Envelope], st: State, job_id: int, at_seq: int | None
                  ) -> tuple[list[ev.Envelope], Iterable[ev.Envelope]]:
    """Fold into ``st`` the envelopes (a list) before job ``job_id``'s submit: no moment of the job's is among
    them (the first is at the end of the run of events holding its submit, whatever came before in that run),
    so a walk need not look at them one by one. (Those folded, the rest); nothing folded when the submit is
    not there, or past ``at_seq``."""
    if not isinstance(envelopes, list):
        return [], envelopes
    for i, env in enumerate(envelopes):
        e = env.event
        if isinstance(e, ev.JobSubmitted) and e.job_id == job_id:
            if at_seq is not None and env.seq > at_seq:
                break
            fold(envelopes[:i], st)
            return envelopes[:i], envelopes[i:]
    return [], envelopes


def why_all(envelopes: Iterable[ev.Envelope], job_ids: Iterable[int] | None = None) -> dict[int, WhyReport]:
    """:func:`why` for many jobs (every job submitted in the log when ``job_ids`` is None) in one walk of
    the whole log: the scheduler runs once per moment for all the jobs it concerns (explaining every
    pending job) instead of once per job. Each report is the one :func:`why` gives."""
    wanted = None if job_ids is None else set(job_ids)
    st = State()
    stories: dict[int, _Story] = {}
    live: dict[int, _Story] = {}          # stories not over yet
    ended_at: dict[int, int] = {}         # story -> the last sequence of its story
    exits: dict[int, list[tuple[int, int]]] = {}
    moments = Moments(None)
    for env, now in moments.walk(envelopes, st, None):
        if now is not None or isinstance(env.event, ev.JobsStarted):
            _sample_all(st, env, now, moments, [s for jid, s in live.items() if jid in st.pending])
            if now is not None:
                continue
        e = env.event
        if isinstance(e, _ACTIONS):
            for story in live.values():
                story.before(st, env)
        ch = Changes()
        moments.apply(st, env, ch)
        if isinstance(e, ev.JobSubmitted) and (wanted is None or e.job_id in wanted) and e.job_id not in stories:
            stories[e.job_id] = live[e.job_id] = _Story(e.job_id, 0)
        if isinstance(e, ev.JobExited):
            exits.setdefault(e.job_id, []).append((env.ts, env.seq))
        for jid in [jid for jid in ch.jobs if jid in live]:
            if live[jid].after(st, env):
                del live[jid]
                ended_at[jid] = env.seq
    last = st.seq
    return {jid: story.report(st, (1, ended_at.get(jid, last)), exits) for jid, story in stories.items()}


def _sample_all(st: State, env: ev.Envelope, now: int | None, moments: "Moments", waiting: list["_Story"]) -> None:
    """One explain pass for every waiting story the moment concerns (a recorded cycle: all of them)."""
    if not waiting:
        return
    e = env.event
    if now is None:
        assert isinstance(e, ev.JobsStarted)
        d = schedule(st, e.now, e.policy, explain=True, kept_shadow=e.shadow)
        planned = _Plan(st, e.now)
        for story in waiting:
            story.sample(_sample(d, st, e.now, story.job_id, e, planned))
        return
    d = schedule(st, now, explain=True)
    counts = moments.counting(d.order)
    planned = _Plan(st, now)
    for story in waiting:
        if counts(story.job_id):
            story.sample(_sample(d, st, now, story.job_id, None, planned))


class _Story:
    """One job's :class:`WhyReport`, built while the log is walked: its samples merged into intervals,
    and what happened around it (actions, its start or end)."""

    def __init__(self, job_id: int, from_snapshot: int) -> None:
        self.job_id = job_id
        self.rep = WhyReport(job_id)
        self.rep.from_snapshot = from_snapshot
        self.versions: list[str] = []
        self.watching: set[str] = set()     # its partition's nodes: their drains and resumes touch it
        self.named: dict[int, int] = {}     # every job named as holding what it needed -> when first named
        self.ended: int | None = None       # when it ended (its story ends there)

    def pending(self, st: State) -> bool:
        job = st.jobs.get(self.job_id)
        return job is not None and job.state == PENDING

    def sample(self, sample: "CycleSample | None") -> None:
        rep = self.rep
        _merge(rep, sample)
        if sample is not None:
            for b in sample.interval.blockers:
                self.named.setdefault(b, sample.interval.start)

    def saw_version(self, version: str) -> None:
        """A controller of this version started within the story's span of the log."""
        if version not in self.versions:
            self.versions.append(version)

    def before(self, st: State, env: ev.Envelope) -> None:
        """Before ``env`` (an action, or a controller's start) is applied."""
        e = env.event
        if isinstance(e, ev.ControllerStarted):
            self.saw_version(e.version)
        if self.pending(st):
            _note_action(self.rep, env, e, self.job_id, self.watching)
        elif isinstance(e, _RUN_ACTIONS) and e.job_id == self.job_id and (not isinstance(e, (ev.JobCancelled, ev.JobRequeued))
                                                                          or e.reason):
            detail = {k: v for k, v in e.model_dump(mode="json").items() if k not in ("type", "v")}
            self.rep.actions.append({"time": env.ts, "seq": env.seq, "actor": env.actor, "action": e.type, **detail})
        if isinstance(e, ev.JobsStarted) and e.preemptions:
            _note_preemptions(self.rep, st, env, e, self.job_id)

    def after(self, st: State, env: ev.Envelope) -> bool:
        """After ``env`` (which touched the job) is applied; True once the job has ended."""
        rep, e, job_id = self.rep, env.event, self.job_id
        job = st.jobs.get(job_id)
        if job is None:
            return False
        if isinstance(e, ev.JobSubmitted) and e.job_id == job_id:
            rep.name, rep.user, rep.partition = job.spec.name, job.spec.user, job.partition
            rep.submit_time, rep.submit_seq = env.ts, env.seq
            part = st.partition(job.partition)
            self.watching = set(part.nodes) if part is not None else set()
        if rep.start_time is None and job.state == RUNNING:
            rep.start_time, rep.start_seq = job.start_time, env.seq
            rep.nodes = tuple(a.node for a in job.alloc)
            rep.backfilled = job.backfilled
            rep.partition = job.partition
            if rep.intervals:
                rep.intervals[-1].end = job.start_time
        if job.state in TERMINAL_STATES:
            rep.end_state = job.state
            self.ended = st.now
            return True
        return False

    def report(self, st: State, log_range: tuple[int, int], exits: dict[int, list[tuple[int, int]]]) -> WhyReport:
        """The report, with each blocker's end: its first after it was named, within the story."""
        rep = self.rep
        for b, named in self.named.items():
            end = next((t for t, seq in exits.get(b, ()) if t >= named and seq <= log_range[1]), None)
            if end is not None:
                rep.blocker_ends[b] = end
        rep.found = rep.submit_seq > 0
        rep.log_range = log_range
        rep.config_seq = st.config_seq
        rep.versions = tuple(self.versions)
        rep.policy = st.config.scheduler.policy if st.config is not None else ""
        if st.config is not None and (rep.backfilled or rep.backfilled_past):
            rep.slurm_differences = slurm_differences(st.config.scheduler)
        if rep.intervals and rep.start_time is None:
            rep.intervals[-1].end = self.ended if self.ended is not None else st.now
        return rep


@dataclass
class CycleSample:
    """What one recorded cycle said about the job: its interval and the jobs started around it."""

    interval: Interval
    backfilled_past: list[dict]


def cycle_sample(st: State, e: ev.JobsStarted, job_id: int, bases: NodeBases | None = None) -> CycleSample | None:
    """Re-run the cycle ``e`` records, from ``st`` (the state just before it), focused on ``job_id``;
    None when the job starts in it (no wait to record, no reservation to place others around).
    ``bases``: the nodes' timeline inputs kept along the walk (:class:`Moments` keeps them current)."""
    d = schedule(st, e.now, e.policy, explain=True, focus=job_id, bases=bases, kept_shadow=e.shadow)
    return _sample(d, st, e.now, job_id, e)


def evaluate(st: State, now: int, job_id: int, bases: NodeBases | None = None) -> CycleSample | None:
    """The scheduler's view of ``job_id`` at ``now`` from ``st``, as a cycle then would have decided it
    (the configured policy; nothing was recorded: no cycle started anything); None if it would start."""
    policy = st.config.scheduler.policy if st.config is not None else None
    return _sample(schedule(st, now, policy, explain=True, focus=job_id, bases=bases), st, now, job_id, None)


class _Plan:
    """The plan's estimated starts at one moment, made once and only when a job without a reservation
    asks (:func:`rota.core.schedule.plan`)."""

    def __init__(self, st: State, now: int, focus: int | None = None) -> None:
        self.st, self.now, self.focus = st, now, focus
        self.starts: dict[int, int] | None = None

    def of(self, job_id: int) -> int | None:
        if self.starts is None:
            self.starts = plan(self.st, self.now, self.focus)
        return self.starts.get(job_id)


def _sample(d: Any, st: State, now: int, job_id: int, e: ev.JobsStarted | None,
            planned: _Plan | None = None) -> CycleSample | None:
    """What decision ``d`` (from ``st`` at ``now``; recorded as ``e``, or None between cycles) says of
    ``job_id``; None when it starts the job. A job waiting for resources or priority without a
    reservation gets an estimated start from the plan (``planned``, else made for it)."""
    p = d.pending_of(job_id)
    if p is None:
        return None
    start, estimated = p.start, False
    if start is None and p.reason in ("Resources", "Priority"):
        start = (planned or _Plan(st, now, job_id)).of(job_id)
        if start is not None and start <= now:
            start = None     # the plan would start it now where the policy does not: no honest estimate
        estimated = start is not None
    if e is None:
        iv = Interval(now, now, st.seq, st.seq, p.reason, p.display, p.detail, p.rank, p.priority, start,
                      p.blockers, p.ahead, p.evaluated, cycles=0, derived=1, decisive=p.decisive, at_cycle=False,
                      estimated=estimated)
        _rank_factors(iv, st, now, job_id)
        return CycleSample(iv, [])
    iv = Interval(now, now, st.seq + 1, st.seq + 1, p.reason, p.display, p.detail, p.rank, p.priority,
                  start, p.blockers, p.ahead, p.evaluated, decisive=p.decisive, estimated=estimated)
    _rank_factors(iv, st, now, job_id)
    past: list[dict] = []
    res = d.reservations.get(job_id)
    if res is not None:
        ranked_before, reserved = set(d.order[:d.order.index(job_id)]), set(res.nodes)
        for s in e.starts:
            owner = s.array_job_id or s.job_id
            # a backfilled job ranked below this one, on nodes of its reservation: placed around it
            if s.backfilled and owner != job_id and owner not in ranked_before and \
                    reserved.intersection(a.node for a in s.alloc):
                past.append({"time": now, "seq": st.seq + 1, "job_id": s.job_id,
                             "user": st.jobs[owner].spec.user, "ends_by": now + s.time_limit,
                             "reserved_start": res.start})
    return CycleSample(iv, past)


def _rank_factors(iv: Interval, st: State, now: int, job_id: int) -> None:
    """The factors that ranked the job behind the first job ahead of it, when one competed for its nodes."""
    ahead = next((j for j in iv.ahead if st.jobs.get(j) is not None and st.jobs[j].state == PENDING), None)
    if ahead is None:
        return
    got = factors_of(st, now, (job_id, ahead))
    if job_id in got and ahead in got:
        iv.factors = tuple(got[job_id][1])
        iv.ahead_factors = (ahead, tuple(got[ahead][1]))


def _always(_job_id: int) -> bool:
    return True


class Moments:
    """The moments a pending job's evaluation could change, walking a log.

    The scheduler is a pure function of (state, now) and the state changes only at events, so the
    decision at any moment can be re-derived without a recorded cycle. The moments are every recorded
    cycle (evaluated from the state just before its decision) and, between them, the end of each run of
    events with one timestamp that changed the state (a submit, an end, a drain, a hold...), and the
    job's begin time. A recorded cycle's own changes need no second evaluation: its explain pass already
    placed the jobs it started. Nor do submits of jobs ranked below it: the walk stops at the job, so
    they cannot change what the scheduler says of it.
    """

    def __init__(self, job_id: int | None) -> None:
        self.job_id = job_id                 # None: every pending job (what any cycle could start)
        self.bases = NodeBases()             # node timelines' inputs, dropped for each node a change touches
        self.changed = False                 # something that may change its evaluation
        self.submitted: list[int] = []       # jobs submitted since, still pending: matter if ranked above
        self.begins: list[tuple[int, int]] = []   # (begin time, job), every pending job's, when job_id is None
        self.prev: ev.Envelope | None = None      # the last envelope walked: its group may not be over
        # what the moment just yielded is, when job_id is None: only these jobs were submitted (None:
        # anything may have changed), or these jobs' begin time is reached (None: not a begin time)
        self.only_submitted: list[int] | None = None
        self.begun: tuple[int, ...] | None = None

    def walk(self, envelopes: Iterable[ev.Envelope], st: State, at_seq: int | None, settle: bool = True
             ) -> Iterator[tuple[ev.Envelope, int | None]]:
        """(envelope, None) for each envelope, which the caller then applies with :meth:`apply`; and
        (last envelope applied, now) for each moment to evaluate from the state as it then is.
        ``settle``: the last run of events is over (the log ends there); else a later walk goes on."""
        prev = self.prev
        for env in envelopes:
            if at_seq is not None and env.seq > at_seq:
                break
            if prev is not None and env.ts != prev.ts:
                yield from self._between(prev, st, env.ts)
            yield env, None
            prev = self.prev = env
            job = st.jobs.get(self.job_id) if self.job_id is not None else None
            if job is not None and job.state in TERMINAL_STATES and at_seq is None:
                return
        if prev is not None and settle:
            yield from self.settle(st, None)

    def settle(self, st: State, until: int | None) -> Iterator[tuple[ev.Envelope, int | None]]:
        """The moments after the last envelope walked, up to ``until`` (None: any), when no more events
        with its timestamp can come."""
        prev, self.prev = self.prev, None
        if prev is not None:
            yield from self._between(prev, st, until)

    def _between(self, prev: ev.Envelope, st: State, next_ts: int | None
                 ) -> Iterator[tuple[ev.Envelope, int | None]]:
        if self.job_id is None:
            yield from self._between_all(prev, st, next_ts)
            return
        job = st.jobs.get(self.job_id)
        changed, submitted = self.changed, self.submitted
        self.changed, self.submitted = False, []
        if job is None or job.state != PENDING:
            return
        if changed or (submitted and self._outranked(st, prev, submitted)):
            yield prev, prev.ts
        begin = job.spec.begin
        if begin is not None and prev.ts < begin and (next_ts is None or begin < next_ts):
            yield prev, begin

    def _outranked(self, st: State, prev: ev.Envelope, submitted: list[int]) -> bool:
        """Whether the jobs just submitted (or the job itself) make a moment for the job."""
        assert self.job_id is not None
        return self.job_id in submitted or outranked(st, prev.ts, self.job_id, submitted)

    def _between_all(self, prev: ev.Envelope, st: State, next_ts: int | None
                     ) -> Iterator[tuple[ev.Envelope, int | None]]:
        changed, submitted = self.changed, self.submitted
        self.changed, self.submitted = False, []
        begins = self.begins
        while begins and begins[0][0] <= prev.ts:
            heappop(begins)
        if not st.pending:
            return
        if changed or submitted:
            self.only_submitted, self.begun = (None if changed else submitted), None
            yield prev, prev.ts
        while begins and (next_ts is None or begins[0][0] < next_ts):
            t = begins[0][0]
            due = []
            while begins and begins[0][0] == t:
                jid = heappop(begins)[1]
                job = st.jobs.get(jid)
                if job is not None and job.state == PENDING and job.spec.begin == t:
                    due.append(jid)
            if due:
                self.only_submitted, self.begun = None, tuple(sorted(set(due)))
                yield prev, t

    def counting(self, ranked: list[int]) -> Callable[[int], bool]:
        """Whether the moment just yielded (every job's) is one at which :func:`why` evaluates a job,
        given the ranking then (``Decision.order``; jobs held back before ranking absent): after submits
        only, the new jobs and those they outrank; at a begin time, the jobs it is theirs."""
        if self.begun is not None:
            return self.begun.__contains__
        subs = self.only_submitted
        if subs is None:
            return _always
        order = {jid: i for i, jid in enumerate(ranked)}
        new = set(subs)
        first = min((order[j] for j in new if j in order), default=None)

        def counts(job_id: int) -> bool:
            if job_id in new:
                return True
            mine = order.get(job_id)
            return mine is None or (first is not None and first < mine)   # as schedule.outranks says
        return counts

    def apply(self, st: State, env: ev.Envelope, ch: Changes | None = None) -> None:
        """Apply ``env`` to ``st`` (noting into ``ch``, which may span many events), noting whether it
        changed anything a later moment must look at."""
        own = ch is None
        ch = Changes() if ch is None else ch
        touches = ch.touches
        apply(st, env, ch)
        e = env.event
        if own:
            drop_touched(self.bases, ch)
        else:
            self.bases.clear()                    # a batch-wide report cannot say what this event touched
        if isinstance(e, ev.JobsStarted):
            self.changed, self.submitted = False, []     # evaluated as recorded, just before it
            return
        if ch.touches == touches:
            return
        job = st.jobs.get(e.job_id) if isinstance(e, ev.JobSubmitted) else None
        if job is not None and job.state == PENDING:
            self.submitted.append(job.job_id)
        else:
            self.changed = True
        if self.job_id is None:
            self._note_begins(st, e, env.ts)

    def _note_begins(self, st: State, e: Any, ts: int) -> None:
        """A job submitted (or updated) to begin later becomes eligible then: a moment to look again."""
        jid = getattr(e, "job_id", None)
        job = st.jobs.get(jid) if isinstance(jid, int) else None
        if job is not None and job.state == PENDING and job.spec.begin is not None and job.spec.begin > ts:
            heappush(self.begins, (job.spec.begin, job.job_id))


def cycle_samples(envelopes: Iterable[ev.Envelope], job_id: int, at_seq: int | None = None,
                  state: State | None = None, pick: Callable[[Key], bool] | None = None,
                  stop_at: int | None = None) -> Iterator[tuple[Key, CycleSample | None]]:
    """The evaluations :func:`why` makes while ``job_id`` was pending (only those whose key ``pick`` takes, and
    none from log sequence ``stop_at`` on), keyed by (log sequence, None) for a recorded cycle and (log sequence,
    moment) for the others, as they are made, in the order :func:`why` meets them: the expensive part of
    :func:`why`, to be shared out."""
    st = state if state is not None else State()
    moments = Moments(job_id)
    _head, envelopes = before_submit(envelopes, st, job_id, at_seq)
    for env, after in moments.walk(envelopes, st, at_seq):
        if stop_at is not None and env.seq >= stop_at:
            return
        if after is not None:
            key: Key = (env.seq, after)
            if pick is None or pick(key):
                yield key, evaluate(st, after, job_id, moments.bases)
            continue
        e = env.event
        job = st.jobs.get(job_id)
        if job is not None and job.state == PENDING and isinstance(e, ev.JobsStarted):
            key = (env.seq, None)
            if pick is None or pick(key):
                yield key, cycle_sample(st, e, job_id, moments.bases)
        moments.apply(st, env)


def _merge(rep: WhyReport, sample: CycleSample | None) -> None:
    if sample is None:
        return
    iv = sample.interval
    last = rep.intervals[-1] if rep.intervals else None
    if last is not None and last.key() == iv.key():
        last.end, last.last_seq = iv.start, iv.first_seq
        last.cycles, last.derived = last.cycles + iv.cycles, last.derived + iv.derived
        last.detail, last.expected_start, last.decisive = iv.detail, iv.expected_start, iv.decisive
        last.estimated = iv.estimated
    else:
        if last is not None:
            last.end = iv.start
        rep.intervals.append(replace(iv))   # merged into later: never the sample's own object
    if not rep.estimates or rep.estimates[-1][1:] != (iv.expected_start, iv.estimated):
        rep.estimates.append((iv.start, iv.expected_start, iv.estimated))
    rep.backfilled_past.extend(sample.backfilled_past)


def _note_preemptions(rep: WhyReport, st: State, env: ev.Envelope, e: ev.JobsStarted, job_id: int) -> None:
    """A cycle's preemptions that name the job, as victim or preemptor, with the state just before them:
    who, under which QOS, and every candidate in the order tried."""
    qos_prio = {q.name: q.priority for q in st.qos.values()}

    def who(jid: int) -> dict:
        job = st.jobs.get(jid)
        if job is None:
            return {"job_id": jid}
        return {"job_id": jid, "user": job.spec.user, "qos": job.spec.qos, "qos_priority": qos_prio.get(job.spec.qos, 0),
                "start": job.start_time or None}

    for p in e.preemptions:
        chosen = {v.job_id: v for v in p.victims}
        if job_id in chosen:
            v = chosen[job_id]
            rep.preempted.append({"time": env.ts, "seq": env.seq, "by": who(p.by), "mode": v.mode, "grace": v.grace,
                                  "victims": sorted(chosen), "candidates": [who(c) for c in p.candidates],
                                  "may_preempt": list(st.qos[st.jobs[p.by].spec.qos].preempt)
                                  if p.by in st.jobs and st.jobs[p.by].spec.qos in st.qos else []})
        elif p.by == job_id:
            rep.preempting.append({"time": env.ts, "seq": env.seq, "victims": [who(v) for v in sorted(chosen)],
                                   "candidates": len(p.candidates)})


def _note_action(rep: WhyReport, env: ev.Envelope, e: Any, job_id: int, nodes: set[str]) -> None:
    kind: str | None = None
    if isinstance(e, _JOB_ACTIONS) and e.job_id == job_id:
        kind = e.type
    elif isinstance(e, _NODE_ACTIONS) and e.node in nodes:
        kind = e.type
    elif isinstance(e, ev.ClusterConfigured):
        kind = e.type
    if kind is not None:
        detail = {k: v for k, v in e.model_dump(mode="json").items() if k not in ("type", "v", "config")}
        actor = detail.pop("by", None) or env.actor   # who did it, as the event records it
        rep.actions.append({"time": env.ts, "seq": env.seq, "actor": actor, "action": kind, **detail})


# ---------------------------------------------------------------- verify

@dataclass
class Divergence:
    seq: int
    cycle: int
    job_id: int | None
    recorded: str
    recomputed: str


def drop_touched(bases: NodeBases, ch: Changes) -> None:
    """Drop from ``bases`` every node the event noted in ``ch`` touched."""
    if ch.touches:
        bases.touched(ch.nodes)
        for before in ch.jobs.values():       # a running job's limit may change without touching its node
            bases.touched(a.node for a in before.job.alloc)


def verify(envelopes: Iterable[ev.Envelope], from_seq: int = 1, to_seq: int | None = None,
           pick: Any = None) -> Iterator[tuple[int, Divergence | None]]:
    """Re-run the scheduler at every recorded cycle from the state just before it; yields
    (sequence, None) for a cycle that matches, (sequence, Divergence) for one that does not.
    ``pick(k)``: check only the k-th cycle of the range when true (to share the work out)."""
    st = State()
    bases = NodeBases()
    memory = PlanMemory()          # the last conservative cycle's plan, repaired by the next
    k = 0
    for env in envelopes:
        if to_seq is not None and env.seq > to_seq:
            break
        e = env.event
        if isinstance(e, ev.JobsStarted) and env.seq >= from_seq:
            if pick is None or pick(k):
                yield env.seq, check_cycle(st, env.seq, e, bases, memory)
            k += 1
        ch = Changes()
        apply(st, env, ch)
        drop_touched(bases, ch)


def check_cycle(st: State, seq: int, e: ev.JobsStarted, bases: NodeBases | None = None,
                memory: PlanMemory | None = None) -> Divergence | None:
    """The recorded cycle ``e`` (at ``seq``) re-run from ``st``, the state just before it: None if it decides
    the same (``memory``: the plan of the cycle last re-run, :mod:`rota.core.replan`)."""
    d = schedule(st, e.now, e.policy, kept_shadow=e.shadow, bases=bases, memory=memory)
    return _compare(seq, e, d.starts) or _compare_preemptions(seq, e, d.preemptions)


def _compare(seq: int, e: ev.JobsStarted, starts: list[ev.Start]) -> Divergence | None:
    recorded = {s.job_id: s for s in e.starts}
    again = {s.job_id: s for s in starts}
    for jid in sorted(set(recorded) | set(again)):
        a, b = recorded.get(jid), again.get(jid)
        if a == b:
            continue
        return Divergence(seq, e.cycle, jid, _start_text(a), _start_text(b))
    if [s.job_id for s in e.starts] != [s.job_id for s in starts]:
        return Divergence(seq, e.cycle, None, "order " + ",".join(str(s.job_id) for s in e.starts),
                          "order " + ",".join(str(s.job_id) for s in starts))
    return None


def _compare_preemptions(seq: int, e: ev.JobsStarted, again: list[ev.Preemption]) -> Divergence | None:
    """The first preemption that differs between the recorded cycle and its re-run (None: the same)."""
    recorded = list(e.preemptions)
    for i in range(max(len(recorded), len(again))):
        a = recorded[i] if i < len(recorded) else None
        b = again[i] if i < len(again) else None
        if a != b:
            by = a.by if a is not None else b.by if b is not None else None
            return Divergence(seq, e.cycle, by, _preemption_text(a), _preemption_text(b))
    return None


def _preemption_text(p: ev.Preemption | None) -> str:
    if p is None:
        return "no preemption"
    return f"job {p.by} preempted " + ", ".join(f"{v.job_id} ({v.mode}, grace {v.grace}s)" for v in p.victims)


def _start_text(s: ev.Start | None) -> str:
    if s is None:
        return "not started"
    where = " ".join(f"{a.node}(cpus={a.cpus},mem={a.mem},gpus={list(a.gpus)})" for a in s.alloc)
    return f"started in {s.partition} on {where}" + (" (backfilled)" if s.backfilled else "")
