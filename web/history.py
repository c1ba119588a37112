"""The cluster over time from the projection's rows (pure): GPUs allocated, idle and drained, and the queue's
length by reason, sampled at evenly spaced moments by one sweep over each kind of change."""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Iterable, Sequence

POINTS = 200               # moments sampled between the first submit and now
UNUSABLE = ("drain", "down", "fail", "not_responding", "maint", "inval")


@dataclass
class Series:
    times: list[int]
    allocated: list[int]
    idle: list[int]
    drained: list[int]
    total: int
    queue: dict[str, list[int]] = field(default_factory=dict)     # reason -> pending jobs at each moment


def moments(t0: int, t1: int, points: int = POINTS) -> list[int]:
    """``points`` moments from t0 to t1, both included (one when they are equal)."""
    if t1 <= t0:
        return [t0]
    return [t0 + (t1 - t0) * i // (points - 1) for i in range(points)]


def _sweep(times: Sequence[int], deltas: list[tuple[int, int]]) -> list[int]:
    """The running sum of ``deltas`` (time, change) as of each of ``times`` (changes at a moment included)."""
    deltas.sort()
    out, level, i = [], 0, 0
    for t in times:
        while i < len(deltas) and deltas[i][0] <= t:
            level += deltas[i][1]
            i += 1
        out.append(level)
    return out


def unusable(state: str) -> bool:
    s = state.lower()
    return any(word in s for word in UNUSABLE)


def series(runs: Iterable[Sequence], spans: Iterable[Sequence], node_states: Iterable[Sequence],
           t0: int, t1: int, points: int = POINTS) -> Series:
    """From runs (start, end or 0, GPUs), reason spans (code, start, end or None) and node states (node, time,
    state, reason, GPUs): the cluster at each moment."""
    times = moments(t0, t1, points)
    far = t1 + 1
    allocated = _sweep(times, [d for start, end, gpus in runs if gpus
                               for d in ((start, gpus), (end or far, -gpus))])
    by_reason: dict[str, list[tuple[int, int]]] = {}
    for code, start, end in spans:
        by_reason.setdefault(code, []).extend(((start, 1), (end if end is not None else far, -1)))
    queue = {code: _sweep(times, deltas) for code, deltas in sorted(by_reason.items())}
    last: dict[str, tuple[bool, int]] = {}
    drained_d: list[tuple[int, int]] = []
    total = {}
    for node, t, state, _reason, gpus in node_states:
        down = unusable(state)
        was = last.get(node)
        if was is not None and was[0]:
            drained_d.append((t, -was[1]))
        if down:
            drained_d.append((t, gpus))
        last[node] = (down, gpus)
        total[node] = gpus
    drained = _sweep(times, drained_d)
    size = sum(total.values())
    idle = [max(0, size - a - d) for a, d in zip(allocated, drained)]
    return Series(times, allocated, idle, drained, size, queue)


def at_index(times: Sequence[int], t: int) -> int:
    """The sampled moment at or before ``t``."""
    return max(0, bisect_right(times, t) - 1)
