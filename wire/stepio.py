"""A step's I/O stream between ``srun`` and the agents running its tasks (built-in modules only).

As in Slurm, ``srun`` listens and each node's agent connects to it. Each side proves it holds the step's
one-time key without sending it: ``srun`` speaks first, a greeting with a fresh nonce and its MAC under the
key (an agent writes nothing to a peer that cannot, so it never talks to a service that is not this step's
srun); the agent answers one line of JSON (its node, its task ranks, and its own MAC of that nonce), and
``srun`` says ``ok``. Then frames go both ways. A frame is a header (kind, task rank, length: ``>BIH`` is too
small for a pipe's chunk, so ``>BII``) and its bytes.
"""
from __future__ import annotations

import hmac
import struct

HEADER = struct.Struct(">BII")
MAX_FRAME = 1 << 20

STDOUT, STDERR, EXIT = 1, 2, 3        # agent -> srun (EXIT carries "code signal" of the task)
STDIN, STDIN_EOF, SIGNAL = 4, 5, 6     # srun -> agent (SIGNAL carries the signal number)
TASK_ENDED = 7     # agent -> srun, as a task ends ("code signal"); EXIT follows once the node's end is reported
ALL_TASKS = 0xFFFFFFFF


def frame(kind: int, task: int, data: bytes = b"") -> bytes:
    """One frame's bytes."""
    return HEADER.pack(kind, task, len(data)) + data


def parse_exit(data: bytes) -> tuple[int, int]:
    """(exit code, signal) from an EXIT frame's bytes."""
    code, _, sig = data.decode("ascii", "replace").partition(" ")
    return int(code or 0), int(sig or 0)


GREETING = "rota-srun1"
MAX_GREETING = 200


def greeting(key: str, nonce: str) -> bytes:
    """srun's first line on a connection: the nonce, and srun's MAC of it."""
    return f"{GREETING} {nonce} {_mac(key, 'srun', nonce)}\n".encode()


def greeted(line: bytes, key: str) -> str | None:
    """The nonce of a greeting made with ``key``; None when ``line`` is not one."""
    parts = line.decode("ascii", "replace").split()
    if len(parts) != 3 or parts[0] != GREETING or not hmac.compare_digest(parts[2], _mac(key, "srun", parts[1])):
        return None
    return parts[1]


def proof(key: str, nonce: str, node: str) -> str:
    """The agent's MAC of srun's nonce, for its node."""
    return _mac(key, "agent", nonce, node)


def _mac(key: str, *parts: str) -> str:
    return hmac.new(key.encode(), " ".join(parts).encode(), "sha256").hexdigest()
