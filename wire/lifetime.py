"""A child process's lifetime tied to its parent's (Linux: PR_SET_PDEATHSIG), a child out of time stopped, a
daemon's end that always comes (its event loop run with a bounded stop), and its C heap kept close to what it
holds."""
from __future__ import annotations

import asyncio
import functools
import os
from typing import Any


@functools.cache
def libc() -> Any:
    """The C library, loaded once (a process that forks many children loads it before forking)."""
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def die_with(parent: int, signum: int = 15):
    """For the child (before exec, or after a fork): get ``signum`` (SIGTERM) when the process that started
    it dies, even by kill -9 (an embedded nats-server must not outlive ``rota up`` holding its port and
    store; a command server must not outlive its signer). 0: no longer."""
    def arm() -> None:
        libc().prctl(1, signum, 0, 0, 0)         # PR_SET_PDEATHSIG
        if signum and os.getppid() != parent:    # the parent died before prctl took effect
            os._exit(1)
    return arm


M_MMAP_THRESHOLD, M_ARENA_MAX = -3, -8     # glibc's mallopt parameters


def lean_heap(mmap_threshold: int = 128 * 1024) -> bool:
    """A long-running process's C heap (glibc's; elsewhere nothing changes): one arena, so what its worker
    threads free (a snapshot written off the loop, SQLite's thread) is reused by the next work, not kept in
    an arena of their own; and blocks of ``mmap_threshold`` or more always mapped and unmapped (glibc
    otherwise raises the threshold each time one is freed, and a deep queue's large transient buffers then
    fragment the heap for good). Whether the C library took both settings."""
    try:
        mallopt = libc().mallopt
    except AttributeError:
        return False
    return bool(mallopt(M_ARENA_MAX, 1)) & bool(mallopt(M_MMAP_THRESHOLD, mmap_threshold))


def run_bounded(main: Any) -> None:
    """``asyncio.run`` without its unbounded end: tasks left over get 5 s to finish once cancelled, and
    threads still blocked (a write to a full disk, say) are not waited for: stopping always ends. The
    daemon's heap is made lean first (:func:`lean_heap`), before its threads start."""
    lean_heap()
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(main)
    finally:
        left = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for t in left:
            t.cancel()
        if left:
            loop.run_until_complete(asyncio.wait(left, timeout=5))
        loop.close()          # shuts its thread pool down without waiting for it


async def stop_child(proc: asyncio.subprocess.Process, grace: float = 5.0) -> None:
    """Stop a child that ran out of time: SIGTERM first (a thin client passes it on to the command server's worker
    that runs its command; a SIGKILL would stop only the client), SIGKILL after ``grace`` seconds."""
    if proc.returncode is None:
        try:
            proc.terminate()
        except ProcessLookupError:     # already gone
            pass
    try:
        await asyncio.wait_for(proc.wait(), grace)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
