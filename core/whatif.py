"""What if the cluster had run under other settings (pure): replay a log's inputs, re-deciding every start.

The inputs are everything the scheduler does not decide: submits, cancels, holds and releases, updates,
requeues, node registrations, drains, resumes, failures and configuration changes, each at the time it
was logged (a cancel of a job that has already ended changes nothing, as the reducer says), and each
job's real run (its time from start to end on the log, so launch delays are in it, with how it ended,
so dependencies resolve as they did). The scheduler's starts and the ends they cause are re-derived:
a cycle runs at every recorded cycle's moment and after every change, delayed by the cycle latency
measured on the log (its 90th percentile). Under the recorded settings this reproduces the history;
how closely is reported.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from . import events as ev
from .apply import apply
from .schedule import schedule
from .sim import JobOutcome, SimResult
from .state import RUNNING, State
from .timeline import Timeline

Key = tuple[int, int | None]          # (job id, None) or (array id, task index)
_DECIDED = (ev.JobsStarted, ev.JobExited)


@dataclass
class Run:
    """One recorded run of a job: how long from start to end on the log, and how it ended."""

    seconds: int
    exited: ev.JobExited
    ended_at: int = -1        # when it ended on the log, and the end's place there
    seq: int = 0


@dataclass
class Recorded:
    """A log's inputs: its first configuration, the events no scheduler decides, each job's runs, the
    recorded (submit, start, end) of every job, the cycle moments and the measured cycle latency."""

    config: ev.ClusterConfig
    inputs: list[ev.Envelope]
    runs: dict[Key, list[Run]]
    outcomes: dict[Key, tuple[int, int, int]]
    cycles: list[tuple[int, int]]                 # (moment, log sequence) of each recorded cycle
    latency: int
    counts: dict[str, int] = field(default_factory=dict)   # inputs by kind, for the report


def key_of(job: Any) -> Key:
    """A job's identity across replays: its id, or its array's id and task index (tasks get new ids)."""
    if job.array_job_id is not None and job.array_task_id is not None and job.array_job_id != job.job_id:
        return (job.array_job_id, job.array_task_id)
    return (job.job_id, job.array_task_id if job.array_job_id == job.job_id else None)


def key_text(key: Key) -> str:
    return str(key[0]) if key[1] is None else f"{key[0]}_{key[1]}"


def recorded_inputs(envelopes: Iterable[ev.Envelope]) -> Recorded:
    """Split a log into inputs and decisions; measure each run and the cycle latency."""
    st = State()
    config: ev.ClusterConfig | None = None
    inputs: list[ev.Envelope] = []
    runs: dict[Key, list[Run]] = {}
    outcomes: dict[Key, list[int]] = {}
    cycles: list[tuple[int, int]] = []
    delays: list[int] = []
    last_input = None
    counts: dict[str, int] = {}
    for env in envelopes:
        e = env.event
        if isinstance(e, ev.ClusterConfigured) and config is None:
            config = e.config
        if isinstance(e, ev.JobsStarted):
            cycles.append((e.now, env.seq))
            if last_input is not None:
                delays.append(max(0, e.now - last_input))
        elif isinstance(e, ev.JobExited):
            job = st.jobs.get(e.job_id)
            if job is not None and job.state == RUNNING:
                runs.setdefault(key_of(job), []).append(Run(max(0, env.ts - job.start_time), e, env.ts, env.seq))
            last_input = env.ts      # a change a cycle follows, too
        else:
            inputs.append(env)
            counts[e.type] = counts.get(e.type, 0) + 1
            last_input = env.ts
        apply(st, env)
        _record_outcome(st, env, outcomes)
    if config is None:
        raise ValueError("the log has no cluster configuration")
    # most cycles come this soon after a change: later ones add starts the history made no sooner
    latency = sorted(delays)[(len(delays) * 9) // 10] if delays else 0
    return Recorded(config, inputs, runs, {k: (v[0], v[1], v[2]) for k, v in outcomes.items()}, cycles, latency,
                    counts)


def _record_outcome(st: State, env: ev.Envelope, outcomes: dict[Key, list[int]]) -> None:
    """Note a job's (submit, start, end) on the log as its submit, first start and end go by."""
    e = env.event
    if isinstance(e, ev.JobSubmitted):
        outcomes[(e.job_id, None)] = [env.ts, -1, -1]
    elif isinstance(e, (ev.JobsStarted, ev.JobExited)):
        for job in _touched(st, e):
            out = outcomes.setdefault(key_of(job), [job.submit_time, -1, -1])
            if isinstance(e, ev.JobsStarted) and out[1] < 0:
                out[1] = job.start_time
            if isinstance(e, ev.JobExited):
                out[2] = env.ts


