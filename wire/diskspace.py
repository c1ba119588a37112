"""Room on the disk that holds the event log: writes stop with a clear error while a reserve is left (so
what is already running can still log its end), and the projection stops growing before that."""
from __future__ import annotations

import shutil
import time

MIB = 1 << 20
_CHECK_EVERY = 1.0        # seconds a free-space reading is reused
_seen: dict[str, tuple[float, int, int]] = {}     # path -> (when read, free bytes, total bytes)


def reserve(total: int) -> int:
    """The bytes kept free for the log: 2 % of the disk, at least 16 MiB, at most 512 MiB."""
    return min(512 * MIB, max(16 * MIB, total // 50))


def _usage(path: str) -> tuple[int, int]:
    now = time.monotonic()
    hit = _seen.get(path)
    # a reading is reused for a second only while far from the reserve: near it, writes come faster than that
    if hit is not None and now - hit[0] < _CHECK_EVERY and hit[1] > 4 * reserve(hit[2]):
        return hit[1], hit[2]
    try:
        u = shutil.disk_usage(path)
    except OSError:
        return 1 << 62, 1 << 62        # cannot tell: do not refuse
    _seen[path] = (now, u.free, u.total)
    return u.free, u.total


def log_space_problem(path: str) -> str | None:
    """Why a write must be refused now (None: there is room)."""
    free, total = _usage(path)
    keep = reserve(total)
    if free >= keep:
        return None
    return (f"no space left for the event log at {path} ({free // MIB} MiB free; rota keeps {keep // MIB} MiB for "
            "the jobs already running): free some space there and try again")


def projection_may_grow(path: str) -> bool:
    """Whether the projection may write: it stops at twice the log's reserve, so it never starves the log."""
    free, total = _usage(path)
    return free >= 2 * reserve(total)
