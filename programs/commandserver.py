"""The warm side of the thin commands: a process with the Slurm-named commands already imported hands
each caller to a worker of the caller's own: a child forked from it that became that user for good (its
uid, gid and groups, from the kernel) and runs the caller's command with the caller's working directory,
environment, umask and open terminal or pipes (passed over the socket), as the command's own process
would have. The caller's process only hands these over and waits for the exit status: it skips Python's
start and rota's imports. A worker serves the same user's next commands, one at a time (no fork per
command); it leaves when idle a while, after a command that may leave state behind (``srun``, ``salloc``,
an interrupted one, one that left threads or changed signal handlers), or with the server. The server holds
no key: a worker has nothing of the cluster's that its user could not have.

One runs beside every local signer (``rota up``, ``rota agent``, ``rota authd``) on ``run/commands.sock``.
``rota up``'s (``--log-commands``) also runs the log's lookups, ``rota why``, ``replay`` and ``history`` (command
``rota``, whose first argument must be one of them), with what reading the log imports already loaded; their
worker leaves after each (it read the log into its heap).
Run as root it serves every local user; run as a user, only that user (others are told to fall back to
running the command themselves).

The protocol, on a Unix stream socket: the client sends a 4-byte big-endian length and a JSON request
(``cmd``, ``argv``, ``cwd``, ``env``, ``umask``) with its stdin, stdout and stderr attached (SCM_RIGHTS).
The server answers ``F`` (fall back: run the command yourself) or ``A`` and the worker's pid (signals for
the command go there); the client, if it has not given up waiting, answers ``G`` and the command runs;
when it is done the server sends ``X`` and its exit status (4 bytes, signed). A client that gave up
before ``A`` closes the socket and runs the command itself: without its ``G`` the worker runs nothing.
"""
from __future__ import annotations

import array
import importlib
import io
import json
import os
import pwd
import select
import signal
import socket
import struct
import sys
import time
from collections import deque

from rota.cli.thin import COMMANDS as THIN_COMMANDS, LOG_COMMANDS

COMMANDS = {name: f"rota.cli.{name}" for name in THIN_COMMANDS}
ROTA = "rota"                  # the command that runs ``rota why|replay|history`` (LOG_COMMANDS), where served
LOG_MODULE = "rota.cli.main"
# commands that leave nothing behind in the process: their worker takes the user's next command
REUSABLE = frozenset(THIN_COMMANDS) - {"srun", "salloc"}
# what the commands import when they run (imported here once, so a worker finds them loaded)
WARM = ("rota.cli.client", "rota.cli.options", "rota.cli.timespec", "rota.cli.lightjson", "rota.cli.exits",
        "rota.wire.localsock", "rota.wire.paths", "rota.core.hostlist", "sqlite3", "json", "datetime", "shlex",
        "hmac", "select")
# what the log's lookups import besides (loaded by a server that serves them: ``rota up``'s)
LOG_WARM = (LOG_MODULE, "rota.cli.timetravel", "rota.core.timetravel", "rota.core.liveness", "rota.controller.eventlog",
            "rota.controller.snapshots", "rota.wire.cluster", "rota.wire.jsqueue", "rota.wire.keys", "rota.wire.seen",
            "rota.projections.queries", "rota.projections.hurry", "nats.js.api", "orjson", "pickle", "queue",
            "rota.core.reason_history", "typer._adapters", "typer._click.decorators")