def _touched(st: State, e: Any) -> list[Any]:
    if isinstance(e, ev.JobsStarted):
        return [st.jobs[s.job_id] for s in e.starts if s.job_id in st.jobs]
    job = st.jobs.get(e.job_id)
    return [job] if job is not None else []


TIME_LIMITS = "time_limits"     # not a field: every job's --time replaced, "used*1.2" = its real run time x 1.2


def limit_factor(settings: dict[str, str]) -> float | None:
    """``time_limits=used*F``: each job's limit becomes its recorded run time times F (None: limits as recorded)."""
    value = settings.get(TIME_LIMITS)
    if value is None:
        return None
    word, _, factor = value.partition("*")
    try:
        f = float(factor) if factor else 1.0
    except ValueError:
        f = 0.0
    if word != "used" or f < 1.0:
        raise ValueError(f"{TIME_LIMITS}={value!r}: give used*F with F at least 1, e.g. used*1.2")
    return f


def apply_settings(config: ev.ClusterConfig, settings: dict[str, str]) -> ev.ClusterConfig:
    """``scheduler.policy=easy``, ``scheduler.bf_window=3600``, ``priority.age=1000`` ... on a config
    (``time_limits`` is the replay's, not the configuration's: see :func:`limit_factor`)."""
    data = config.model_dump(mode="json")
    limit_factor(settings)
    for key, value in settings.items():
        if key == TIME_LIMITS:
            continue
        parts = key.split(".")
        if len(parts) == 1:
            parts = ["scheduler", parts[0]]
        target = data
        for p in parts[:-1]:
            if not isinstance(target, dict) or p not in target:
                raise ValueError(f"unknown setting {key!r}")
            target = target[p]
        if not isinstance(target, dict) or parts[-1] not in target:
            raise ValueError(f"unknown setting {key!r}: {parts[-1]!r} is not a field of {'.'.join(parts[:-1])}")
        old = target[parts[-1]]
        target[parts[-1]] = int(value) if isinstance(old, int) and not isinstance(old, bool) and \
            value.lstrip("-").isdecimal() else (value.lower() in ("1", "true", "yes") if isinstance(old, bool) else value)
    return ev.ClusterConfig.model_validate(data)


# at one moment: ends the log does not have (runs that moved, cancels; by job id), then inputs, recorded cycles
# and the ends the log has, in log order (a cycle logged before an end in the same second did not see the
# freed resources), then the cycles that follow changes
_END, _LOGGED, _AFTER = 0, 1, 2


@dataclass(slots=True)
class _End:
    """A run's end, due at a moment: unless the run was ended, stopped or requeued before it."""

    job_id: int
    restarts: int
    exited: ev.JobExited


