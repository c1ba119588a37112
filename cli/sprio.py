"""``sprio``: each pending job's priority and the weighted factors it is made of, in sprio's layout.

    sprio [-j jobs] [-u users] [-p partitions] [-l] [-n] [-o format] [-w] [-h] [-v]
"""
from __future__ import annotations

import re
import sys

from .options import NO, REQUIRED, read_command_line, table

OPTIONS = table(
    ("j", "jobs", REQUIRED, "jobs"), ("u", "user", REQUIRED, "users"), ("p", "partition", REQUIRED, "partitions"),
    ("l", "long", NO, "long"), ("w", "weights", NO, "weights"), ("h", "noheader", NO, "noheader"),
    ("", "help", NO, "help"), ("", "usage", NO, "usage"), ("V", "version", NO, "version"),
    ("v", "verbose", NO, "verbose", True), ("M", "clusters", REQUIRED, "clusters"), ("n", "norm", NO, "norm"),
    ("o", "format", REQUIRED, "format"), ("", "local", NO, "~local"), ("", "sibling", NO, "~sibling"))
# letter -> (header, the weight it shows with -w, what a row shows): factor i of the reply's factors
# (0 the priority, 1 age, 2 fair-share, 3 job size, 4 partition, 5 QOS, 6 nice, 7 rota's accuracy); upper case
# weighted, lower case normalized (the factor over its weight). E/e (accuracy) is rota's: shown by default only
# where RotaPriorityWeightAccuracy is set
FACTORS = {"A": ("AGE", "age", 1), "F": ("FAIRSHARE", "fairshare", 2), "J": ("JOBSIZE", "job_size", 3),
           "P": ("PARTITION", "partition", 4), "Q": ("QOS", "qos", 5), "E": ("ACCURACY", "accuracy", 7)}
LONG = "%.15i %9r %.8u %.10Y %.10S %.10A %.10B %.10F %.10J %.10P %.10Q %.11N %.20T"
LONG_NORM = "%.15i %9r %.8u %10y %10a %10b %10f %10j %10p %10q %20t"
_SPEC = re.compile(r"%(\.?)(\d*)([a-zA-Z])")


class FormatError(ValueError):
    pass


def default_format(o: dict, weights: dict) -> str:
    """Slurm's: the job, partition, (user when asked by user), priority, site, then each weighted factor."""
    norm = bool(o.get("norm"))
    if o.get("long"):
        return LONG_NORM if norm else LONG
    fmt = "%.15i %9r" + (" %.8u" if o.get("users") else "") + (" %10y" if norm else " %.10Y %.10S")
    for letter, (_head, key, _i) in FACTORS.items():
        if weights.get(key):
            fmt += f" %10{letter.lower()}" if norm else f" %.10{letter}"
    return fmt


def _cell(letter: str, row: dict | None, weights: dict) -> str:
    """One field: the header (``row`` None), the weights line (``row`` {}), or a job's value."""
    upper = letter.upper()
    if upper in FACTORS:
        head, key, i = FACTORS[upper]
        if row is None:
            return head
        if not row:
            return str(weights.get(key, 0))
        weighted = row["factors"][i] if i < len(row["factors"]) else 0
        return str(weighted) if letter == upper else f"{weighted / weights[key] if weights.get(key) else 0:.7f}"
    head, value = _PLAIN[letter]
    if row is None:
        return head
    if not row:
        return "Weights" if letter == "i" else ("1" if letter == "S" else "")
    return value(row)


_PLAIN = {
    "i": ("JOBID", lambda r: str(r["job_id"])), "r": ("PARTITION", lambda r: r["partition"]),
    "u": ("USER", lambda r: r["user"]), "c": ("CLUSTER", lambda r: r.get("cluster", "")),
    "Y": ("PRIORITY", lambda r: str(r["factors"][0])),
    "y": ("PRIORITY", lambda r: f"{r['factors'][0] / 0xffffffff:16.14f}"),
    "S": ("SITE", lambda r: "0"), "B": ("ASSOC", lambda r: "0"), "b": ("ASSOC", lambda r: f"{0:.7f}"),
    "N": ("NICE", lambda r: str(r["factors"][6]) if len(r["factors"]) > 6 else "0"),
    "T": ("TRES", lambda r: ""), "t": ("TRES", lambda r: ""),
}