MAX_REQUEST = 4 << 20          # the environment and arguments of one command
MAX_WORKERS = 512              # commands in flight at once (an srun holds a worker for its job), idle ones included
MAX_USER_WORKERS = 64          # of them, one user's: another user's flood never takes them all
MAX_USER_WAITING = 64          # one user's callers waiting for a worker; beyond, they are told to run it themselves
WAITING_LIMIT = 5.0            # seconds a caller waits for a worker (the client's own wait: it falls back then)
BACKLOG = 4096                 # connections the kernel queues for the accept loop (capped by net.core.somaxconn)
ACCEPT_BURST = 256             # callers accepted in one turn of the loop before the workers' news is read
IDLE_EXIT = 60.0               # seconds a worker waits for its user's next command
MAX_USES = 1000                # commands one worker runs before it makes way for a fresh one
RECEIVE_WAIT = 2.0             # seconds a worker waits for its caller's request
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def served(log: bool) -> dict[str, str]:
    """The commands a server runs (name: module): the Slurm-named ones, and with ``log`` the log's lookups."""
    return {**COMMANDS, ROTA: LOG_MODULE} if log else dict(COMMANDS)


def warm(log: bool = False) -> None:
    """Import what the commands use (with ``log``, what the log's lookups use too, as ``rota`` imports it), and
    load the name service's libraries (each worker looks its user up)."""
    import gc

    from rota.wire.lifetime import libc

    from .imports import nats_without_websockets, pydantic_without_plugins

    libc()
    if log:
        nats_without_websockets()
        pydantic_without_plugins()
    for name in (*COMMANDS.values(), *WARM, *(LOG_WARM if log else ())):
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    try:
        os.getgrouplist(pwd.getpwuid(os.geteuid()).pw_name, os.getegid())
    except KeyError:
        pass
    gc.freeze()          # what is loaded now stays put: workers do not copy it for the collector's sake


class Worker:
    """The server's side of one worker: its control socket (a caller's connection goes over it; the worker
    says ``D`` when it is ready for the next, and closes it when it leaves) and whose commands it runs."""

    def __init__(self, ctl: socket.socket, user: tuple[int, int]) -> None:
        self.ctl, self.user = ctl, user
        self.idle_since: float | None = None


