"""A job's task spawner on one node: a small process already inside the job's cgroup, as the job's user,
that forks the job's step tasks, so a task starts without a cgroup attach of its own (on cgroup v1 an
attach waits for an RCU grace period, tens of milliseconds, on every step).

The agent starts it (once per run of a job on a node, at the job's first step there) with ``python -I -S``
and one end of a ``SOCK_SEQPACKET`` pair (its fd number as the argument). Each request is a JSON message with the task's stdin,
stdout and stderr as passed file descriptors; the answer names the task's pid; each end comes back as
``{"exit": pid, "status": waitstatus, "rss": KiB}``. The spawner ends when the agent closes the socket.
"""
from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys

# The spawner's own code: built-in modules only, run with -I -S (no site, no user paths).
CODE = r"""
import errno, json, os, select, signal, socket, sys
sock = socket.socket(fileno=int(sys.argv[1]))
r, w = os.pipe()
os.set_blocking(w, False)
signal.set_wakeup_fd(w)
signal.signal(signal.SIGCHLD, lambda *a: None)
def reap():
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        sock.send(json.dumps({"exit": pid, "status": status, "rss": usage.ru_maxrss}).encode())
while True:
    ready, _, _ = select.select([sock, r], [], [])
    if r in ready:
        os.read(r, 4096)
        reap()
    if sock not in ready:
        continue
    try:
        msg, fds, _flags, _addr = socket.recv_fds(sock, 1 << 20, 3)
    except InterruptedError:
        continue
    if not msg:
        break
    req = json.loads(msg)
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            for i, fd in enumerate(fds):
                os.dup2(fd, i)
            for fd in fds:
                if fd > 2:
                    os.close(fd)
            for fd_text, (path, flags) in req["files"].items():
                try:
                    opened = os.open(path, flags, 0o644)
                except OSError as exc:
                    stream = ("stdin", "stdout", "stderr")[int(fd_text)]
                    os.write(2, ("slurmstepd: error: Could not open %s file %s: %s\n"
                                 % (stream, path, exc.strerror)).encode())
                    os._exit(1)
                os.dup2(opened, int(fd_text))
                os.close(opened)
            try:
                os.chdir(req["cwd"])
            except OSError:
                os.chdir("/tmp")
            os.closerange(3, 65536)   # nothing of the spawner's (its socket, its wakeup pipe) reaches the task
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.set_wakeup_fd(-1)
            env = req["env"]
            umask = env.get("SLURM_UMASK", "")
            if umask.isdigit() and len(umask) <= 4:     # srun's caller's umask, as Slurm gives it to tasks
                os.umask(int(umask, 8) & 0o777)
            if "SLURM_TASK_PID" in env:     # the task's own pid: this process becomes it
                env = {**env, "SLURM_TASK_PID": str(os.getpid())}
            os.execvpe(req["argv"][0], req["argv"], env)
        except OSError as exc:
            os.write(2, ("slurmstepd: error: execve(): %s: %s\n" % (req["argv"][0], exc.strerror)).encode())
            os._exit(2 if exc.errno == errno.ENOENT else 126)
        os._exit(127)
    for fd in fds:
        os.close(fd)
    sock.send(json.dumps({"id": req["id"], "pid": pid}).encode())
    reap()
"""


class SpawnerGone(Exception):
    """The spawner ended (the job's cgroup was killed, or it could not start)."""


class Spawner:
    """The agent's side of one job run's spawner on this node."""

    def __init__(self, proc: subprocess.Popen, sock: socket.socket) -> None:
        self.proc, self.sock = proc, sock
        self._next = 0
        self._started: dict[int, asyncio.Future] = {}
        self._ended: dict[int, asyncio.Future] = {}
        self._early: dict[int, tuple[int, int]] = {}
        self._reader: asyncio.Task | None = None

    @classmethod
    def start(cls, cg_procs: list[str], uid: int, gid: int, groups: list[int], become: bool) -> "Spawner":
        """Start the spawner inside the job's cgroup (``cg_procs``), as the job's user."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)

        from .launch import spawn

        try:
            proc = spawn([sys.executable, "-I", "-S", "-c", CODE, str(theirs.fileno())], cg_procs=cg_procs,
                         user=(uid, gid, groups) if become else None, workdir="/", pass_fds=(theirs.fileno(),),
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        finally:
            theirs.close()
        ours.setblocking(False)
        return cls(proc, ours)

    def _read_loop(self) -> None:
        if self._reader is None:
            self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                data = await loop.sock_recv(self.sock, 65536)
                if not data:
                    break
                msg = json.loads(data)
                if "pid" in msg:
                    fut = self._started.pop(msg["id"], None)
                    if fut is not None and not fut.done():
                        fut.set_result(msg["pid"])
                else:
                    end = (msg["status"], msg.get("rss", 0))
                    fut = self._ended.pop(msg["exit"], None)
                    if fut is not None and not fut.done():
                        fut.set_result(end)
                    else:
                        self._early[msg["exit"]] = end
        except (OSError, ValueError):
            pass
        for fut in [*self._started.values(), *self._ended.values()]:
            if not fut.done():
                fut.set_exception(SpawnerGone())
        self._started.clear()
        self._ended.clear()

    async def spawn(self, argv: list[str], env: dict[str, str], cwd: str, files: dict[int, tuple[str, int]],
                    stdio: tuple[int, int, int]) -> int:
        """Start a task; its pid (also its process group). ``stdio`` are passed as its fds 0, 1, 2."""
        self._read_loop()
        if self.proc.poll() is not None:
            raise SpawnerGone()
        self._next += 1
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._started[self._next] = fut
        body = json.dumps({"id": self._next, "argv": argv, "env": env, "cwd": cwd,
                           "files": {str(k): list(v) for k, v in files.items()}}).encode()
        try:
            socket.send_fds(self.sock, [body], list(stdio))
        except OSError:
            self._started.pop(self._next, None)
            raise SpawnerGone() from None
        return await asyncio.wait_for(fut, 30)

    async def wait(self, pid: int) -> tuple[int, int]:
        """A task's wait status and peak memory (KiB), once it has ended."""
        if pid in self._early:
            return self._early.pop(pid)
        fut: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()
        self._ended[pid] = fut
        return await fut

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
        if self._reader is not None:
            self._reader.cancel()
        try:
            self.proc.kill()
            self.proc.wait(1)
        except (OSError, subprocess.TimeoutExpired):
            pass


def returncode(status: int) -> int:
    """A wait status as ``Popen.returncode`` says it (negative: the signal that killed it)."""
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
