"""Signal names and ``--signal`` specifications, as Slurm reads them (Linux numbering; pure)."""
from __future__ import annotations

from typing import NamedTuple

SIGNALS = {"HUP": 1, "INT": 2, "QUIT": 3, "ABRT": 6, "KILL": 9, "USR1": 10, "USR2": 12, "PIPE": 13, "ALRM": 14,
           "TERM": 15, "CONT": 18, "STOP": 19, "TSTP": 20, "URG": 23, "XCPU": 24, "XFSZ": 25, "VTALRM": 26,
           "PROF": 27, "WINCH": 28, "IO": 29, "PWR": 30, "SYS": 31}
DEFAULT_WARNING = 60      # seconds before the time limit when ``--signal`` names none


def signal_number(name: str) -> int | None:
    """A signal's number from its name (``USR1``, ``SIGUSR1``) or number; None for no such signal."""
    t = name.strip().upper().removeprefix("SIG")
    if t.isdecimal():
        n = int(t)
        return n if 1 <= n <= 64 else None
    return SIGNALS.get(t)


class Warning(NamedTuple):
    """``--signal=[{R|B}:]SIG[@SECONDS]``: which signal, how long before the limit, to whom."""

    signal: int
    before: int
    batch_only: bool          # B: only the batch shell; otherwise the steps (not the batch shell)


def parse_warning(text: str) -> Warning:
    """Read a ``--signal`` value; raises ValueError saying what is wrong."""
    spec = text
    batch = False
    head, sep, rest = spec.partition(":")
    if sep:
        if not head or any(c not in "BRbr" for c in head):
            raise ValueError(f"invalid --signal specification: {text!r} (use [{{R|B}}:]SIG[@SECONDS], e.g. USR2@90)")
        batch, spec = "B" in head.upper(), rest
    name, at, secs = spec.partition("@")
    sig = signal_number(name)
    if sig is None:
        raise ValueError(f"invalid --signal specification: {text!r}: no signal {name!r}")
    if at and (not secs.isdecimal() or int(secs) > 65535):
        raise ValueError(f"invalid --signal specification: {text!r}: the time must be seconds (0-65535)")
    return Warning(sig, int(secs) if at else DEFAULT_WARNING, batch)
