"""The node agent (slurmd): registers inventory, runs assigned jobs confined, reports what happens.

It reads only its own node's orders (``rota.orders.<node>``, through a consumer it makes itself from the
last order it acted on: :mod:`rota.wire.orderqueue`) and reports through the inbox (``rota.inbox.<node>``,
a work-queue stream the controller drains and appends to the log). Heartbeats are plain NATS messages
(``rota.hb.<node>``). Jobs run under a tiny shell shepherd that records the exit status in the spool, so a
restarted agent finds its running jobs again (or reports honestly what became of them) and never leaves one
behind.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rota.core import __version__
from rota.core import credentials
from rota.core import events as ev
from rota.core.orders import Heartbeat, Kill, Launch, Order, Signal, StepKill, StepLaunch, Update
from rota.wire import natsconn
from rota.wire import orders as wire_orders
from rota.wire import subjects as sj
from rota.wire.subjects import CRED_HEADER
from rota.wire.jsqueue import stored_at
from rota.wire.orderqueue import OrderMark, OrderReader

from . import cgroups as cg
from . import launch
from .exitwatch import ExitWatch
from .gpu import Gpus, open_gpus
from .gpuuse import GpuUse
from .steps import Steps, warning

log = logging.getLogger("rota.agent")



@dataclass
class Run:
    """One job on this node."""

    order: Launch
    pid: int
    started: float                          # wall clock
    proc: Any = None                        # Popen when we are its parent; None when adopted
    cgroup: Any = None
    status_file: str | None = None          # where the shepherd records the exit status
    ticks: int | None = None                # the shepherd's start time (a reused pid is not it)
    time_limit: int = 0                     # seconds, 0 = UNLIMITED (an update changes it)
    kill_reason: str | None = None          # "cancelled", "stopped", "timeout", "oom", "tasks"
    tasks_limit: int = 0                    # its process limit, when it was ended for reaching it
    term_sent: float = 0.0
    peak_kib: int = 0
    cpus: list[int] = field(default_factory=list)
    warned: bool = False                    # the --signal=B: warning was sent to the batch shell

    def __post_init__(self) -> None:
        self.time_limit = self.time_limit or self.order.time_limit

    @property
    def job_id(self) -> int:
        return self.order.job_id

    @property
    def restarts(self) -> int:
        return self.order.restarts

    @property
    def deadline(self) -> float:
        """When the time limit runs out. It counts from the logged start, or from the launch where the
        order came late (redelivered after a NATS server died holding it): the job gets its whole limit."""
        return max(self.order.start_time, self.started) + self.time_limit if self.time_limit else float("inf")


MIN_TASKS = 1024          # a job's process limit is never lower (threads count: a runtime's pool may take hundreds)
FORKS_REFUSED = 100       # forks the kernel refused at a job's limit before the agent ends the job


class Agent:
    def __init__(self, node: str, nats_url: str, state_dir: str | os.PathLike, *, keyring: Any,
                 tls_ca: str | None = None, fake_gpus: str | None = None,
                 faults_file: str | None = None, heartbeat: float = 5.0, health_interval: float = 30.0,
                 kill_wait: float = 30.0, health_program: str | None = None, cpus: int | None = None,
                 memory: int | None = None, use_cgroups: bool = True, max_tasks: int | None = None,
                 gpu_max_temp: int = 90, gpu_drain_on: str = "", gpu_sample: float = 10.0,
                 gpu_idle_report: float = 60.0) -> None:
        if not credentials.valid_host(node):
            raise ValueError(f"node name {node!r} cannot be used: letters, digits, '_' and '-' only")
        self.node, self.url = node, nats_url
        self.keyring, self.tls_ca = keyring, tls_ca
        self.key = keyring.key_of(node)
        if self.key is None:
            raise ValueError(f"the key given is not node {node}'s (rota keygen --host {node})")
        self.replay = credentials.ReplayCache()
        self.dir = Path(state_dir) / "agent" / node
        self.spool = self.dir / "spool"
        self.ledger = self.dir / "jobs"
        self.heartbeat, self.health_interval, self.kill_wait = heartbeat, health_interval, kill_wait
        self.health_program = health_program
        self.cpus = cpus or os.cpu_count() or 1
        self.memory = memory or mem_total_mib()
        self.gpus: Gpus | None
        self.gpus, self.gpu_note = open_gpus(fake_gpus, faults_file or str(self.dir / "fake-nvml.json"), node)
        drain_on = frozenset(w.strip() for w in gpu_drain_on.split(",") if w.strip())
        if drain_on - {"throttle", "pcie", "temp"}:
            raise ValueError(f"--gpu-drain-on {gpu_drain_on!r}: choose among throttle, pcie and temp")
        if self.gpus is not None:
            self.gpus.max_temp, self.gpus.drain_on = gpu_max_temp, drain_on
        self.gpu_sample, self.gpu_idle_report = gpu_sample, gpu_idle_report
        scope = f"{node}-{credentials.derived_key(self.key, 'cgroup scope')[:4].hex()}"   # this cluster's node
        self.all_tasks = node_tasks_limit()
        self.max_tasks = max_tasks            # each job's process limit (None: its share of the node's)
        self.cgroups, self.cgroup_note = cg.detect(scope, all_tasks=self.all_tasks) if use_cgroups \
            else (None, "cgroups disabled")
        self._tasks_checked = 0.0
        self.runs: dict[int, Run] = {}
        self.exits = ExitWatch()
        self.launching: dict[int, list[int]] = {}   # job id -> its CPUs, while its run is being started
        self.steps = Steps(node, self.spool, self.cgroups, self.report, kill_wait)
        self.next_runs: dict[int, Launch] = {}
        self.seen: set[tuple[int, int]] = set()   # (job id, restarts) launched here
        self.nc: Any = None
        self.js: Any = None
        self.orders: OrderReader | None = None
        self._tasks: list[asyncio.Task] = []
        self._stop = asyncio.Event()

    def describe(self) -> list[str]:
        return [f"rota agent {self.node}: {self.cpus} CPUs, {self.memory} MiB, {self.gpu_note}",
                f"rota agent {self.node}: confinement: {self.cgroup_note}"]

    # ------------------------------------------------------------ life cycle

    def make_dirs(self) -> None:
        """The agent's folders: its ledger (launch records: environments and scripts) private to it,
        the spool reachable so each job's own private folder in it can be handed to the job's user."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.spool.mkdir(exist_ok=True)
        self.ledger.mkdir(exist_ok=True)
        os.chmod(self.dir.parent, 0o755)
        os.chmod(self.dir, 0o755)
        os.chmod(self.spool, 0o755)
        os.chmod(self.ledger, 0o700)
        for f in self.ledger.glob("*.json"):
            os.chmod(f, 0o600)

    async def start(self) -> None:

        self.make_dirs()
        self.nc = await natsconn.connect(self.url, f"agent {self.node}", keyring=self.keyring, host=self.node,
                                         tls_ca=self.tls_ca)
        self.js = self.nc.jetstream(timeout=10)
        # its orders' consumer before it registers: an order sent once it has would be missed by a first read
        self.orders = OrderReader(self.js, self.node, OrderMark(self.dir / "orders.json"))
        await self.orders.open()
        running = self._adopt()
        for run in [r for r in self.runs.values() if r.job_id not in running]:
            done = self._exit_status(run)      # ended while no agent watched: its real end goes first, before
            if done is not None:               # a registration without it would have the controller fail it
                await self._finished(run, *done)
        inventory = self.gpus.inventory() if self.gpus is not None else []
        launch.DEVICES[self.node] = launch.device_names(inventory)
        await self.report(ev.NodeRegistered(node=self.node, cpus=self.cpus, memory=self.memory, gpus=tuple(inventory),
                                            agent_version=__version__, boot_time=_boot_time(),
                                            running=tuple(sorted(running))))
        self._tasks = [asyncio.create_task(c) for c in (self._heartbeats(), self._assignments(),
                                                        self._supervise(), self._health(), self._gpu_use())]

    async def run_forever(self) -> None:
        await self.start()
        await self._stop.wait()

    async def stop(self, kill_jobs: bool = False) -> None:
        """Stop the agent. Jobs keep running (a restarted agent adopts them) unless ``kill_jobs``."""
        self._stop.set()
        for t in self._tasks:
            t.cancel()
        if kill_jobs:
            for run in list(self.runs.values()):
                self._signal(run, signal.SIGKILL)
        await self.steps.stop()     # a step's tasks cannot be adopted: their srun talks to this process
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.nc is not None:
            try:
                await self.nc.close()   # reports are acknowledged one by one: nothing to drain
            except Exception:  # noqa: BLE001
                pass

    # ------------------------------------------------------------ reporting

    def sign(self, subject: str, body: bytes) -> str:
        """This node's credential for a message it sends (checked by the controller against the node)."""
        return credentials.issue(self.key, "node", 0, 0, self.node, int(time.time()), os.urandom(16).hex(),
                                 subject, body)

    async def report(self, event: Any) -> None:
        """Put an observation into the inbox; retried (same message id) until JetStream has it. One that
        can never be delivered (larger than NATS carries) is set aside with its reason, never retried."""
        from nats.errors import MaxPayloadError

        body = ev.EVENT_ADAPTER.dump_json(event)
        subject = f"{sj.INBOX_PREFIX}.{self.node}"
        headers = {"Nats-Msg-Id": f"{self.node}-{uuid.uuid4().hex}", CRED_HEADER: self.sign(subject, body)}
        delay = 0.1
        while True:
            try:
                await self.js.publish(subject, body, stream=sj.INBOX_STREAM, headers=headers)
                return
            except MaxPayloadError:
                log.error("a %s report of %s bytes was set aside: larger than NATS carries", event.type, len(body))
                return
            except Exception as exc:  # noqa: BLE001 - NATS down or slow: keep it, retry
                log.warning("report not yet accepted (%s); retrying", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _heartbeats(self) -> None:
        subject = f"{sj.HEARTBEAT_PREFIX}.{self.node}"
        while True:
            assert self.orders is not None      # made before the heartbeats start
            mark = self.orders.mark
            body = Heartbeat(running=tuple(sorted(self.runs)), orders=mark.seq,
                             order_stream=mark.stream or "").model_dump_json().encode()
            try:
                await self.nc.publish(subject, body, headers={CRED_HEADER: self.sign(subject, body)})
            except Exception:  # noqa: BLE001 - reconnecting
                pass
            await asyncio.sleep(self.heartbeat)

    async def _health(self) -> None:
        """NVML's findings and the admin's health-check program, every interval: faults that drain while they
        persist (the controller keeps the first), warnings once until they clear."""
        warned: set[tuple[str, int | None]] = set()
        while True:
            found: list[ev.HealthFault] = []
            if self.gpus is not None:
                found.extend(ev.HealthFault(node=self.node, reason=f.reason, gpu_index=f.gpu_index, code=f.code,
                                            action=f.action, drains=f.drains) for f in self.gpus.faults())
            if self.health_program:
                problem = await _run_health_program(self.health_program)
                if problem:
                    found.append(ev.HealthFault(node=self.node, reason=problem[:1000], code="healthcheck"))
            now = {(f.code, f.gpu_index) for f in found if not f.drains}
            for fault in found:
                if fault.drains or (fault.code, fault.gpu_index) not in warned:
                    await self.report(fault)
            warned = now
            await asyncio.sleep(self.health_interval)

    async def _gpu_use(self) -> None:
        """Sample the running jobs' GPUs every ``gpu_sample`` seconds; report idleness and its end (GpuUse)."""
        if self.gpus is None or self.gpu_sample <= 0:
            return
        use = GpuUse(self.node, self.gpus.utilisation, self.gpu_idle_report)
        while True:
            for report in use.sample(self.runs, int(time.time())):
                await self.report(report)
            await asyncio.sleep(self.gpu_sample)

    # ------------------------------------------------------------ assignments

    def check_order(self, msg: Any) -> Order:
        """An order from the controller, if it carries the controller's credential for this node
        (valid when the broker stored it, never seen before); raises CredentialError or BadOrder."""
        credentials.verify(lambda host: self.key if host == self.node else None,
                           (msg.headers or {}).get(CRED_HEADER), msg.subject, msg.data,
                           stored_at(msg, int(time.time())), kind="ctl", replay=self.replay)
        return wire_orders.decode(msg.data)

    async def _assignments(self) -> None:
        assert self.orders is not None
        async for msgs in self.orders.batches():
            for msg in msgs:
                try:
                    order = self.check_order(msg)
                except (credentials.CredentialError, wire_orders.BadOrder) as exc:
                    log.error("an order for %s was set aside: %s", self.node, exc)
                    continue
                try:
                    await self.act(order)
                except launch.LaunchError as exc:
                    log.error("job %s cannot start here: %s", order.job_id, exc)
                    await self._launch_failed(order, str(exc))
                except Exception as exc:  # noqa: BLE001 - a bad assignment must not stop the agent
                    log.error("order %r failed: %s", msg.data[:200], exc)
                    await self._launch_failed(order, f"{type(exc).__name__}: {exc}")
            await self.orders.done(msgs)

    async def _launch_failed(self, order: Order, why: str) -> None:
        if isinstance(order, Launch):
            await self.report(ev.JobExited(job_id=order.job_id, state="FAILED", exit_code=1, node=self.node,
                                           reason=why[:1000]))

    async def act(self, order: Order) -> None:
        """Carry out one order: launch a job, or kill, update or signal one of its runs."""
        if isinstance(order, Launch):
            await self._accept_launch(order)
        elif isinstance(order, StepLaunch):
            self.steps.launch(order)
        elif isinstance(order, StepKill):
            self.steps.kill(order.job_id, order.restarts, order.step_id, order.signal)
        else:
            self._to_run(order)

    async def _accept_launch(self, order: Launch) -> None:
        key = (order.job_id, order.restarts)
        running = self.runs.get(order.job_id)
        if key in self.seen or (running is not None and running.restarts >= order.restarts):
            return   # a re-sent order: it runs (or ran) here already
        self.seen.add(key)
        if running is not None:
            self.next_runs[order.job_id] = order   # a requeued job's new run: once its old run has ended
            return
        await self._launch(order)

    def _to_run(self, order: Kill | Update | Signal) -> None:
        """A kill, an update or a signal for a job's run here (and a kill or signal for its steps)."""
        if isinstance(order, Signal) and order.steps:
            self.steps.send_signal(order.job_id, order.restarts, order.signal, order.step_id)
        run = self.runs.get(order.job_id)
        if isinstance(order, Kill):
            self.steps.kill(order.job_id, order.restarts)   # the job's end ends its steps here
            if run is None:      # a node of the job that runs no batch script of it: its part is over
                self.steps.end_job(order.job_id, order.restarts, remove_cgroup=True)
        if run is None or (order.restarts is not None and order.restarts != run.restarts):
            return   # not here, or meant for an earlier run of a requeued job
        if isinstance(order, Signal):
            if order.batch:
                self._signal_batch(run, order.signal)
        elif isinstance(order, Update):
            run.time_limit = order.time_limit
        elif run.kill_reason is None:
            run.kill_reason = order.reason
            self._signal(run, signal.SIGCONT)
            self._signal(run, order.signal or signal.SIGTERM)
            run.term_sent = time.time()

    async def _launch(self, order: Launch) -> None:
        if not order.nodes or order.nodes[0] != self.node:
            raise launch.LaunchError(f"the order is for {list(order.nodes)!r}, not for {self.node}")
        launch.identity(order)         # a launch for a user this node does not know stops here
        cpus = self._pick_cpus(order.cpus) if self.cgroups is not None else None
        self.launching[order.job_id] = cpus or []
        try:   # the cgroup's making, the fork and the child's cgroup attach take milliseconds each: off the loop
            proc, status, cgroup = await asyncio.to_thread(self._start, order, cpus)
        finally:
            del self.launching[order.job_id]
        run = Run(order, proc.pid, time.time(), proc, cgroup, status_file=str(status), ticks=_start_ticks(proc.pid),
                  cpus=cpus or [])
        self.runs[run.job_id] = run
        self.exits.watch(run.pid)
        record = json.dumps({"order": order.model_dump(mode="json"), "status_file": run.status_file, "pid": proc.pid,
                             "started": run.started, "ticks": run.ticks})
        path = self.ledger / f"{run.job_id}.json"
        part = path.with_suffix(".part")     # renamed whole: an agent killed mid-write leaves no empty record
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(record)
        os.replace(part, path)

    def _start(self, order: Launch, cpus: list[int] | None) -> tuple[Any, Path, Any]:
        """The run's cgroup and its started shepherd (in a worker thread: touches nothing of the agent's)."""
        cgroup = None
        if self.cgroups is not None:
            cgroup = self.cgroups.create(order.job_id, order.mem, cpus, order.restarts, tasks=self.tasks_for(order.cpus))
        try:
            proc, status = launch.start(order, self.node, self.spool, cgroup)
        except Exception:
            if cgroup is not None:
                cgroup.remove()
            raise
        return proc, status, cgroup

    def tasks_for(self, cpus: int) -> int:
        """A job's process limit: ``--max-tasks``, else its share of what the node's jobs may hold together,
        by its CPUs, and at least MIN_TASKS."""
        if self.max_tasks:
            return self.max_tasks
        return min(self.all_tasks, max(MIN_TASKS, self.all_tasks * cpus // max(1, self.cpus)))

    def _check_tasks(self, now: float) -> None:
        """End each job whose forks the kernel keeps refusing at its process limit (a fork bomb), once a second."""
        if now - self._tasks_checked < 1.0:
            return
        self._tasks_checked = now
        for run in self.runs.values():
            if run.cgroup is not None and run.kill_reason is None and run.cgroup.forks_refused() >= FORKS_REFUSED:
                run.kill_reason, run.tasks_limit = "tasks", run.cgroup.tasks_limit()
                log.warning("job %s reached its limit of %d processes and threads: ended", run.job_id, run.tasks_limit)
                self._signal(run, signal.SIGKILL)
                run.term_sent = now

    def _pick_cpus(self, n: int) -> list[int] | None:
        """Specific CPUs for a job's cpuset, when this host really has the CPUs the node claims."""
        host = sorted(os.sched_getaffinity(0))
        if len(host) < self.cpus:
            return None      # several fake nodes share this host: no binding
        used = {c for r in self.runs.values() for c in r.cpus} | {c for cs in self.launching.values() for c in cs}
        free = [c for c in host if c not in used]
        return free[:n] if len(free) >= n else None

    # ------------------------------------------------------------ supervision

    async def _supervise(self) -> None:
        last_rss = 0.0
        while True:
            now = time.time()
            poll_rss = self.cgroups is None and now - last_rss >= 0.5
            if poll_rss:
                last_rss = now
            self.steps.tick(now)
            self._check_tasks(now)
            for run in list(self.runs.values()):
                warn = warning(run.order.spec.signal) if run.order.spec.signal and not run.warned else None
                if warn is not None and warn.batch_only and run.time_limit and now >= run.deadline - warn.before:
                    run.warned = True
                    self._signal_batch(run, warn.signal)
                if run.kill_reason is None and now >= run.deadline:
                    run.kill_reason = "timeout"
                    self._signal(run, signal.SIGTERM)
                    run.term_sent = now
                elif run.kill_reason is not None and run.term_sent and now - run.term_sent >= self.kill_wait:
                    self._signal(run, signal.SIGKILL)
                    run.term_sent = 0.0
                if poll_rss:
                    rss = launch.group_rss_kib(run.pid)
                    run.peak_kib = max(run.peak_kib, rss)
                    if run.order.mem and rss > run.order.mem * 1024 and run.kill_reason is None:
                        run.kill_reason = "oom"
                        self._signal(run, signal.SIGKILL)
                done = self._exit_status(run)
                if done is not None:
                    await self._finished(run, *done)
            await self.exits.wait(0.02 if self.runs else 0.1)

    def _exit_status(self, run: Run) -> tuple[int, int] | None:
        """(exit code, signal) once the job ended, else None."""
        waited: int | None = None            # the shepherd's own status, when we are its parent
        if run.proc is not None:
            waited = run.proc.poll()
            if waited is None:
                return None
            if waited < 0:
                return 0, -waited             # the shepherd itself was killed (our kill of the group)
        elif _alive(run.pid, run.ticks):
            return None
        text = _read_users_file(run.status_file)
        if text is not None and text.strip().isdecimal() and len(text.strip()) < 4:
            rc = int(text.strip())
        elif waited is None:                  # adopted, and its shepherd died without a word: a kill
            return 0, signal.SIGKILL
        else:
            rc = waited
        return (0, rc - 128) if rc > 128 else (rc, 0)

    async def _finished(self, run: Run, exit_code: int, sig: int) -> None:
        del self.runs[run.job_id]
        self.exits.forget(run.pid)
        self._signal(run, signal.SIGKILL)     # nothing of a job outlives it
        self.steps.kill(run.job_id, run.restarts)
        self.steps.end_job(run.job_id, run.restarts, remove_cgroup=False)
        oom = run.kill_reason == "oom"
        if run.cgroup is not None:
            oom = oom or run.cgroup.oom_killed()
            run.peak_kib = max(run.peak_kib, run.cgroup.peak_kib())
            await asyncio.to_thread(run.cgroup.remove)
        elapsed = max(0, int(time.time() - run.order.start_time))
        state = launch.end_state(run.kill_reason, oom, exit_code, sig)
        why = _read_users_file(f"{run.status_file}.why") if run.status_file else None
        why = (why or "").strip().splitlines()[0][:1000] if why and why.strip() else ""
        if why:
            log.error("job %s could not start: %s", run.job_id, why)
        if run.kill_reason == "tasks":
            why = (f"the job reached its limit of {run.tasks_limit} processes and threads, and kept "
                   "forking (rota agent --max-tasks sets the limit)")
        await asyncio.to_thread(_tell_the_user, run, self.node, state)   # before the log says it ended
        if run.kill_reason != "stopped":   # a job the log already ended needs no report
            await self.report(ev.JobExited(job_id=run.job_id, state=state, exit_code=exit_code, signal=sig,
                                           max_rss=run.peak_kib, elapsed=elapsed, node=self.node, reason=why))
        (self.ledger / f"{run.job_id}.json").unlink(missing_ok=True)
        if run.status_file:
            import shutil

            shutil.rmtree(Path(run.status_file).parent, ignore_errors=True)
        waiting = self.next_runs.pop(run.job_id, None)
        if waiting is not None:
            try:
                await self._launch(waiting)
            except launch.LaunchError as exc:
                await self._launch_failed(waiting, str(exc))

    def _signal_batch(self, run: Run, sig: int) -> None:
        """A signal to the batch script's processes, not the shepherd: it must live on to record how the job ends."""
        for pid in launch.group_members(run.pid):
            if pid != run.pid:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass

    def _signal(self, run: Run, sig: int) -> None:
        try:
            os.killpg(run.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        if run.cgroup is not None:
            run.cgroup.kill_all(sig)

    def _adopt(self) -> set[int]:
        """Jobs a previous agent process started: adopt those still running, report those that ended."""
        running: set[int] = set()
        for f in sorted(self.ledger.glob("*.json")):
            try:
                rec = json.loads(f.read_text())
                order, status_file = _ledger_order(rec)
                pid, started = int(rec["pid"]), float(rec["started"])
            except (OSError, ValueError, KeyError, TypeError):
                log.error("launch record %s is unreadable: set aside", f)
                f.unlink(missing_ok=True)
                continue
            cgroup = self.cgroups.existing(order.job_id, order.restarts) if self.cgroups is not None else None
            run = Run(order, pid, started, None, cgroup, status_file=status_file, ticks=rec.get("ticks"))
            self.runs[run.job_id] = run
            self.seen.add((order.job_id, order.restarts))
            if _alive(run.pid, rec.get("ticks")):
                running.add(run.job_id)
        return running


def node_tasks_limit() -> int:
    """The most processes and threads all of this node's jobs may hold together: three quarters of what the
    kernel allows (the lower of pid_max and threads-max), so a fork bomb leaves room for the node's own."""
    limits = []
    for f in ("/proc/sys/kernel/pid_max", "/proc/sys/kernel/threads-max"):
        try:
            limits.append(int(Path(f).read_text()))
        except (OSError, ValueError):
            pass
    return max(MIN_TASKS, min(limits, default=32768) * 3 // 4)


def _tell_the_user(run: Run, node: str, state: str) -> None:
    """Slurm's notes at the end of the job's error file: why it was killed."""
    import datetime as dt

    jid = run.job_id
    at = dt.datetime.now().strftime("%Y-%m-%dT%H:%M:%S")
    line = {
        "TIMEOUT": f"slurmstepd-{node}: error: *** JOB {jid} ON {node} CANCELLED AT {at} DUE TO TIME LIMIT ***",
        "CANCELLED": f"slurmstepd-{node}: error: *** JOB {jid} ON {node} CANCELLED AT {at} ***",
        "OUT_OF_MEMORY": f"slurmstepd-{node}: error: Detected 1 oom-kill event(s) in StepId={jid}.batch. Some of "
                         "your processes may have been killed by the cgroup out-of-memory handler.",
    }.get(state)
    if run.kill_reason == "tasks":
        line = (f"slurmstepd-{node}: error: *** JOB {jid} ON {node} CANCELLED AT {at} DUE TO TASK LIMIT "
                f"({run.tasks_limit}) ***")
    if line is None or run.kill_reason == "stopped":
        return
    try:
        _out, err = launch.output_paths(run.order, node)
    except (KeyError, ValueError):
        return
    if str(err) != "/dev/null":
        launch.append_as_user(run.order, err, line)


def _ledger_order(rec: dict[str, Any]) -> tuple[Launch, str | None]:
    """The launch order and status file of a ledger record (also one an older agent wrote, whose
    order was a plain mapping with the status file inside)."""
    if "order" in rec:
        return Launch.model_validate(rec["order"]), rec.get("status_file")
    old = rec["a"]
    return Launch.model_validate({k: v for k, v in old.items() if k in Launch.model_fields}), old.get("status_file")


def _read_users_file(path: str | None) -> str | None:
    """A small file the job's user could have replaced: read without following links or blocking."""
    if not path:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        import stat

        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, 4096).decode(errors="replace")
    finally:
        os.close(fd)


def mem_total_mib() -> int:
    """This machine's memory in MiB, as /proc/meminfo says (1 GiB where it cannot be read)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    except OSError:
        pass
    return 1024


def _boot_time() -> int:
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("btime "):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _start_ticks(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _alive(pid: int, ticks: int | None) -> bool:
    """Whether ``pid`` is still the process we started (not a zombie, not a reused pid)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    if fields[0] == "Z":
        return False
    return ticks is None or int(fields[19]) == ticks


async def _run_health_program(program: str) -> str | None:
    """Run the admin's health check; a non-zero exit is a fault whose reason is its first output line."""
    try:
        proc = await asyncio.create_subprocess_shell(program, stdout=asyncio.subprocess.PIPE,
                                                     stderr=asyncio.subprocess.STDOUT)
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=60)
    except (OSError, asyncio.TimeoutError) as exc:
        return f"health check {program!r} failed to run: {exc}"
    if proc.returncode != 0:
        first = (out or b"").decode(errors="replace").strip().splitlines()
        return f"health check failed: {first[0] if first else 'exit ' + str(proc.returncode)}"
    return None


def hostname() -> str:
    """This host's short name, as credentials and NATS users spell it (other characters become '-')."""
    name = socket.gethostname().split(".")[0] or "localhost"
    return "".join(c if (c.isascii() and c.isalnum()) or c in "_-" else "-" for c in name)[:64]
