"""When a process that folds the log stores its state (the controller's snapshots, the projections' checkpoints)."""
from __future__ import annotations

from rota.core.state import State


class SnapshotCadence:
    """Every ``every`` events, or every as many events as the last snapshot held jobs when that is more: a
    snapshot is a pass over every job, so its cost per event stays the same however long the queue."""

    __slots__ = ("every", "seq", "jobs")

    def __init__(self, every: int) -> None:
        self.every = every
        self.seq = 0        # the sequence of the last snapshot
        self.jobs = 0       # the jobs it held

    def due(self, state: State) -> bool:
        return state.seq - self.seq >= max(self.every, self.jobs)

    def taken(self, state: State) -> None:
        """A snapshot of ``state`` was stored (or ``state`` was loaded from one)."""
        self.seq, self.jobs = state.seq, len(state.jobs)
