"""Tail the log into SQLite: job rows (array tasks, ``.batch`` steps), nodes, partitions, usage.

The projector folds events with the core reducer (so its rows say exactly what the scheduler saw)
and writes, for every batch, the rows the batch touched together with the batch's last sequence,
in one transaction: a crash at any point leaves rows and checkpoint consistent, and re-delivered
events (sequence at or below the checkpoint) are skipped. Its own state snapshot is stored in the
same database, so a restart resumes from the checkpoint without replaying the log from zero.
"""
from __future__ import annotations

import asyncio
import logging
import math
from pathlib import Path
from typing import Any, Callable, Iterable

from rota.core import events as ev
from rota.core.apply import fold
from rota.core.changes import Changes
from rota.core.static_reasons import reasons_now
from rota.core.state import TERMINAL_STATES, Job, State, Step, dump_snapshot, load_snapshot
from rota.wire import collector
from rota.wire.cadence import SnapshotCadence
from rota.wire.diskspace import projection_may_grow

from .hurry import HurryLine, path_for
from .reasons import ReasonLane
from .schema import SCHEMA, SCHEMA_VERSION

log = logging.getLogger("rota.projections")

JOB_COLUMNS = ("job_id", "array_job_id", "array_task_id", "array_spec", "name", "user", "uid", "account",
               "partition", "qos", "state", "cancel_by", "submit", "eligible", "start", "end_time", "time_limit",
               "exit_code", "signal", "max_rss", "elapsed", "nodes", "alloc_nodes", "alloc_cpus", "alloc_mem",
               "alloc_gpus", "req_nodes", "req_cpus", "req_mem", "req_gpus", "gpu_type", "restarts", "workdir",
               "dependency", "hold", "priority", "submit_seq", "reason", "seq")

_UPSERT_JOB = (f"INSERT OR REPLACE INTO jobs ({', '.join(JOB_COLUMNS)}) "
               f"VALUES ({', '.join('?' * len(JOB_COLUMNS))})")


def job_row(job: Job, seq: int, reason: str | None = None) -> tuple:
    spec, req = job.spec, job.req
    array_spec = None
    if job.array_pending is not None and job.array_task_id is None:
        from rota.core.arrays import format_indices

        array_spec = format_indices(job.array_pending) + (f"%{job.array_throttle}" if job.array_throttle else "")
    alloc = job.alloc
    return (job.job_id, job.array_job_id, job.array_task_id, array_spec, spec.name, spec.user, spec.uid,
            spec.account, job.partition, spec.qos, job.state, job.cancel_by, job.submit_time, job.eligible_time,
            job.start_time, job.end_time, job.time_limit, job.exit_code, job.signal, job.max_rss, job.elapsed,
            ",".join(a.node for a in alloc), len(alloc), sum(a.cpus for a in alloc), sum(a.mem for a in alloc),
            sum(len(a.gpus) for a in alloc),
            req.nnodes if req else spec.nodes, req.total_cpus if req else 0, (req.mem * req.nnodes) if req else 0,
            (req.gpus * req.nnodes) if req else 0, spec.gpu_type, job.restarts, spec.workdir, spec.dependency,
            job.hold, job.priority_override, job.submit_seq, reason, seq)


