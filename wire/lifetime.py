"""A child process's lifetime tied to its parent's (Linux: PR_SET_PDEATHSIG)."""
from __future__ import annotations

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
