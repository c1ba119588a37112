"""The simulator: the production reducer and scheduler driven by a simulated clock (pure).

Jobs arrive at their submit times; each arrival or completion is an event in the same log a
controller would write, and after the events of one instant a scheduling cycle runs, exactly
as the controller's cycle does. A started job ends after its actual run time, or is killed at
its time limit (TIMEOUT) when ``kill_at_limit``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from . import events as ev
from .policies import cycle_policy, next_backfill
from .schedule import Decision, schedule
from .state import State
from .timeline import Timeline


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a workload: when it arrives, what it asks for, how long it really runs."""

    submit: int
    spec: ev.JobSpec
    runtime: int
    trace_id: int = 0


@dataclass(slots=True)
class JobOutcome:
    job_id: int
    trace_id: int
    submit: int
    start: int = -1
    end: int = -1
    runtime: int = 0
    cpus: int = 0
    gpus: int = 0
    state: str = "PENDING"
    backfilled: bool = False


@dataclass(slots=True)
class SimResult:
    policy: str
    capacity_cpus: int
    capacity_gpus: int
    outcomes: dict[int, JobOutcome]
    cycles: int
    log: list[ev.Envelope] = field(default_factory=list)
    samples: list[tuple[int, int, int, int]] = field(default_factory=list)  # (t, busy cpus, busy gpus, queued)
    state: State | None = None

    def finished(self) -> list[JobOutcome]:
        return [o for o in self.outcomes.values() if o.start >= 0]

    def metrics(self, tau: int = 10) -> dict[str, float]:
        """Average wait, bounded slowdown, utilisation (CPU and GPU) and makespan."""
        done = self.finished()
        if not done:
            return {"jobs": 0}
        waits = [o.start - o.submit for o in done]
        bsld = [max(1.0, (o.start - o.submit + o.runtime) / max(o.runtime, tau)) for o in done]
        first_submit = min(o.submit for o in self.outcomes.values())
        last_end = max(o.end for o in done)
        last_start = max(o.start for o in done)
        makespan = max(1, last_end - first_submit)
        cpu_work = sum(o.runtime * o.cpus for o in done)
        gpu_work = sum(o.runtime * o.gpus for o in done)
        out = {
            "jobs": float(len(done)),
            "avg_wait": sum(waits) / len(done),
            "avg_bsld": sum(bsld) / len(done),
            "makespan": float(makespan),
            "util": cpu_work / (makespan * max(1, self.capacity_cpus)),
            "util_to_last_start": cpu_work / (max(1, last_start - first_submit) * max(1, self.capacity_cpus)),
            "backfilled": float(sum(1 for o in done if o.backfilled)),
        }
        if self.capacity_gpus:
            out["gpu_util"] = gpu_work / (makespan * self.capacity_gpus)
        return out


_EXIT, _ARRIVE = 0, 1      # at one moment, runs end before jobs arrive
_TICK = object()           # a backfill moment under Slurm's cadence (rota_cadence=slurm)


@dataclass(frozen=True, slots=True)
class Action:
    """An administrator's command at a moment of a workload (drain, resume...): ``make`` turns the state then
    into its event."""

    at: int
    make: Callable[[State], Any]


@dataclass(slots=True)
class _Exit:
    """A run's end, due at a moment: unless the run was stopped or requeued before it."""

    job_id: int
    state: ev.JobEndState
    elapsed: int
    restarts: int


@dataclass(slots=True)
class _Tally:
    """What one run of the simulator keeps beside the state: outcomes, real run times and its figures."""

    outcomes: dict[int, JobOutcome]
    runtimes: dict[int, int]
    total: int
    next_sample: int
    started: int = 0
    cycles: int = 0
    busy_cpus: int = 0
    busy_gpus: int = 0
    samples: list[tuple[int, int, int, int]] = field(default_factory=list)

    def busy(self, alloc: Iterable[ev.NodeAlloc], sign: int) -> None:
        for a in alloc:
            self.busy_cpus += sign * a.cpus
            self.busy_gpus += sign * len(a.gpus)


