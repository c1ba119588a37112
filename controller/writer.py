"""The group-committing writer: the only code that appends to the log, and the keeper of the state.

Requests queue up; each batch is prepared against the state as it will be when each event lands,
applied speculatively, and appended as atomic batches or one record after another, each fenced at
its own sequence (so the log keeps exactly this order); callers are answered once every append is
acknowledged. What the batch changed (:class:`~rota.core.changes.Changes`) becomes the agents'
orders. Anything unexpected (a timeout, a duplicate, a fence) rebuilds the state from the log and
answers each request from what the log really holds.
"""
from __future__ import annotations

import asyncio
import functools
import gc
import logging
import time
from typing import Any, Callable

from rota.core import effects
from rota.core import events as ev
from rota.core.apply import apply, fold
from rota.core.changes import Changes, InvalidOnly
from rota.core.state import State

from rota.wire import collector

from .eventlog import Appended, AtomicRefused, EventLog, FencedError, LogUnavailable
from .logerrors import NotSent
from .logbatch import ATOMIC_FROM
from .outbox import Outbox
from .recent import Recent
from .writequeue import FairQueue, OffLoop, Prepare

SLOW_APPEND = 2.0     # seconds: an append taking longer is logged

log = logging.getLogger("rota.controller")

_REPORTED_INVALID = 20      # invalid transitions named one by one per load; the rest are counted


def may_start_something(event: Any) -> bool:
    """Whether a cycle right after ``event`` could decide anything new. A held job is skipped by the
    scheduler, so submitting one (or holding one) cannot; the periodic cycle still runs."""
    if isinstance(event, ev.JobSubmitted):
        return not event.spec.hold
    return not isinstance(event, (ev.JobHeld, ev.RequestDenied))


