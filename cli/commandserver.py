"""The warm side of the thin commands: a process with the Slurm-named commands already imported keeps a
few children forked ahead of time; each takes one caller, becomes it (its uid, gid and groups from the
kernel; its working directory, environment, umask and open terminal or pipes, passed over the socket) and
runs the command there, as the command's own process would have. The caller's process only hands these
over and waits for the exit status: it skips Python's start and rota's imports. The server holds no key:
a child has nothing of the cluster's that its caller could not have.

One runs beside every local signer (``rota up``, ``rota agent``, ``rota authd``) on ``run/commands.sock``.
Run as root it serves every local user; run as a user, only that user (others are told to fall back to
running the command themselves).

The protocol, on a Unix stream socket: the client sends a 4-byte big-endian length and a JSON request
(``cmd``, ``argv``, ``cwd``, ``env``, ``umask``) with its stdin, stdout and stderr attached (SCM_RIGHTS).
The server answers ``F`` (fall back: run the command yourself) or ``A`` and the child's pid (signals for
the command go there); the client, if it has not given up waiting, answers ``G`` and the command runs;
when it is done the server sends ``X`` and its exit status (4 bytes, signed). A client that gave up
before ``A`` closes the socket and runs the command itself: without its ``G`` the child runs nothing.
"""
from __future__ import annotations

import array
import importlib
import io
import json
import os
import pwd
import signal
import socket
import struct
import sys

from .thin import COMMANDS as THIN_COMMANDS

COMMANDS = {name: f"rota.cli.{name}" for name in THIN_COMMANDS}
# what the commands import when they run (imported here once, so a child finds them loaded)
WARM = ("rota.cli.client", "rota.cli.options", "rota.cli.timespec", "rota.cli.lightjson", "rota.cli.exits",
        "rota.wire.localsock", "rota.wire.paths", "rota.core.hostlist", "sqlite3", "json", "datetime", "shlex")
MAX_REQUEST = 4 << 20          # the environment and arguments of one command
MAX_CHILDREN = 512             # commands in flight at once (an srun holds one for its job), spares included
SPARES = 4                     # children forked ahead, each waiting for a caller
RECEIVE_WAIT = 2.0             # seconds a child waits for its caller's request


def warm() -> None:
    """Import what the commands use, and load the name service's libraries (each child looks its caller up)."""
    import gc

    for name in (*COMMANDS.values(), *WARM):
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    try:
        os.getgrouplist(pwd.getpwuid(os.geteuid()).pw_name, os.getegid())
    except KeyError:
        pass
    gc.freeze()          # what is loaded now stays put: children do not copy it for the collector's sake


class CommandServer:
    """Serves callers on ``path`` from a few children forked ahead of time (see the module's docstring):
    each accepts one caller, tells this process so (a new spare is forked at once), becomes the caller
    and runs its command. At most ``MAX_CHILDREN`` at a time; callers beyond wait in the backlog, and
    give up waiting after a few seconds to run the command themselves."""

    def __init__(self, path: str, spares: int = SPARES) -> None:
        self.path, self.spares = path, spares
        self.children: set[int] = set()
        self.idle = 0                              # children forked and not yet given a caller
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if os.path.exists(path):
            os.unlink(path)
        self.sock.bind(path)
        os.chmod(path, 0o666)                      # any local user; who they are comes from the kernel
        self.sock.listen(128)
        self.taken_r, self.taken_w = os.pipe()    # a child writes a byte here when it accepted a caller

    def serve_forever(self) -> None:
        import select

        while True:
            while self.idle < self.spares and len(self.children) < MAX_CHILDREN:
                self._spawn()
            ready, _, _ = select.select([self.taken_r], [], [], 1.0)
            if ready:
                self.idle -= len(os.read(self.taken_r, 64))
            self._reap()

    def _reap(self) -> None:
        while self.children:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.children.clear()
                return
            if pid == 0:
                return
            self.children.discard(pid)

    def _spawn(self) -> None:
        from rota.wire.lifetime import die_with

        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(self.taken_r)
                die_with(parent)()                 # a spare goes with the server
                conn, _ = self.sock.accept()
                die_with(parent, 0)()              # a command under way does not
                os.write(self.taken_w, b".")
                os.close(self.taken_w)
                self.sock.close()
                code = _serve(conn)
            finally:
                os._exit(code)
        self.children.add(pid)
        self.idle += 1


