"""A simulated clock over a state (pure): the discrete-event driver the simulator and ``whatif`` share.

Items wait on a heap by (time, class, tie): at one moment a lower class goes first, and within a class
the lower tie (by default, the order the items were put). Events are applied to the state through the
production reducer as a controller's log would carry them, numbered in order.
"""
from __future__ import annotations

import heapq
from typing import Any, Callable

from . import events as ev
from .apply import apply
from .changes import NOTHING, Changes
from .state import RUNNING, Job, State


class Timeline:
    """The heap of what happens next, and the state the events so far have made."""

    def __init__(self, state: State | None = None, *, idem: str = "sim-", record: list[ev.Envelope] | None = None
                 ) -> None:
        self.state = state if state is not None else State()
        self.seq = 0
        self.idem = idem               # prefix of each event's idempotency id
        self.record = record           # where each applied event is kept, if anywhere
        self._heap: list[tuple[int, int, int, int, Any]] = []
        self._count = 0

    def at(self, t: int, cls: int, item: Any, tie: int | None = None) -> None:
        """Put ``item`` at time ``t``, in class ``cls`` (lower first), ``tie`` within it (default: in turn)."""
        self._count += 1
        heapq.heappush(self._heap, (t, cls, self._count if tie is None else tie, self._count, item))

    def waiting(self) -> int:
        """How many items are still due."""
        return len(self._heap)

    def put(self, ts: int, event: Any, actor: str, changes: Changes = NOTHING) -> ev.Envelope:
        """Apply ``event`` at ``ts`` as the log's next record (noting what it changed in ``changes``)."""
        self.seq += 1
        env = ev.Envelope(seq=self.seq, ts=ts, actor=actor, idem=f"{self.idem}{self.seq}", event=event)
        apply(self.state, env, changes)
        if self.record is not None:
            self.record.append(env)
        return env

    def current_run(self, job_id: int, restarts: int) -> Job | None:
        """The job, if it still runs the run that started with ``restarts`` (not ended, stopped or requeued)."""
        job = self.state.jobs.get(job_id)
        return job if job is not None and job.state == RUNNING and job.restarts == restarts else None

    def run(self, handle: Callable[[int, Any], None], instant_done: Callable[[int], bool] | None = None) -> None:
        """Take the items in order, ``handle(t, item)`` each; after the last item of a moment, ``instant_done(t)``
        (which may put more, even at ``t``; False stops the clock)."""
        heap = self._heap
        while heap:
            t, _cls, _tie, _n, item = heapq.heappop(heap)
            handle(t, item)
            if instant_done is not None and (not heap or heap[0][0] != t) and not instant_done(t):
                return
