"""Usage as fair-share and GrpTRESMins count it (pure): CPU- and GPU-seconds that ended runs used, per
account and per user association, decayed with ``PriorityDecayHalfLife`` in integer arithmetic, so a
replay on any machine computes the same numbers.

Each entry is ``[cpu_seconds, gpu_seconds, as_of]``: its value at log time ``as_of``; at a later time it
is worth ``value * 2 ** (-(t - as_of) / half_life)``. A run is charged whole when it ends (Slurm charges
running jobs every PriorityCalcPeriod; here a running job's use counts from its end on). A half-life of 0
turns decay off, as in Slurm.
"""
from __future__ import annotations

from functools import lru_cache
from math import isqrt
from typing import Iterable, Mapping

Q = 62
ONE = 1 << Q
_BITS = 32          # the fraction of a half-life is resolved to 2**-32


def _roots() -> tuple[int, ...]:
    """2 ** (-2 ** -i) in Q62 for i = 1 .. 32, by repeated integer square roots of 1/2."""
    out = []
    value = ONE >> 1                       # 2 ** -1
    for _ in range(_BITS):
        value = isqrt(value << Q)          # sqrt of a Q62 number, in Q62
        out.append(value)
    return tuple(out)


_ROOTS = _roots()


@lru_cache(maxsize=4096)
def decay_factor(dt: int, half_life: int) -> int:
    """2 ** (-dt / half_life) in Q62 (``ONE`` when decay is off or no time passed)."""
    if half_life <= 0 or dt <= 0:
        return ONE
    halves, rem = divmod(dt, half_life)
    if halves >= Q:
        return 0
    factor = ONE >> halves
    frac = (rem << _BITS) // half_life     # rem / half_life in Q32
    for i in range(_BITS):
        if frac & (1 << (_BITS - 1 - i)):
            factor = factor * _ROOTS[i] >> Q
    return factor


def decayed(value: int, dt: int, half_life: int) -> int:
    """``value`` after ``dt`` seconds of decay."""
    if half_life <= 0 or dt <= 0 or not value:
        return value
    return value * decay_factor(dt, half_life) >> Q


def charge(entries: dict, key, cpu_s: int, gpu_s: int, ts: int, half_life: int) -> None:
    """Add a run's CPU- and GPU-seconds to ``entries[key]`` at log time ``ts``."""
    entry = entries.get(key)
    if entry is None:
        entries[key] = [cpu_s, gpu_s, ts]
        return
    dt = ts - entry[2]
    if dt > 0:
        entry[0] = decayed(entry[0], dt, half_life)
        entry[1] = decayed(entry[1], dt, half_life)
        entry[2] = ts
    entry[0] += cpu_s
    entry[1] += gpu_s


def value_at(entry: list[int] | None, now: int, half_life: int) -> tuple[int, int]:
    """(CPU-seconds, GPU-seconds) an entry is worth at ``now``."""
    if entry is None:
        return 0, 0
    dt = now - entry[2]
    return decayed(entry[0], dt, half_life), decayed(entry[1], dt, half_life)


def with_running(entries: Mapping, running: Mapping, now: int, half_life: int) -> dict:
    """``entries`` with the CPU-seconds running jobs have used so far (``running``, by the same keys) added as
    of ``now``."""
    if not running:
        return dict(entries)
    out = dict(entries)
    for key, cpu_s in running.items():
        cpu, gpu = value_at(entries.get(key), now, half_life)
        out[key] = [cpu + cpu_s, gpu, now]
    return out


def ancestors(parents: Mapping[str, str], account: str) -> Iterable[str]:
    """``account`` and each account above it, up to (not including) root; a cycle in the tree stops."""
    seen: set[str] = set()
    while account and account != "root" and account not in seen:
        seen.add(account)
        yield account
        account = parents.get(account, "root")


def rolled_up(entries: Mapping[str, list[int]], parents: Mapping[str, str], now: int,
              half_life: int) -> dict[str, list[int]]:
    """Each account's usage at ``now`` with everything below it in the tree: {account: [cpu_s, gpu_s]}
    (root included, holding everything)."""
    out: dict[str, list[int]] = {"root": [0, 0]}
    for account in sorted(entries):
        cpu, gpu = value_at(entries[account], now, half_life)
        if not (cpu or gpu):
            continue
        for name in (*ancestors(parents, account), "root"):
            total = out.setdefault(name, [0, 0])
            total[0] += cpu
            total[1] += gpu
    return out
