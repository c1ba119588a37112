"""``sprio``: each pending job's priority and the weighted factors it is made of, in sprio's layout.

    sprio [-j jobs] [-u users] [-p partitions] [-l] [-w] [-h]
"""
from __future__ import annotations

import sys

from .options import NO, REQUIRED, read_command_line, table

OPTIONS = table(
    ("j", "jobs", REQUIRED, "jobs"), ("u", "user", REQUIRED, "users"), ("p", "partition", REQUIRED, "partitions"),
    ("l", "long", NO, "long"), ("w", "weights", NO, "weights"), ("h", "noheader", NO, "noheader"),
    ("", "help", NO, "help"), ("", "usage", NO, "usage"), ("V", "version", NO, "version"),
    ("v", "verbose", NO, "verbose"), ("M", "clusters", REQUIRED, "clusters"))
# (header, width, left-justified); factor index in the reply's factors, or a field of the row
SHORT = (("JOBID", 15, False, "job_id"), ("PARTITION", 9, True, "partition"), ("PRIORITY", 10, False, 0),
         ("SITE", 10, False, "site"), ("AGE", 10, False, 1), ("FAIRSHARE", 10, False, 2), ("JOBSIZE", 10, False, 3),
         ("PARTITION", 10, False, 4), ("QOS", 10, False, 5))
LONG = (("JOBID", 15, False, "job_id"), ("PARTITION", 9, True, "partition"), ("USER", 8, False, "user"),
        ("ACCOUNT", 10, False, "account"), ("PRIORITY", 10, False, 0), ("SITE", 10, False, "site"),
        ("AGE", 10, False, 1), ("ASSOC", 10, False, "assoc"), ("FAIRSHARE", 10, False, 2),
        ("JOBSIZE", 10, False, 3), ("PARTITION", 10, False, 4), ("QOS", 10, False, 5), ("NICE", 6, False, 6))
WEIGHTS = {"site": 1, 1: "age", 2: "fairshare", 3: "job_size", 4: "partition", 5: "qos"}


def _fit(text: str, width: int, left: bool) -> str:
    text = text[: width - 1] + "+" if len(text) > width else text
    return text.ljust(width) if left else text.rjust(width)


def render(reply: dict, o: dict) -> list[str]:
    """sprio's lines for the jobs the options select (and the weights with -w)."""
    cols = LONG if o.get("long") else SHORT
    out: list[str] = []
    if not o.get("noheader"):
        out.append(" ".join(_fit(h, w, left) for h, w, left, _k in cols))
    if o.get("weights"):
        weights = reply["weights"]
        cells = []
        for _head, w, left, key in cols:
            if key == "job_id":
                cells.append(_fit("Weights", w, left))
            elif key == "site":
                cells.append(_fit("1", w, left))
            elif isinstance(key, int) and key in WEIGHTS:
                cells.append(_fit(str(weights.get(WEIGHTS[key], 0)), w, left))
            else:
                cells.append(_fit("", w, left))
        out.append(" ".join(cells).rstrip())
        return out
    jobs = {j for j in (o.get("jobs") or "").split(",") if j}
    users = {u for u in (o.get("users") or "").split(",") if u}
    parts = {p for p in (o.get("partitions") or "").split(",") if p}
    for row in sorted(reply["rows"], key=lambda r: r["job_id"]):
        if (jobs and str(row["job_id"]) not in jobs) or (users and row["user"] not in users) or \
                (parts and row["partition"] not in parts):
            continue
        values = {"job_id": str(row["job_id"]), "partition": row["partition"], "user": row["user"],
                  "account": row["account"], "site": "0", "assoc": "0"}
        out.append(" ".join(_fit(values[k] if isinstance(k, str) else str(row["factors"][k]), w, left)
                            for _h, w, left, k in cols))
    return out


def main(argv: list[str] | None = None) -> int:
    read = read_command_line("sprio", sys.argv[1:] if argv is None else argv, OPTIONS)
    if isinstance(read, int):
        return read
    o, _operands = read
    from .client import ask

    reply = ask("sprio", "priorities", {})
    if reply is None:
        return 1
    lines = render(reply, o)
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
