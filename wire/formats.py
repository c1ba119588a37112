"""How times and sizes are written for people, as Slurm writes them: the one place every command and
view takes them from (durations, which need no clock, are in :mod:`rota.core.timefmt`)."""
from __future__ import annotations

import time

from rota.core.timefmt import format_squeue_time


def timestamp(t: int | None, unset: str = "Unknown") -> str:
    """``2026-12-03T04:05:06`` in local time; ``unset`` (Slurm's Unknown, None or N/A) for none."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t)) if t else unset


def memory(mib: int | None, zero: str = "0") -> str:
    """``64G`` when a whole number of GiB, else ``1500M``; ``zero`` for none (sacct ``0``, scontrol ``0M``)."""
    if not mib:
        return zero
    return f"{mib // 1024}G" if mib % 1024 == 0 else f"{mib}M"


def time_limit(seconds: int | None) -> str:
    """sinfo's TIMELIMIT: ``infinite`` for none."""
    return "infinite" if not seconds else format_squeue_time(seconds)
