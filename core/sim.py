"""The simulator: the production reducer and scheduler driven by a simulated clock (pure).

Jobs arrive at their submit times; each arrival or completion is an event in the same log a
controller would write, and after the events of one instant a scheduling cycle runs, exactly
as the controller's cycle does. A started job ends after its actual run time, or is killed at
its time limit (TIMEOUT) when ``kill_at_limit``.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from . import events as ev
from .apply import apply
from .schedule import Decision, schedule
from .state import State


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
        self.state = State()
        self.seq = 0
        self.log: list[ev.Envelope] = []
        self.sample_every = sample_every
        self._append(start_time, ev.ClusterConfigured(config=config, source="simulation"), "admin")
        self._append(start_time, ev.ControllerStarted(version="sim", policy=self.policy), "controller")
        for event in setup:
            self._append(start_time, event, "admin")

    def _append(self, ts: int, event, actor: str = "sim") -> None:
        self.seq += 1
        env = ev.Envelope(seq=self.seq, ts=ts, actor=actor, idem=f"sim-{self.seq}", event=event)
        apply(self.state, env)
        if self.record_log:
            self.log.append(env)

    def decide(self, state: State, now: int) -> Decision:
        """One cycle's decision (the scheduler's own; a subclass may stand in for a faulty controller).
        easy_strict keeps the blocked head job's shadow from cycle to cycle, as the published simulator does."""
        d = schedule(state, now, self.policy, kept_shadow=self.kept_shadow)
        self.kept_shadow = d.shadow
        return d

    def run(self, jobs: Iterable[TraceJob], *, stop_when_all_started: bool = False,
            progress: Callable[[int, int], None] | None = None) -> SimResult:
        """Simulate until every job has ended (or started, with ``stop_when_all_started``)."""
        trace = sorted(jobs, key=lambda j: (j.submit, j.trace_id))
        state = self.state
        outcomes: dict[int, JobOutcome] = {}
        runtimes: dict[int, int] = {}
        trace_of: dict[int, TraceJob] = {}
        pending_events: list[tuple[int, int, int, str, Any]] = []  # (t, class, order, kind, payload)
        order = 0
        for tj in trace:
            heapq.heappush(pending_events, (tj.submit, 1, order, "submit", tj))
            order += 1
        total = len(trace)
        started = 0
        cycles = 0
        samples: list[tuple[int, int, int, int]] = []
        next_sample = trace[0].submit if trace else 0
        cap_cpus = sum(n.cpus for n in self.config.nodes)
        cap_gpus = sum(n.gpu_count for n in self.config.nodes)
        busy_cpus = busy_gpus = 0
        while pending_events:
            now = pending_events[0][0]
            while pending_events and pending_events[0][0] == now:
                _t, _cls, _o, kind, payload = heapq.heappop(pending_events)
                if kind == "submit":
                    tj = payload
                    jid = state.next_job_id
                    self._append(now, ev.JobSubmitted(job_id=jid, spec=tj.spec), tj.spec.user)
                    outcomes[jid] = JobOutcome(jid, tj.trace_id, now, runtime=tj.runtime)
                    runtimes[jid] = tj.runtime
                    trace_of[jid] = tj
                else:
                    jid, end_state, elapsed, restarts = payload
                    job = state.jobs.get(jid)
                    if job is None or job.state != "RUNNING" or job.restarts != restarts:
                        continue         # that run was preempted (stopped, or requeued and maybe running again)
                    busy_cpus -= sum(a.cpus for a in job.alloc)
                    busy_gpus -= sum(len(a.gpus) for a in job.alloc)
                    self._append(now, ev.JobExited(job_id=jid, state=end_state, elapsed=elapsed,
                                                   exit_code=0), "agent")
                    o = outcomes.get(jid)
                    if o is not None:
                        o.end, o.state = now, state.jobs[jid].state if jid in state.jobs else end_state
            if state.pending:
                decision = self.decide(state, now)
                cycles += 1
                event = decision.event()
                if event is not None:
                    stopped = [v for p in event.preemptions for v in p.victims]
                    for v in stopped:           # what stops now stops being busy now
                        victim = state.jobs[v.job_id]
                        if v.grace <= 0:
                            busy_cpus -= sum(a.cpus for a in victim.alloc)
                            busy_gpus -= sum(len(a.gpus) for a in victim.alloc)
                            o = outcomes.get(v.job_id)
                            if o is not None:
                                o.end, o.state = now, "PREEMPTED"
                        else:                   # its agent stops it when its grace time runs out
                            heapq.heappush(pending_events, (now + v.grace, 0, order, "exit",
                                                            (v.job_id, "TIMEOUT", now + v.grace - victim.start_time,
                                                             v.restarts)))
                            order += 1
                    self._append(now, event, "controller")
                    for s in event.starts:
                        run = runtimes.get(s.job_id, runtimes.get(s.array_job_id or -1, 0))
                        limit = s.time_limit
                        end_state = "COMPLETED"
                        if self.kill_at_limit and limit and run > limit:
                            run, end_state = limit, "TIMEOUT"
                        restarts = state.jobs[s.job_id].restarts
                        heapq.heappush(pending_events, (now + run, 0, order, "exit",
                                                        (s.job_id, end_state, run, restarts)))
                        order += 1
                        o = outcomes.get(s.job_id)
                        if o is None:   # a split array task
                            parent = outcomes[s.array_job_id]  # type: ignore[index]
                            o = JobOutcome(s.job_id, parent.trace_id, parent.submit, runtime=parent.runtime)
                            outcomes[s.job_id] = o
                        o.start, o.runtime = now, run
                        o.cpus = sum(a.cpus for a in s.alloc)
                        o.gpus = sum(len(a.gpus) for a in s.alloc)
                        o.backfilled = s.backfilled
                        busy_cpus += o.cpus
                        busy_gpus += o.gpus
                        started += 1
                    if progress is not None:
                        progress(started, total)
            if self.sample_every and now >= next_sample:
                samples.append((now, busy_cpus, busy_gpus, len(state.pending)))
                next_sample = now + self.sample_every
            if stop_when_all_started and started >= total and not state.pending:
                break
        return SimResult(self.policy, cap_cpus, cap_gpus, outcomes, cycles, self.log, samples, state)
