"""The reason-history lane of the projection: each job's pending-reason intervals (``reasons`` table).

Deriving them re-runs the scheduler at every moment ``rota why`` evaluates (about what the controller
spent deciding), so it runs beside the job rows, not in their way: its own state, checkpoint and
snapshot in the same database, its folds in a worker thread, in small batches, so neither the rows nor
the controller sharing the process wait for it. Its rows are idempotent (keyed by job, start and
sequence): a batch written twice after a crash writes the same rows.
"""
from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import Any, Callable

from rota.core import events as ev
from rota.core.reason_history import ReasonHistory, Span
from rota.core.state import State, dump_snapshot, load_snapshot
from rota.wire.cadence import SnapshotCadence

log = logging.getLogger("rota.projections")

_UPSERT_SPAN = "INSERT OR REPLACE INTO reasons VALUES (?, ?, ?, ?, ?)"
BATCH = 500          # events folded per step: a few hundred scheduler runs at most
YIELD_AFTER = 0.05   # seconds of folding after which the lane, beside the controller, pauses


def span_rows(spans: list[Span]) -> list[tuple]:
    """``reasons`` table rows."""
    return [(s.job_id, s.code, s.start, s.end, s.seq) for s in spans]


class ReasonLane:
    """Follows the log into the ``reasons`` table of the projection open on ``db``."""

    def __init__(self, db: Any, eventlog: Any, *, snapshot_every: int = 20_000,
                 may_write: Callable[[], bool] = lambda: True, give_way: Callable[[], None] | None = None) -> None:
        self.db = db
        self.log = eventlog
        self.cadence = SnapshotCadence(snapshot_every)
        self.may_write = may_write            # False while the disk is nearly full: the lane waits
        self.state = State()
        self.history = ReasonHistory(give_way)   # the scheduler it re-runs pauses there for requests beside it
        self._lock = threading.Lock()      # the state is folded in a worker thread
        self._planned: tuple[str, ...] | None = None     # as last written

    async def open(self, meta: dict) -> None:
        """Resume from the lane's stored state (``meta``: the projection's meta table)."""
        if meta.get("reasons_state"):
            self.state = load_snapshot(meta["reasons_state"])
            self.cadence.taken(self.state)
            spans = await self.db.execute_fetchall("SELECT job_id, code, start, seq FROM reasons WHERE end_time IS NULL")
            self.history.resume(self.state, [Span(*r) for r in spans])

    @property
    def seq(self) -> int:
        return self.state.seq

    async def catch_up(self, to_seq: int | None = None, *, beside: bool = False) -> int:
        """Fold everything the log holds past the lane's checkpoint; returns the number of events.
        ``beside``: following a live log beside other work (the controller's, in rota up) that must not wait
        for the lane's folds: after a step of d seconds (more than YIELD_AFTER) the lane pauses for 2d."""
        n = 0
        async for chunk in (self.log.read_batches(self.state.seq + 1, to_seq) if to_seq is not None
                            else self.log.read_tail(self.state.seq + 1)):
            chunk = [env for env in chunk if env.seq > self.state.seq]
            for i in range(0, len(chunk), BATCH):
                part = chunk[i:i + BATCH]
                t0 = time.perf_counter()
                spans, snapshot = await asyncio.to_thread(self._fold, part)
                took = time.perf_counter() - t0
                await self._write(spans, snapshot)
                n += len(part)
                if beside and took > YIELD_AFTER:
                    # its folds hold the interpreter (one lock for every thread): a step that took d
                    # seconds is followed by 2d of leaving it to the controller beside it, as a cycle is
                    await asyncio.sleep(2 * took)
        return n

    def _fold(self, part: list[ev.Envelope]) -> tuple[list[tuple], bytes | None]:
        with self._lock:
            self.history.fold(self.state, part)
            snapshot = None
            if self.cadence.due(self.state):
                snapshot = dump_snapshot(self.state)
                self.cadence.taken(self.state)
            return span_rows(self.history.take()), snapshot

    def _settle(self, now: int) -> list[tuple]:
        with self._lock:
            if now <= self.state.now:
                return []
            self.history.settle(self.state, now)
            return span_rows(self.history.take())

    def _snapshot(self) -> bytes | None:
        with self._lock:
            if self.cadence.seq == self.state.seq:
                return None
            self.cadence.taken(self.state)
            return dump_snapshot(self.state)

    async def _write(self, spans: list[tuple], snapshot: bytes | None) -> None:
        db = self.db
        if spans:
            await db.executemany(_UPSERT_SPAN, spans)
        await self._write_planned()
        await db.execute("INSERT OR REPLACE INTO meta VALUES ('reasons_seq', ?)", (self.state.seq,))
        if snapshot is not None:
            await db.execute("INSERT OR REPLACE INTO meta VALUES ('reasons_state', ?)", (snapshot,))
        await db.commit()

    async def settle(self, now: int) -> None:
        """The clock has passed the last event's second: no more events with its timestamp can come,
        so the reasons at that moment (and at begin times reached since) are recorded."""
        spans = await asyncio.to_thread(self._settle, now)
        if spans:
            await self.db.executemany(_UPSERT_SPAN, spans)
        if spans or await self._write_planned():
            await self.db.commit()

    async def _write_planned(self) -> bool:
        """Keep the planned nodes (sinfo's ``planned``) in the meta table when they changed; whether they did."""
        planned = self.history.planned
        if planned == self._planned:
            return False
        await self.db.execute("INSERT OR REPLACE INTO meta VALUES ('planned', ?)", (json.dumps(list(planned)),))
        self._planned = planned
        return True

    async def follow(self, stop: asyncio.Event, poll: float = 1.0) -> None:
        """Keep the lane up to date until ``stop`` is set."""
        said = ""
        while not stop.is_set():
            try:
                if not self.may_write():
                    raise OSError("the disk is nearly full (it goes on when there is room again)")
                await self.catch_up(beside=True)
                await self.settle(int(time.time()) - 1)
                said = ""
            except Exception as exc:  # noqa: BLE001 - the log is briefly unavailable: retry
                if str(exc) != said:
                    log.warning("reason history paused: %s", exc)
                said = str(exc)
            try:
                await asyncio.wait_for(stop.wait(), timeout=poll)
            except asyncio.TimeoutError:
                pass

    async def save_state(self) -> None:
        """Store the lane's state with its checkpoint (on shutdown: a fast restart)."""
        snapshot = await asyncio.to_thread(self._snapshot)
        if snapshot is not None:
            await self.db.execute("INSERT OR REPLACE INTO meta VALUES ('reasons_state', ?)", (snapshot,))
            await self.db.commit()
