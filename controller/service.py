"""The controller: fold the log, serve requests over NATS, run scheduling cycles, append decisions.

The loop is: read request -> validate against the state (``rota.core.commands``) -> append
(fenced on the last folded sequence, idempotent on the client's request id) -> apply -> maybe
schedule. Only this process appends; a stale or second controller's append is refused by the
log and it steps back.
"""
from __future__ import annotations

import asyncio
import gc
import json
import logging
import time
from typing import Any, Callable

from rota.core import commands, events as ev
from rota.core import __version__
from rota.core.apply import apply, fold
from rota.core.schedule import schedule
from rota.core.state import State, dump_snapshot, load_snapshot

from .eventlog import FencedError, LogUnavailable

log = logging.getLogger("rota.controller")
API = "rota.api"
SNAPSHOT_BUCKET = "rota-snapshots"


class Controller:
    def __init__(self, eventlog: Any, *, config: ev.ClusterConfig | None = None,
                 clock: Callable[[], float] = time.time, cycle_interval: float = 5.0,
                 debounce: float = 0.02, snapshot_every: int = 10_000, name: str = "controller") -> None:
        self.log = eventlog
        self.state = State()
        self.config = config
        self.clock = clock
        self.cycle_interval = cycle_interval
        self.debounce = debounce
        self.snapshot_every = snapshot_every
        self.name = name
        self.leader = False
        self._lock = asyncio.Lock()
        self._dirty = asyncio.Event()
        self._results: dict[str, dict] = {}
        self._tasks: list[asyncio.Task] = []
        self._subs: list[Any] = []
        self._last_snapshot_seq = 0
        self._uncertain: set[str] = set()   # appends whose outcome the log did not confirm

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
            async for chunk in self.log.read_batches(self.state.seq + 1):
                fold(chunk, self.state)
        finally:
            if was_enabled:
                gc.enable()
        gc.freeze()   # what was loaded lives as long as the process: keep it out of later collections

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
        async with self._lock:
            return (await self._append_locked(event, actor, idem))[0]

    async def _append_locked(self, event: Any, actor: str, idem: str = "") -> tuple[ev.Envelope, bool]:
        """Append and apply; returns the envelope and whether the log had it already (a retry)."""
        if not self.leader:
            raise FencedError(self.state.seq)
        ts = max(self.now(), self.state.now)
        idem = idem or f"{self.name}-{self.state.seq + 1}-{ts}"
        try:
            ack = await self.log.append(event, actor=actor, idem=idem, ts=ts, expected_last=self.state.seq)
        except LogUnavailable:
            self._uncertain.add(idem)   # the write may have landed: fold whatever is there
            await self._catch_up()
            raise
        except FencedError:
            if await self._catch_up():
                self.leader = False
                log.error("another controller appended to the log: stepping back to follower")
                raise
            ack = await self.log.append(event, actor=actor, idem=idem, ts=ts, expected_last=self.state.seq)
        env = ev.Envelope(seq=ack.seq, ts=ts, actor=actor, idem=idem, event=event)
        if not ack.duplicate:
            apply(self.state, env)
            self._dirty.set()
        return env, ack.duplicate

    async def _catch_up(self) -> bool:
        """Fold what the log holds beyond our state; True if another writer appended it."""
        other = False
        try:
            async for env in self.log.read(self.state.seq + 1):
                apply(self.state, env)
                self._dirty.set()
                if env.idem not in self._uncertain:
                    other = True
                self._uncertain.discard(env.idem)
        except Exception as exc:  # noqa: BLE001 - still unavailable: the caller reports it
            log.warning("catching up from the log failed: %s", exc)
        return other

    # ------------------------------------------------------------ requests

    async def handle(self, verb: str, body: dict) -> dict:
        """Serve one API request; a rejected request gets Slurm's error lines."""
        rid = body.get("rid", "")
        if rid and rid in self._results:
            return self._results[rid]
        try:
            result = await self._dispatch(verb, body, rid)
        except commands.Rejected as r:
            result = {"ok": False, "error": list(r.lines), "code": r.code}
        except FencedError:
            result = {"ok": False, "error": ["controller is not the leader"], "code": "not_leader"}
        except LogUnavailable as exc:
            result = {"ok": False, "error": [f"event log unavailable ({exc}); retry"], "code": "unavailable"}
        except (ValueError, KeyError, TypeError) as exc:
            result = {"ok": False, "error": [f"bad request: {exc}"], "code": "bad_request"}
        if rid and result.get("ok"):
            self._results[rid] = result
            if len(self._results) > 100_000:
                self._results.pop(next(iter(self._results)))
        return result

    async def _dispatch(self, verb: str, body: dict, rid: str) -> dict:
        user = body.get("user", "root")
        st = self.state
        if verb == "submit":
            spec = ev.JobSpec.model_validate(body["spec"])
            async with self._lock:
                job_id = self.state.next_job_id
                event = commands.submit(self.state, spec, job_id)
                env, duplicate = await self._append_locked(event, spec.user, rid)
            if duplicate:   # a retried submit: answer with the job its first try created
                job_id = next((j.job_id for j in self.state.jobs.values() if j.submit_seq == env.seq), job_id)
            return {"ok": True, "job_id": job_id}
        if verb == "cancel":
            await self.append(commands.cancel(st, int(body["job_id"]), int(body.get("uid", 0))), user, rid)
            return {"ok": True}
        if verb in ("hold", "release"):
            jid = int(body["job_id"])
            admin = bool(body.get("admin", False))
            event = commands.hold(st, jid, admin) if verb == "hold" else commands.release(st, jid, admin)
            await self.append(event, user, rid)
            return {"ok": True}
        if verb == "update_job":
            event = commands.update_job(st, int(body["job_id"]), time_limit=body.get("time_limit"),
                                        priority=body.get("priority"), by_admin=bool(body.get("admin", True)))
            await self.append(event, user, rid)
            return {"ok": True}
        if verb in ("drain", "down", "resume"):
            node = body["node"]
            if verb == "drain":
                event = commands.drain(st, node, body.get("reason", ""), user)
            elif verb == "down":
                event = commands.down(st, node, body.get("reason", ""), user)
            else:
                event = commands.resume(st, node, user)
            await self.append(event, user, rid)
            return {"ok": True}
        if verb == "queue":
            return {"ok": True, "jobs": self.queue_view(), "now": self.now()}
        if verb == "nodes":
            return {"ok": True, "nodes": self.nodes_view()}
        if verb == "ping":
            return {"ok": True, "seq": st.seq, "leader": self.leader, "version": __version__}
        raise commands.Rejected(f"unknown request {verb!r}", code="unknown")

    def queue_view(self) -> list[dict]:
        """Pending and running jobs with their current reasons (as squeue needs them)."""
        d = schedule(self.state, self.now(), explain=False) if self.state.pending else None
        out = []
        for jid in list(self.state.pending) + list(self.state.running):
            job = self.state.jobs[jid]
            p = d.pending.get(jid) if d is not None else None
            out.append({
                "job_id": jid, "array_job_id": job.array_job_id, "array_task_id": job.array_task_id,
                "array_pending": job.array_pending, "array_throttle": job.array_throttle,
                "partition": job.partition, "name": job.spec.name, "user": job.spec.user,
                "state": job.state, "start_time": job.start_time, "submit_time": job.submit_time,
                "time_limit": job.time_limit, "nodes": [a.node for a in job.alloc],
                "num_nodes": len(job.alloc) or (job.req.nnodes if job.req else 1),
                "reason": (p.display if p is not None else "None") if job.state == "PENDING" else "None",
                "expected_start": p.start if p is not None else None,
                "cpus": sum(a.cpus for a in job.alloc) or (job.req.total_cpus if job.req else 1),
            })
        return out

    def nodes_view(self) -> list[dict]:
        return [{"name": n.name, "state": n.display_state(), "cpus": n.cpus, "alloc_cpus": n.alloc_cpus,
                 "memory": n.memory, "alloc_mem": n.alloc_mem, "gpus": n.gpu_count, "free_gpus": n.free_gpus,
                 "reason": n.reason, "reason_by": n.reason_by, "reason_time": n.reason_time}
                for n in self.state.nodes.values()]

    # ------------------------------------------------------------ cycles

    async def cycle(self) -> ev.JobsStarted | None:
        """One scheduling cycle; appends its decision when it started something."""
        async with self._lock:
            if not self.leader or not self.state.pending:
                return None
            decision = schedule(self.state, max(self.now(), self.state.now))
            event = decision.event()
            if event is not None:
                await self._append_locked(event, self.name, f"{self.name}-cycle-{decision.cycle}-{self.state.seq}")
            return event

    async def run_cycles(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._dirty.wait(), timeout=self.cycle_interval)
            except asyncio.TimeoutError:
                pass
            await asyncio.sleep(self.debounce)
            self._dirty.clear()
            try:
                await self.cycle()
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
        if js is None:
            return None
        try:
            return await js.object_store(SNAPSHOT_BUCKET)
        except Exception:
            return await js.create_object_store(bucket=SNAPSHOT_BUCKET)

    async def maybe_snapshot(self, force: bool = False) -> bool:
        """Write a snapshot (with its sequence inside) every ``snapshot_every`` events."""
        if not force and self.state.seq - self._last_snapshot_seq < self.snapshot_every:
            return False
        store = await self._store()
        if store is None or self.state.seq == self._last_snapshot_seq and not force:
            return False
        await store.put("latest", dump_snapshot(self.state))
        self._last_snapshot_seq = self.state.seq
        return True

    async def _read_snapshot(self) -> State | None:
        store = await self._store()
        if store is None:
            return None
        try:
            entry = await store.get("latest")
        except Exception:
            return None
        if entry is None or not entry.data:
            return None
        try:
            return load_snapshot(entry.data)
        except ValueError as exc:
            log.warning("ignoring unreadable snapshot: %s", exc)
            return None

    # ------------------------------------------------------------ serving over NATS

    async def serve(self, nc: Any) -> None:
        """Answer ``rota.api.<verb>`` requests (JSON in, JSON out) and run cycles."""

        async def on_request(msg: Any) -> None:
            verb = msg.subject.rsplit(".", 1)[-1]
            try:
                body = json.loads(msg.data or b"{}")
            except ValueError:
                body = None
            if not isinstance(body, dict):
                result = {"ok": False, "error": ["bad request: body is not a JSON object"], "code": "bad_request"}
            else:
                result = await self.handle(verb, body)
            await msg.respond(json.dumps(result).encode())

        self._subs.append(await nc.subscribe(f"{API}.*", queue="rota-controller", cb=on_request))
        self._tasks.append(asyncio.create_task(self.run_cycles()))

    async def stop(self) -> None:
        for sub in self._subs:
            await sub.unsubscribe()
        for t in self._tasks:
            t.cancel()
        self._subs, self._tasks = [], []