class CommandServer:
    """Serves callers on ``path`` (see the module's docstring): accepts each caller, reads who it is from
    the kernel and hands the connection to an idle worker of that user (uid and gid), forking one when
    none is idle. At most ``MAX_WORKERS`` at a time and ``MAX_USER_WORKERS`` of one user's; callers beyond
    wait in their user's line, the lines served in turn, until a worker is free, and give up after a few
    seconds to run the command themselves (so does a caller whose user already has a full line)."""

    def __init__(self, path: str, commands: dict[str, str] | None = None) -> None:
        self.path = path
        self.commands = served(False) if commands is None else commands   # name: module (see served)
        self.workers: dict[int, Worker] = {}          # by control socket's descriptor
        self.per_user: dict[int, int] = {}        # workers by uid: a user's groups (newgrp) do not widen its share
        # callers waiting for a worker, a line per uid (the next line to serve first): (connection, uid and gid, since)
        self.waiting: dict[int, deque[tuple[socket.socket, tuple[int, int], float]]] = {}
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if os.path.exists(path):
            os.unlink(path)
        self.sock.bind(path)
        os.chmod(path, 0o666)                      # any local user; who they are comes from the kernel
        self.sock.listen(BACKLOG)
        self.sock.setblocking(False)

    def serve_forever(self) -> None:
        while True:
            self.serve_once(1.0)

    def serve_once(self, timeout: float) -> None:
        """Accept callers, take the workers' news, reap and retire workers, for at most ``timeout`` s."""
        listening = self.sock.fileno()
        poll = select.poll()                      # not select(): descriptors may pass FD_SETSIZE
        for fd in (listening, *self.workers):
            poll.register(fd, select.POLLIN)
        timeout = 0.2 if self.waiting else timeout  # those waiting are dropped once their clients gave up
        for fd, _ in poll.poll(timeout * 1000):
            if fd == listening:
                self._accept()
            elif fd in self.workers:
                self._news(self.workers[fd])
        now = time.monotonic()
        self._retire_idle(now)
        _reap()
        self._serve_waiting(now)

    def _accept(self) -> None:
        """Take every caller the kernel has queued (up to a burst): a flood is drained as fast as it comes, and
        what each caller costs before its user's limits apply is one look at who it is."""
        for _ in range(ACCEPT_BURST):
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.setblocking(True)
            try:
                _pid, uid, gid = _peer(conn)
            except OSError:
                conn.close()
                continue
            if os.geteuid() != 0 and uid != os.geteuid():
                _send(conn, b"F")                  # a user's own rota serves only that user
                conn.close()
                continue
            # behind that user's callers already waiting, else to a worker now if one may take it
            if uid in self.waiting or not self._dispatch(conn, (uid, gid)):
                self._wait(conn, (uid, gid))

    def _wait(self, conn: socket.socket, user: tuple[int, int]) -> None:
        line = self.waiting.setdefault(user[0], deque())
        if len(line) >= MAX_USER_WAITING:
            _send(conn, b"F")                      # this user has enough waiting: run it yourself
            conn.close()
            return
        line.append((conn, user, time.monotonic()))

    def _dispatch(self, conn: socket.socket, user: tuple[int, int]) -> bool:
        """Hand ``conn`` to a worker of ``user`` (an idle one, or a new one); False when none may take it now."""
        for w in self.workers.values():
            if w.user == user and w.idle_since is not None:
                try:
                    socket.send_fds(w.ctl, [b"C"], [conn.fileno()])
                except OSError:
                    self._forget(w)
                    continue
                w.idle_since = None
                conn.close()
                return True
        if self.per_user.get(user[0], 0) >= MAX_USER_WORKERS:
            return False
        if len(self.workers) >= MAX_WORKERS:
            idle = [w for w in self.workers.values() if w.idle_since is not None]
            if not idle:
                return False
            self._forget(min(idle, key=lambda w: w.idle_since or 0.0))
        self._fork(conn, user)
        return True

    def _serve_waiting(self, now: float) -> None:
        """Give the waiting callers the workers that are free, a caller from each user's line in turn; drop
        those who waited longer than their client does (it has run the command itself)."""
        progress = True
        while self.waiting and progress:
            progress = False
            for uid in list(self.waiting):
                line = self.waiting.pop(uid)
                while line and now - line[0][2] > WAITING_LIMIT:
                    line.popleft()[0].close()
                if line and self._dispatch(line[0][0], line[0][1]):
                    line.popleft()
                    progress = True
                if line:
                    self.waiting[uid] = line            # to the back of the turn

    def _fork(self, conn: socket.socket, user: tuple[int, int]) -> None:
        ours, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                ours.close()
                self.sock.close()
                for w in self.workers.values():
                    w.ctl.close()
                for line in self.waiting.values():
                    for c, *_ in line:
                        c.close()
                code = _worker(theirs, conn, *user, self.commands)
            finally:
                os._exit(code)
        theirs.close()
        conn.close()
        ours.setblocking(False)
        self.workers[ours.fileno()] = Worker(ours, user)
        self.per_user[user[0]] = self.per_user.get(user[0], 0) + 1

    def _news(self, w: Worker) -> None:
        try:
            news = w.ctl.recv(16)
        except BlockingIOError:
            return
        except OSError:
            news = b""
        if not news:
            self._forget(w)
        else:
            w.idle_since = time.monotonic()

    def _forget(self, w: Worker) -> None:
        """No more callers for ``w``: it leaves once it sees its control socket closed."""
        if self.workers.pop(w.ctl.fileno(), None) is not None:
            uid = w.user[0]
            left = self.per_user[uid] - 1
            if left:
                self.per_user[uid] = left
            else:
                del self.per_user[uid]
        w.ctl.close()

    def _retire_idle(self, now: float) -> None:
        for w in [w for w in self.workers.values() if w.idle_since is not None and now - w.idle_since > IDLE_EXIT]:
            self._forget(w)


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _peer(conn: socket.socket) -> tuple[int, int, int]:
    pid, uid, gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid, uid, gid