class Writer:
    """Owns the folded state and the only path onto the log."""

    def __init__(self, eventlog: EventLog, *, now: Callable[[], int], name: str, outbox: Outbox | None = None,
                 max_batch: int = 256) -> None:
        self.log = eventlog
        self.now = now
        self.name = name
        self.outbox = outbox
        self.max_batch = max_batch
        self.state = State()
        self.leader = False
        self.dirty = asyncio.Event()          # something changed that a cycle may act on
        self.lock = asyncio.Lock()            # held while a batch is in flight
        self.stale = False                    # the state may hold events the log does not: reload first
        self.invalid = 0                      # records that fit no transition, seen since the start
        self._queue = FairQueue()
        self._task: asyncio.Task | None = None
        self._recent: Recent[str, int] = Recent(200_000)   # idempotency id -> sequence, for retries
        self._reported = 0
        self._retried: set[int] = set()       # requests already tried again after a fence by a set-aside record
        self._unsure: Recent[str, bool] = Recent(1024)   # appends of unknown outcome: theirs if they land late
        self.snapshot_seq = 0                 # the sequence of the snapshot the last rebuild started from
        self._landed: asyncio.Future | None = None   # resolved when the next batch has been through

    # ------------------------------------------------------------ loading

    async def load(self) -> None:
        """Rebuild the state: nearest snapshot + replay of the tail."""
        state, _landed = await self._rebuild()
        self.state = state
        gc.freeze()   # what was loaded lives as long as the process: keep it out of later collections

    async def _rebuild(self, since: int | None = None) -> tuple[State, dict[str, int]]:
        """Snapshot + log into a new state; also the idems of the events after ``since``."""
        state = await self.log.snapshots.latest() or State()
        self.snapshot_seq = state.seq
        landed: dict[str, int] = {}
        seen = InvalidOnly()
        with collector.paused():      # a replay allocates millions of objects that mostly live on
            remember = self.remember
            async for chunk in self.log.read_batches(state.seq + 1):
                fold(chunk, state, seen)
                for env in chunk:
                    if env.event is not None:
                        remember(env.idem, env.seq)
                        if since is not None and env.seq > since:
                            landed[env.idem] = env.seq
        self._reported = 0
        self._report(state, seen.invalid)
        return state, landed

    async def catch_up(self) -> int:
        """Fold what the log holds beyond the state (a standby following the leader); the events folded."""
        seen = InvalidOnly()
        n = 0
        async with self.lock:
            async for chunk in self.log.read_batches(self.state.seq + 1):
                fold(chunk, self.state, seen)
                for env in chunk:
                    self.remember(env.idem, env.seq)
                n += len(chunk)
        if n:
            self._report(self.state, seen.invalid)
        return n

    def _report(self, state: State, invalid: list[tuple[int, str]]) -> None:
        """Name, by sequence, the records the reducer set aside and those that changed nothing."""
        for seq, why in state.set_aside[self._reported:]:
            log.error("log record %d set aside by the reducer: %s", seq, why)
        self._reported = len(state.set_aside)
        self.invalid += len(invalid)
        for seq, what in invalid[:_REPORTED_INVALID]:
            log.warning("log record %d changed nothing: %s", seq, what)
        if len(invalid) > _REPORTED_INVALID:
            log.warning("%d more log records changed nothing (%d in all since the start)",
                        len(invalid) - _REPORTED_INVALID, self.invalid)

    def remember(self, idem: str, seq: int) -> None:
        if idem:
            self._recent[idem] = seq

    # ------------------------------------------------------------ writing

    async def append(self, event: Any, actor: str, idem: str = "") -> ev.Envelope:
        """Append ``event`` on top of the folded state and apply it (no read back)."""
        return (await self.write(lambda _state: event, actor, idem))[0]

    async def write(self, prepare: Prepare, actor: str, idem: str = "") -> tuple[ev.Envelope, bool]:
        """Validate-and-append through the group commit.

        ``prepare(state)`` builds the event from the state as it will be when the event lands (or
        raises ``Rejected``). Returns the envelope and whether the log already held ``idem`` (a retry;
        the envelope then carries the original's sequence).
        """
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._queue.append((prepare, actor, idem, fut))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain())
        return await fut

    async def changed(self, timeout: float) -> bool:
        """Wait until the next batch has been through the log (the state may have changed), at most
        ``timeout`` seconds; whether one was."""
        if self._landed is None or self._landed.done():
            self._landed = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(asyncio.shield(self._landed), timeout)
        except TimeoutError:
            return False
        return True

    def _signal_landed(self) -> None:
        if self._landed is not None and not self._landed.done():
            self._landed.set_result(None)

    async def _drain(self) -> None:
        while self._queue:
            # an off-loop prepare leads its batch: the state readers see meanwhile holds only what landed
            batch = self._queue.take(self.max_batch)
            async with self.lock:
                try:
                    await self._commit(batch)
                except BaseException as exc:  # never leave a caller waiting
                    for *_rest, fut in batch:
                        if not fut.done():
                            _reject(fut, exc if isinstance(exc, Exception) else LogUnavailable(str(exc)))
                    if not isinstance(exc, Exception):
                        raise
                finally:
                    self._signal_landed()

    async def _commit(self, batch: list) -> None:
        if self.stale and not await self._reload():
            _fail(batch, LogUnavailable("the log is not readable"))
            return
        if not self.leader:
            _fail(batch, FencedError(self.state.seq))
            return
        base = self.state.seq
        changes = Changes()
        staged = await self._stage(batch, changes)
        if not staged:
            return
        began = time.monotonic()
        acks = await self._append(base, staged)
        took = time.monotonic() - began
        clean = all(not isinstance(a, BaseException) and not a.duplicate and a.seq == env.seq
                    for a, (env, _, _) in zip(acks, staged))
        if not clean:
            failed = next((a for a in acks if isinstance(a, BaseException)), None)
            log.warning("appending %d event(s) after sequence %d did not land as sent (%s, after %.1f s): reading "
                        "back what the log holds", len(staged), base,
                        f"{type(failed).__name__}: {failed}" if failed else "a duplicate or a sequence moved", took)
            await self._reconcile(base, staged, acks)
            log.warning("the state now holds the log up to sequence %d (%.1f s after the append began)",
                        self.state.seq, time.monotonic() - began)
            return
        if took > SLOW_APPEND:
            log.warning("appending %d event(s) after sequence %d took %.1f s", len(staged), base, took)
        for env, fut, _ in staged:
            self.remember(env.idem, env.seq)
            _resolve(fut, (env, False))
        if any(may_start_something(env.event) for env, _, _ in staged):
            self.dirty.set()
        self._report(self.state, changes.invalid)
        if self.outbox is not None:
            self.outbox.put(effects.orders(self.state, changes))

    async def _append(self, base: int, staged: list) -> list:
        """Each staged event's acknowledgement or exception: as atomic batches where the log takes them and
        the group is large enough to pay for one (one sync for the lot), else one by one, each sent once the
        one before it landed where it was fenced (sent together, a record fenced at its own sequence could
        land after another writer's record that took its predecessor's place)."""
        ready_chain = getattr(self.log, "ready_chain", None)
        if ready_chain is not None:
            await ready_chain(base)
        append_batch = getattr(self.log, "append_batch", None)
        if len(staged) >= ATOMIC_FROM and append_batch is not None and getattr(self.log, "atomic", False):
            try:
                return list(await append_batch([(env.event, env.actor, env.idem, env.ts) for env, _, _ in staged],
                                               base))
            except AtomicRefused as exc:
                log.warning("the log refused a batch (%s): appending one by one", exc)
            except (FencedError, LogUnavailable) as exc:
                return [exc] * len(staged)
        last = staged[-1][0].seq
        acks: list = []
        for env, _, _ in staged:
            ack: Appended | Exception
            try:
                ack = await self.log.append(env.event, actor=env.actor, idem=env.idem, ts=env.ts,
                                            expected_last=env.seq - 1, seal=env.seq == last)
            except Exception as exc:  # noqa: BLE001 - answered by the reconcile
                ack = exc
            acks.append(ack)
            if isinstance(ack, BaseException) or ack.duplicate or ack.seq != env.seq:
                break
        return acks + [NotSent() for _ in staged[len(acks):]]

    async def _stage(self, batch: list, changes: Changes) -> list[tuple[ev.Envelope, asyncio.Future, tuple]]:
        """Prepare and apply each request's event in turn; answer retries and refusals at once."""
        staged: list[tuple[ev.Envelope, asyncio.Future, tuple]] = []
        first_of: dict[str, asyncio.Future] = {}
        for item in batch:
            prepare, actor, idem, fut = item
            if idem and idem in self._recent:   # a retry of something already on the log
                _resolve(fut, (ev.Envelope.trusted(self._recent[idem], self.state.now, actor, idem, None), True))
                continue
            if idem in first_of:                # a retry that arrived with its first try: one event, one answer
                first_of[idem].add_done_callback(functools.partial(_answer_like, follower=fut))
                continue
            try:
                event = await asyncio.to_thread(prepare, self.state) if isinstance(prepare, OffLoop) \
                    else prepare(self.state)
            except Exception as exc:  # noqa: BLE001 - Rejected and bad requests go back to the caller
                _reject(fut, exc)
                continue
            ts = max(self.now(), self.state.now)
            seq = self.state.seq + 1
            env = ev.Envelope(seq=seq, ts=ts, actor=actor, idem=idem or f"{self.name}-{seq}-{ts}", event=event)
            apply(self.state, env, changes)
            staged.append((env, fut, item))
            if idem:
                first_of[idem] = fut
        return staged

    async def _reconcile(self, base: int, staged: list, acks: list) -> None:
        """After a failed group commit: rebuild from the log and answer each request truthfully. A request
        fenced only by a record that was set aside (not another controller's) is tried once more; one never
        sent, again."""
        ours = {env.idem for env, _, _ in staged}
        landed = await self._reload(since=base)
        if landed is None:
            self.stale = True
            for (env, fut, _), ack in zip(staged, acks):
                if not isinstance(ack, NotSent):
                    self._unsure[env.idem] = True
                _reject(fut, ack if isinstance(ack, Exception) else LogUnavailable("outcome unknown"))
            return
        if any(idem not in ours and idem not in self._unsure for idem in landed):
            self.leader = False
            log.error("another controller appended to the log: stepping back to follower")
        again = []
        for (env, fut, item), ack in zip(staged, acks):
            if self.leader and isinstance(ack, NotSent) and env.idem not in landed:
                again.append(item)
            elif self.leader and isinstance(ack, FencedError) and env.idem not in landed and \
                    id(fut) not in self._retried:
                self._retried.add(id(fut))
                fut.add_done_callback(lambda f: self._retried.discard(id(f)))
                again.append(item)
            elif env.idem in landed:
                _resolve(fut, (env.model_copy(update={"seq": landed[env.idem]}), False))
            elif not isinstance(ack, BaseException) and ack.duplicate:
                self.remember(env.idem, ack.seq)
                _resolve(fut, (env.model_copy(update={"seq": ack.seq}), True))
            elif not self.leader:
                _reject(fut, FencedError(base))
            else:
                self._unsure[env.idem] = True      # sent, not found: a server failing over may store it late
                _reject(fut, ack if isinstance(ack, LogUnavailable) else
                                  LogUnavailable("a request before it in the same batch failed"))
        self._queue.put_back(again)

    async def _reload(self, since: int | None = None) -> dict[str, int] | None:
        """Rebuild the state from snapshot + log; returns the idems of events after ``since`` (None: the
        log could not be read). The agents are sent every running job's launch again (they ignore repeats)."""
        try:
            state, landed = await self._rebuild(since)
        except Exception as exc:  # noqa: BLE001 - still unavailable: the caller reports it
            log.warning("rebuilding from the log failed: %s", exc)
            return None
        self.state = state
        self.stale = False
        self.dirty.set()
        if self.outbox is not None:
            self.outbox.put(effects.launches(state))
        return landed


def _resolve(fut: asyncio.Future, value: Any) -> None:
    """Answer a request, unless its caller already gave up on it (a cancelled cycle, say)."""
    if not fut.done():
        fut.set_result(value)


def _reject(fut: asyncio.Future, exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)


def _fail(batch: list, exc: Exception) -> None:
    for *_rest, fut in batch:
        _reject(fut, exc)


def _answer_like(first: asyncio.Future, follower: asyncio.Future) -> None:
    """Answer a retry the way its first try was answered (as a duplicate of it)."""
    if follower.done():
        return
    if first.cancelled() or first.exception() is not None:
        _reject(follower, first.exception() or LogUnavailable("cancelled"))
    else:
        env, _duplicate = first.result()
        _resolve(follower, (env, True))