def _fit(text: str, width: int, right: bool) -> str:
    """Slurm's sprio cell: cut at the width, padded (right-justified with ``%.N``)."""
    if not width:
        return text
    return (text.rjust(width) if right else text)[:width].ljust(width)


def render_format(fmt: str, rows: list[dict | None], weights: dict) -> list[str]:
    """``fmt``'s line for each row (None: the header; {}: the weights)."""
    pieces: list[tuple[str, str, int, bool]] = []      # (literal before, letter, width, right)
    at = 0
    for m in _SPEC.finditer(fmt):
        if m.group(3) not in _PLAIN and m.group(3).upper() not in FACTORS:
            raise FormatError(f"Invalid job format specification: {m.group(3)}")
        pieces.append((fmt[at:m.start()], m.group(3), int(m.group(2) or 0), bool(m.group(1))))
        at = m.end()
    tail = fmt[at:]
    return ["".join(lit + _fit(_cell(letter, row, weights), width, right) for lit, letter, width, right in pieces) + tail
            for row in rows]


def render(reply: dict, o: dict) -> list[str]:
    """sprio's lines for the jobs the options select (and the weights with -w)."""
    weights = reply["weights"]
    fmt = o.get("format") or default_format(o, weights)
    head: list[dict | None] = [] if o.get("noheader") else [None]
    if o.get("weights"):
        return render_format(fmt, [*head, {}], weights)
    jobs = {j for j in (o.get("jobs") or "").split(",") if j}
    users = {u for u in (o.get("users") or "").split(",") if u}
    parts = {p for p in (o.get("partitions") or "").split(",") if p}
    rows = [row for row in sorted(reply["rows"], key=lambda r: r["job_id"])
            if not ((jobs and str(row["job_id"]) not in jobs) or (users and row["user"] not in users)
                    or (parts and row["partition"] not in parts))]
    return render_format(fmt, [*head, *rows], weights)


def settings(o: dict) -> list[str]:
    """``-v``: the options sprio runs with, as Slurm's sprio prints them."""
    return ["-----------------------------", f"format     = {o.get('format') or '(null)'}",
            f"job_flag   = {1 if o.get('jobs') else 0}", f"jobs       = {o.get('jobs') or '(null)'}",
            f"partition  = {o.get('partitions') or '(null)'}", f"users      = {o.get('users') or '(null)'}",
            f"verbose    = {len(o['verbose']) if isinstance(o.get('verbose'), list) else int(bool(o.get('verbose')))}",
            "-----------------------------", "", ""]


def main(argv: list[str] | None = None) -> int:
    read = read_command_line("sprio", sys.argv[1:] if argv is None else argv, OPTIONS)
    if isinstance(read, int):
        return read
    o, _operands = read
    from .client import ask

    reply = ask("sprio", "priorities", {})
    if reply is None:
        return 1
    if o.get("verbose"):
        sys.stdout.write("".join(line + "\n" for line in settings(o)))
    try:
        lines = render(reply, o)
    except FormatError as exc:
        print(f"sprio: error: {exc}", file=sys.stderr)
        return 1
    if (o.get("jobs") or o.get("users")) and len(lines) == (0 if o.get("noheader") else 1) and not o.get("weights"):
        print("Unable to find jobs matching user/id(s) specified", file=sys.stderr)
        return 1
    sys.stdout.write("".join(line + "\n" for line in lines))
    return 0


def main_exit() -> None:
    from .exits import exit_with

    exit_with(main)


if __name__ == "__main__":
    main_exit()
