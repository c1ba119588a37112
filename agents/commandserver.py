"""The warm side of the thin commands: a process with the Slurm-named commands already imported that, for
each caller, forks a child which becomes the caller (its uid, gid and groups from the kernel, its working
directory, environment, umask and open terminal or pipes, passed over the socket) and runs the command
there, as the command's own process would have. The caller's process only hands these over and waits
for the exit status: it skips Python's start and rota's imports.

One runs beside every local signer (``rota up``, ``rota agent``, ``rota authd``) on ``run/commands.sock``.
Run as root it serves every local user; run as a user, only that user (others are told to fall back to
running the command themselves).

The protocol, on a Unix stream socket: the client sends a 4-byte big-endian length and a JSON request
(``cmd``, ``argv``, ``cwd``, ``env``, ``umask``) with its stdin, stdout and stderr attached (SCM_RIGHTS).
The server answers ``F`` (fall back: run the command yourself) or ``A`` and the child's pid (signals for
the command go there), then, when the command is done, ``X`` and its exit status (4 bytes, signed).
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

COMMANDS = {name: f"rota.cli.{name}" for name in ("sbatch", "squeue", "sacct", "sinfo", "scancel", "scontrol",
                                                   "srun", "salloc", "sacctmgr", "sshare", "sprio")}
# what the commands import when they run (imported here once, so a child finds them loaded)
WARM = ("rota.cli.client", "rota.cli.options", "rota.cli.timespec", "rota.cli.lightjson", "rota.cli.exits",
        "rota.wire.localsock", "rota.wire.paths", "rota.core.hostlist", "sqlite3", "json", "datetime", "shlex")
MAX_REQUEST = 4 << 20          # the environment and arguments of one command
MAX_CHILDREN = 256             # commands in flight at once; beyond that callers run theirs themselves
MAX_PER_USER = 64


def command_socket_in(run_dir: str) -> str:
    return os.path.join(run_dir, "commands.sock")


def warm() -> None:
    for name in (*COMMANDS.values(), *WARM):
        try:
            importlib.import_module(name)
        except ImportError:
            pass


class CommandServer:
    """Accepts callers on ``path`` and forks a child per command (see the module's docstring)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.children: dict[int, int] = {}         # pid -> uid
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if os.path.exists(path):
            os.unlink(path)
        self.sock.bind(path)
        os.chmod(path, 0o666)                      # any local user; who they are comes from the kernel
        self.sock.listen(128)
        self.sock.settimeout(1.0)

    def serve_forever(self) -> None:
        while True:
            self._reap()
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            except InterruptedError:
                continue
            try:
                self._fork_for(conn)
            finally:
                conn.close()

    def _reap(self) -> None:
        while self.children:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.children.clear()
                return
            if pid == 0:
                return
            self.children.pop(pid, None)

    def _fork_for(self, conn: socket.socket) -> None:
        pid_, uid, gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                             struct.calcsize("3i")))
        mine = sum(1 for u in self.children.values() if u == uid)
        if len(self.children) >= MAX_CHILDREN or mine >= MAX_PER_USER or (os.geteuid() != 0 and uid != os.geteuid()):
            _send(conn, b"F")
            return
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                self.sock.close()
                code = _child(conn, uid, gid)
            finally:
                os._exit(code)
        self.children[pid] = uid


def _send(conn: socket.socket, data: bytes) -> None:
    try:
        conn.sendall(data)
    except OSError:
        pass


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    """The request and the three descriptors that came with it."""
    conn.settimeout(10)
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
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
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
    _become(uid, gid)
    _send(conn, b"A" + struct.pack("!I", os.getpid()))
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


def start(path: str):  # -> subprocess.Popen
    """Start a command server on ``path`` beside this process; it dies with it."""
    import subprocess

    from rota.controller.natsserver import die_with

    return subprocess.Popen([sys.executable, "-m", "rota.agents.commandserver", path], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=die_with(os.getpid()) if sys.platform == "linux" else None)


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m rota.agents.commandserver SOCKET")
    warm()
    CommandServer(sys.argv[1]).serve_forever()


if __name__ == "__main__":
    main()
