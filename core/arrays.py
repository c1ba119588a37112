"""Job array specifications: ``0-99``, ``1,3,5-9``, ``0-15:4``, ``0-15%4`` (pure)."""
from __future__ import annotations

from collections import namedtuple
from functools import lru_cache

MAX_ARRAY_SIZE = 1001


class ArraySpecError(ValueError):
    """An array specification Slurm would reject."""


# (indices, throttle): sorted unique indices and the %N limit (0 = unlimited). A namedtuple, not a
# dataclass: sbatch imports this module and the dataclasses machinery costs it ~8 ms at start.
ArraySpec = namedtuple("ArraySpec", ["indices", "throttle"])


def parse_array(text: str, max_array_size: int = MAX_ARRAY_SIZE) -> ArraySpec:
    """Parse an ``--array`` value; indices come back sorted and unique."""
    raw = text.strip()
    body, pct, thr = raw.partition("%")
    throttle = 0
    if pct:
        if not thr.isdecimal() or int(thr) < 1:
            raise ArraySpecError(f"invalid array throttle in {text!r}: use %N with N a whole number of at least 1")
        throttle = int(thr)
    indices: set[int] = set()
    for piece in body.split(","):
        rng, colon, step_s = piece.partition(":")
        step = 1
        if colon:
            if not step_s.isdecimal() or int(step_s) < 1:
                raise ArraySpecError(f"invalid array step in {piece!r}")
            step = int(step_s)
        lo, dash, hi = rng.partition("-")
        if not lo.isdecimal() or (dash and not hi.isdecimal()):
            raise ArraySpecError(f"invalid array range {piece!r} in {text!r}")
        a = int(lo)
        b = int(hi) if dash else a
        if b < a:
            raise ArraySpecError(f"array range {piece!r} runs backwards")
        if b >= max_array_size:
            raise ArraySpecError(f"array index {b} exceeds MaxArraySize-1 ({max_array_size - 1})")
        indices.update(range(a, b + 1, step))
    if not indices:
        raise ArraySpecError(f"empty array specification {text!r}")
    return ArraySpec(tuple(sorted(indices)), throttle)


@lru_cache(maxsize=256)
def array_summary(text: str) -> tuple[int, int, int, int] | None:
    """(count, min, max, step) of an array specification, as each task's environment gives them
    (SLURM_ARRAY_TASK_COUNT/MIN/MAX/STEP); None for one Slurm would reject. Kept per text: every task of
    an array asks, and parsing one spells out all its indices."""
    try:
        indices = parse_array(text, 1 << 30).indices
    except ArraySpecError:
        return None
    step = indices[1] - indices[0] if len(indices) > 1 else 1
    return len(indices), indices[0], indices[-1], step


def format_indices(indices: list[int] | tuple[int, ...], throttle: int = 0) -> str:
    """Compress indices as squeue shows a pending array: ``0-3,7`` (+``%N``)."""
    parts: list[str] = []
    items = sorted(indices)
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        parts.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    s = ",".join(parts)
    return f"{s}%{throttle}" if throttle else s