class Projector:
    def __init__(self, db_path: str | Path, eventlog: Any, *, snapshot_every: int = 20_000,
                 give_way: Callable[[], None] | None = None) -> None:
        self.path = Path(db_path)
        self.log = eventlog
        self.cadence = SnapshotCadence(snapshot_every)
        self.give_way = give_way      # for the reason lane's scheduler runs (rota up: while requests are answered)
        self.state = State()
        self.reasons: ReasonLane | None = None
        self.db: Any = None
        self._node_seen: dict[str, tuple[str, str]] = {}     # node -> (state, reason) last written to node_states
        self.stored = 0               # the sequence the database holds (what readers see)
        self.line: HurryLine | None = None   # readers asking for a sequence, while following
        self._hurried_at = -math.inf      # when the last catch-up asked for by a reader began (loop time)

    async def open(self) -> None:
        import aiosqlite

        self.path.parent.mkdir(parents=True, exist_ok=True)
        rows = await self._connect(aiosqlite)
        if rows.get("schema_version", SCHEMA_VERSION) != SCHEMA_VERSION:
            # derived data: a projection of an older layout is set aside and rebuilt from the log
            await self.db.close()
            old = self.path.with_name(self.path.name + f".v{rows['schema_version']}")
            for suffix in ("", "-wal", "-shm"):
                src = Path(str(self.path) + suffix)
                if src.exists():
                    src.replace(Path(str(old) + suffix))
            log.warning("projection %s had schema %s (this rota writes %s): moved to %s, rebuilding from the log",
                        self.path, rows["schema_version"], SCHEMA_VERSION, old)
            rows = await self._connect(aiosqlite)
        self.stored = int(rows.get("seq") or 0)
        if rows.get("state"):
            self.state = load_snapshot(rows["state"])
            self.cadence.taken(self.state)
        self.reasons = ReasonLane(self.db, self.log, snapshot_every=self.cadence.every,
                                  may_write=lambda: projection_may_grow(str(self.path.parent)),
                                  give_way=self.give_way)
        await self.reasons.open(rows)
        await self.db.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (SCHEMA_VERSION,))
        await self.db.commit()

    async def _connect(self, aiosqlite: Any) -> dict:
        self.db = await aiosqlite.connect(self.path)
        await self.db.execute("PRAGMA journal_mode=WAL")
        await self.db.execute("PRAGMA synchronous=NORMAL")
        rows: dict = {}
        try:
            rows = dict(await self.db.execute_fetchall("SELECT key, value FROM meta"))
        except Exception:  # noqa: BLE001 - a new file: no tables yet
            pass
        if rows.get("schema_version", SCHEMA_VERSION) == SCHEMA_VERSION:
            await self.db.executescript(SCHEMA)
        return rows

    async def close(self) -> None:
        if self.db is not None:
            await self.db.close()
            self.db = None

    @property
    def seq(self) -> int:
        return self.state.seq

    async def catch_up(self, to_seq: int | None = None) -> int:
        """Project everything the log holds past the checkpoint; returns the number of events.

        While batch N's rows are written (aiosqlite's thread; SQLite releases the GIL), batch N+1 is
        read and folded. The collector is paused meanwhile: a catch-up allocates objects that mostly
        live on, and full collections would rescan that growing heap again and again.
        """
        n = 0
        writing: asyncio.Future | None = None
        with collector.paused():
            try:
                async for chunk in (self.log.read_batches(self.state.seq + 1, to_seq) if to_seq is not None
                                    else self.log.read_tail(self.state.seq + 1)):
                    chunk = [env for env in chunk if env.seq > self.state.seq]   # re-delivered: already projected
                    if chunk:
                        batch = self._fold(chunk)
                        snapshot = None
                        if self.cadence.due(self.state):   # a pass over every job: off the loop, folds wait
                            snapshot = await asyncio.to_thread(dump_snapshot, self.state)
                            self.cadence.taken(self.state)
                        if writing is not None:
                            await writing
                        writing = asyncio.ensure_future(self._write(*batch, snapshot=snapshot))
                        n += len(chunk)
                if writing is not None:
                    await writing
            finally:
                if writing is not None and not writing.done():
                    writing.cancel()
        return n

    async def follow(self, stop: asyncio.Event, wakeup: asyncio.Event | None = None, poll: float = 1.0,
                     min_interval: float = 0.05) -> None:
        """Keep projecting new events until ``stop`` is set (woken early by ``wakeup``): writes that come at most
        one per tenth of ``min_interval`` as they come, a faster stream in batches, one per ``min_interval`` (each
        catch-up costs a transaction, whatever it holds). A reader waiting for a write of the stream
        (read-your-writes) asks on the hurry line for its batch now: then at most one per tenth of that."""
        loop = asyncio.get_running_loop()
        hurried = asyncio.Event()

        def on_hurry() -> None:
            if line.waiting:
                hurried.set()
                if wakeup is not None:
                    wakeup.set()
        line = HurryLine(path_for(str(self.path)), on_hurry, folded=lambda: self.stored)
        if line.open(loop):
            self.line = line
        lane: asyncio.Task | None = None
        said = ""              # the last warning given (said once, not every second)
        try:
            while not stop.is_set():
                started = loop.time()
                said, lane = await self._follow_once(stop, poll, said, lane)
                try:
                    await asyncio.wait_for((wakeup or stop).wait(), timeout=poll)
                except asyncio.TimeoutError:
                    pass
                if wakeup is not None:
                    wakeup.clear()
                await self._pace(stop, hurried, started, min_interval)
        finally:
            self.line = None
            line.close(loop)
            if lane is not None:
                if not stop.is_set():
                    lane.cancel()
                await asyncio.gather(lane, return_exceptions=True)

    async def _follow_once(self, stop: asyncio.Event, poll: float, said: str,
                           lane: asyncio.Task | None) -> tuple[str, asyncio.Task | None]:
        """One catch-up of :meth:`follow`: the warning now said, and the reason lane (started once caught up)."""
        try:
            if not projection_may_grow(str(self.path.parent)):
                raise OSError("the disk is nearly full (it goes on when there is room again)")
            n = await self.catch_up()
            if lane is None and self.reasons is not None and n < 1000:
                # the rows first: the history follows once they have caught up with the log
                lane = asyncio.create_task(self.reasons.follow(stop, poll))
        except Exception as exc:  # noqa: BLE001 - the log is briefly unavailable: retry
            if str(exc) != said:
                log.warning("projection paused: %s", exc)
            return str(exc), lane
        return "", lane

    async def _pace(self, stop: asyncio.Event, hurried: asyncio.Event, started: float, min_interval: float) -> None:
        """Before the catch-up of what woke the projector: nothing when it came a tenth of ``min_interval`` or more
        after the last catch-up ``started`` (writes as slow as that are projected as they come); else, for a
        faster stream, the rest of ``min_interval`` (its batch); while a reader waits, only what is left of a
        tenth of it since the last catch-up made for one (the most that readers, any number, can ask)."""
        loop = asyncio.get_running_loop()
        if self.line is not None and self.line.waiting:
            hurried.set()
        elapsed = loop.time() - started
        rest = min_interval - elapsed if elapsed < min_interval / 10 else 0.0
        if rest > 0 and not stop.is_set() and not hurried.is_set():
            waits = [asyncio.ensure_future(hurried.wait()), asyncio.ensure_future(stop.wait())]
            await asyncio.wait(waits, timeout=rest, return_when=asyncio.FIRST_COMPLETED)
            for w in waits:
                w.cancel()
        if hurried.is_set():
            rest = min(rest, min_interval / 10 - (loop.time() - self._hurried_at))
            if rest > 0 and not stop.is_set():
                await asyncio.sleep(rest)
            self._hurried_at = loop.time()
        hurried.clear()

    def _fold(self, chunk: list[ev.Envelope]) -> tuple[list[tuple], list[tuple], list[tuple], dict, list[tuple] | None,
                                                      list[tuple] | None, int, int, list[tuple]]:
        """Apply a batch to the projector's state; what :meth:`_write` stores for it, taken now (the
        state moves on while the write runs). Rows are written for exactly the jobs and nodes the
        reducer reports changed."""
        state = self.state
        changes = Changes()
        fold(chunk, state, changes)
        rows: list[tuple] = []
        steps: list[tuple] = []
        usage: dict[tuple[str, str, str], list[int]] = {}
        never_ran = [b.job for b in changes.jobs.values() if b.job.state in TERMINAL_STATES and not b.job.alloc
                     and b.state not in TERMINAL_STATES]
        reasons = reasons_now(state, never_ran, state.now) if never_ran else {}
        for before in changes.jobs.values():
            job = before.job      # the object itself: a job purged later in the batch still gets its row
            reason = None
            ended = before.state not in TERMINAL_STATES or before.restarts != job.restarts
            if job.state in TERMINAL_STATES and ended:
                if not job.alloc:   # it ended without running: what held it back (the history has more)
                    why = reasons.get(job.job_id)
                    reason = why.code if why is not None else None
                else:
                    if not job.spec.allocation:
                        steps.append(_batch_step(job))
                    u = usage.setdefault((job.spec.user, job.spec.account, job.partition), [0, 0, 0])
                    elapsed = job.elapsed or max(0, job.end_time - job.start_time)
                    u[0] += sum(a.cpus for a in job.alloc) * elapsed
                    u[1] += sum(len(a.gpus) for a in job.alloc) * elapsed
                    u[2] += 1
            rows.append(job_row(job, before.seq, reason))
        for (jid, _run, _sid), (step, _new) in changes.steps.items():
            steps.append(step_row(jid, step))
        runs = [(r.job_id, r.restarts, r.start, r.end, ",".join(r.nodes), r.cpus, r.exit_code, r.signal, r.gpus,
                 r.state) for r in changes.runs]
        nodes = self._node_rows() if changes.nodes or changes.config else None
        partitions = self._partition_rows() if changes.config else None
        node_states = self._node_changes(changes.nodes if not changes.config else state.nodes)
        return rows, steps, runs, usage, nodes, partitions, state.seq, state.now, node_states

    def _node_changes(self, names: Iterable[str]) -> list[tuple]:
        """Rows of node_states for the changed nodes whose state or reason moved (the web view's history)."""
        state = self.state
        out = []
        for name in names:
            node = state.nodes.get(name)
            if node is None:
                continue
            now = (node.display_state(), node.reason or "")
            if self._node_seen.get(name) != now:
                self._node_seen[name] = now
                out.append((name, state.now, state.seq, now[0], now[1], node.gpu_count))
        return out

    async def _write(self, rows: list[tuple], steps: list[tuple], runs: list[tuple], usage: dict,
                     nodes: list[tuple] | None, partitions: list[tuple] | None, seq: int, now: int,
                     node_states: list[tuple], snapshot: bytes | None = None) -> None:
        """One batch's rows and its checkpoint, in one transaction and one trip to the database's thread (a
        trip costs more than a small batch's statements: aiosqlite's hand-off of a function to its thread)."""
        cfg = self.state.config
        cluster = cfg.cluster_name if cfg else "rota"
        await self.db._execute(_write_batch, self.db._conn, rows, steps, runs, usage, nodes, partitions, cluster,
                               seq, now, node_states, snapshot)
        self.stored = seq
        if self.line is not None:
            self.line.answer(seq)

    async def save_state(self) -> None:
        """Store the projector's state with the checkpoint (on shutdown: a fast restart)."""
        if self.db is not None and self.cadence.seq != self.state.seq:
            await self.db.execute("INSERT OR REPLACE INTO meta VALUES ('state', ?)", (dump_snapshot(self.state),))
            await self.db.commit()
            self.cadence.taken(self.state)
        if self.db is not None and self.reasons is not None:
            await self.reasons.save_state()

    def _node_rows(self) -> list[tuple]:
        cfg = self.state.config
        parts: dict[str, list[str]] = {}
        gres: dict[str, str] = {}
        if cfg is not None:
            for p in cfg.partitions:
                for n in p.nodes:
                    parts.setdefault(n, []).append(p.name)
            for nc in cfg.nodes:
                gres[nc.name] = ",".join(f"gpu:{g.type}:{g.count}" if g.type else f"gpu:{g.count}" for g in nc.gpus)
        return [(n.name, n.index, n.display_state(), n.reason, n.reason_by, n.reason_time, n.cpus, n.alloc_cpus,
                 n.memory, n.alloc_mem, n.gpu_count, n.gpu_count - n.free_gpus, gres.get(n.name, ""),
                 ",".join(n.features), ",".join(parts.get(n.name, [])), n.boot_time, ",".join(map(str, n.jobs)),
                 n.base_state(), int(n.drain), int(n.not_responding), n.weight, n.last_busy)
                for n in self.state.nodes.values()]

    def _partition_rows(self) -> list[tuple]:
        cfg = self.state.config
        if cfg is None:
            return []
        return [(p.name, i, int(p.default), p.state, p.max_time, p.default_time, ",".join(p.nodes), p.priority_tier,
                 p.max_nodes) for i, p in enumerate(cfg.partitions)]


