"""An agent's supervision wakes when a job's process ends, not at its next tick."""
import subprocess
import sys
import time

import pytest

from rota.agents.exitwatch import ExitWatch

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pidfds are Linux's")


async def test_the_end_of_a_watched_process_wakes_the_wait_at_once():
    watch = ExitWatch()
    proc = subprocess.Popen(["sleep", "0.3"])
    try:
        watch.watch(proc.pid)
        await watch.wait(30)                 # a new process to supervise wakes it at once
        t = time.monotonic()
        await watch.wait(30)                 # then its end does, long before the 30 s tick
        assert 0.1 < time.monotonic() - t < 10
        assert watch.fds == {}               # its pidfd is closed once it has woken the wait
    finally:
        proc.wait()


async def test_a_forgotten_process_wakes_nothing():
    watch = ExitWatch()
    proc = subprocess.Popen(["sleep", "0.1"])
    try:
        watch.watch(proc.pid)
        watch.forget(proc.pid)
        await watch.wait(0)
        t = time.monotonic()
        await watch.wait(1.0)
        assert time.monotonic() - t >= 0.9 and watch.fds == {}
    finally:
        proc.wait()