def _send(conn: socket.socket, data: bytes) -> None:
    try:
        conn.sendall(data)
    except OSError:
        pass


def _become(uid: int, gid: int) -> None:
    """Take on the user's identity for good: groups, gid, uid (nothing of root is left to regain)."""
    if os.geteuid() != 0:
        return
    try:
        groups = os.getgrouplist(pwd.getpwuid(uid).pw_name, gid)
    except KeyError:
        groups = [gid]
    os.setgroups(groups)
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)


def _worker(ctl: socket.socket, conn: socket.socket, uid: int, gid: int, commands: dict[str, str]) -> int:
    """A worker's life: become the user, then run the callers' commands that come, one at a time, until the
    server closes ``ctl`` or a command leaves something behind."""
    _become(uid, gid)                    # before reading a byte of what any caller sent
    interrupted: list[int] = []

    def interrupt(signum: int, _frame: object) -> None:
        interrupted.append(signum)
        raise KeyboardInterrupt

    handlers = {sig: signal.getsignal(sig) for sig in FORWARDED}
    handlers[signal.SIGINT] = interrupt
    null = os.open(os.devnull, os.O_RDWR)
    for uses in range(MAX_USES):
        if _peer(conn)[1:] != (uid, gid):     # the server gives a worker only its own user's callers
            conn.close()
            return 1
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        clean = _serve(conn, commands)
        conn.close()
        for fd in (0, 1, 2):
            os.dup2(null, fd)            # the caller's terminal or pipes are the caller's again
        os.chdir("/")
        if not clean or interrupted or uses == MAX_USES - 1 or _left_behind(handlers):
            return 0
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_IGN)   # a late signal for the command that ended
        try:
            ctl.sendall(b"D")
            _, fds, _, _ = socket.recv_fds(ctl, 16, 1)
        except OSError:
            return 0
        if not fds:
            return 0                     # the server is done with this worker
        conn = socket.socket(fileno=fds[0])
    return 0


def _left_behind(handlers: dict) -> bool:
    """Whether the command that ran left something that would reach the next one: threads, signal handlers."""
    threading = sys.modules.get("threading")
    if threading is not None and threading.active_count() > 1:
        return True
    return any(signal.getsignal(sig) is not h for sig, h in handlers.items())


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    """The request and the three descriptors that came with it."""
    conn.settimeout(RECEIVE_WAIT)
    fds = array.array("i")
    data, ancdata, _flags, _addr = conn.recvmsg(65536, socket.CMSG_SPACE(3 * fds.itemsize))
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    try:
        if len(data) < 4:
            raise ValueError("a request shorter than its length")
        size = struct.unpack("!I", data[:4])[0]
        if size > MAX_REQUEST:
            raise ValueError("a request larger than 4 MiB")
        body = bytearray(data[4:])
        while len(body) < size:
            chunk = conn.recv(min(1 << 20, size - len(body)))
            if not chunk:
                raise ValueError("the request was cut short")
            body += chunk
        req = json.loads(bytes(body))
        if not isinstance(req, dict) or len(fds) != 3:
            raise ValueError("a request without its three descriptors")
    except (OSError, ValueError):
        for fd in fds:
            os.close(fd)
        raise
    return req, list(fds)


