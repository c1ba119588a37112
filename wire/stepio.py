"""A step's I/O stream between ``srun`` and the agents running its tasks (built-in modules only).

As in Slurm, ``srun`` listens and each node's agent connects to it: first one line of JSON (the step's
one-time key, the node and its task ranks), then frames both ways. A frame is a header (kind, task
rank, length: ``>BIH`` is too small for a pipe's chunk, so ``>BII``) and its bytes.
"""
from __future__ import annotations

import struct

HEADER = struct.Struct(">BII")
MAX_FRAME = 1 << 20

STDOUT, STDERR, EXIT = 1, 2, 3        # agent -> srun (EXIT carries "code signal" of the task)
STDIN, STDIN_EOF, SIGNAL = 4, 5, 6     # srun -> agent (SIGNAL carries the signal number)
ALL_TASKS = 0xFFFFFFFF


def frame(kind: int, task: int, data: bytes = b"") -> bytes:
    """One frame's bytes."""
    return HEADER.pack(kind, task, len(data)) + data


def parse_exit(data: bytes) -> tuple[int, int]:
    """(exit code, signal) from an EXIT frame's bytes."""
    code, _, sig = data.decode("ascii", "replace").partition(" ")
    return int(code or 0), int(sig or 0)
