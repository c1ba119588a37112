"""How times, sizes and tables are written for people, as Slurm writes them: the one place every command and
view takes them from (durations, which need no clock, are in :mod:`rota.core.timefmt`)."""
from __future__ import annotations

import time

from rota.core.timefmt import format_squeue_time

TYPE_CHECKING = False    # (typing's, without importing typing: the thin commands stay light)
if TYPE_CHECKING:
    from typing import Any, Callable, Iterable, Sequence


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


class Column:
    """One column a command can print, in the one shape every command's format table has: its header, its
    text for one row (the command says what a row is: squeue a job and the time, sinfo a partition and its
    nodes, sacct a row's values, sacctmgr a record), and its default width and justification."""

    __slots__ = ("header", "value", "width", "left")

    def __init__(self, header: str, value: Callable[..., str], width: int = 0, left: bool = False) -> None:
        self.header = header
        self.value = value
        self.width = width      # 0: as wide as the format asks (or the text, where none is asked)
        self.left = left        # left-justified unless the format says otherwise


def fixed_table(columns: Sequence[tuple[Column, int, bool]], rows: Iterable[Any], header: bool,
                parsable: str | None) -> list[str]:
    """The accounting commands' layout (sacct, sacctmgr): each of ``columns`` (with its width and whether it is
    left-justified) a cell followed by a blank, text too wide cut with a ``+``, a rule of dashes under the
    header; or, with ``parsable`` (``|`` or ``|+``, -p and -P), the cells joined by it."""
    if parsable is not None:
        delim, tail = parsable[0], parsable[0] if parsable[1:] == "+" else ""
        lines = [delim.join(c.header for c, _w, _l in columns) + tail] if header else []
        return lines + [delim.join(c.value(r) for c, _w, _l in columns) + tail for r in rows]

    def cell(text: str, w: int, left: bool) -> str:
        if len(text) > w:
            text = text[: w - 1] + "+"
        return text.ljust(w) if left else text.rjust(w)

    lines = []
    if header:
        lines.append("".join(cell(c.header, w, left) + " " for c, w, left in columns))
        lines.append("".join("-" * w + " " for _c, w, _l in columns))
    return lines + ["".join(cell(c.value(r), w, left) + " " for c, w, left in columns) for r in rows]
