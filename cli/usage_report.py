"""``rota report usage``: CPU and GPU hours per account and user over a period, from the projection
(sreport's cluster AccountUtilizationByUser, in hours), as a table, ``-P`` lines or a Parquet file.

    rota report usage [-S START] [-E END] [-P] [--parquet FILE]
"""
from __future__ import annotations

import os
import time
from typing import Any

from .options import NO, REQUIRED, OptionError, parse, table

OPTIONS = table(("S", "start starttime", REQUIRED, "start"), ("E", "end endtime", REQUIRED, "end"),
                ("P", "parsable2", NO, "parsable"), ("", "parquet", REQUIRED, "parquet"), ("h", "help", NO, "help"))
USAGE = ("Usage: rota report usage [-S START] [-E END] [-P] [--parquet FILE]\n"
         "  CPU and GPU hours per account and user between START (default: the beginning) and END (default: now);\n"
         "  times as sacct takes them (2026-12-01, 2026-12-01T08:00, now-7days, midnight...).\n")
HEADER = ("Account", "User", "CPU hours", "GPU hours", "Jobs")


def run(argv: list[str], out: Any, err: Any, db: str | None = None, uid: int | None = None,
        only_uid: int | None = None) -> int:
    """The report for ``argv`` (after ``usage``); ``db`` given: run by the controller for ``uid``, who then
    may not write files, and sees only its own rows when ``only_uid`` is set."""
    from rota.projections import queries
    from rota.wire.paths import projections_db

    from .timespec import MomentError, parse_moment

    try:
        o, operands = parse("rota report usage", argv, OPTIONS)
    except OptionError as exc:
        err.write(f"{exc}\n{USAGE}")
        return 1
    if o.get("help"):
        out.write(USAGE)
        return 0
    if operands:
        err.write(f"rota report usage: unexpected argument {operands[0]!r}\n{USAGE}")
        return 1
    now = time.time()
    try:
        start = parse_moment(o["start"], now) if o.get("start") else 0
        end = parse_moment(o["end"], now) if o.get("end") else int(now)
    except MomentError as exc:
        err.write(f"rota report usage: invalid time {exc}: use YYYY-MM-DD[THH:MM[:SS]], MM/DD, now-N(days|hours), "
                  "midnight...\n")
        return 1
    if end <= start:
        err.write("rota report usage: the end (-E) must be after the start (-S)\n")
        return 1
    path = db or projections_db()
    if not os.access(path, os.R_OK):
        if db is None:
            if o.get("parquet"):
                err.write(f"rota report usage: --parquet writes a file here, but the projection {path} is not "
                          "readable by you: run it as its owner, or without --parquet\n")
                return 1
            from .client import remote_command

            return remote_command("report", argv, out, err, prog="rota report usage")
        err.write(f"rota report usage: no rota accounting at {path}; is `rota up` running?\n")
        return 1
    if db is not None and o.get("parquet"):
        err.write("rota report usage: --parquet is for those who can read the projection themselves\n")
        return 1
    try:
        conn = queries.connect(path)
        rows = [tuple(r) for r in queries.usage(conn, start, end, int(now), only_uid)]
    except queries.Error as exc:
        err.write(f"rota report usage: cannot read the projection {path}: {exc}\n")
        return 1
    if o.get("parquet"):
        _write_parquet(o["parquet"], rows, start, end)
        out.write(f"{o['parquet']}: {len(rows)} rows\n")
        return 0
    out.write("".join(line + "\n" for line in render(rows, start, end, bool(o.get("parsable")))))
    return 0


def _write_parquet(path: str, rows: list[tuple], start: int, end: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = {"account": [r[0] for r in rows], "user": [r[1] for r in rows],
            "cpu_seconds": pa.array([r[2] for r in rows], pa.int64()),
            "gpu_seconds": pa.array([r[3] for r in rows], pa.int64()), "jobs": pa.array([r[4] for r in rows], pa.int64()),
            "period_start": pa.array([start] * len(rows), pa.int64()),
            "period_end": pa.array([end] * len(rows), pa.int64())}
    pq.write_table(pa.table(cols), path)


def render(rows: list[tuple], start: int, end: int, parsable: bool) -> list[str]:
    """The report's lines: per (account, user), and each account's total."""
    lines = [(acct or "(none)", user, f"{cpu / 3600:.2f}", f"{gpu / 3600:.2f}", str(n)) for acct, user, cpu, gpu, n in rows]
    if parsable:
        return ["|".join(HEADER)] + ["|".join(line) for line in lines]
    totals: dict[str, list[float]] = {}
    for acct, _user, cpu, gpu, _n in rows:
        t = totals.setdefault(acct or "(none)", [0, 0])
        t[0] += cpu
        t[1] += gpu
    when = ("from the start" if start == 0 else time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(start))) + \
        " to " + time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(end))
    out = [f"Usage by account and user {when} (CPU and GPU hours)",
           f"{'Account':<16} {'User':<12} {'CPU hours':>12} {'GPU hours':>12} {'Jobs':>8}",
           f"{'-' * 16} {'-' * 12} {'-' * 12} {'-' * 12} {'-' * 8}"]
    for i, line in enumerate(lines):
        out.append(f"{line[0]:<16} {line[1]:<12} {line[2]:>12} {line[3]:>12} {line[4]:>8}")
        if i + 1 == len(lines) or lines[i + 1][0] != line[0]:
            t = totals[line[0]]
            out.append(f"{line[0]:<16} {'(all)':<12} {t[0] / 3600:>12.2f} {t[1] / 3600:>12.2f} {'':>8}")
    return out
