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
from rota.core.state import State, dump_snapshot

from . import assign, snapshots
from .recent import Recent
from .eventlog import FencedError, LogUnavailable

log = logging.getLogger("rota.controller")
API = "rota.api"


_AGENT_EVENTS = (ev.JobsStarted, ev.JobCancelled, ev.JobRequeued, ev.JobUpdated, ev.NodeDown, ev.NodeRegistered,
                 ev.ClusterConfigured)


def _may_start_something(event: Any) -> bool:
    """Whether a cycle right after ``event`` could decide anything new. A held job is skipped by the
    scheduler, so submitting one (or holding one) cannot; the periodic cycle still runs."""
    if isinstance(event, ev.JobSubmitted):
        return not event.spec.hold
    return not isinstance(event, ev.JobHeld)


READ_VERBS = frozenset({"job", "queue", "squeue", "nodes", "ping", "test_submit", "accounting"})


class _Raw:
    """A reply value that is JSON already (inserted as is by :func:`encode_reply`)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


def encode_reply(result: dict) -> bytes:
    """A reply as JSON bytes (orjson), splicing pre-encoded values in without re-encoding them."""
    import orjson

    return orjson.dumps(result, default=lambda v: orjson.Fragment(v.data) if isinstance(v, _Raw) else str(v))


class _NothingToDo(Exception):
    """A cycle that started nothing: no event to append."""


class Controller:
    def __init__(self, eventlog: Any, *, config: ev.ClusterConfig | None = None,
                 clock: Callable[[], float] = time.time, cycle_interval: float = 5.0,
                 debounce: float = 0.02, snapshot_every: int = 10_000, history_every: int = 10_000,
                 name: str = "controller") -> None:
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
        self._results: Recent[dict] = Recent(100_000)   # answers to recent requests, by request id
        self._tasks: list[asyncio.Task] = []
        self._subs: list[Any] = []
        self._last_snapshot_seq = 0
        self._queue: list[tuple[Callable[[State], Any], str, str, asyncio.Future]] = []
        self._writer: asyncio.Task | None = None
        self.max_batch = 256
        self._stale = False                  # the state may hold events the log does not: reload first
        self._recent: Recent[int] = Recent(200_000)   # idempotency id -> sequence, for retries after a restart
        self.on_assign: Callable[[list[tuple[str, dict]]], None] | None = None   # agent messages to send
        self.on_reload: Callable[[], None] | None = None                         # state rebuilt from the log
        self._last_decision: tuple[int, Any] | None = None   # (state sequence, Decision) for queue views
        self.projection_db: str | None = None   # the projection rota up keeps, for remote sacct/sinfo
        self._view_cache: tuple[tuple, list[dict]] | None = None
        self._queue_cache: tuple[list[dict], bytes] | None = None
        self._squeue_cache: tuple[list[dict] | None, dict[bytes, tuple[int | None, bytes]]] = (None, {})

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
                    remember(env.idem, env.seq)
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
                except BaseException as exc:  # noqa: BLE001 - never leave a caller waiting
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
        staged: list[tuple[ev.Envelope, asyncio.Future]] = []
        outbox: list[tuple[str, dict]] = []
        for prepare, actor, idem, fut in batch:
            if idem and idem in self._recent:   # a retry of something already on the log
                fut.set_result((self._recent_envelope(idem, actor), True))
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
            staged.append((env, fut))
        if not staged:
            return
        acks = await asyncio.gather(*(self.log.append(env.event, actor=env.actor, idem=env.idem, ts=env.ts,
                                                      expected_last=env.seq - 1) for env, _ in staged),
                                    return_exceptions=True)
        clean = all(not isinstance(a, BaseException) and not a.duplicate and a.seq == env.seq
                    for a, (env, _) in zip(acks, staged))
        if clean:
            for env, fut in staged:
                self._remember(env.idem, env.seq)
                fut.set_result((env, False))
            if any(_may_start_something(env.event) for env, _ in staged):
                self._dirty.set()
            if outbox and self.on_assign is not None:
                self.on_assign(outbox)
            return
        await self._reconcile(base, staged, acks)
        if self.on_reload is not None:
            self.on_reload()

    async def _reconcile(self, base: int, staged: list, acks: list) -> None:
        """After a failed group commit: rebuild from the log and answer each request truthfully."""
        ours = {env.idem for env, _ in staged}
        landed = await self._reload(since=base)
        if landed is None:
            self._stale = True
            for (env, fut), ack in zip(staged, acks):
                fut.set_exception(ack if isinstance(ack, Exception) else LogUnavailable("outcome unknown"))
            return
        if any(idem not in ours for idem in landed):
            self.leader = False
            log.error("another controller appended to the log: stepping back to follower")
        for (env, fut), ack in zip(staged, acks):
            if env.idem in landed:
                fut.set_result((env.model_copy(update={"seq": landed[env.idem]}), False))
            elif not isinstance(ack, BaseException) and ack.duplicate:
                self._remember(env.idem, ack.seq)
                fut.set_result((env.model_copy(update={"seq": ack.seq}), True))
            elif not self.leader:
                fut.set_exception(FencedError(base))
            else:
                fut.set_exception(ack if isinstance(ack, LogUnavailable) else
                                  LogUnavailable("a request before it in the same batch failed"))

    async def _reload(self, since: int | None = None) -> dict[str, int] | None:
        """Rebuild the state from snapshot + log; returns the idems of events after ``since``."""
        try:
            state = await self._read_snapshot() or State()
            landed: dict[str, int] = {}
            async for chunk in self.log.read_batches(state.seq + 1):
                fold(chunk, state)
                for env in chunk:
                    self._remember(env.idem, env.seq)
                    if since is not None and env.seq > since:
                        landed[env.idem] = env.seq
        except Exception as exc:  # noqa: BLE001 - still unavailable: the caller reports it
            log.warning("rebuilding from the log failed: %s", exc)
            return None
        self.state = state
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

    async def handle(self, verb: str, body: dict) -> dict | _Raw:
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
        if rid and verb not in READ_VERBS and result.get("ok"):   # a retried write gets the same answer
            self._results[rid] = result
        return result

    async def _dispatch(self, verb: str, body: dict, rid: str) -> dict:
        user = body.get("user", "root")
        st = self.state
        if verb == "submit":
            spec = ev.JobSpec.model_validate(body["spec"])
            env, duplicate = await self.write(lambda state: commands.submit(state, spec, state.next_job_id),
                                              spec.user, rid)
            if duplicate:   # a retried submit: answer with the job its first try created
                job_id = next((j.job_id for j in self.state.jobs.values() if j.submit_seq == env.seq), None)
                if job_id is None:
                    raise commands.Rejected("this request was accepted earlier, but its job is no longer known",
                                            code="duplicate")
                return {"ok": True, "job_id": job_id}
            return {"ok": True, "job_id": env.event.job_id}
        if verb == "test_submit":
            return self.test_submit(ev.JobSpec.model_validate(body["spec"]))
        if verb == "signal":
            # a signal changes nothing the scheduler knows: it goes to the batch host, not into the log
            job = self.state.jobs.get(int(body["job_id"]))
            if job is None:
                raise commands.Rejected("Invalid job id specified", code="no_job")
            if job.state != "RUNNING" or not job.alloc:
                raise commands.Rejected("Job is not running", code="not_running")
            if self.on_assign is None:
                raise commands.Rejected("no agents are connected to deliver the signal", code="no_agents")
            self.on_assign([(job.alloc[0].node, {"op": "signal", "job_id": job.job_id, "restarts": job.restarts,
                                                 "signal": int(body.get("signal", 15))})])
            return {"ok": True}
        if verb == "cancel":
            jid, uid = int(body["job_id"]), int(body.get("uid", 0))
            tasks = tuple(int(t) for t in body["tasks"]) if body.get("tasks") is not None else None
            await self.write(lambda state: commands.cancel(state, jid, uid, tasks), user, rid)
            return {"ok": True}
        if verb in ("hold", "release"):
            jid = int(body["job_id"])
            admin = bool(body.get("admin", False))
            act = commands.hold if verb == "hold" else commands.release
            await self.write(lambda state: act(state, jid, admin), user, rid)
            return {"ok": True}
        if verb == "requeue":
            jid, hold = int(body["job_id"]), bool(body.get("hold", False))
            await self.write(lambda state: commands.requeue(state, jid, hold), user, rid)
            return {"ok": True}
        if verb == "update_job":
            jid = int(body["job_id"])
            await self.write(lambda state: commands.update_job(
                state, jid, time_limit=body.get("time_limit"), priority=body.get("priority"),
                by_admin=bool(body.get("admin", True))), user, rid)
            return {"ok": True}
        if verb in ("drain", "down", "resume"):
            node, reason = body["node"], body.get("reason", "")
            if verb == "drain":
                await self.write(lambda state: commands.drain(state, node, reason, user), user, rid)
            elif verb == "down":
                await self.write(lambda state: commands.down(state, node, reason, user), user, rid)
            else:
                await self.write(lambda state: commands.resume(state, node, user), user, rid)
            return {"ok": True}
        if verb == "job":
            return {"ok": True, "job": self.job_view(int(body["job_id"])), "now": self.now()}
        if verb == "queue":
            return {"ok": True, "jobs": _Raw(self.queue_json()), "now": self.now()}
        if verb == "squeue":
            return _Raw(self.squeue_reply(body))
        if verb == "nodes":
            return {"ok": True, "nodes": self.nodes_view()}
        if verb == "accounting":
            return await self.accounting(body)
        if verb == "ping":
            return {"ok": True, "seq": st.seq, "leader": self.leader, "version": __version__}
        raise commands.Rejected(f"unknown request {verb!r}", code="unknown")

    def queue_json(self) -> bytes:
        """``queue_view`` as JSON, reused while the view is the same list."""
        view = self.queue_view()
        if self._queue_cache is not None and self._queue_cache[0] is view:
            return self._queue_cache[1]
        import orjson

        data = orjson.dumps(view)
        self._queue_cache = (view, data)
        return data

    async def accounting(self, body: dict) -> dict:
        """``sacct``/``sinfo`` run here over this cluster's projection, for a client machine that has
        none (a login node): the same code, the caller's uid for "my jobs"."""
        import io

        command, argv, uid = body["command"], body["argv"], int(body["uid"])
        if command not in ("sacct", "sinfo") or not isinstance(argv, list) or \
                not all(isinstance(a, str) for a in argv):
            raise ValueError("accounting wants command sacct|sinfo and argv as a list of strings")
        if self.projection_db is None:
            raise commands.Rejected("this controller keeps no projection (run sacct/sinfo where rota up runs)",
                                    code="no_projection")
        if command == "sacct":
            from rota.cli.sacct import run
        else:
            from rota.cli.sinfo import run
        out, err = io.StringIO(), io.StringIO()
        code = await asyncio.to_thread(run, argv, out, err, db=self.projection_db, uid=uid)
        return {"ok": True, "out": out.getvalue(), "err": err.getvalue(), "code": code}

    def squeue_reply(self, request: dict) -> bytes:
        """squeue's rendered output for one command line (see :mod:`rota.projections.squeue_view`), as the
        encoded reply. Kept per command line while the queue view is the same (tools poll squeue far
        more often than the queue changes) and, for output with running jobs' times, the same second."""
        import orjson

        from rota.projections.squeue_view import answer

        clean = {k: v for k, v in sorted(request.items()) if k != "rid"}
        view = self.queue_view()
        now = int(self.now())
        if self._squeue_cache[0] is not view:
            self._squeue_cache = (view, {})
        key = orjson.dumps(clean)
        hit = self._squeue_cache[1].get(key)
        if hit is not None and (hit[0] is None or hit[0] == now):
            return hit[1]
        result = answer(view, clean, now)
        dependent = result.pop("now_dependent", False)
        data = orjson.dumps(result)
        if len(self._squeue_cache[1]) >= 64:
            self._squeue_cache[1].clear()
        self._squeue_cache[1][key] = (now if dependent else None, data)
        return data

    def queue_view(self) -> list[dict]:
        """Pending and running jobs with their current reasons (as squeue needs them); the same list
        object while nothing in it changed, so views derived from it can be reused."""
        key = (self.state.seq, id(self._last_decision[1]) if self._last_decision else None)
        cached = self._view_cache
        if cached is not None and cached[0] == key:
            return cached[1]
        view = self._build_queue_view()
        if cached is not None and cached[1] == view:
            view = cached[1]
        key = (self.state.seq, id(self._last_decision[1]) if self._last_decision else None)
        self._view_cache = (key, view)
        return view

    def _build_queue_view(self) -> list[dict]:
        d = None
        if self.state.pending:
            # the last cycle's reasons, as slurmctld shows them; a fresh pass only when jobs arrived since
            last = self._last_decision
            fresh = last is not None and last[0] == self.state.seq
            d = last[1] if fresh else schedule(self.state, self.now(), explain=False)
            if not fresh:
                self._last_decision = (self.state.seq, d)
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
                "priority": (d.priorities.get(jid, 0) if d is not None else 0) if job.state == "PENDING" else 0,
                "sched_nodes": list(d.reservations[jid].nodes) if d is not None and jid in d.reservations else [],
                "account": job.spec.account, "uid": job.spec.uid,
                "cpus": sum(a.cpus for a in job.alloc) or (job.req.total_cpus if job.req else 1),
            })
        return out

    def test_submit(self, spec: ev.JobSpec) -> dict:
        """``sbatch --test-only``: validate and say when and where the job would start; nothing is logged."""
        import copy
        import datetime as dt

        from rota.core.hostlist import compress

        state = self.state
        job_id = state.next_job_id
        event = commands.submit(state, spec, job_id)
        trial = copy.deepcopy(state)
        now = max(self.now(), trial.now)
        apply(trial, ev.Envelope(seq=trial.seq + 1, ts=now, actor=spec.user, idem="", event=event))
        d = schedule(trial, now)
        start = next((s for s in d.starts if (s.array_job_id or s.job_id) == job_id), None)
        if start is not None:
            when, nodes, part = now, [a.node for a in start.alloc], start.partition
            cpus = sum(a.cpus for a in start.alloc)
        else:
            res = d.reservations.get(job_id)
            job = trial.jobs[job_id]
            when = res.start if res is not None else None
            nodes = list(res.nodes) if res is not None else []
            part = res.partition if res is not None else job.partition
            cpus = job.req.total_cpus if job.req is not None else 1
        return {"ok": True, "job_id": job_id, "partition": part, "cpus": cpus, "nodes": compress(nodes) or "(null)",
                "start": dt.datetime.fromtimestamp(when).strftime("%Y-%m-%dT%H:%M:%S") if when else "Unknown"}

    def job_view(self, job_id: int) -> dict:
        """Everything ``scontrol show job`` prints about a job the controller still holds."""
        job = self.state.jobs.get(job_id)
        if job is None:
            raise commands.Rejected("Invalid job id specified", code="no_job")
        p = None
        if job.state == "PENDING":
            last = self._last_decision
            d = last[1] if last is not None and last[0] == self.state.seq else schedule(self.state, self.now())
            p = d.pending.get(job_id)
        req = job.req
        return {
            "job_id": job.job_id, "array_job_id": job.array_job_id, "array_task_id": job.array_task_id,
            "spec": job.spec.model_dump(mode="json", exclude={"script", "env"}), "state": job.state,
            "reason": p.reason if p is not None else None, "expected_start": p.start if p is not None else None,
            "priority": p.priority if p is not None else 0, "hold": job.hold, "partition": job.partition,
            "submit_time": job.submit_time, "eligible_time": job.eligible_time, "start_time": job.start_time,
            "end_time": job.end_time, "time_limit": job.time_limit, "exit_code": job.exit_code, "signal": job.signal,
            "restarts": job.restarts, "nodes": [a.node for a in job.alloc], "alloc_cpus": sum(a.cpus for a in job.alloc),
            "alloc_mem": sum(a.mem for a in job.alloc), "alloc_gpus": sum(len(a.gpus) for a in job.alloc),
            "req": list(req) if req is not None else None, "backfilled": job.backfilled, "nice": job.nice,
        }

    def nodes_view(self) -> list[dict]:
        return [{"name": n.name, "state": n.display_state(), "cpus": n.cpus, "alloc_cpus": n.alloc_cpus,
                 "memory": n.memory, "alloc_mem": n.alloc_mem, "gpus": n.gpu_count, "free_gpus": n.free_gpus,
                 "reason": n.reason, "reason_by": n.reason_by, "reason_time": n.reason_time}
                for n in self.state.nodes.values()]

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
                self._last_decision = (state.seq, decision)
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
        await snapshots.put(store, data, seq, history)
        if history:
            self._last_history_seq = seq
        self._last_snapshot_seq = seq
        return True

    async def _read_snapshot(self) -> State | None:
        store = await self._store()
        return None if store is None else await snapshots.latest(store)

    # ------------------------------------------------------------ serving over NATS

    async def serve(self, nc: Any) -> None:
        """Answer ``rota.api.<verb>`` requests (JSON in, JSON out) and run cycles."""

        inflight: set[asyncio.Task] = set()

        async def on_request(msg: Any) -> None:
            # nats-py runs a subscription's callbacks one at a time: hand each request to its own task
            # so concurrent requests reach the writer together and are committed as one group.
            task = asyncio.create_task(answer(msg))
            inflight.add(task)
            task.add_done_callback(inflight.discard)

        async def answer(msg: Any) -> None:
            verb = msg.subject.rsplit(".", 1)[-1]
            try:
                body = json.loads(msg.data or b"{}")
            except ValueError:
                body = None
            if not isinstance(body, dict):
                result = {"ok": False, "error": ["bad request: body is not a JSON object"], "code": "bad_request"}
            else:
                result = await self.handle(verb, body)
            await msg.respond(encode_reply(result))

        self._subs.append(await nc.subscribe(f"{API}.*", queue="rota-controller", cb=on_request))
        self._tasks.append(asyncio.create_task(self.run_cycles()))

    async def stop(self) -> None:
        for sub in self._subs:
            await sub.unsubscribe()
        for t in self._tasks:
            t.cancel()
        self._subs, self._tasks = [], []
