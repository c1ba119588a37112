"""Scheduling policies as objects behind one protocol (pure).

The walk over the ranked jobs (:func:`rota.core.schedule.schedule`) asks its policy four things:
whether a job is considered at all, how far ahead a search may look, whether a partition may be
tried for a job of that duration, and what happens when a job cannot start now (reserve, or block).
A policy object lives for one cycle and keeps what it has learnt in it.

- ``fifo``: strict priority, no backfill: a blocked job blocks its partitions.
- ``easy``: one reservation, for the first blocked job; later jobs start only if they do not
  disturb it.
- ``easy_strict``: EASY as in the RLScheduler simulator: a later job may start only if it
  ends strictly before the reserved job's start, the shadow (no use of spare resources beside the
  reservation). The simulator keeps the head job's shadow from the cycle that first blocked it while
  other jobs end early (``kept``), as the published simulator does; a live controller recomputes it
  every cycle, since its decisions must follow from the log alone.
- ``conservative`` (default): every job gets a reservation at its earliest start within
  ``bf_window``; a job starts now only if that disturbs no reservation of a higher-priority job.
"""
from __future__ import annotations

from typing import Protocol, Sequence

from .events import SchedulerParams
from .profile import INF


class Policy(Protocol):
    """One cycle's policy."""

    name: str
    book: bool        # a reservation holds its nodes on the timelines (later jobs are placed around it)
    head: tuple[int, int] | None     # the blocked head job and the shadow kept for it (easy_strict)

    def considers(self, parts: Sequence[str]) -> bool:
        """Whether a job using ``parts`` is tested at all (False: it waits for Priority)."""

    def horizon(self) -> int:
        """The latest start a search may find (``now``: start now or not at all)."""

    def may_try(self, partition: str, duration: int) -> bool:
        """Whether a job of ``duration`` seconds may be placed in ``partition``."""

    def blocked(self, parts: Sequence[str], start: int | None, job_id: int) -> bool:
        """Job ``job_id`` could not start now (its earliest start is ``start``, None: none in the
        horizon): True when it gets a reservation."""

    @property
    def reserved(self) -> bool:
        """Whether a reservation was made this cycle (later starts are backfill)."""


class Fifo:
    name = "fifo"
    book = True
    head: tuple[int, int] | None = None

    def __init__(self, now: int) -> None:
        self.now = now
        self.blocked_parts: set[str] = set()
        self.reserved = False

    def considers(self, parts: Sequence[str]) -> bool:
        return not all(p in self.blocked_parts for p in parts)

    def horizon(self) -> int:
        return self.now

    def may_try(self, partition: str, duration: int) -> bool:
        return partition not in self.blocked_parts

    def blocked(self, parts: Sequence[str], start: int | None, job_id: int) -> bool:
        self.blocked_parts.update(parts)
        return False


class Easy:
    name = "easy"
    book = True
    head: tuple[int, int] | None = None

    def __init__(self, now: int) -> None:
        self.now = now
        self.reserved = False
        self.shadow = INF              # the reserved job's start

    def considers(self, parts: Sequence[str]) -> bool:
        return True

    def horizon(self) -> int:
        return self.now if self.reserved else INF

    def may_try(self, partition: str, duration: int) -> bool:
        return True

    def blocked(self, parts: Sequence[str], start: int | None, job_id: int) -> bool:
        if start is None:
            return False
        if not self.reserved:
            self.reserved, self.shadow = True, start
        return True


class EasyStrict(Easy):
    name = "easy_strict"
    book = False      # a backfill must end before the shadow: the time alone keeps it out of the way

    def __init__(self, now: int, kept: tuple[int, int] | None = None) -> None:
        super().__init__(now)
        self.kept = kept                      # (head job, shadow) from an earlier cycle

    def blocked(self, parts: Sequence[str], start: int | None, job_id: int) -> bool:
        if start is None:
            return False
        if not self.reserved:
            shadow = self.kept[1] if self.kept is not None and self.kept[0] == job_id else start
            self.reserved, self.shadow, self.head = True, shadow, (job_id, shadow)
        return True

    def may_try(self, partition: str, duration: int) -> bool:
        return not self.reserved or self.now + duration < self.shadow


class Conservative:
    name = "conservative"
    book = True
    head: tuple[int, int] | None = None

    def __init__(self, now: int, window: int) -> None:
        self.now = now
        self.window_end = now + window
        self.reserved = False

    def considers(self, parts: Sequence[str]) -> bool:
        return True

    def horizon(self) -> int:
        return self.window_end

    def may_try(self, partition: str, duration: int) -> bool:
        return True

    def blocked(self, parts: Sequence[str], start: int | None, job_id: int) -> bool:
        if start is None:
            return False
        self.reserved = True
        return True


POLICIES = ("fifo", "easy", "easy_strict", "conservative")


def make_policy(name: str, now: int, bf_window: int, kept: tuple[int, int] | None = None) -> Policy:
    """The policy called ``name`` for a cycle at ``now`` (``kept``: easy_strict's head job and shadow
    from an earlier cycle); ValueError for an unknown name."""
    if name == "fifo":
        return Fifo(now)
    if name == "easy":
        return Easy(now)
    if name == "easy_strict":
        return EasyStrict(now, kept)
    if name == "conservative":
        return Conservative(now, bf_window)
    raise ValueError(f"unknown scheduling policy {name!r}; choose one of {', '.join(POLICIES)}")


def cycle_policy(sched: SchedulerParams, backfill: bool) -> str:
    """The policy a cycle runs: the configured one, except under Slurm's cadence (``rota_cadence=slurm``)
    where only the backfill cycles (every ``bf_interval``) run it and a cycle after a change is the main
    scheduler's strict-priority pass."""
    return sched.policy if backfill or sched.cadence != "slurm" else "fifo"


def slurm_differences(sched: SchedulerParams) -> list[str]:
    """The settings under which rota decides differently from Slurm 22.05's sched/backfill, each as a sentence
    saying how (none under ``rota_policy=conservative`` with ``rota_cadence=slurm``)."""
    out = []
    if sched.policy != "conservative":
        out.append(f"rota_policy={sched.policy}: Slurm's backfill reserves nodes for every job it tests within "
                   "bf_window (rota's conservative policy), so jobs may start in another order than Slurm's")
    if sched.cadence != "slurm":
        out.append(f"rota's cadence: every change gets a backfill pass, where Slurm's backfill runs every bf_interval "
                   f"({sched.bf_interval}s) and a change gets its main scheduler's strict-priority pass, so a job "
                   "rota backfilled could have started up to that much later under Slurm, and jobs submitted in "
                   "between could have gone first (SchedulerParameters=rota_cadence=slurm gives Slurm's)")
    return out


def next_backfill(sched: SchedulerParams, origin: int, now: int) -> int:
    """Under Slurm's cadence, the first backfill moment after ``now`` on the grid of ``bf_interval`` from
    ``origin``."""
    step = max(1, sched.bf_interval)
    return now + step - (now - origin) % step
