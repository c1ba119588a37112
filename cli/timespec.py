"""Moments as Slurm's commands accept them (``sbatch --begin``, ``sacct -S/-E``): its ``parse_time``.

``now[{+|-}N[seconds|minutes|hours|days|weeks]]``, ``today``, ``midnight``, ``noon``, ``elevenses``,
``fika``, ``teatime``, ``tomorrow``, ``HH:MM[:SS][AM|PM]``, ``MMDD[YY]``, ``MM/DD[/YY]``,
``MM.DD[.YY]``, ``YYYY-MM-DD[THH:MM[:SS]]``; local time, like Slurm.
"""
from __future__ import annotations

import time

_UNITS = {"": 1, "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1, "m": 60, "min": 60, "mins": 60,
          "minute": 60, "minutes": 60, "h": 3600, "hour": 3600, "hours": 3600, "d": 86400, "day": 86400,
          "days": 86400, "w": 604800, "week": 604800, "weeks": 604800}
_NAMED_HOURS = {"midnight": 0, "today": 0, "elevenses": 11, "noon": 12, "fika": 15, "teatime": 16}


class MomentError(ValueError):
    """Not a time Slurm would accept; the message is Slurm's."""

    def __init__(self, text: str) -> None:
        super().__init__(f"Invalid time specification (pos=0): {text}")


def _at(day: time.struct_time, h: int = 0, m: int = 0, s: int = 0, add_days: int = 0) -> int:
    return int(time.mktime((day.tm_year, day.tm_mon, day.tm_mday + add_days, h, m, s, 0, 0, -1)))


def _clock(text: str) -> tuple[int, int, int] | None:
    """``HH:MM[:SS][AM|PM]`` -> (h, m, s)."""
    t = text.lower()
    shift = 0
    if t.endswith(("am", "pm")):
        shift, t = (12 if t.endswith("pm") else 0), t[:-2]
    parts = t.split(":")
    if len(parts) not in (2, 3) or not all(p.isdecimal() and len(p) <= 2 for p in parts):
        return None
    h, m, s = (int(p) for p in parts + ["0"] * (3 - len(parts)))
    if shift or text.lower().endswith("am"):
        if not 1 <= h <= 12:
            return None
        h = h % 12 + shift
    if h > 23 or m > 59 or s > 59:
        return None
    return h, m, s


def _date(text: str, today: time.struct_time) -> tuple[int, int, int] | None:
    """``MMDD[YY]``, ``MM/DD[/YY]``, ``MM.DD[.YY]`` -> (year, month, day)."""
    if text.isdecimal() and len(text) in (4, 6):
        parts = [text[0:2], text[2:4]] + ([text[4:6]] if len(text) == 6 else [])
    else:
        sep = "/" if "/" in text else "." if "." in text else None
        if sep is None:
            return None
        parts = text.split(sep)
        if len(parts) not in (2, 3) or not all(p.isdecimal() and 1 <= len(p) <= 2 for p in parts):
            return None
    month, day = int(parts[0]), int(parts[1])
    year = 2000 + int(parts[2]) if len(parts) == 3 else today.tm_year
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return None
    return year, month, day


def parse_moment(text: str, now: float, *, future: bool = False) -> int:
    """Epoch seconds for ``text``; ``future``: a bare time of day already past means tomorrow (--begin)."""
    t = text.strip()
    low = t.lower()
    today = time.localtime(now)
    if low.startswith("now"):
        rest = low[3:]
        if not rest:
            return int(now)
        sign = rest[0]
        digits = rest[1:].rstrip("abcdefghijklmnopqrstuvwxyz")
        unit = rest[1 + len(digits):]
        if sign not in "+-" or not digits.isdecimal() or unit not in _UNITS:
            raise MomentError(text)
        delta = int(digits) * _UNITS[unit]
        return int(now + delta if sign == "+" else now - delta)
    if low in _NAMED_HOURS:
        at = _at(today, _NAMED_HOURS[low])
        return at + 86400 if future and at < now and low != "today" else at
    if low == "tomorrow":
        return _at(today, add_days=1)
    date_part, _, clock_part = t.partition("T")
    if len(date_part) == 10 and date_part[4] == "-" and date_part[7] == "-":   # YYYY-MM-DD[THH:MM[:SS]]
        y, mo, d = date_part.split("-")
        clock = _clock(clock_part) if clock_part else (0, 0, 0)
        if not (y.isdecimal() and mo.isdecimal() and d.isdecimal()) or clock is None \
                or not (1 <= int(mo) <= 12 and 1 <= int(d) <= 31):
            raise MomentError(text)
        return int(time.mktime((int(y), int(mo), int(d), *clock, 0, 0, -1)))
    clock = _clock(t)
    if clock is not None:
        at = _at(today, *clock)
        return at + 86400 if future and at < now else at
    date = _date(t, today)
    if date is not None:
        return int(time.mktime((*date, 0, 0, 0, 0, 0, -1)))
    raise MomentError(text)