def _serve(conn: socket.socket, commands: dict[str, str]) -> bool:
    """Run one caller's command; whether this process can take another (nothing of this one is left)."""
    try:
        req, fds = _receive(conn)
    except (OSError, ValueError):
        _send(conn, b"F")
        return True
    try:
        name = str(req["cmd"])
        module = commands[name]
        argv = [str(a) for a in req["argv"]]
        if name == ROTA and (not argv or argv[0] not in LOG_COMMANDS):
            raise KeyError(name)           # of rota's own commands, only the log's lookups run here
        env = {str(k): str(v) for k, v in dict(req["env"]).items()}
        cwd, umask = str(req["cwd"]), int(req["umask"]) & 0o777
    except (ValueError, KeyError, TypeError):
        for fd in fds:
            os.close(fd)
        _send(conn, b"F")                  # run it yourself
        return True
    _send(conn, b"A" + struct.pack("!I", os.getpid()))
    try:
        go = conn.recv(1)                   # the caller still waits (it runs the command itself otherwise)
    except OSError:
        go = b""
    if go != b"G":
        for fd in fds:
            os.close(fd)
        return True
    conn.settimeout(None)
    _take_on(fds, env, umask, [name, *argv])
    sent: list[int] = []

    def report(code: int) -> None:
        """Flush the command's output, let go of the caller's descriptors and tell the caller its exit
        status (once)."""
        if sent:
            return
        sent.append(code)
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        _send(conn, b"X" + struct.pack("!i", code))

    from rota.cli import exits

    exits.before_exit = report          # a command that leaves with os._exit (srun) reports first
    code, clean = _run(module, name, cwd)
    exits.before_exit = None
    _let_go()                               # before the status: a shell reading the output sees its end now
    report(code)
    return clean and name in REUSABLE


def _take_on(fds: list[int], env: dict[str, str], umask: int, argv: list[str]) -> None:
    """The caller's stdin, stdout and stderr, environment, umask and argv become this process's."""
    for i, fd in enumerate(fds):
        os.dup2(fd, i)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8", errors="surrogateescape")
    # the same stdout and stderr objects, now writing to the caller's: a command's ``out=sys.stdout`` default
    # was bound to them when it was imported here
    out, err = sys.stdout, sys.stderr
    assert isinstance(out, io.TextIOWrapper) and isinstance(err, io.TextIOWrapper)   # as main() made them
    out.reconfigure(line_buffering=os.isatty(1))
    err.reconfigure(line_buffering=True, write_through=True)
    environ = os.environ               # made equal to the caller's: only what differs is changed
    for key in [k for k in environ if k not in env]:
        del environ[key]
    for key, value in env.items():
        if environ.get(key) != value:
            environ[key] = value
    os.umask(umask)
    sys.argv = argv


def _let_go() -> None:
    """Flush the command's output and give back the caller's descriptors (/dev/null in their place)."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)


def _run(module: str, name: str, cwd: str) -> tuple[int, bool]:
    """The command's entry point (its ``main_exit``), as its own process would run it, in the caller's
    working directory: its exit status, and whether it ended by itself (not interrupted)."""
    try:
        os.chdir(cwd)
    except OSError as exc:
        print(f"{name}: error: cannot use the working directory {cwd}: {exc.strerror}", file=sys.stderr)
        return 1, True
    try:
        importlib.import_module(module).main_exit()
        return 0, True
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return int(exc.code or 0), True
        print(exc.code, file=sys.stderr)
        return 1, True
    except KeyboardInterrupt:
        return 130, False
    except Exception:  # noqa: BLE001 - as the command's own process would: the traceback, status 1
        import traceback

        traceback.print_exc()
        return 1, False


def main() -> None:
    import resource

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:     # each caller waiting and each worker holds a descriptor here
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    log = "--log-commands" in sys.argv[1:]     # serve the log's lookups too (rota up's server)
    args = [a for a in sys.argv[1:] if a != "--log-commands"]
    if len(args) != 1:
        raise SystemExit("usage: python -m rota.programs.commandserver [--log-commands] SOCKET")
    for fd, attr in ((1, "stdout"), (2, "stderr")):    # what every command will write through (see _take_on)
        setattr(sys, attr, io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding="utf-8",
                                            errors="backslashreplace"))
    server = CommandServer(args[0], served(log))    # callers who come while the commands load wait in its queue
    warm(log)
    server.serve_forever()


if __name__ == "__main__":
    main()
