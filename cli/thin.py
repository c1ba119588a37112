"""The thin path of the Slurm-named commands: hand the command to this host's warm command server
(:mod:`rota.programs.commandserver`) and relay its exit status; the command runs there, as the caller, on
the caller's terminal or pipes. Only the standard library is used here.

``ROTA_THIN=0`` turns it off (the command then runs in this process, as it does when no server runs).
"""
from __future__ import annotations

import array
import json
import os
import signal
import socket
import struct
import sys

# the commands that go the thin way (also the native client's list, in cli/native/rota_command.c)
COMMANDS = ("sbatch", "squeue", "sacct", "sinfo", "scancel", "scontrol", "srun", "salloc", "sacctmgr", "sshare",
            "sprio")
# ``rota`` subcommands that go the thin way (as command ``rota``) where the command server serves them: the
# log's lookups, on the controller's host (``rota up``'s server has what reading the log imports loaded)
LOG_COMMANDS = ("why", "replay", "history")
ANSWER_WAIT = 5.0      # seconds to wait for the server to take the command before running it here
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
             signal.SIGCONT)


def command_socket() -> str:
    """The command server beside the local signer this command would talk to."""
    from rota.wire.paths import socket_path

    return os.path.join(os.path.dirname(socket_path()), "commands.sock")


def _recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        try:
            chunk = sock.recv(n - len(data))
        except InterruptedError:
            continue
        if not chunk:
            return None
        data += chunk
    return data


def _descriptors() -> list[int]:
    """stdin, stdout and stderr as they are (a closed one is sent as /dev/null)."""
    out = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            out.append(fd)
        except OSError:
            out.append(os.open(os.devnull, os.O_RDWR))
    return out


def call(name: str, argv: list[str]) -> int | None:
    """Run command ``name`` with ``argv`` in the command server; its exit status, or None when there is no
    server to run it (or it asks this process to run it itself)."""
    if os.environ.get("ROTA_THIN") == "0":
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(command_socket())
    except OSError:
        sock.close()
        return None
    umask = os.umask(0o022)
    os.umask(umask)
    req = json.dumps({"cmd": name, "argv": argv, "cwd": os.getcwd(), "env": dict(os.environ),
                      "umask": umask}).encode()
    try:
        sock.settimeout(ANSWER_WAIT)
        sock.sendmsg([struct.pack("!I", len(req)) + req],
                     [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", _descriptors()))])
        answer = _recv_exactly(sock, 5)
        if answer is None or answer[:1] != b"A":
            sock.close()
            return None
        sock.settimeout(None)
        sock.sendall(b"G")                 # from here on the command runs there, never here
    except OSError:
        sock.close()
        return None
    child = struct.unpack("!I", answer[1:])[0]

    def forward(signum: int, _frame: object) -> None:
        try:
            os.kill(child, signum)
        except OSError:
            pass
    for sig in FORWARDED:
        signal.signal(sig, forward)
    try:
        end = _recv_exactly(sock, 5)
    except OSError:
        end = None
    if end is None or end[:1] != b"X":
        print(f"{name}: error: the command server stopped before the command ended", file=sys.stderr)
        return 1
    return struct.unpack("!i", end[1:])[0]


def _entry(name: str):
    def run() -> None:
        code = call(name, sys.argv[1:])
        if code is None:
            import importlib

            importlib.import_module(f"rota.cli.{name}").main_exit()
        raise SystemExit(code)
    run.__name__ = name
    run.__doc__ = f"`{name}`: through the command server when one runs, else in this process."
    return run


sbatch, squeue, sacct, sinfo, scancel, scontrol, srun, salloc, sacctmgr, sshare, sprio = map(_entry, COMMANDS)
