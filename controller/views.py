"""What the controller shows: the queue (squeue), one job (scontrol show job), nodes, a test submit,
and the projection-backed commands (sacct, sinfo) and time travel run on a caller's behalf.

Views read the controller's state; they never change it. Where ``PrivateData=jobs`` is set, a
caller who is not an operator sees only its own jobs.
"""
from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING, Any

from rota.core import commands, events as ev
from rota.core.apply import apply
from rota.core.auth import Caller
from rota.core.schedule import priority_of, schedule
from rota.core.state import TERMINAL_STATES
from rota.wire.lifetime import stop_child


if TYPE_CHECKING:
    from .port import ControllerPort

log = logging.getLogger("rota.controller.views")
LONG_QUEUE = 2000       # pending jobs beyond which a view uses the last cycle's decision instead of a fresh pass


def private_jobs(state: Any, caller: Caller) -> bool:
    """Whether ``caller`` may see only its own jobs (``PrivateData=jobs``)."""
    cfg = state.config
    return cfg is not None and "jobs" in cfg.auth.private_data and not caller.operator


class Views:
    def __init__(self, controller: ControllerPort) -> None:
        self.c = controller
        self._view_cache: tuple[tuple, list[dict]] | None = None
        self._queue_cache: tuple[list[dict], bytes] | None = None
        self._squeue_cache: tuple[list[dict] | None, dict[bytes, tuple[int | None, bytes]]] = (None, {})
        self._chosen_cache: tuple[tuple | None, dict[bytes, tuple[int | None, bytes]]] = (None, {})
        self._plan_cache: tuple[int, dict[int, int]] | None = None
        self._timetravel = asyncio.Semaphore(2)
        self._timetravel_users: set[int] = set()

    # ------------------------------------------------------------ the queue

    def queue_json(self, caller: Caller) -> bytes:
        """``queue_view`` as JSON, reused while the view is the same list."""
        import orjson

        view = self.queue_view()
        if private_jobs(self.c.state, caller):
            return orjson.dumps([j for j in view if j["uid"] == caller.uid])
        if self._queue_cache is not None and self._queue_cache[0] is view:
            return self._queue_cache[1]
        data = orjson.dumps(view)
        self._queue_cache = (view, data)
        return data

    def _squeue_request(self, request: dict, caller: Caller) -> dict:
        """The options that matter, in one order (a cache key): ``--me`` as the caller's uid, ``-M`` with
        this cluster's name."""
        clean = {k: v for k, v in sorted(request.items()) if v not in (None, False)}
        if clean.pop("me", False):
            clean["users"] = str(caller.uid)
        if "clusters" in clean:
            cfg = self.c.state.config
            clean["_cluster"] = cfg.cluster_name if cfg is not None else "rota"
        return clean

    def squeue_reply(self, request: dict, caller: Caller) -> bytes:
        """squeue's rendered output for one command line (see :mod:`rota.controller.squeue_view`), as the
        encoded reply. Kept per command line while the queue view is the same (tools poll squeue far
        more often than the queue changes) and, for output with running jobs' times, the same second."""
        import orjson

        from .squeue_view import answer, requested_ids, select_jobs, wants_ended

        clean = self._squeue_request(request, caller)
        if clean.get("steps"):
            from .squeue_steps import answer_steps

            return orjson.dumps(answer_steps(self.c.state, clean, caller.uid if private_jobs(self.c.state, caller)
                                             else None, int(self.c.now())))
        chosen = select_jobs(self.c.state, clean)    # a few jobs of a long queue: only their rows are made
        if chosen is None:
            full = view = self.queue_view()
            if self._squeue_cache[0] is not full:
                self._squeue_cache = (full, {})
            cache = self._squeue_cache[1]
        else:
            full = view = self._rows(chosen)
            key = self._view_key()        # after the rows: making them may have made a decision
            if self._chosen_cache[0] != key:
                self._chosen_cache = (key, {})
            cache = self._chosen_cache[1]
        if private_jobs(self.c.state, caller):
            view = [j for j in full if j["uid"] == caller.uid]
            clean["_uid"] = caller.uid
        now = int(self.c.now())
        if clean.get("jobs"):       # which of the jobs asked for have ended but are still held (a header, no error)
            ids = requested_ids(clean["jobs"])
            jobs = self.c.state.jobs
            if isinstance(ids, set):
                mine_only = private_jobs(self.c.state, caller)
                clean["_ended"] = sorted(i for i in ids if i in jobs and jobs[i].state in TERMINAL_STATES
                                         and (not mine_only or jobs[i].spec.uid == caller.uid))
        if wants_ended(clean.get("states")):    # -t all: also the jobs that ended within MinJobAge
            ended = self._ended_rows(caller)
            view = view + ended
            full = full + ended
            clean["_seq"] = self.c.state.seq
        if clean.get("start"):   # jobs without a reservation: the plan's estimate, as Slurm's backfill plan gives one
            estimates = self.start_estimates()
            view = [j if j["expected_start"] or j["state"] != "PENDING" else
                    {**j, "expected_start": estimates.get(j["array_job_id"] or j["job_id"])} for j in view]
            clean["_seq"] = self.c.state.seq      # the plan may change where the queue's rows do not
        line = orjson.dumps(clean)
        hit = cache.get(line)
        if hit is not None and (hit[0] is None or hit[0] == now):
            return hit[1]
        result = answer(view, clean, now)
        dependent = result.pop("now_dependent", False)
        data = orjson.dumps(result)
        if len(cache) >= 64:
            cache.clear()
        cache[line] = (now if dependent else None, data)
        return data

    def queue_view(self) -> list[dict]:
        """Pending and running jobs with their current reasons (as squeue needs them); the same list
        object while nothing in it changed, so views derived from it can be reused."""
        cached = self._view_cache
        if cached is not None and cached[0] == self._view_key():
            return cached[1]
        state = self.c.state
        view = self._rows([state.jobs[jid] for ids in (state.pending, state.running) for jid in ids])
        if cached is not None and cached[1] == view:
            view = cached[1]
        self._view_cache = (self._view_key(), view)    # the rows may have made a decision
        return view

    def _view_key(self) -> tuple[int, Any]:
        """What the queue's rows are made from: the state (by sequence) and the decision giving reasons (the
        object itself: an equal decision gives the same rows, and a freed one's address cannot be mistaken
        for a new one's)."""
        c = self.c
        return (c.state.seq, c.last_decision[1] if c.last_decision else None)

    def start_estimates(self) -> dict[int, int]:
        """Each pending job's estimated start from the current plan (:func:`rota.core.schedule.plan`),
        made once per state of the cluster; a start the plan puts now (the policy does not) is left out."""
        from rota.core.schedule import plan

        c = self.c
        if self._plan_cache is None or self._plan_cache[0] != c.state.seq:
            now = int(max(c.now(), c.state.now))
            self._plan_cache = (c.state.seq, {j: t for j, t in plan(c.state, now).items() if t > now})
        return self._plan_cache[1]

    def _decision(self) -> Any:
        """The last cycle's decision (reasons as slurmctld shows them); a fresh pass when jobs arrived since,
        unless the queue is long: then the last cycle's stands (a pass over it takes as long as a cycle),
        and a job submitted since shows the reason None until the next cycle, as in Slurm."""
        c = self.c
        last = c.last_decision
        if last is not None and (last[0] == c.state.seq or len(c.state.pending) > LONG_QUEUE):
            return last[1]
        d = schedule(c.state, c.now(), explain=False)
        c.last_decision = (c.state.seq, d)
        return d

    def _ended_rows(self, caller: Caller) -> list[dict]:
        """squeue rows of the jobs that ended but are still held (MinJobAge), the caller's own when jobs are private."""
        state = self.c.state
        mine = private_jobs(state, caller)
        rows = []
        for _end, jid in state.finished:
            job = state.jobs.get(jid)
            if job is None or job.state not in TERMINAL_STATES or (mine and job.spec.uid != caller.uid):
                continue
            rows.append(self._row(job, None, None))
        return rows

    def _rows(self, jobs: list) -> list[dict]:
        """The squeue rows of these live jobs, with the reasons of the current decision."""
        d = self._decision() if self.c.state.pending else None
        return [self._row(job, d, d.pending_of(job.job_id) if d is not None else None) for job in jobs]

    @staticmethod
    def _row(job: Any, d: Any, p: Any) -> dict:
        """One job's squeue row (``d``: the decision; ``p``: its pending entry, if it waits)."""
        jid = job.job_id
        pending = job.state == "PENDING"
        spec, alloc, req = job.spec, job.alloc, job.req
        if alloc:
            nodes, num_nodes, cpus = [a.node for a in alloc], len(alloc), sum([a.cpus for a in alloc])
        else:
            nodes, num_nodes, cpus = [], req.nnodes if req else 1, req.total_cpus if req else 1
        return {
            "job_id": jid, "array_job_id": job.array_job_id, "array_task_id": job.array_task_id,
            "array_pending": job.array_pending, "array_throttle": job.array_throttle,
            "partition": job.partition, "name": spec.name, "user": spec.user,
            "state": job.state, "start_time": job.start_time, "submit_time": job.submit_time,
            "time_limit": job.time_limit, "nodes": nodes, "num_nodes": num_nodes,
            "reason": (p.display if p is not None else "None") if pending else "None",
            "expected_start": p.start if p is not None else None,
            "priority": (d.priorities.get(jid, 0) if d is not None else 0) if pending else 0,
            "sched_nodes": list(d.reservations[jid].nodes) if d is not None and jid in d.reservations else [],
            "account": spec.account, "qos": spec.qos, "uid": spec.uid, "cpus": cpus, "end_time": job.end_time,
            "exec_host": (nodes[0] if not spec.allocation else spec.submit_host or nodes[0]) if nodes else None,
            "gid": spec.gid, "workdir": spec.workdir, "dependency": spec.dependency, "nice": job.nice,
            "min_cpus": req.cpus if req else 1, "min_mem": req.mem if req else 0, "comment": spec.comment,
            "idle_since": job.idle_since,
        }

    # ------------------------------------------------------------ one job, nodes, a trial submit

    def job_states(self, job_ids: list[int], caller: Caller) -> dict[str, dict]:
        """Each job's state and exit code, as far as the controller still knows it: a job purged after
        MinJobAge is COMPLETED (exit 0) or ENDED (otherwise: sacct tells how); one it never had, or another
        user's under PrivateData=jobs, UNKNOWN."""
        state = self.c.state
        private = private_jobs(state, caller)
        out: dict[str, dict] = {}
        for job_id in job_ids:
            job = state.jobs.get(job_id)
            if job is not None and not (private and job.spec.uid != caller.uid):
                out[str(job_id)] = {"state": job.state, "exit_code": job.exit_code}
            elif job is None and job_id in state.ended:
                ok, bad = state.ended[job_id]
                out[str(job_id)] = {"state": "COMPLETED" if ok and not bad else "ENDED", "exit_code": 0 if not bad else None}
            else:
                out[str(job_id)] = {"state": "UNKNOWN", "exit_code": None}
        return out

    def job(self, job_id: int, caller: Caller) -> dict:
        """Everything ``scontrol show job`` prints about a job the controller still holds (never its
        script or environment)."""
        state = self.c.state
        job = state.jobs.get(job_id)
        if job is None or (private_jobs(state, caller) and job.spec.uid != caller.uid):
            raise commands.Rejected("Invalid job id specified", code="no_job")
        p = self._decision().pending_of(job_id) if job.state == "PENDING" else None
        req = job.req
        return {
            "job_id": job.job_id, "array_job_id": job.array_job_id, "array_task_id": job.array_task_id,
            "array_pending": job.array_pending, "array_throttle": job.array_throttle,
            "spec": job.spec.model_dump(mode="json", exclude={"script", "env"}), "state": job.state,
            "reason": p.reason if p is not None else None, "expected_start": p.start if p is not None else None,
            "priority": (p.priority or priority_of(state, int(max(self.c.now(), state.now)), job_id)) if p is not None
            else 0, "hold": job.hold, "partition": job.partition,
            "submit_time": job.submit_time, "eligible_time": job.eligible_time, "start_time": job.start_time,
            "end_time": job.end_time, "time_limit": job.time_limit, "exit_code": job.exit_code, "signal": job.signal,
            "restarts": job.restarts, "nodes": [a.node for a in job.alloc], "alloc_cpus": sum(a.cpus for a in job.alloc),
            "alloc_mem": sum(a.mem for a in job.alloc), "alloc_gpus": sum(len(a.gpus) for a in job.alloc),
            "req": list(req) if req is not None else None, "backfilled": job.backfilled, "nice": job.nice,
            "steps": sorted(job.steps or ()), "alloc": self._alloc_details(job),
        }

    def jobs(self, caller: Caller, array_job_id: int | None = None) -> list[dict]:
        """:meth:`job` for every job the controller holds that the caller may see (of one array, when given),
        by job id."""
        state = self.c.state
        private = private_jobs(state, caller)
        return [self.job(job_id, caller) for job_id in sorted(state.jobs)
                if not (private and state.jobs[job_id].spec.uid != caller.uid)
                and (array_job_id is None or state.jobs[job_id].array_job_id == array_job_id)]

    def _alloc_details(self, job: Any) -> list[list]:
        """Each node of a running job: [node, CPU ids, MiB, GPU indices, GPU type]. The CPU ids are the node's CPUs
        handed out in the order its running jobs started (what an agent binds when the host has them)."""
        from rota.core.arrays import format_indices

        if job.state != "RUNNING":
            return []
        out = []
        for a in job.alloc:
            node = self.c.state.nodes.get(a.node)
            first = 0
            for other in (node.jobs if node is not None else ()):
                if other == job.job_id:
                    break
                held = self.c.state.jobs.get(other)
                first += next((x.cpus for x in held.alloc if x.node == a.node), 0) if held is not None else 0
            types = node.gpu_types if node is not None else []
            gtype = types[a.gpus[0]] if a.gpus and a.gpus[0] < len(types) else ""
            out.append([a.node, format_indices(list(range(first, first + a.cpus)), 0), a.mem, list(a.gpus), gtype])
        return out

    def nodes(self) -> list[dict]:
        return [{"name": n.name, "state": n.display_state(), "cpus": n.cpus, "alloc_cpus": n.alloc_cpus,
                 "memory": n.memory, "alloc_mem": n.alloc_mem, "gpus": n.gpu_count, "free_gpus": n.free_gpus,
                 "reason": n.reason, "reason_by": n.reason_by, "reason_time": n.reason_time}
                for n in self.c.state.nodes.values()]

    def test_submit(self, spec: ev.JobSpec, caller: Caller) -> dict:
        """``sbatch --test-only``: validate and say when and where the job would start; nothing is logged."""
        import copy
        import datetime as dt
        from rota.core.hostlist import compress

        state = self.c.state
        job_id = state.next_job_id
        event = commands.submit(state, spec, job_id, caller)
        trial = copy.deepcopy(state)
        now = max(self.c.now(), trial.now)
        apply(trial, ev.Envelope(seq=trial.seq + 1, ts=now, actor=caller.actor(), idem="", event=event))
        d = schedule(trial, now)
        start = next((s for s in d.starts if (s.array_job_id or s.job_id) == job_id), None)
        when: int | None = now
        if start is not None:
            nodes, part = [a.node for a in start.alloc], start.partition
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

    # ------------------------------------------------------------ commands run for a caller

    async def accounting(self, command: str, argv: list[str], caller: Caller) -> dict:
        """``sacct``/``sinfo``/``scontrol show`` over this cluster's projection, for a caller who cannot
        read it: the same code, the caller's uid for "my jobs" (and, under PrivateData=jobs, only theirs)."""
        reports = self.c.reports
        if reports is None:
            raise commands.Rejected("this controller keeps no projection (run sacct/sinfo where rota up runs)",
                                    code="no_projection")
        cfg = self.c.state.config
        private_usage = command == "report" and cfg is not None and "usage" in cfg.auth.private_data \
            and not caller.operator
        only = caller.uid if private_jobs(self.c.state, caller) or private_usage else None
        code, out, err = await asyncio.to_thread(reports, command, argv, caller.uid, only, self.c.state.seq)
        return {"ok": True, "out": out, "err": err, "code": code}

    async def timetravel(self, command: str, argv: list[str], caller: Caller) -> dict:
        """``rota why|replay|verify|whatif`` run here (where the log can be read) for a caller who cannot
        read the log: a child process with a time limit, at most two at once, one per user."""
        env = self.c.timetravel_env
        if env is None or not self.c.timetravel_argv:
            raise commands.Rejected("this controller cannot run time travel for others (no state directory)",
                                    code="no_log")
        bad = _timetravel_argv_problem(command, argv)
        if bad:
            raise commands.Rejected(bad, code="invalid")
        if caller.uid in self._timetravel_users:
            raise commands.Rejected("you already have a time-travel command running; wait for it", code="busy")
        self._timetravel_users.add(caller.uid)
        try:
            async with self._timetravel:
                proc = await asyncio.create_subprocess_exec(
                    *self.c.timetravel_argv, command, *argv, env=env, cwd="/",
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
                try:
                    out, err = await asyncio.wait_for(proc.communicate(), timeout=600)
                except asyncio.TimeoutError:
                    await stop_child(proc)
                    raise commands.Rejected(f"rota {command} took longer than 600 s and was stopped",
                                            code="timeout") from None
        finally:
            self._timetravel_users.discard(caller.uid)
        return {"ok": True, "out": out[:64 << 20].decode(errors="replace"),
                "err": err[:1 << 20].decode(errors="replace"), "code": proc.returncode}


# the options each time-travel command may be given on another user's behalf (nothing that names a
# file or another cluster)
TIMETRAVEL_OPTIONS = {"why": {"--at", "--json"}, "replay": {"--at"}, "verify": {"--from", "--to", "--latency", "--no-liveness"},
                      "whatif": {"--set", "--json", "--top"}, "history": {"--json"}}
_FLAGS = {"--json", "--no-liveness"}


def _timetravel_argv_problem(command: str, argv: list[str]) -> str | None:
    allowed = TIMETRAVEL_OPTIONS[command]
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("-"):
            name = arg.split("=", 1)[0]
            if name not in allowed:
                return f"rota {command}: option {name} is not available through the controller " \
                       f"(allowed: {', '.join(sorted(allowed))})"
            if "=" not in arg and name not in _FLAGS:
                i += 1
        i += 1
    return None


def timetravel_environment(state_dir: str) -> dict[str, str]:
    """The environment of a time-travel child: this cluster's state directory, nothing of the caller's."""
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TZ", "HOME")}
    return {**keep, "ROTA_STATE_DIR": state_dir, "ROTA_DIRECT_LOG": "1"}
