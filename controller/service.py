"""The controller: fold the log, serve requests over NATS, run scheduling cycles, append decisions.

The loop is: read request -> validate against the state (``rota.core.commands``) -> append
(fenced on the last folded sequence, idempotent on the client's request id) -> apply -> maybe
schedule. Only this process appends; a stale or second controller's append is refused by the
log and it steps back.
"""
from __future__ import annotations

import asyncio
import functools
import gc
import logging
import time
from typing import Any, Callable

from rota.core import commands, events as ev
from rota.core import __version__
from rota.core.apply import apply, fold
from rota.core.auth import ROOT, Caller
from rota.core.schedule import schedule
from rota.core.state import State, dump_snapshot

from . import assign, snapshots
from .eventlog import FencedError, LogUnavailable
from .frontdoor import FrontDoor
from .recent import Recent
from .views import Views, encode_reply

log = logging.getLogger("rota.controller")
API = "rota.api"


_AGENT_EVENTS = (ev.JobsStarted, ev.JobCancelled, ev.JobRequeued, ev.JobUpdated, ev.NodeDown, ev.NodeRegistered,
                 ev.ClusterConfigured)


def _may_start_something(event: Any) -> bool:
    """Whether a cycle right after ``event`` could decide anything new. A held job is skipped by the
    scheduler, so submitting one (or holding one) cannot; the periodic cycle still runs."""
    if isinstance(event, ev.JobSubmitted):
        return not event.spec.hold
    return not isinstance(event, (ev.JobHeld, ev.RequestDenied))


def _answer_like(first: asyncio.Future, follower: asyncio.Future) -> None:
    """Answer a retry the way its first try was answered (as a duplicate of it)."""
    if follower.done():
        return
    if first.cancelled() or first.exception() is not None:
        follower.set_exception(first.exception() or LogUnavailable("cancelled"))
    else:
        env, _duplicate = first.result()
        follower.set_result((env, True))


class _NothingToDo(Exception):
    """A cycle that started nothing: no event to append."""


