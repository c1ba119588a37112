"""A step's tasks on this node (``srun``): launched as the job's user inside the step's share of the job's
cgroup and GPUs, their stdin, stdout and stderr carried to and from ``srun``, their end reported.

Each task is its own process group. What a task writes goes to ``srun`` as frames (:mod:`rota.wire.stepio`)
unless the step names output files; what ``srun`` reads from its stdin goes to every task. When ``srun``
goes away, or the job ends, the tasks are killed: a step never outlives its job or its ``srun``.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

from rota.core import events as ev
from rota.core.hostlist import compress
from rota.core.orders import StepLaunch
from rota.core.signals import Warning, parse_warning
from rota.wire import stepio

from . import launch
from .spawner import Spawner, SpawnerGone, returncode

log = logging.getLogger("rota.agent.steps")

KEEP_FROM_JOB = ("SLURM_", "CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL")


@dataclass
class Task:
    rank: int
    local: int
    pid: int | None = None                  # also its process group (each task is a session leader)
    wait: Callable[[], Awaitable[int]] | None = None   # its end: a Popen-style return code
    stdin_fd: int | None = None             # the pipe to its stdin, when srun's stdin reaches it
    out_fds: list[tuple[int, int]] = field(default_factory=list)   # (our end of its pipe, STDOUT|STDERR)
    code: int | None = None
    sig: int = 0
    peak_kib: int = 0
    stdin: bytearray = field(default_factory=bytearray)   # from srun, not yet taken by the task
    stdin_eof: bool = False


@dataclass
class StepRun:
    """One step's tasks on this node."""

    order: StepLaunch
    alloc: ev.StepAlloc
    tasks: list[Task]
    started: float = field(default_factory=time.time)
    cgroup: Any = None
    writer: asyncio.StreamWriter | None = None
    reader: asyncio.StreamReader | None = None
    shared_cgroup: bool = False         # the tasks run in the job's own cgroup (the step asked for no memory share)
    oom_before: int = 0                 # the job cgroup's OOM kills when the step began (shared_cgroup)
    killed: str | None = None           # "cancelled" (a kill order, srun gone) or "timeout"
    warned: bool = False                # the --signal warning was sent

    @property
    def key(self) -> tuple[int, int, int]:
        return self.order.job_id, self.order.restarts, self.order.step_id

    def pgids(self) -> list[int]:
        return [t.pid for t in self.tasks if t.pid is not None and t.code is None]


def task_env(o: StepLaunch, alloc: ev.StepAlloc, node: str, rank: int, local: int, node_id: int) -> dict[str, str]:
    """A task's environment as Slurm sets it: ``srun``'s own, the job's Slurm variables, then the step's."""
    step, job = o.step, o.job
    env = dict(step.env)
    job_vars = launch.job_env(job, node)
    if not env:
        env.update(job_vars)
    env.update({k: v for k, v in job_vars.items() if k.startswith(KEEP_FROM_JOB)})
    env.setdefault("PATH", job_vars.get("PATH", "/usr/bin:/bin"))
    env.setdefault("HOME", job_vars.get("HOME", "/"))
    nodes = [a.node for a in step.alloc]
    per_node = [len(a.tasks) for a in step.alloc]
    if alloc.gpus_per_task:
        gpus = alloc.gpus[local * alloc.gpus_per_task:(local + 1) * alloc.gpus_per_task]
    else:
        gpus = alloc.gpus
    sid = str(step.step_id)
    env.update({
        "SLURM_STEP_ID": sid, "SLURM_STEPID": sid, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(local),
        "SLURM_NODEID": str(node_id), "SLURM_NTASKS": str(step.ntasks), "SLURM_NPROCS": str(step.ntasks),
        "SLURM_STEP_NUM_TASKS": str(step.ntasks), "SLURM_STEP_NUM_NODES": str(len(nodes)),
        "SLURM_NNODES": str(len(nodes)), "SLURM_STEP_NODELIST": compress(nodes), "SLURM_NODELIST": compress(nodes),
        "SLURM_STEP_TASKS_PER_NODE": launch.run_length(tuple(per_node)),
        "SLURM_TASKS_PER_NODE": launch.run_length(tuple(per_node)),
        "SLURM_GTIDS": ",".join(map(str, alloc.tasks)), "SLURM_CPUS_ON_NODE": str(job.cpus),
        "SLURM_DISTRIBUTION": "block", "SLURMD_NODENAME": node, "SLURM_TOPOLOGY_ADDR": node,
        "SLURM_TOPOLOGY_ADDR_PATTERN": "node", "SLURM_TASK_PID": "",
        "SLURM_CPUS_PER_TASK": str(step.cpus_per_task),
        "CUDA_VISIBLE_DEVICES": launch.cuda_devices(node, tuple(gpus)), "GPU_DEVICE_ORDINAL": ",".join(map(str, gpus)),
        "SLURM_STEP_GPUS": ",".join(map(str, alloc.gpus)),
    })
    if step.io:
        host, _, port = step.io.rpartition(":")
        env["SLURM_SRUN_COMM_HOST"] = env["SLURM_LAUNCH_NODE_IPADDR"] = host
        env["SLURM_SRUN_COMM_PORT"] = port
    if not alloc.gpus:
        env.pop("SLURM_STEP_GPUS", None)
    return env