def _batch_step(job: Job) -> tuple:
    """The ``.batch`` step of a job that ran: a time limit or a cancel ends it by signal 15."""
    state, exit_code, sig = job.state, job.exit_code, job.signal
    if state in ("TIMEOUT", "CANCELLED"):
        state, exit_code, sig = "CANCELLED", 0, 15
    elif state == "OUT_OF_MEMORY":
        exit_code, sig = 0, 125
    elapsed = job.elapsed or max(0, job.end_time - job.start_time)
    first = job.alloc[0] if job.alloc else None
    return (job.job_id, "batch", "batch", state, exit_code, sig, job.max_rss, elapsed, job.start_time, job.end_time,
            1, first.cpus if first else 0, first.node if first else "")


def step_row(job_id: int, step: Step) -> tuple:
    """An srun step's row: RUNNING from its start, then how it ended."""
    s = step.started
    return (job_id, str(s.step_id), s.name, step.state, step.exit_code, step.signal, step.max_rss, step.elapsed,
            step.start, step.end, s.ntasks, sum(a.cpus for a in s.alloc), ",".join(a.node for a in s.alloc))


def _write_batch(db: Any, rows: list[tuple], steps: list[tuple], runs: list[tuple], usage: dict,
                 nodes: list[tuple] | None, partitions: list[tuple] | None, cluster: str, seq: int, now: int,
                 node_states: list[tuple], snapshot: bytes | None) -> None:
    """:meth:`Projector._write` in the database's thread (``db``: its sqlite3 connection)."""
    db.executemany(_UPSERT_JOB, rows)
    if runs:
        db.executemany("INSERT OR REPLACE INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", runs)
    if steps:
        db.executemany(f"INSERT OR REPLACE INTO steps VALUES ({', '.join('?' * 13)})", steps)
    for (user, account, part), (cpu, gpu, jobs) in usage.items():
        db.execute("INSERT INTO usage VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(user, account, partition) DO "
                   "UPDATE SET cpu_seconds = cpu_seconds + excluded.cpu_seconds, gpu_seconds = "
                   "gpu_seconds + excluded.gpu_seconds, jobs = jobs + excluded.jobs", (user, account, part, cpu, gpu, jobs))
    if partitions is not None:
        db.execute("DELETE FROM partitions")
        db.executemany("INSERT INTO partitions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", partitions)
        db.execute("INSERT OR REPLACE INTO meta VALUES ('cluster', ?)", (cluster,))
    if node_states:
        db.executemany("INSERT INTO node_states VALUES (?, ?, ?, ?, ?, ?)", node_states)
    if nodes is not None:
        db.execute("DELETE FROM nodes")
        db.executemany(f"INSERT INTO nodes VALUES ({', '.join('?' * 22)})", nodes)
    db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", (("seq", seq), ("now", now)))
    if snapshot is not None:
        db.execute("INSERT OR REPLACE INTO meta VALUES ('state', ?)", (snapshot,))
    db.commit()
