"""What applying events changed: the reducer's report, from which effects and rows are derived (pure).

The reducer records each job as it was just before an event first touched it (its state, run count,
cancel mark, time limit and batch node), each node whose resources or state it touched, and whether
the configuration changed. The controller turns that into orders for agents
(:mod:`rota.core.effects`), the projector into rows: nobody reads an event's type a second time to
guess what it touched.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .state import Job, Step


@dataclass(frozen=True, slots=True)
class EndedRun:
    """A run of a job that went back to the queue: what ``sacct -D`` lists (REQUEUED, or PREEMPTED when a
    preemption requeued it)."""

    job_id: int
    restarts: int
    start: int
    end: int
    nodes: tuple[str, ...]
    cpus: int
    exit_code: int
    signal: int
    gpus: int = 0
    state: str = "REQUEUED"


@dataclass(slots=True)
class Before:
    """A job as it was before the changes (``state`` None: it did not exist)."""

    job: "Job"                 # the job object itself (kept even if it is purged later in the same fold)
    state: str | None
    restarts: int
    cancel_by: int | None
    time_limit: int | None
    node: str | None           # its batch host, when it ran
    seq: int                   # the last log sequence that touched it
    nodes: tuple[str, ...] = ()   # every node it held, when it ran


class Changes:
    """Collected while folding; read afterwards. One instance may span many events (a batch)."""

    __slots__ = ("jobs", "nodes", "config", "reported", "signals", "invalid", "seq", "touches", "steps", "runs",
                 "warnings")

    def __init__(self) -> None:
        self.jobs: dict[int, Before] = {}
        self.nodes: dict[str, None] = {}        # an ordered set
        self.config = False
        self.reported: set[int] = set()         # jobs whose end their own agent reported
        self.signals: dict[int, int] = {}       # cancelled running jobs: the signal to stop them with
        self.invalid: list[tuple[int, str]] = []   # (sequence, what) of events that fit no transition
        self.seq = 0
        self.touches = 0                        # notes taken (jobs and nodes): whether an event changed anything
        # steps touched, by (job id, run, step id): the step object and whether it existed before
        self.steps: dict[tuple[int, int, int], tuple["Step", bool]] = {}
        self.runs: list[EndedRun] = []          # runs of jobs that went back to the queue (sacct -D)
        self.warnings: dict[int, int] = {}      # running jobs told to stop soon (preempted): the signal

    def job(self, job: "Job") -> None:
        """Note ``job`` before the current event changes it."""
        self.touches += 1
        before = self.jobs.get(job.job_id)
        if before is None:
            self.jobs[job.job_id] = Before(job, job.state, job.restarts, job.cancel_by, job.time_limit,
                                           job.alloc[0].node if job.alloc else None, self.seq,
                                           tuple(a.node for a in job.alloc))
        else:
            before.job, before.seq = job, self.seq

    def new_job(self, job: "Job") -> None:
        """Note a job the current event creates."""
        self.touches += 1
        if job.job_id not in self.jobs:
            self.jobs[job.job_id] = Before(job, None, 0, None, None, None, self.seq)
        else:
            self.jobs[job.job_id].job = job

    def step(self, job_id: int, restarts: int, step: "Step", new: bool = False) -> None:
        """Note a step the current event starts (``new``) or changes."""
        self.touches += 1
        key = (job_id, restarts, step.step_id)
        if key not in self.steps:
            self.steps[key] = (step, new)

    def run_ended(self, run: "EndedRun") -> None:
        """Note a run that ended because its job was requeued."""
        self.runs.append(run)

    def node(self, name: str) -> None:
        """Note that the current event changes node ``name`` (its resources, flags or jobs)."""
        self.touches += 1
        self.nodes[name] = None

    def exited(self, job_id: int) -> None:
        """Note that the job's end was reported (its agent knows: no order needed)."""
        self.reported.add(job_id)

    def cancelled(self, job_id: int, signal: int) -> None:
        """Note that a running job was cancelled, to be stopped with ``signal``."""
        self.signals[job_id] = signal

    def warned(self, job_id: int, signal: int) -> None:
        """Note that a running job goes on for now but is sent ``signal`` (preempted with a grace time)."""
        self.warnings[job_id] = signal

    def ignored(self, what: str) -> None:
        """The current event asked for a transition the state does not allow (it changed nothing)."""
        self.invalid.append((self.seq, what))


class InvalidOnly(Changes):
    """Records only the events that fit no transition (a replay that needs nothing else)."""

    __slots__ = ()

    def job(self, job: "Job") -> None:
        return None

    def new_job(self, job: "Job") -> None:
        return None

    def step(self, job_id: int, restarts: int, step: "Step", new: bool = False) -> None:
        return None

    def run_ended(self, run: "EndedRun") -> None:
        return None

    def node(self, name: str) -> None:
        return None

    def exited(self, job_id: int) -> None:
        return None

    def cancelled(self, job_id: int, signal: int) -> None:
        return None

    def warned(self, job_id: int, signal: int) -> None:
        return None


class _Nothing(InvalidOnly):
    __slots__ = ()

    def ignored(self, what: str) -> None:
        return None


NOTHING: Changes = _Nothing()
"""Records nothing: for folds nobody asks about (simulation, what-if, time travel)."""