class _Replay:
    """One replay of a log's inputs: a cycle at every recorded cycle's moment and ``latency`` after each change."""

    def __init__(self, rec: Recorded, settings: dict[str, str]) -> None:
        self.rec, self.settings = rec, settings
        self.timeline = Timeline(idem="w")
        self.used: dict[Key, int] = {}
        self.outcomes: dict[int, JobOutcome] = {}
        self.trace_id: dict[Key, int] = {}
        self.keys: dict[int, Key] = {}
        self.cycle_at: set[int] = set()      # moments a cycle that follows a change is already due
        self.cycles = 0
        self.factor = limit_factor(settings)
        self.longest: dict[int, int] = {}    # job (or array) id -> its longest recorded run, in seconds
        for key, runs in rec.runs.items():
            self.longest[key[0]] = max([self.longest.get(key[0], 0), *(r.seconds for r in runs)])
        for env in rec.inputs:
            self.timeline.at(env.ts, _LOGGED, env, tie=env.seq)
        for now, seq in rec.cycles:
            self.timeline.at(now, _LOGGED, None, tie=seq)

    def run(self) -> tuple[SimResult, dict[int, Key]]:
        self.timeline.run(self._handle)
        st = self.timeline.state
        cfg = st.config or self.rec.config
        result = SimResult(cfg.scheduler.policy, sum(n.cpus for n in cfg.nodes), sum(n.gpu_count for n in cfg.nodes),
                           self.outcomes, self.cycles, state=st)
        return result, self.keys

    def _handle(self, t: int, item: ev.Envelope | _End | None) -> None:
        if item is None:
            self.cycle_at.discard(t)
            self._cycle(t)
            return
        if isinstance(item, _End):
            job = self.timeline.current_run(item.job_id, item.restarts)
            if job is None:
                return     # it already ended (cancelled, its node failed) or this run was requeued
            self.timeline.put(t, item.exited.model_copy(update={"job_id": item.job_id, "elapsed": t - job.start_time}),
                              "whatif")
            o = self.outcomes.get(item.job_id)
            if o is not None:
                o.end, o.state = t, item.exited.state
        else:
            e = item.event
            if isinstance(e, ev.ClusterConfigured):
                e = e.model_copy(update={"config": apply_settings(e.config, self.settings)})
            elif isinstance(e, ev.JobSubmitted) and self.factor is not None and e.job_id in self.longest:
                e = e.model_copy(update={"spec": e.spec.model_copy(update={"time_limit": self._limit(e)})})
            self.timeline.put(t, e, "whatif")
            if isinstance(e, ev.JobCancelled):
                self._stop_cancelled(e, t)
        after = t + self.rec.latency
        if after not in self.cycle_at:
            self.cycle_at.add(after)
            self.timeline.at(after, _AFTER, None, tie=0)

    def _limit(self, e: ev.JobSubmitted) -> int | None:
        """The job's limit closer to its use: its longest run times the factor, in whole minutes, never longer
        than the limit it asked for."""
        assert self.factor is not None
        closer = max(60, -(-int(self.longest[e.job_id] * self.factor) // 60) * 60)
        return closer if e.spec.time_limit is None else min(e.spec.time_limit, closer)

    def _cycle(self, t: int) -> None:
        st = self.timeline.state
        if not st.pending:
            return
        self.cycles += 1
        event = schedule(st, t).event()
        if event is None:
            return
        self.timeline.put(t, event, "whatif")
        for s in event.starts:
            self._start(t, s)

    def _start(self, t: int, s: ev.Start) -> None:
        job = self.timeline.state.jobs[s.job_id]
        k = self.keys[s.job_id] = key_of(job)
        runs = self.rec.runs.get(k, [])
        n = self.used.get(k, 0)
        self.used[k] = n + 1
        if n < len(runs):
            run = runs[n]
        else:    # it never ran (or ran fewer times) in the history: it holds its nodes its whole limit
            run = Run(s.time_limit or 0, ev.JobExited(job_id=s.job_id, state="TIMEOUT"))
        ends = t + run.seconds
        order, tie = (_LOGGED, run.seq) if ends == run.ended_at else (_END, s.job_id)
        self.timeline.at(ends, order, _End(s.job_id, job.restarts, run.exited), tie=tie)
        tid = self.trace_id.setdefault(k, len(self.trace_id) + 1)
        self.outcomes[s.job_id] = JobOutcome(s.job_id, tid, job.submit_time, start=t, runtime=run.seconds,
                                             cpus=sum(a.cpus for a in s.alloc), gpus=sum(len(a.gpus) for a in s.alloc),
                                             state="RUNNING", backfilled=s.backfilled)

    def _stop_cancelled(self, e: ev.JobCancelled, t: int) -> None:
        """A cancel of running work: it ends now, as its agent reports once it has stopped it."""
        st = self.timeline.state
        targets = [e.job_id] if e.tasks is None else []
        if e.tasks is not None:
            wanted = set(e.tasks)
            targets = [j for j in st.array_tasks.get(e.job_id, ()) if st.jobs[j].array_task_id in wanted]
        elif e.job_id in st.array_tasks:
            targets += list(st.array_tasks[e.job_id])
        for jid in targets:
            job = st.jobs.get(jid)
            if job is not None and job.state == RUNNING:
                self.timeline.at(t, _END, _End(jid, job.restarts, ev.JobExited(job_id=jid, state="CANCELLED",
                                                                               signal=e.signal)), tie=jid)


def replay(rec: Recorded, settings: dict[str, str]) -> tuple[SimResult, dict[int, Key]]:
    """Re-run the recorded inputs under ``settings`` (none: the recorded ones): each job's outcome, and
    the identity (:func:`key_of`) of each job id that ran."""
    return _Replay(rec, settings).run()


@dataclass
class WhatIf:
    baseline: dict[str, float]
    changed: dict[str, float]
    per_job: list[dict]                # job, user, wait before/after
    by_user: dict[str, float]          # user -> mean change of wait (s): negative = gains
    inputs: dict[str, int]             # the inputs replayed, by kind
    baseline_matches_history: int      # jobs whose replayed start under the recorded settings is the recorded one
    replayed: int                      # jobs that started in history
    baseline_error: float              # mean |replayed start - recorded start| under the recorded settings (s)
    latency: int                       # the cycle latency measured on the log and used (s)


def whatif(envelopes: Iterable[ev.Envelope], settings: dict[str, str]) -> WhatIf:
    """Replay the recorded inputs under the recorded settings (the baseline, checked against history) and
    under the changed ones; compare per job and in aggregate."""
    rec = recorded_inputs(envelopes)
    apply_settings(rec.config, settings)          # a bad setting is refused before any replay
    (base, base_keys), (after, after_keys) = replay(rec, {}), replay(rec, settings)
    b = {base_keys[o.job_id]: o for o in base.outcomes.values()}
    a = {after_keys[o.job_id]: o for o in after.outcomes.values()}
    owner = {env.event.job_id: env.event.spec.user for env in rec.inputs if isinstance(env.event, ev.JobSubmitted)}
    users = {k: owner.get(k[0], "") for k in b}
    ran = {k: v for k, v in rec.outcomes.items() if v[1] >= 0}
    same = sum(1 for k, v in ran.items() if k in b and b[k].start == v[1])
    errors = [abs(b[k].start - v[1]) for k, v in ran.items() if k in b]
    per_job: list[dict] = []
    by_user: dict[str, list[int]] = {}
    for k in sorted(b, key=lambda k: (k[0], -1 if k[1] is None else k[1])):
        if k not in a:
            continue
        wb, wa = b[k].start - b[k].submit, a[k].start - a[k].submit
        user = users.get(k, "")
        per_job.append({"job": key_text(k), "user": user, "wait_before": wb, "wait_after": wa, "change": wa - wb})
        by_user.setdefault(user, []).append(wa - wb)
    return WhatIf(base.metrics(), after.metrics(), per_job, {u: sum(v) / len(v) for u, v in sorted(by_user.items())},
                  dict(sorted(rec.counts.items())), same, len(ran),
                  sum(errors) / len(errors) if errors else 0.0, rec.latency)