class Steps:
    """The steps running on one node, for its agent."""

    def __init__(self, node: str, spool: Path, cgroups: Any, report: Callable[[Any], Awaitable[None]],
                 kill_wait: float = 30.0) -> None:
        self.node, self.spool, self.cgroups, self.report, self.kill_wait = node, spool, cgroups, report, kill_wait
        self.runs: dict[tuple[int, int, int], StepRun] = {}
        self.seen: set[tuple[int, int, int]] = set()
        self.spawners: dict[tuple[int, int], Spawner] = {}   # (job, run): its spawner on this node
        self._tasks: set[asyncio.Task] = set()

    def launch(self, o: StepLaunch) -> None:
        """Start the step's tasks that belong here (a repeated order is ignored)."""
        key = (o.job_id, o.restarts, o.step_id)
        if key in self.seen:
            return
        self.seen.add(key)
        alloc = next((a for a in o.step.alloc if a.node == self.node), None)
        if alloc is None:
            return
        run = StepRun(o, alloc, [Task(rank, i) for i, rank in enumerate(alloc.tasks)])
        self.runs[key] = run
        task = asyncio.create_task(self._run(run))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def of_job(self, job_id: int, restarts: int | None = None) -> list[StepRun]:
        return [r for (j, n, _s), r in self.runs.items() if j == job_id and (restarts is None or n == restarts)]

    def send_signal(self, job_id: int, restarts: int | None, sig: int, step_id: int | None = None) -> None:
        """Deliver ``sig`` to the tasks of the job's steps here (or of one step)."""
        for run in self.of_job(job_id, restarts):
            if step_id is None or run.order.step_id == step_id:
                self._signal(run, sig)

    def kill(self, job_id: int, restarts: int | None, step_id: int | None = None, sig: int = signal.SIGKILL,
             why: str = "cancelled") -> None:
        """Stop the job's steps here (or one of them)."""
        for run in self.of_job(job_id, restarts):
            if step_id is None or run.order.step_id == step_id:
                run.killed = run.killed or why
                self._signal(run, signal.SIGCONT)
                self._signal(run, sig)
                if sig != signal.SIGKILL:
                    loop = asyncio.get_running_loop()
                    loop.call_later(self.kill_wait, self._signal, run, signal.SIGKILL)

    def tick(self, now: float) -> None:
        """The ``--signal`` warning before the job's time limit, to the steps' tasks (not the batch shell)."""
        for run in list(self.runs.values()):
            job = run.order.job
            warn = warning(job.spec.signal)
            if warn is None or run.warned or not job.time_limit or warn.batch_only:
                continue
            if now >= job.start_time + job.time_limit - warn.before:
                run.warned = True
                self._signal(run, warn.signal)

    def end_job(self, job_id: int, restarts: int | None, remove_cgroup: bool) -> None:
        """The job's run is over here: its spawner goes (and, on a node that ran no batch script of it, the
        cgroup its steps ran in)."""
        for key in [k for k in self.spawners if k[0] == job_id and restarts in (None, k[1])]:
            self.spawners.pop(key).close()
        if remove_cgroup and self.cgroups is not None and restarts is not None:
            job_cg = self.cgroups.existing(job_id, restarts)
            if job_cg is not None:
                job_cg.remove()

    async def stop(self) -> None:
        for spawner in self.spawners.values():
            spawner.close()
        self.spawners.clear()
        for run in list(self.runs.values()):
            self._signal(run, signal.SIGKILL)
        for t in list(self._tasks):
            t.cancel()

    # ------------------------------------------------------------ one step

    def _signal(self, run: StepRun, sig: int) -> None:
        for pg in run.pgids():
            try:
                os.killpg(pg, sig)
            except (ProcessLookupError, PermissionError):
                pass

    async def _run(self, run: StepRun) -> None:
        o, alloc = run.order, run.alloc
        step = o.step
        try:
            if step.io:
                await self._connect(run)
            self._make_cgroup(run)
            for t in run.tasks:
                await self._start(run, t)
        except Exception as exc:  # noqa: BLE001 - a step that cannot start here fails here, clearly
            why = exc.args[0] if isinstance(exc, launch.LaunchError) else f"{type(exc).__name__}: {exc}"
            if isinstance(exc, FileNotFoundError):
                why = f"execve(): {step.argv[0]}: No such file or directory"
            log.error("step %s.%s cannot start on %s: %s", o.job_id, o.step_id, self.node, why)
            await self._send(run, stepio.STDERR, alloc.tasks[0], f"slurmstepd-{self.node}: error: {why}\n".encode())
            for t in run.tasks:
                if t.pid is None:
                    t.code = 1 if not isinstance(exc, FileNotFoundError) else 2
        pumps = [asyncio.create_task(self._pump(run, t)) for t in run.tasks if t.pid is not None]
        reader = asyncio.create_task(self._from_srun(run)) if run.writer is not None else None
        sampler = asyncio.create_task(self._sample(run))
        await asyncio.gather(*pumps, return_exceptions=True)
        sampler.cancel()
        if reader is not None:
            reader.cancel()
        await self._finish(run)

    async def _connect(self, run: StepRun) -> None:
        """Reach the step's srun, and prove to each other that both hold the step's key (see
        :mod:`rota.wire.stepio`): nothing is written before the other end has proven it is this step's srun."""
        step = run.order.step
        host, _, port = step.io.rpartition(":")
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 10)
        except (OSError, ValueError, asyncio.TimeoutError) as exc:
            raise launch.LaunchError(f"cannot reach srun at {step.io}: {exc}") from None
        try:
            line = await asyncio.wait_for(reader.readline(), 10)
            nonce = stepio.greeted(line[:stepio.MAX_GREETING], step.io_key)
            if nonce is None:
                raise launch.LaunchError(f"{step.io} did not greet as this step's srun")
            hello = {"node": self.node, "tasks": list(run.alloc.tasks), "proof": stepio.proof(step.io_key, nonce, self.node)}
            writer.write(json.dumps(hello).encode() + b"\n")
            await writer.drain()
            if await asyncio.wait_for(reader.readline(), 10) != b"ok\n":
                raise launch.LaunchError(f"{step.io} did not take this node as one of its step's")
        except (OSError, ValueError, asyncio.TimeoutError, asyncio.LimitOverrunError) as exc:
            writer.close()
            raise launch.LaunchError(f"{step.io} did not answer as this step's srun ({type(exc).__name__})") from None
        except launch.LaunchError:
            writer.close()
            raise
        run.writer, run.reader = writer, reader

    def _make_cgroup(self, run: StepRun) -> None:
        if self.cgroups is None:
            return
        o = run.order
        job_cg = self.cgroups.existing(o.job_id, o.restarts)
        if job_cg is None:      # a node of the job that runs no batch script
            job_cg = self.cgroups.create(o.job_id, o.job.mem, None, o.restarts)
        if run.alloc.mem:
            run.cgroup = self.cgroups.create_step(o.job_id, o.restarts, o.step_id, run.alloc.mem)
        else:    # the step's share is the job's whole allocation here (a fresh cgroup's first attach is slow)
            run.cgroup, run.shared_cgroup = job_cg, True
            run.oom_before = job_cg.oom_kills()

    async def _start(self, run: StepRun, t: Task) -> None:
        """Start one task as the job's user, in the step's cgroup: through the job's spawner when the step
        shares the job's cgroup (no attach of its own), else forked here."""
        o, alloc, step = run.order, run.alloc, run.order.step
        uid, gid, groups, _name = launch.identity(o.job)
        me = os.geteuid()
        if me != 0 and uid != me:
            raise launch.LaunchError(f"this node's agent does not run as root: it can run only jobs of uid {me}")
        node_id = [a.node for a in step.alloc].index(self.node)
        env = task_env(o, alloc, self.node, t.rank, t.local, node_id)
        workdir = step.workdir or "/"
        append = o.job.spec.open_mode == "append"
        files: dict[int, tuple[str, int]] = {}     # opened as the user: a task writes only where its user may
        for fd, pattern in ((1, step.output), (2, step.error or step.output), (0, step.input)):
            if pattern and pattern != "none":
                path = Path(launch.expand_pattern(pattern, o.job, self.node, step.step_id, t.rank, node_id))
                flags = os.O_RDONLY if fd == 0 else os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
                files[fd] = (str(path if path.is_absolute() else Path(workdir) / path), flags)
        if files.get(2) is not None and files.get(2) == files.get(1):
            files[2] = (files[2][0], files[2][1] & ~os.O_TRUNC | os.O_APPEND)
        to_srun = run.writer is not None
        if run.shared_cgroup and run.cgroup is not None:
            spawner = self._spawner(run, uid, gid, groups, me == 0)
            await self._spawn(spawner, t, list(step.argv), env, workdir, files, to_srun)
        else:
            self._fork(run, t, list(step.argv), env, workdir, files, to_srun, (uid, gid, groups, me == 0))

    def _spawner(self, run: StepRun, uid: int, gid: int, groups: list[int], become: bool) -> Spawner:
        key = (run.order.job_id, run.order.restarts)
        spawner = self.spawners.get(key)
        if spawner is None or spawner.proc.poll() is not None:
            procs = [str(p) for p in run.cgroup.proc_files()]
            spawner = self.spawners[key] = Spawner.start(procs, uid, gid, groups, become)
        return spawner

    async def _spawn(self, spawner: Spawner, t: Task, argv: list[str], env: dict[str, str], cwd: str,
                     files: dict[int, tuple[str, int]], to_srun: bool) -> None:
        theirs: list[int] = []
        ours: list[int] = []
        try:
            for fd in (0, 1, 2):
                if to_srun and fd not in files:
                    r, w = os.pipe()
                    theirs.append(r if fd == 0 else w)
                    ours.append(w if fd == 0 else r)
                    if fd == 0:
                        t.stdin_fd = w
                    else:
                        t.out_fds.append((r, stepio.STDOUT if fd == 1 else stepio.STDERR))
                else:
                    theirs.append(os.open(os.devnull, os.O_RDWR))
            t.pid = await spawner.spawn(argv, env, cwd, files, (theirs[0], theirs[1], theirs[2]))
        except BaseException:
            for fd in ours:
                os.close(fd)
            t.stdin_fd, t.out_fds = None, []
            raise
        finally:
            for fd in theirs:
                os.close(fd)

        async def wait() -> int:
            status, rss = await spawner.wait(t.pid or 0)
            t.peak_kib = max(t.peak_kib, rss)
            return returncode(status)

        t.wait = wait

    def _fork(self, run: StepRun, t: Task, argv: list[str], env: dict[str, str], workdir: str,
              files: dict[int, tuple[str, int]], to_srun: bool, who: tuple[int, int, list[int], bool]) -> None:
        uid, gid, groups, become = who
        cg_procs = [str(p) for p in run.cgroup.proc_files()] if run.cgroup is not None else []

        proc = launch.spawn(
            argv, env=env, cg_procs=cg_procs, user=(uid, gid, groups) if become else None, workdir=workdir,
            files=files,
            stdin=subprocess.PIPE if to_srun and 0 not in files else subprocess.DEVNULL,
            stdout=subprocess.PIPE if to_srun and 1 not in files else subprocess.DEVNULL,
            stderr=subprocess.PIPE if to_srun and 2 not in files else subprocess.DEVNULL)
        t.pid = proc.pid
        t.stdin_fd = os.dup(proc.stdin.fileno()) if proc.stdin is not None else None
        for pipe, kind in ((proc.stdout, stepio.STDOUT), (proc.stderr, stepio.STDERR)):
            if pipe is not None:
                t.out_fds.append((os.dup(pipe.fileno()), kind))
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        t.wait = lambda: _exited(proc)

    async def _pump(self, run: StepRun, t: Task) -> None:
        """Carry a task's output to srun until it ends; then its exit status."""
        readers = [asyncio.create_task(self._drain_pipe(run, t, fd, kind)) for fd, kind in t.out_fds]
        try:
            status = await t.wait() if t.wait is not None else 1
        except SpawnerGone:
            status = -signal.SIGKILL        # the job's cgroup was killed under it
        await asyncio.gather(*readers, return_exceptions=True)
        t.code, t.sig = (0, -status) if status < 0 else (status, 0)
        if t.stdin_fd is not None:
            _close_stdin(t)
        await self._send(run, stepio.TASK_ENDED, t.rank, f"{t.code or 0} {t.sig}".encode())   # srun's -K and -W

    async def _drain_pipe(self, run: StepRun, t: Task, fd: int, kind: int) -> None:
        loop = asyncio.get_running_loop()
        os.set_blocking(fd, False)
        queue: asyncio.Queue[bytes] = asyncio.Queue()

        def readable() -> None:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            queue.put_nowait(data)
            if not data:
                loop.remove_reader(fd)

        loop.add_reader(fd, readable)
        try:
            while True:
                data = await queue.get()
                if not data:
                    break
                await self._send(run, kind, t.rank, data)
        finally:
            loop.remove_reader(fd)
            os.close(fd)

    async def _send(self, run: StepRun, kind: int, rank: int, data: bytes) -> None:
        w = run.writer
        if w is None or w.is_closing():
            return
        try:
            w.write(stepio.frame(kind, rank, data))
            await w.drain()
        except (ConnectionError, OSError):
            self.kill(*run.key, why="cancelled")   # srun is gone: so is its step

    async def _from_srun(self, run: StepRun) -> None:
        """stdin and signals from srun; srun gone means the step is killed."""
        reader = run.reader
        assert reader is not None
        try:
            while True:
                head = await reader.readexactly(stepio.HEADER.size)
                kind, rank, size = stepio.HEADER.unpack(head)
                if size > stepio.MAX_FRAME:
                    raise ConnectionError("frame too large")
                data = await reader.readexactly(size) if size else b""
                if kind in (stepio.STDIN, stepio.STDIN_EOF):
                    for t in run.tasks:
                        if rank in (t.rank, stepio.ALL_TASKS):
                            _feed(t, data if kind == stepio.STDIN else None)
                    while any(len(t.stdin) > STDIN_BUFFER for t in run.tasks if t.code is None):
                        await asyncio.sleep(0.01)     # a task that does not read: srun waits, as in Slurm
                elif kind == stepio.SIGNAL:
                    sig = int(data or b"2")
                    if sig == signal.SIGKILL:
                        run.killed = run.killed or "cancelled"
                    self._signal(run, sig)
        except (asyncio.IncompleteReadError, ConnectionError, OSError, ValueError):
            if any(t.code is None for t in run.tasks):
                log.info("srun of step %s.%s went away: its tasks here are killed", run.order.job_id,
                         run.order.step_id)
                self.kill(*run.key, why="cancelled")

    async def _sample(self, run: StepRun) -> None:
        """Each task's memory, every half second (a scan of /proc: not on the path of a short step's start)."""
        while True:
            await asyncio.sleep(0.5)
            for t in run.tasks:
                if t.pid is not None and t.code is None:
                    t.peak_kib = max(t.peak_kib, launch.group_rss_kib(t.pid))

    async def _finish(self, run: StepRun) -> None:
        o = run.order
        peak = max((t.peak_kib for t in run.tasks), default=0)
        oom = False
        if run.cgroup is not None and not run.shared_cgroup:
            oom = run.cgroup.oom_killed()
            peak = max(peak, run.cgroup.peak_kib())
            await asyncio.to_thread(run.cgroup.remove)
        if run.cgroup is not None and run.shared_cgroup:
            oom = run.cgroup.oom_kills() > run.oom_before
        from rota.core.steps import worst

        ends: list[tuple[str, int, int, int]] = [
            (launch.end_state(run.killed, oom, t.code or 0, t.sig), t.code or 0, t.sig, t.peak_kib) for t in run.tasks]

        state, code, sig, _rss = worst(ends)
        del self.runs[run.key]
        # the report first, then srun hears of the ends: whatever srun's caller does next (its batch script
        # ends, its allocation is given back) comes after this node's end of the step in the inbox
        await self.report(ev.StepEnded(job_id=o.job_id, restarts=o.restarts, step_id=o.step_id, node=self.node,
                                       state=state, exit_code=code, signal=sig, max_rss=peak,  # type: ignore[arg-type]
                                       elapsed=int(time.time() - run.started)))
        for t in run.tasks:
            await self._send(run, stepio.EXIT, t.rank, f"{t.code or 0} {t.sig}".encode())
        if run.writer is not None:
            try:
                run.writer.close()
            except OSError:
                pass



