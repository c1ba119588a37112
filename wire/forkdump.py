"""A large state serialized aside: a forked child (a copy-on-write image of the state as it is at the fork) turns
it into bytes and hands them back through a pipe, while the parent goes on changing its state at once. The
state is held still only for the fork (milliseconds), not for the whole dump (about a second per 60,000 jobs,
longer while the parent's event loop competes for the interpreter), so writes wait for no snapshot."""
from __future__ import annotations

import os
import signal
from typing import Any, Callable

from .lifetime import die_with


class Aside:
    """A child dumping a state: ``result()`` (blocking: call it in a thread) gives its bytes."""

    def __init__(self, pid: int, fd: int) -> None:
        self.pid, self.fd = pid, fd

    def result(self) -> bytes:
        parts = []
        try:
            while chunk := os.read(self.fd, 1 << 20):
                parts.append(chunk)
        finally:
            os.close(self.fd)
            _, status = os.waitpid(self.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise OSError(f"the child that wrote the snapshot failed (status {os.waitstatus_to_exitcode(status)})")
        return b"".join(parts)


def dump_aside(dump: Callable[[Any], bytes], state: Any) -> Aside | None:
    """Start ``dump(state)`` in a forked child; None where there is no fork (the caller dumps in place)."""
    if not hasattr(os, "fork"):
        return None
    r, w = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            signal.set_wakeup_fd(-1)             # the parent's event loop is not this process's
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)
            die_with(parent, signal.SIGKILL)()
            view = memoryview(dump(state))
            while view:
                view = view[os.write(w, view):]
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    return Aside(pid, r)
