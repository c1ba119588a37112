"""Slurm time-limit and duration syntax (pure).

Durations are integer seconds. ``UNLIMITED`` is represented by :data:`UNLIMITED` (0), which
is also what ``--time=0`` means to Slurm.
"""
from __future__ import annotations

UNLIMITED = 0
"""A time limit of 0 seconds means no limit, as ``--time=0`` does in Slurm."""

_INFINITE_WORDS = {"unlimited", "infinite", "-1"}


class TimeSpecError(ValueError):
    """A time string that Slurm's syntax does not allow."""


def _int(part: str, text: str) -> int:
    if not part.isdecimal():
        raise TimeSpecError(f"invalid time specification {text!r}")
    return int(part)


def parse_time_limit(text: str) -> int:
    """Parse ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S`` or UNLIMITED into seconds.

    Seconds round up to the next whole minute, as Slurm's resolution is one minute.
    Returns :data:`UNLIMITED` for ``0``/``UNLIMITED``/``INFINITE``/``-1``.
    """
    raw = text.strip()
    if raw.lower() in _INFINITE_WORDS:
        return UNLIMITED
    if not raw:
        raise TimeSpecError("empty time specification")
    days = hours = minutes = seconds = 0
    if "-" in raw:
        day_part, _, rest = raw.partition("-")
        days = _int(day_part, text)
        fields = rest.split(":") if rest else []
        if len(fields) > 3 or not fields:
            raise TimeSpecError(f"invalid time specification {text!r}")
        values = [_int(f, text) for f in fields] + [0] * (3 - len(fields))
        hours, minutes, seconds = values
    else:
        fields = raw.split(":")
        if len(fields) == 3:
            hours, minutes, seconds = (_int(f, text) for f in fields)
        elif len(fields) == 2:
            minutes, seconds = (_int(f, text) for f in fields)
        elif len(fields) == 1:
            minutes = _int(fields[0], text)
        else:
            raise TimeSpecError(f"invalid time specification {text!r}")
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    return (total + 59) // 60 * 60


def _split(seconds: int) -> tuple[int, int, int, int]:
    days, rem = divmod(max(0, int(seconds)), 86400)
    h, rem = divmod(rem, 3600)
    m, s = divmod(rem, 60)
    return days, h, m, s


def format_duration(seconds: int) -> str:
    """sacct/scontrol style: ``HH:MM:SS`` or ``D-HH:MM:SS``."""
    days, h, m, s = _split(seconds)
    if days:
        return f"{days}-{h:02d}:{m:02d}:{s:02d}"
    return f"{h:02d}:{m:02d}:{s:02d}"


def format_squeue_time(seconds: int) -> str:
    """squeue %M/%l style: ``M:SS``, ``H:MM:SS`` or ``D-HH:MM:SS``."""
    days, h, m, s = _split(seconds)
    if days:
        return f"{days}-{h:02d}:{m:02d}:{s:02d}"
    if h:
        return f"{h}:{m:02d}:{s:02d}"
    return f"{m}:{s:02d}"


def format_limit(seconds: int | None) -> str:
    """A time limit as squeue prints it (UNLIMITED for 0)."""
    if seconds is None:
        return "NOT_SET"
    if seconds == UNLIMITED:
        return "UNLIMITED"
    return format_squeue_time(seconds)


def format_utc(epoch: int) -> str:
    """``epoch`` as Slurm writes a moment (``YYYY-MM-DDTHH:MM:SS``), in UTC (the core has no time zone)."""
    days, secs = divmod(int(epoch), 86400)
    z = days + 719468                      # civil date from days since 1970-01-01 (H. Hinnant's algorithm)
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day, month = doy - (153 * mp + 2) // 5 + 1, mp + 3 if mp < 10 else mp - 9
    year = yoe + era * 400 + (month <= 2)
    return f"{year:04d}-{month:02d}-{day:02d}T{secs // 3600:02d}:{secs % 3600 // 60:02d}:{secs % 60:02d}"


def parse_utc(text: str) -> int:
    """``YYYY-MM-DDTHH:MM:SS`` (as sacct writes a moment) read as UTC: seconds since the epoch; ValueError
    when it is not one (sacct writes ``Unknown`` or ``None`` for a moment that did not happen)."""
    date, sep, clock = text.strip().partition("T")
    parts = date.split("-")
    hms = clock.split(":")
    if not sep or len(parts) != 3 or len(hms) != 3 or not all(p.isdecimal() for p in parts + hms):
        raise ValueError(f"not a moment: {text!r} (expected YYYY-MM-DDTHH:MM:SS)")
    y, m, d = (int(p) for p in parts)
    if not (1 <= m <= 12 and 1 <= d <= 31):
        raise ValueError(f"not a moment: {text!r}")
    y -= m <= 2
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m - 3 if m > 2 else m + 9) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    days = era * 146097 + doe - 719468
    return days * 86400 + int(hms[0]) * 3600 + int(hms[1]) * 60 + int(hms[2])