def warning(text: str | None) -> Warning | None:
    """A job's ``--signal`` warning (None: none, or one that no longer reads)."""
    try:
        return parse_warning(text) if text else None
    except ValueError:
        return None


STDIN_BUFFER = 1 << 20


def _feed(t: Task, data: bytes | None) -> None:
    """Queue ``data`` for a task's stdin (None: end of input) and write what the pipe takes now."""
    fd = t.stdin_fd
    if fd is None:
        t.stdin.clear()
        return
    if data is None:
        t.stdin_eof = True
    else:
        t.stdin += data
    os.set_blocking(fd, False)
    loop = asyncio.get_running_loop()

    def writable() -> None:
        try:
            while t.stdin:
                n = os.write(fd, t.stdin[:65536])
                del t.stdin[:n]
        except BlockingIOError:
            return
        except OSError:
            t.stdin.clear()
        loop.remove_writer(fd)
        if t.stdin_eof:
            _close_stdin(t)

    loop.remove_writer(fd)
    writable()
    if (t.stdin or t.stdin_eof) and t.stdin_fd is not None:
        loop.add_writer(fd, writable)


def _close_stdin(t: Task) -> None:
    fd, t.stdin_fd = t.stdin_fd, None
    if fd is not None:
        try:
            asyncio.get_running_loop().remove_writer(fd)
        except RuntimeError:
            pass
        os.close(fd)


async def _exited(proc: subprocess.Popen) -> int:
    """Wait for a process without a thread: its pidfd becomes readable when it ends."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        while proc.poll() is None:
            await asyncio.sleep(0.02)
        return proc.returncode
    loop = asyncio.get_running_loop()
    ended = loop.create_future()
    loop.add_reader(pidfd, lambda: None if ended.done() else ended.set_result(None))
    try:
        if proc.poll() is None:
            await ended
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)
    return proc.wait()
