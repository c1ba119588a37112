"""The controller: fold the log, serve requests over NATS, run scheduling cycles, append decisions.

It is composed of parts with one job each: the :class:`~rota.controller.writer.Writer` (the only
path onto the log, keeper of the state), the :class:`~rota.controller.frontdoor.FrontDoor`
(credentials, rights, verbs), the :class:`~rota.controller.views.Views` (what callers are shown)
and the log's snapshot store. Only this process appends; a stale or second controller's append is
refused by the log and it steps back.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any, Callable, Sequence

from rota.core import __version__, commands
from rota.core import events as ev
from rota.core.auth import ROOT, Caller
from rota.core.idle import idle_actions
from rota.core.orders import Order
from rota.core.policies import cycle_policy
from rota.core.replan import PlanMemory
from rota.core.schedule import Decision, schedule
from rota.core.state import State, dump_snapshot
from rota.wire import collector, diskspace, subjects as sj
from rota.wire.cadence import SnapshotCadence
from rota.wire.forkdump import dump_aside
from rota.wire.keys import Keyring

from .eventlog import EventLog, FencedError, LogUnavailable
from .frontdoor import FrontDoor
from .outbox import Outbox
from .port import ReportRunner
from .replies import encode_reply
from .metrics_view import CycleHistogram
from .views import Views
from .writer import OffLoop, Prepare, Writer

log = logging.getLogger("rota.controller")
FREEZE_JOBS = 10_000    # jobs held from which a snapshot also moves what is alive out of the collector's reach
OFF_LOOP_PENDING = 1_000   # pending jobs from which a cycle runs in a worker thread, reads answered meanwhile
SLOW_CYCLE = 5.0           # seconds: a cycle taking longer, with its wait for the writer, is logged
DUMP_ASIDE_FROM = 5_000    # jobs held from which a snapshot is written by a forked child (writes need not wait)
GIVE_WAY_MAX = 1.0         # seconds a cycle off the loop may pause for reads, in all


class _NothingToDo(Exception):
    """A cycle that started nothing: no event to append."""


class Controller:
    """The scheduler's process: its state is the log's, its cycle appends what it decides."""

    def __init__(self, eventlog: EventLog, *, config: ev.ClusterConfig | None = None,
                 clock: Callable[[], float] = time.time, cycle_interval: float = 5.0,
                 debounce: float = 0.02, snapshot_every: int = 10_000, history_every: int = 10_000,
                 name: str = "controller", keyring: Keyring | None = None, outbox: Outbox | None = None,
                 reports: ReportRunner | None = None, timetravel_env: dict[str, str] | None = None,
                 timetravel_argv: list[str] | None = None) -> None:
        self.log = eventlog
        self.config = config
        self.reload_config: Callable[[], ev.ClusterConfig] | None = None   # scontrol reconfigure: read it again
        self.store_dir: str | None = None      # where the log's server keeps it, when on this host (rota up's own)
        self.clock = clock
        self.name = name
        self.cycle_interval, self.debounce = cycle_interval, debounce
        self.cadence = SnapshotCadence(snapshot_every)
        self.history_every = history_every     # also keep a snapshot for time travel this often
        self.outbox = outbox                   # orders for the agents (None: no agents run jobs)
        self.writer = Writer(eventlog, now=self.now, name=name, outbox=outbox)
        self.keyring = keyring
        self.reports = reports                 # sacct/sinfo/scontrol-show over rota up's projection
        self.timetravel_env = timetravel_env   # how to run time travel for callers who cannot read the log
        self.timetravel_argv = list(timetravel_argv or [])   # the program it runs as (the composition root names it)
        self.frontdoor = FrontDoor(self, keyring)
        self.views = Views(self)
        self.last_decision: tuple[int, Decision] | None = None   # (state sequence, Decision) for queue views
        self.plan_memory = PlanMemory()      # the last conservative cycle's plan, repaired by the next
        self.deciding = 0.0      # seconds the latest cycle spent deciding (without its wait for the writer)
        self.cycle_times: deque[float] = deque(maxlen=100)       # seconds of the latest cycles (sdiag's figures)
        self.cycle_hist = CycleHistogram()                       # every cycle's duration (/metrics)
        self.agent_seen: dict[str, float] = {}                   # node -> monotonic time of its last heartbeat
        self._last_history_seq = 0
        self._tasks: list[asyncio.Task] = []
        self._subs: list[Any] = []
        self._nc: Any = None

    @property
    def state(self) -> State:
        return self.writer.state

    @property
    def leader(self) -> bool:
        return self.writer.leader

    def now(self) -> int:
        return int(self.clock())

    # ------------------------------------------------------------ life cycle

    async def load(self) -> None:
        """Rebuild the state from the nearest snapshot and the log after it."""
        await self.writer.load()
        self.cadence.seq = self.writer.snapshot_seq

    async def start(self) -> None:
        """Become the writer: configure the cluster if needed, log our version, serve."""
        await self.load()
        await self.lead()

    async def lead(self, name: str = "", host: str = "") -> None:
        """Write the log from its current end: configure the cluster if the configuration changed, and say
        who leads from here (``name``: one of several controllers)."""
        self.writer.leader = True
        if self.config is not None and (self.state.config is None or self.state.config != self.config):
            await self.append(ev.ClusterConfigured(config=self.config, source="rota up"), "admin")
        cfg = self.state.config
        policy = cfg.scheduler.policy if cfg is not None else "conservative"
        audit = getattr(self.log, "audit", None)
        await self.append(ev.ControllerStarted(version=__version__, policy=policy, name=name, host=host,
                                               audit_key=audit.public if audit is not None else ""), self.name)
        self.writer.dirty.set()

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

        self._subs.append(await nc.subscribe(f"{sj.API}.*", queue="rota-controller", cb=on_request))
        self._tasks.append(asyncio.create_task(self.run_cycles()))

    async def stop(self) -> None:
        for sub in self._subs:
            await sub.unsubscribe()
        for t in self._tasks:
            t.cancel()
        self._subs, self._tasks = [], []

    # ------------------------------------------------------------ writing and requests

    def check_space(self, writes: bool) -> None:
        """Refuse a request that would write when the disk holding the log is down to its reserve."""
        if writes and self.store_dir is not None:
            problem = diskspace.log_space_problem(self.store_dir)
            if problem is not None:
                raise commands.Rejected(problem, code="disk")

    async def append(self, event: Any, actor: str, idem: str = "") -> ev.Envelope:
        """Append on top of the folded state and apply it (see :meth:`Writer.append`)."""
        return await self.writer.append(event, actor, idem)

    async def write(self, prepare: Prepare, actor: str, idem: str = "") -> tuple[ev.Envelope, bool]:
        """Validate-and-append through the group commit (see :meth:`Writer.write`)."""
        return await self.writer.write(prepare, actor, idem)

    async def changed(self, timeout: float) -> bool:
        """Wait, at most ``timeout`` seconds, for the next batch through the log (see :meth:`Writer.changed`)."""
        return await self.writer.changed(timeout)

    def send(self, orders: Sequence[tuple[str, Order]]) -> None:
        """Orders that change nothing on the log (a signal): straight to the agents."""
        if self.outbox is None:
            raise commands.Rejected("no agents are connected to deliver the signal", code="no_agents")
        self.outbox.put(list(orders))

    async def handle(self, verb: str, body: dict, caller: Caller = ROOT, rid: str = "") -> dict:
        """Serve one API request in process (tests, benchmarks, tools beside the controller): the same
        validation, rights and handlers as a request through the front door, for an already known caller."""
        import orjson

        body = dict(body)
        rid = rid or str(body.pop("rid", ""))
        result = await self.frontdoor.dispatch(verb, orjson.dumps(body), caller, rid)
        return orjson.loads(encode_reply(result))   # what a caller over NATS reads

    async def local_request(self, subject: str, headers: dict, payload: bytes) -> bytes | None:
        """A signed request from a signer in this process, answered without the trip through NATS; None
        while this controller does not serve requests (it follows: the request goes to the leader)."""
        if not self._subs:
            return None
        return (await self.frontdoor.answer(subject, headers, payload))[1]

    async def nc_reply(self, subject: str, data: bytes) -> None:
        await self._nc.publish(subject, data)

    def queue_view(self) -> list[dict]:
        return self.views.queue_view()

    # ------------------------------------------------------------ cycles

    async def cycle(self, backfill: bool = True) -> ev.JobsStarted | None:
        """One scheduling cycle; appends its decision when it started something. ``backfill``: a backfill cycle
        (under Slurm's cadence the others are the main scheduler's strict-priority pass)."""
        self.deciding = 0.0
        if not self.leader or not self.state.pending:
            return None
        decided: list[ev.JobsStarted] = []

        off_loop = len(self.state.pending) >= OFF_LOOP_PENDING
        give_way = GiveWay(lambda: self.frontdoor.reading > 0, GIVE_WAY_MAX) if off_loop else None

        def decide(state: State) -> ev.JobsStarted:
            t0 = time.perf_counter()
            with collector.paused():   # its many short-lived objects would be moved to the oldest generation
                policy = cycle_policy(state.config.scheduler, backfill) if state.config is not None else None
                decision = schedule(state, max(self.now(), state.now), policy=policy, give_way=give_way,
                                    memory=self.plan_memory)
            self.deciding += time.perf_counter() - t0
            event = decision.event()
            self.last_decision = (state.seq, decision)
            if event is None:
                raise _NothingToDo
            decided.append(event)
            return event

        began = time.monotonic()
        try:
            await self.write(OffLoop(decide) if off_loop else decide, self.name)
        except _NothingToDo:
            return None
        finally:
            took = time.monotonic() - began
            if took > SLOW_CYCLE:
                log.warning("a cycle took %.1f s from its request to its outcome (%d pending)", took,
                            len(self.state.pending))
        return decided[0]

    async def idle_sweep(self) -> None:
        """Cancel or requeue what the idle-GPU policy says is due (rota.core.idle), each checked again on the state
        it lands on."""
        if not self.leader or not self.state.running:
            return
        for due in idle_actions(self.state, self.now()):
            def prepare(st: State, due: Any = due) -> Any:
                if not any(a.job_id == due.job_id for a in idle_actions(st, self.now())):
                    raise commands.Rejected(f"job {due.job_id} is no longer due", code="noop")
                return due
            try:
                await self.write(prepare, "idle-gpu-policy")
            except commands.Rejected:
                pass

    def _backfill_interval(self) -> float | None:
        """Seconds between backfill cycles under Slurm's cadence; None under rota's (every cycle is one)."""
        cfg = self.state.config
        return float(cfg.scheduler.bf_interval) if cfg is not None and cfg.scheduler.cadence == "slurm" else None

    def cycle_figures(self) -> dict[str, float]:
        """The latest cycles' durations in ms, as sdiag gives them (none before the first)."""
        t = self.cycle_times
        return {"cycle_last_ms": t[-1] * 1000, "cycle_max_ms": max(t) * 1000,
                "cycle_mean_ms": sum(t) / len(t) * 1000} if t else {}

    async def run_cycles(self) -> None:
        """Cycle when something changed and every ``cycle_interval``. A change after a quiet spell is
        scheduled at once; after a cycle that had jobs pending and took d seconds, the next starts no
        sooner than ``debounce`` and 2d later, so a burst of submits against a long queue is not starved
        by back-to-back cycles (d is the cycle's own deciding: a wait for the log, a server failing over, is
        not a reason to wait longer). Under Slurm's cadence (``rota_cadence=slurm``) only the cycles every
        ``bf_interval`` run the policy; the others are the main scheduler's pass."""
        last, ended = 0.0, -float("inf")
        dirty = self.writer.dirty
        backfill_due = time.perf_counter()
        while True:
            interval = self._backfill_interval()
            wait = self.cycle_interval if interval is None else min(self.cycle_interval,
                                                                    max(0.0, backfill_due - time.perf_counter()))
            try:
                await asyncio.wait_for(dirty.wait(), timeout=wait)
            except asyncio.TimeoutError:
                pass
            await asyncio.sleep(max(0.0, ended + max(self.debounce, 2 * last) - time.perf_counter()))
            dirty.clear()
            backfill = interval is None or time.perf_counter() >= backfill_due
            if interval is not None and backfill:
                backfill_due = time.perf_counter() + interval
            try:
                t0 = time.perf_counter()
                ran = self.leader and bool(self.state.pending)
                await self.cycle(backfill)
                await self.idle_sweep()
                spent = time.perf_counter() - t0
                if ran:         # a cycle with nothing pending cost nothing: no wait after it
                    last, ended = self.deciding, t0 + spent
                    self.cycle_times.append(spent)
                    self.cycle_hist.observe(spent)
                await self.maybe_snapshot()
            except FencedError:
                return
            except LogUnavailable as exc:
                log.warning("cycle not recorded: %s", exc)
                dirty.set()
                await asyncio.sleep(0.5)

    # ------------------------------------------------------------ snapshots

    async def maybe_snapshot(self, force: bool = False) -> bool:
        """Write a snapshot (with its sequence inside) as :class:`SnapshotCadence` says, and one for time
        travel every ``history_every``. It is made under the writer's lock (never of a state holding events still
        being committed): of a large state by a forked child, the lock held for the fork alone; else in a worker
        thread, requests that only read answered meanwhile."""
        if not force and not self.cadence.due(self.state):
            return False
        async with self.writer.lock:   # never a state holding events still being committed
            if self.writer.stale:
                return False
            seq = self.state.seq
            aside = dump_aside(dump_snapshot, self.state) if len(self.state.jobs) >= DUMP_ASIDE_FROM else None
            if aside is None:
                data = await asyncio.to_thread(dump_snapshot, self.state)
            self.cadence.taken(self.state)
        if aside is not None:
            data = await asyncio.to_thread(aside.result)
        if len(self.state.jobs) >= FREEZE_JOBS:
            collector.keep_out()
        history = seq - self._last_history_seq >= self.history_every
        audit, chain_at = getattr(self.log, "audit", None), getattr(self.log, "chain_at", None)
        head = await chain_at(seq) if audit is not None and chain_at is not None else None
        await self.log.snapshots.put(data, seq, history, (audit, head) if head is not None else None)
        if history:
            self._last_history_seq = seq
        return True


class GiveWay:
    """Where work in a worker thread beside the event loop pauses: while ``busy()`` (a request is being
    answered) it sleeps, so that the answer need not share the interpreter with it, ``budget`` seconds in
    all. A cycle's budget is short (the writes queued behind it wait too, and a stream of reads must not
    hold them back for long); the reason lane's is unlimited (nothing waits for it)."""

    __slots__ = ("busy", "budget")

    def __init__(self, busy: Callable[[], bool], budget: float) -> None:
        self.busy, self.budget = busy, budget

    def __call__(self) -> None:
        while self.budget > 0 and self.busy():
            time.sleep(0.001)
            self.budget -= 0.001