class Simulator:
    """Run a workload through ``apply`` and ``schedule`` on a simulated clock."""

    def __init__(self, config: ev.ClusterConfig, policy: str | None = None, *,
                 record_log: bool = True, kill_at_limit: bool = True, start_time: int = 0,
                 sample_every: int = 0, setup: Iterable[Any] = ()) -> None:
        """``setup``: events an administrator logs before the workload (accounts and QOS, say)."""
        self.policy = policy or config.scheduler.policy
        if self.policy != config.scheduler.policy:   # the log's configuration says what the cycles ran under
            config = config.model_copy(update={"scheduler": config.scheduler.model_copy(update={"policy": self.policy})})
        self.config = config
        self.kept_shadow: tuple[int, int] | None = None
        self.record_log = record_log
        self.kill_at_limit = kill_at_limit
        self.log: list[ev.Envelope] = []
        self.timeline = Timeline(idem="sim-", record=self.log if record_log else None)
        self.state = self.timeline.state
        self.sample_every = sample_every
        self.origin, self.next_tick = start_time, -1      # Slurm's cadence: backfill cycles on a grid from here
        self.timeline.put(start_time, ev.ClusterConfigured(config=config, source="simulation"), "admin")
        self.timeline.put(start_time, ev.ControllerStarted(version="sim", policy=self.policy), "controller")
        for event in setup:
            self.timeline.put(start_time, event, "admin")

    def decide(self, state: State, now: int, policy: str | None = None) -> Decision:
        """One cycle's decision (the scheduler's own; a subclass may stand in for a faulty controller) under
        ``policy`` (the simulation's by default). easy_strict keeps the blocked head job's shadow from cycle to
        cycle, as the published simulator does."""
        d = schedule(state, now, policy or self.policy, kept_shadow=self.kept_shadow)
        self.kept_shadow = d.shadow
        return d

    def run(self, jobs: Iterable[TraceJob], *, stop_when_all_started: bool = False,
            progress: Callable[[int, int], None] | None = None, actions: Iterable[Action] = ()) -> SimResult:
        """Simulate until every job has ended (or started, with ``stop_when_all_started``); ``actions`` are
        applied at their moments, before the jobs that arrive then."""
        trace = sorted(jobs, key=lambda j: (j.submit, j.trace_id))
        for act in actions:
            self.timeline.at(act.at, _ARRIVE, act)
        for tj in trace:
            self.timeline.at(tj.submit, _ARRIVE, tj)
        tally = _Tally({}, {}, len(trace), trace[0].submit if trace else 0)

        def handle(now: int, item: TraceJob | _Exit | Action | object) -> None:
            if item is _TICK:
                return      # a backfill moment under Slurm's cadence: the instant's cycle is the point
            if isinstance(item, Action):
                self.timeline.put(now, item.make(self.state), "admin")
            elif isinstance(item, TraceJob):
                self._arrive(now, item, tally)
            elif isinstance(item, _Exit):
                self._exit(now, item, tally)

        def instant_done(now: int) -> bool:
            if self.state.pending:
                self._cycle(now, tally, progress)
            if self.sample_every and now >= tally.next_sample:
                tally.samples.append((now, tally.busy_cpus, tally.busy_gpus, len(self.state.pending)))
                tally.next_sample = now + self.sample_every
            return not (stop_when_all_started and tally.started >= tally.total and not self.state.pending)

        self.timeline.run(handle, instant_done)
        return SimResult(self.policy, sum(n.cpus for n in self.config.nodes), sum(n.gpu_count for n in self.config.nodes),
                         tally.outcomes, tally.cycles, self.log, tally.samples, self.state)

    def _arrive(self, now: int, tj: TraceJob, tally: _Tally) -> None:
        jid = self.state.next_job_id
        self.timeline.put(now, ev.JobSubmitted(job_id=jid, spec=tj.spec), tj.spec.user)
        tally.outcomes[jid] = JobOutcome(jid, tj.trace_id, now, runtime=tj.runtime)
        tally.runtimes[jid] = tj.runtime

    def _exit(self, now: int, end: _Exit, tally: _Tally) -> None:
        job = self.timeline.current_run(end.job_id, end.restarts)
        if job is None:
            return         # that run was preempted (stopped, or requeued and maybe running again)
        tally.busy(job.alloc, -1)
        self.timeline.put(now, ev.JobExited(job_id=end.job_id, state=end.state, elapsed=end.elapsed, exit_code=0),
                          "agent")
        o = tally.outcomes.get(end.job_id)
        if o is not None:
            o.end = now
            o.state = self.state.jobs[end.job_id].state if end.job_id in self.state.jobs else end.state

    def _cycle(self, now: int, tally: _Tally, progress: Callable[[int, int], None] | None) -> None:
        tally.cycles += 1
        sched = self.config.scheduler
        slurm_cadence = sched.cadence == "slurm"
        backfill = not slurm_cadence or (now - self.origin) % max(1, sched.bf_interval) == 0
        event = self.decide(self.state, now, cycle_policy(sched, backfill)).event()
        # the next backfill moment, unless nothing is left to happen (a job no cycle can start would tick forever)
        if slurm_cadence and self.next_tick <= now and (event is not None or self.timeline.waiting()):
            self.next_tick = next_backfill(sched, self.origin, now)
            self.timeline.at(self.next_tick, _ARRIVE, _TICK)
        if event is None:
            return
        for v in [v for p in event.preemptions for v in p.victims]:   # what stops now stops being busy now
            victim = self.state.jobs[v.job_id]
            if v.grace > 0:    # its agent stops it when its grace time runs out
                self.timeline.at(now + v.grace, _EXIT, _Exit(v.job_id, "TIMEOUT", now + v.grace - victim.start_time,
                                                             v.restarts))
                continue
            tally.busy(victim.alloc, -1)
            o = tally.outcomes.get(v.job_id)
            if o is not None:
                o.end, o.state = now, "PREEMPTED"
        self.timeline.put(now, event, "controller")
        for s in event.starts:
            self._start(now, s, tally)
        if progress is not None:
            progress(tally.started, tally.total)

    def _start(self, now: int, s: ev.Start, tally: _Tally) -> None:
        run = tally.runtimes.get(s.job_id, tally.runtimes.get(s.array_job_id or -1, 0))
        end_state: ev.JobEndState = "COMPLETED"
        if self.kill_at_limit and s.time_limit and run > s.time_limit:
            run, end_state = s.time_limit, "TIMEOUT"
        self.timeline.at(now + run, _EXIT, _Exit(s.job_id, end_state, run, self.state.jobs[s.job_id].restarts))
        o = tally.outcomes.get(s.job_id)
        if o is None:   # a split array task: its array's outcome has its submit
            parent = tally.outcomes[s.array_job_id if s.array_job_id is not None else s.job_id]
            o = tally.outcomes[s.job_id] = JobOutcome(s.job_id, parent.trace_id, parent.submit, runtime=parent.runtime)
        o.start, o.runtime = now, run
        o.cpus = sum(a.cpus for a in s.alloc)
        o.gpus = sum(len(a.gpus) for a in s.alloc)
        o.backfilled = s.backfilled
        tally.busy(s.alloc, 1)
        tally.started += 1
