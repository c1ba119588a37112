"""Waking an agent's supervision as soon as one of its jobs' processes ends (a pidfd the event loop
watches), instead of at its next tick: a job that ends is reported at once, not up to a tick later."""
from __future__ import annotations

import asyncio
import os


class ExitWatch:
    """Pidfds of the processes being supervised, each waking :meth:`wait` once when its process ends.
    Where pidfds are not available (Linux before 5.3) the supervision keeps its own pace."""

    def __init__(self) -> None:
        self.woken = asyncio.Event()
        self.fds: dict[int, int] = {}   # pid -> its pidfd

    def watch(self, pid: int) -> None:
        """Wake when ``pid`` (a child of this process) ends; wake now too (there is a new process to supervise)."""
        self.woken.set()
        if pid in self.fds:
            return
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError):   # no pidfd here, or the process is gone: the next tick sees it
            return
        self.fds[pid] = fd
        asyncio.get_running_loop().add_reader(fd, self._ended, pid)

    def forget(self, pid: int) -> None:
        """Stop watching ``pid`` (its end was handled)."""
        fd = self.fds.pop(pid, None)
        if fd is not None:
            asyncio.get_running_loop().remove_reader(fd)
            os.close(fd)

    def _ended(self, pid: int) -> None:
        self.forget(pid)        # an ended process's pidfd stays readable: once is enough
        self.woken.set()

    async def wait(self, timeout: float) -> None:
        """Until a watched process ends, a new one is watched, or ``timeout`` seconds have passed."""
        try:
            await asyncio.wait_for(self.woken.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        self.woken.clear()
