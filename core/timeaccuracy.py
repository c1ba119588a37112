"""How honest ``--time`` is (pure): requested against used, per account and user, and a limit to suggest.

Backfill can only use a gap if jobs say how long they run; a limit padded to the partition's maximum makes
every job look long. From ended runs (limit asked, time used) this says, per account and user, how much of
what they asked for they used, how many jobs used under half of it, and what limit their own history
suggests: the 90th percentile of their runs' times, with a fifth more for safety, in whole 5 minutes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

MARGIN = 1.2          # the suggested limit's safety over the 90th percentile of the runs
ROUND = 300           # suggested limits are whole 5 minutes


@dataclass(frozen=True, slots=True)
class Accuracy:
    account: str
    user: str
    jobs: int
    requested_hours: float
    used_hours: float
    used_share: float          # used / requested, all jobs together
    median_share: float        # the median job's used / requested
    under_half: float          # share of jobs that used under half their limit
    suggested: int             # seconds: a limit their own history suggests


def _median(values: list[float]) -> float:
    s = sorted(values)
    n = len(s)
    return (s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2) if n else 0.0


def suggest(used: Iterable[int]) -> int:
    """A limit for jobs that ran ``used`` seconds: their 90th percentile x 1.2, rounded up to 5 minutes (0: none)."""
    s = sorted(u for u in used if u > 0)
    if not s:
        return 0
    p90 = s[min(len(s) - 1, (len(s) * 9 + 9) // 10 - 1)]
    return max(ROUND, -(-int(p90 * MARGIN) // ROUND) * ROUND)


def accuracy(rows: Iterable[tuple[str, str, int, int]]) -> list[Accuracy]:
    """Per (account, user), from ended runs as (account, user, limit asked in seconds, seconds used); runs without
    a limit are left out. Ordered by the hours asked for and not used, most first."""
    by: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for account, user, limit, used in rows:
        if limit and limit > 0:
            by.setdefault((account or "", user or ""), []).append((limit, max(0, used or 0)))
    out = []
    for (account, user), runs in by.items():
        asked = sum(limit for limit, _ in runs)
        spent = sum(min(used, limit) for limit, used in runs)
        shares = [min(1.0, used / limit) for limit, used in runs]
        out.append(Accuracy(account, user, len(runs), round(asked / 3600, 2), round(spent / 3600, 2),
                            round(spent / asked, 3) if asked else 0.0, round(_median(shares), 3),
                            round(sum(1 for s in shares if s < 0.5) / len(runs), 3), suggest(u for _, u in runs)))
    return sorted(out, key=lambda a: (-(a.requested_hours - a.used_hours), a.account, a.user))
