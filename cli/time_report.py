"""``rota report time-accuracy``: how much of their ``--time`` each account and user used, from the projection,
and the limit their own history suggests (rota.core.timeaccuracy).

    rota report time-accuracy [-S START] [-E END] [-P]
"""
from __future__ import annotations

import os
import time
from typing import Any

from .options import OptionError, parse
from .usage_report import OPTIONS

USAGE = ("Usage: rota report time-accuracy [-S START] [-E END] [-P]\n"
         "  Per account and user, the jobs that ended between START and END: hours asked for (--time) and used,\n"
         "  the median job's share, how many used under half, and the limit their history suggests.\n")
HEADER = ("Account", "User", "Jobs", "Asked hours", "Used hours", "Used", "Median job", "Under half", "Suggested")
QUERY = """SELECT account, user, time_limit, COALESCE(NULLIF(elapsed, 0), end_time - start) FROM jobs
           WHERE start > 0 AND end_time >= :start AND end_time < :end AND end_time > 0{mine}"""


def run(argv: list[str], out: Any, err: Any, db: str | None = None, uid: int | None = None,
        only_uid: int | None = None) -> int:
    """The report for ``argv`` (after ``time-accuracy``); ``db`` given: run by the controller for ``uid``, who
    sees only its own jobs when ``only_uid`` is set."""
    from rota.core.timeaccuracy import accuracy
    from rota.projections import queries
    from rota.wire.paths import projections_db

    from .timespec import MomentError, parse_moment

    try:
        o, operands = parse("rota report time-accuracy", argv, OPTIONS)
        now = time.time()
        start = parse_moment(o["start"], now) if o.get("start") else 0
        end = parse_moment(o["end"], now) if o.get("end") else int(now) + 1
    except OptionError as exc:
        err.write(f"{exc}\n{USAGE}")
        return 1
    except MomentError as exc:
        err.write(f"rota report time-accuracy: invalid time {exc}: use YYYY-MM-DD[THH:MM[:SS]], now-N(days|hours)...\n")
        return 1
    if o.get("help") or operands:
        (out if o.get("help") else err).write(USAGE)
        return 0 if o.get("help") else 1
    path = db or projections_db()
    if not os.access(path, os.R_OK):
        if db is None:
            from .client import remote_command

            return remote_command("report", ["time-accuracy", *argv], out, err, prog="rota report time-accuracy")
        err.write(f"rota report time-accuracy: no rota accounting at {path}; is `rota up` running?\n")
        return 1
    try:
        conn = queries.connect(path)
        rows = conn.execute(QUERY.format(mine="" if only_uid is None else " AND uid = :uid"),
                            {"start": start, "end": end, "uid": only_uid}).fetchall()
    except queries.Error as exc:
        err.write(f"rota report time-accuracy: cannot read the projection {path}: {exc}\n")
        return 1
    out.write("".join(line + "\n" for line in render(accuracy(tuple(r) for r in rows), bool(o.get("parsable")))))
    return 0


def render(rows: list, parsable: bool) -> list[str]:
    from rota.core.timefmt import format_duration

    cells = [(a.account or "(none)", a.user, str(a.jobs), f"{a.requested_hours:.2f}", f"{a.used_hours:.2f}",
              f"{a.used_share:.0%}", f"{a.median_share:.0%}", f"{a.under_half:.0%}", format_duration(a.suggested))
             for a in rows]
    if parsable:
        return ["|".join(HEADER)] + ["|".join(c) for c in cells]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(HEADER)]
    line = lambda c: " ".join(v.ljust(w) if i < 2 else v.rjust(w) for i, (v, w) in enumerate(zip(c, widths)))  # noqa: E731
    return [line(HEADER), " ".join("-" * w for w in widths), *(line(c) for c in cells)]
