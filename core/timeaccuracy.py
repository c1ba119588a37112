"""How honest ``--time`` is (pure): requested against used, per account and user, and a limit to suggest.

Backfill can only use a gap if jobs say how long they run; a limit padded to the partition's maximum makes
every job look long. From ended runs (limit asked, time used) this says, per account and user, how much of
what they asked for they used, how many jobs used under half of it, and what limit their own history
suggests: the 90th percentile of their runs' times, with a fifth more for safety, in whole 5 minutes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from .timefmt import format_duration

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


# What the log keeps of honest limits, folded by the reducer (so a replay gives the same figures): per (user,
# account), how much of its limit each run used, averaged with each new run weighing 1/2**SHIFT (the priority
# factor for accurate estimates); per user and job name, the times of its last RUNS_KEPT completed runs (a
# suggested ``--time``), for the NAMES_KEPT names each user ran last (names made unique per job would grow it
# with every job).
SHIFT = 3
RUNS_KEPT = 20
NAMES_KEPT = 100
PPM = 1_000_000
HINT_RATIO = 2        # sbatch hints when the limit asked is over this many times the suggested one
HINT_RUNS = 3         # ... and the suggestion rests on at least this many runs


Runs = dict[str, dict[str, list[int]]]     # user -> job name (the last run last) -> its runs' times


def record_run(accuracy: dict[tuple[str, str], list[int]], runs: Runs,
               user: str, account: str, name: str, limit: int, used: int, timed_out: bool) -> None:
    """A run that ended by itself (completed, or killed at its limit) with ``limit`` asked and ``used`` seconds."""
    if limit <= 0:
        return
    share = PPM if timed_out or used >= limit else max(0, used) * PPM // limit
    key = (user, account)
    entry = accuracy.get(key)
    if entry is None:
        accuracy[key] = [share, 1]
    else:
        entry[0] += (share - entry[0]) >> SHIFT
        entry[1] += 1
    if timed_out or used <= 0:
        return
    names = runs.get(user)
    if names is None:
        names = runs[user] = {}
    kept = names.pop(name, None)
    if kept is None:
        kept = [used]
        if len(names) >= NAMES_KEPT:
            del names[next(iter(names))]
    else:
        kept.append(used)
        if len(kept) > RUNS_KEPT:
            del kept[0]
    names[name] = kept


def accuracy_ppm(accuracy: dict[tuple[str, str], list[int]], user: str, account: str) -> int:
    """The association's accuracy in parts per million: 1.0 until it has a run that ended by itself."""
    entry = accuracy.get((user, account))
    return entry[0] if entry is not None else PPM


def suggested_limit(runs: Runs, user: str, name: str) -> tuple[int, int]:
    """(a limit the user's own completed runs of jobs with this name suggest, how many runs it rests on);
    (0, 0) without history."""
    kept = runs.get(user, {}).get(name)
    return (suggest(kept), len(kept)) if kept else (0, 0)


def hint(runs: Runs, user: str, name: str, limit: int | None) -> str:
    """A line for sbatch when ``limit`` is far over what the user's history of this job suggests ('' otherwise)."""
    suggested, n = suggested_limit(runs, user, name)
    if not suggested or n < HINT_RUNS or limit is None or limit <= HINT_RATIO * suggested:
        return ""
    return (f"your last {n} runs of {name!r} suggest --time={format_duration(suggested)} (asked {format_duration(limit)}); "
            "a shorter limit lets backfill start it sooner (--time=auto uses the suggestion)")