class Controller:
    def __init__(self, eventlog: Any, *, config: ev.ClusterConfig | None = None,
                 clock: Callable[[], float] = time.time, cycle_interval: float = 5.0,
                 debounce: float = 0.02, snapshot_every: int = 10_000, history_every: int = 10_000,
                 name: str = "controller", keyring: Any = None, reports: Any = None,
                 timetravel_env: dict[str, str] | None = None) -> None:
        self.log = eventlog
        self.state = State()
        self.config = config
        self.clock = clock
        self.cycle_interval = cycle_interval
        self.debounce = debounce
        self.snapshot_every = snapshot_every
        self.history_every = history_every     # also keep a snapshot for time travel this often
        self._last_history_seq = 0
        self.name = name
        self.leader = False
        self._lock = asyncio.Lock()
        self._dirty = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._subs: list[Any] = []
        self._last_snapshot_seq = 0
        self._queue: list[tuple[Callable[[State], Any], str, str, asyncio.Future]] = []
        self._writer: asyncio.Task | None = None
        self.max_batch = 256
        self._stale = False                  # the state may hold events the log does not: reload first
        self._recent: Recent[str, int] = Recent(200_000)   # idempotency id -> sequence, for retries after a restart
        self.on_assign: Callable[[list[tuple[str, dict]]], None] | None = None   # agent messages to send
        self.on_reload: Callable[[], None] | None = None                         # state rebuilt from the log
        self.last_decision: tuple[int, Any] | None = None   # (state sequence, Decision) for queue views
        self.reports = reports           # sacct/sinfo/scontrol-show over rota up's projection, for other users
        self.timetravel_env = timetravel_env   # how to run time travel for callers who cannot read the log
        self.keyring = keyring
        self.frontdoor = FrontDoor(self, keyring)
        self.views = Views(self)
        self._nc: Any = None
        self._reported = 0
        self._retried: set[int] = set()   # requests already tried again after a fence by a set-aside record

    # ------------------------------------------------------------ state

    async def load(self) -> None:
        """Rebuild the state: nearest snapshot (when the log has a KV store) + replay of the tail."""
        snap = await self._read_snapshot()
        if snap is not None:
            self.state = snap
            self._last_snapshot_seq = snap.seq
        # A replay allocates millions of objects that mostly live on in the state: with the collector
        # on, its full collections rescan that growing heap again and again (3x slower replay).
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            remember = self._remember
            async for chunk in self.log.read_batches(self.state.seq + 1):
                fold(chunk, self.state)
                for env in chunk:
                    if env.event is not None:
                        remember(env.idem, env.seq)
        finally:
            if was_enabled:
                gc.enable()
        gc.freeze()   # what was loaded lives as long as the process: keep it out of later collections
        self.report_set_aside()

    def report_set_aside(self) -> None:
        """Name, by sequence, the records the reducer could not apply (once each)."""
        for seq, why in self.state.set_aside[self._reported:]:
            log.error("log record %d set aside by the reducer: %s", seq, why)
        self._reported = len(self.state.set_aside)

    async def start(self) -> None:
        """Become the writer: configure the cluster if needed, log our version, serve."""
        await self.load()
        self.leader = True
        if self.config is not None and (self.state.config is None or self.state.config != self.config):
            await self.append(ev.ClusterConfigured(config=self.config, source="rota up"), "admin")
        await self.append(ev.ControllerStarted(version=__version__, policy=self._policy()), self.name)
        self._dirty.set()

    def _policy(self) -> str:
        cfg = self.state.config
        return cfg.scheduler.policy if cfg is not None else "conservative"

    def now(self) -> int:
        return int(self.clock())

    async def append(self, event: Any, actor: str, idem: str = "") -> ev.Envelope:
        """Append on top of the folded state and apply it (no read back)."""
        return (await self.write(lambda _state: event, actor, idem))[0]

    async def write(self, prepare: Callable[[State], Any], actor: str, idem: str = "") -> tuple[ev.Envelope, bool]:
        """Validate-and-append through the group-committing writer.

        ``prepare(state)`` builds the event from the state as it will be when the event lands (or
        raises ``Rejected``). Returns the envelope and whether the log already held ``idem`` (a retry;
        the envelope then carries the original's sequence).
        """
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._queue.append((prepare, actor, idem, fut))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._drain_queue())
        return await fut

    async def _drain_queue(self) -> None:
        while self._queue:
            batch, self._queue = self._queue[:self.max_batch], self._queue[self.max_batch:]
            async with self._lock:
                try:
                    await self._commit(batch)
                except BaseException as exc:  # never leave a caller waiting
                    for *_rest, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc if isinstance(exc, Exception) else LogUnavailable(str(exc)))
                    if not isinstance(exc, Exception):
                        raise

    async def _commit(self, batch: list) -> None:
        """Group commit: apply the batch's events speculatively, publish them pipelined (each fenced on
        its predecessor, so the log keeps exactly this order), answer once all are acknowledged.
        Anything unexpected (a timeout, a duplicate, a fence) rebuilds the state from the log and
        answers each request from what the log really holds."""
        if self._stale and not await self._reload():
            for *_rest, fut in batch:
                fut.set_exception(LogUnavailable("the log is not readable"))
            return
        if not self.leader:
            for *_rest, fut in batch:
                fut.set_exception(FencedError(self.state.seq))
            return
        base = self.state.seq
        staged: list[tuple[ev.Envelope, asyncio.Future, tuple]] = []
        outbox: list[tuple[str, dict]] = []
        first_of: dict[str, asyncio.Future] = {}
        for item in batch:
            prepare, actor, idem, fut = item
            if idem and idem in self._recent:   # a retry of something already on the log
                fut.set_result((self._recent_envelope(idem, actor), True))
                continue
            if idem in first_of:                # a retry that arrived with its first try: one event, one answer
                first_of[idem].add_done_callback(functools.partial(_answer_like, follower=fut))
                continue
            try:
                event = prepare(self.state)
            except Exception as exc:  # noqa: BLE001 - Rejected and bad requests go back to the caller
                fut.set_exception(exc)
                continue
            ts = max(self.now(), self.state.now)
            seq = self.state.seq + 1
            env = ev.Envelope(seq=seq, ts=ts, actor=actor, idem=idem or f"{self.name}-{seq}-{ts}", event=event)
            tracked = isinstance(event, _AGENT_EVENTS)
            before = assign.watched(self.state, event) if tracked else []
            apply(self.state, env)
            if tracked:
                outbox.extend(assign.messages(self.state, event, before))
            staged.append((env, fut, item))
            if idem:
                first_of[idem] = fut
        if not staged:
            return
        acks = await asyncio.gather(*(self.log.append(env.event, actor=env.actor, idem=env.idem, ts=env.ts,
                                                      expected_last=env.seq - 1) for env, _, _ in staged),
                                    return_exceptions=True)
        clean = all(not isinstance(a, BaseException) and not a.duplicate and a.seq == env.seq
                    for a, (env, _, _) in zip(acks, staged))
        if clean:
            for env, fut, _ in staged:
                self._remember(env.idem, env.seq)
                fut.set_result((env, False))
            if any(_may_start_something(env.event) for env, _, _ in staged):
                self._dirty.set()
            if outbox and self.on_assign is not None:
                self.on_assign(outbox)
            return
        await self._reconcile(base, staged, acks)
        if self.on_reload is not None:
            self.on_reload()

    async def _reconcile(self, base: int, staged: list, acks: list) -> None:
        """After a failed group commit: rebuild from the log and answer each request truthfully. A request
        fenced only by a record that was set aside (not another controller's) is tried once more."""
        ours = {env.idem for env, _, _ in staged}
        landed = await self._reload(since=base)
        if landed is None:
            self._stale = True
            for (_env, fut, _), ack in zip(staged, acks):
                fut.set_exception(ack if isinstance(ack, Exception) else LogUnavailable("outcome unknown"))
            return
        if any(idem not in ours for idem in landed):
            self.leader = False
            log.error("another controller appended to the log: stepping back to follower")
        again = []
        for (env, fut, item), ack in zip(staged, acks):
            if self.leader and isinstance(ack, FencedError) and env.idem not in landed and id(fut) not in self._retried:
                self._retried.add(id(fut))
                fut.add_done_callback(lambda f: self._retried.discard(id(f)))
                again.append(item)
            elif env.idem in landed:
                fut.set_result((env.model_copy(update={"seq": landed[env.idem]}), False))
            elif not isinstance(ack, BaseException) and ack.duplicate:
                self._remember(env.idem, ack.seq)
                fut.set_result((env.model_copy(update={"seq": ack.seq}), True))
            elif not self.leader:
                fut.set_exception(FencedError(base))
            else:
                fut.set_exception(ack if isinstance(ack, LogUnavailable) else
                                  LogUnavailable("a request before it in the same batch failed"))
        self._queue[:0] = again

    async def _reload(self, since: int | None = None) -> dict[str, int] | None:
        """Rebuild the state from snapshot + log; returns the idems of events after ``since``."""
        try:
            state = await self._read_snapshot() or State()
            landed: dict[str, int] = {}
            async for chunk in self.log.read_batches(state.seq + 1):
                fold(chunk, state)
                for env in chunk:
                    if env.event is not None:
                        self._remember(env.idem, env.seq)
                    if since is not None and env.seq > since and env.event is not None:
                        landed[env.idem] = env.seq
        except Exception as exc:  # noqa: BLE001 - still unavailable: the caller reports it
            log.warning("rebuilding from the log failed: %s", exc)
            return None
        self.state = state
        self._reported = 0
        self.report_set_aside()
        self._stale = False
        self._dirty.set()
        return landed

    def _remember(self, idem: str, seq: int) -> None:
        if idem:
            self._recent[idem] = seq

    def _recent_envelope(self, idem: str, actor: str) -> ev.Envelope:
        seq = self._recent[idem]
        return ev.Envelope.trusted(seq, self.state.now, actor, idem, None)

    # ------------------------------------------------------------ requests

    async def handle(self, verb: str, body: dict, caller: Caller = ROOT, rid: str = "") -> dict:
        """Serve one API request in process (tests, benchmarks, tools beside the controller): the same
        validation, rights and handlers as a request through the front door, for an already known caller."""
        import orjson

        body = dict(body)
        rid = rid or str(body.pop("rid", ""))
        result = await self.frontdoor.dispatch(verb, orjson.dumps(body), caller, rid)
        return orjson.loads(encode_reply(result))   # what a caller over NATS reads

    async def nc_reply(self, subject: str, data: bytes) -> None:
        await self._nc.publish(subject, data)

    def send_signal(self, job: Any, signal: int) -> None:
        """Deliver a signal to a running job's processes on its batch host (the log does not change)."""
        if self.on_assign is None:
            raise commands.Rejected("no agents are connected to deliver the signal", code="no_agents")
        self.on_assign([(job.alloc[0].node, {"op": "signal", "job_id": job.job_id, "restarts": job.restarts,
                                             "signal": signal})])

    def queue_view(self) -> list[dict]:
        return self.views.queue_view()

    # ------------------------------------------------------------ cycles

    async def cycle(self) -> ev.JobsStarted | None:
        """One scheduling cycle; appends its decision when it started something."""
        if not self.leader or not self.state.pending:
            return None
        decided: list[Any] = []

        def decide(state: State) -> Any:
            decision = schedule(state, max(self.now(), state.now))
            event = decision.event()
            if event is None:
                self.last_decision = (state.seq, decision)
                raise _NothingToDo
            decided.append(event)
            return event

        try:
            await self.write(decide, self.name)
        except _NothingToDo:
            return None
        return decided[0]

    async def run_cycles(self) -> None:
        """Cycle when something changed (debounced) and every ``cycle_interval``; a cycle that took d
        seconds is followed by at least 2d of serving requests, so a burst of submits against a long
        queue is not starved by back-to-back cycles."""
        last = 0.0
        while True:
            try:
                await asyncio.wait_for(self._dirty.wait(), timeout=self.cycle_interval)
            except asyncio.TimeoutError:
                pass
            await asyncio.sleep(max(self.debounce, 2 * last))
            self._dirty.clear()
            try:
                t0 = time.perf_counter()
                await self.cycle()
                last = time.perf_counter() - t0
                await self.maybe_snapshot()
            except FencedError:
                return
            except LogUnavailable as exc:
                log.warning("cycle not recorded: %s", exc)
                self._dirty.set()
                await asyncio.sleep(0.5)

    # ------------------------------------------------------------ snapshots

    async def _store(self):
        """The JetStream object store holding snapshots (chunked: any size), or None in memory."""
        js = getattr(self.log, "js", None)
        return None if js is None else await snapshots.open_store(js)

    async def maybe_snapshot(self, force: bool = False) -> bool:
        """Write a snapshot (with its sequence inside) every ``snapshot_every`` events."""
        if not force and self.state.seq - self._last_snapshot_seq < self.snapshot_every:
            return False
        store = await self._store()
        if store is None or self.state.seq == self._last_snapshot_seq and not force:
            return False
        async with self._lock:   # never a state holding events still being committed
            if self._stale:
                return False
            data, seq = dump_snapshot(self.state), self.state.seq
        history = seq - self._last_history_seq >= self.history_every
        await snapshots.put(store, data, seq, history, getattr(self.log, "mac_key", None))
        if history:
            self._last_history_seq = seq
        self._last_snapshot_seq = seq
        return True

    async def _read_snapshot(self) -> State | None:
        store = await self._store()
        if store is None:
            return None
        snap = await snapshots.latest(store, getattr(self.log, "mac_key", None))
        check = getattr(self.log, "check", None)
        if snap is not None and check is not None:
            check.signed_at(snap.seq)   # the controller signed it: the log is signed from there on
        return snap

    # ------------------------------------------------------------ serving over NATS

    async def serve(self, nc: Any) -> None:
        """Answer ``rota.api.<verb>`` requests through the front door and run cycles."""
        inflight: set[asyncio.Task] = set()
        self._nc = nc

        async def on_request(msg: Any) -> None:
            # nats-py runs a subscription's callbacks one at a time: hand each request to its own task
            # so concurrent requests reach the writer together and are committed as one group.
            task = asyncio.create_task(self.frontdoor.on_message(msg))
            inflight.add(task)
            task.add_done_callback(inflight.discard)

        self._subs.append(await nc.subscribe(f"{API}.*", queue="rota-controller", cb=on_request))
        self._tasks.append(asyncio.create_task(self.run_cycles()))

    async def stop(self) -> None:
        for sub in self._subs:
            await sub.unsubscribe()
        for t in self._tasks:
            t.cancel()
        self._subs, self._tasks = [], []