def _serve(conn: socket.socket) -> int:
    _pid, uid, gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    if os.geteuid() != 0 and uid != os.geteuid():
        _send(conn, b"F")                          # a user's own rota serves only that user
        return 0
    return _child(conn, uid, gid)


def _send(conn: socket.socket, data: bytes) -> None:
    try:
        conn.sendall(data)
    except OSError:
        pass


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    """The request and the three descriptors that came with it."""
    conn.settimeout(RECEIVE_WAIT)
    fds = array.array("i")
    data, ancdata, _flags, _addr = conn.recvmsg(65536, socket.CMSG_SPACE(3 * fds.itemsize))
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
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
    return req, list(fds)


def _become(uid: int, gid: int) -> None:
    """Take on the caller's identity for good: groups, gid, uid (nothing of root is left to regain)."""
    if os.geteuid() != 0:
        return
    try:
        groups = os.getgrouplist(pwd.getpwuid(uid).pw_name, gid)
    except KeyError:
        groups = [gid]
    os.setgroups(groups)
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)


def _child(conn: socket.socket, uid: int, gid: int) -> int:
    _become(uid, gid)                    # before reading a byte of what the caller sent
    try:
        req, fds = _receive(conn)
        name = str(req["cmd"])
        module = COMMANDS[name]
        argv = [str(a) for a in req["argv"]]
        env = {str(k): str(v) for k, v in dict(req["env"]).items()}
        cwd, umask = str(req["cwd"]), int(req["umask"]) & 0o777
    except (OSError, ValueError, KeyError, TypeError):
        _send(conn, b"F")
        return 0
    _send(conn, b"A" + struct.pack("!I", os.getpid()))
    try:
        go = conn.recv(1)                   # the caller still waits (it runs the command itself otherwise)
    except OSError:
        go = b""
    if go != b"G":
        return 0
    conn.settimeout(None)
    for i, fd in enumerate(fds):
        os.dup2(fd, i)
        if fd > 2:
            os.close(fd)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8", errors="surrogateescape")
    for fd, attr in ((1, "stdout"), (2, "stderr")):
        stream = io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
                                  line_buffering=os.isatty(fd) or fd == 2, write_through=fd == 2)
        setattr(sys, attr, stream)
    os.environ.clear()
    os.environ.update(env)
    os.umask(umask)
    sys.argv = [name, *argv]
    sent: list[int] = []

    def report(code: int) -> None:
        """Flush the command's output and tell the caller its exit status (once)."""
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
    report(_run(module, name, cwd))
    return 0


def _run(module: str, name: str, cwd: str) -> int:
    """The command's entry point (its ``main_exit``), as its own process would run it, in the caller's
    working directory; returns its exit status."""
    try:
        os.chdir(cwd)
    except OSError as exc:
        print(f"{name}: error: cannot use the working directory {cwd}: {exc.strerror}", file=sys.stderr)
        return 1
    try:
        importlib.import_module(module).main_exit()
        return 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return int(exc.code or 0)
        print(exc.code, file=sys.stderr)
        return 1
    except Exception:  # noqa: BLE001 - as the command's own process would: the traceback, status 1
        import traceback

        traceback.print_exc()
        return 1


def main() -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m rota.cli.commandserver SOCKET")
    warm()
    CommandServer(sys.argv[1]).serve_forever()


if __name__ == "__main__":
    main()
