"""``squeue``: the queue in Slurm's layouts (default, ``-l``, ``-o``, ``-O``, ``--start``; ``-j -u -p -t --me -h``).

A hot command: it reads its options, asks the controller for the rendered rows (the controller
keeps the queue and renders it, see :mod:`rota.controller.squeue_view`) and writes them.
"""
from __future__ import annotations

import sys

from .options import NO, OPTIONAL, REQUIRED, OptionError, read_command_line, table, unsupported

OPTIONS = table(
    ("A", "account", REQUIRED, "!account"), ("a", "all", NO, "all"), ("r", "array", NO, "array"),
    ("", "array-unique", NO, "!array-unique"), ("", "federation", NO, "~federation"), ("h", "noheader", NO, "noheader"),
    ("", "help", NO, "help"), ("", "hide", NO, "~hide"), ("i", "iterate", REQUIRED, "!iterate"),
    ("j", "jobs", OPTIONAL, "jobs"), ("", "local", NO, "local"), ("l", "long", NO, "long"),
    ("L", "licenses", REQUIRED, "!licenses"), ("M", "clusters", REQUIRED, "clusters"), ("", "me", NO, "me"),
    ("n", "name", REQUIRED, "names"), ("", "noconvert", NO, "noconvert"), ("w", "nodelist", REQUIRED, "nodelist"),
    ("o", "format", REQUIRED, "format"), ("O", "Format", REQUIRED, "Format"), ("p", "partition", REQUIRED, "partitions"),
    ("P", "priority", NO, "!priority"), ("q", "qos", REQUIRED, "!qos"), ("R", "reservation", REQUIRED, "!reservation"),
    ("", "sibling", NO, "~sibling"), ("S", "sort", REQUIRED, "sort"), ("", "start", NO, "start"),
    ("t", "states", REQUIRED, "states"), ("s", "steps", OPTIONAL, "steps"), ("u", "user", REQUIRED, "users"),
    ("", "usage", NO, "usage"), ("v", "verbose", NO, "verbose"), ("V", "version", NO, "version"),
    ("", "json", NO, "!json"), ("", "yaml", NO, "!yaml"))


def main(argv: list[str] | None = None) -> int:
    read = read_command_line("squeue", sys.argv[1:] if argv is None else argv, OPTIONS)
    if isinstance(read, int):
        return read
    o, operands = read
    try:
        for warning in unsupported("squeue", o):
            print(warning, file=sys.stderr)
    except OptionError as exc:
        print(exc, file=sys.stderr)
        return 1
    if operands:   # squeue takes no operands; Slurm's squeue reads a lone one as a job list
        o["jobs"] = ",".join(([str(o["jobs"])] if isinstance(o.get("jobs"), str) else []) + list(operands))
    if o.get("jobs") is True:
        o.pop("jobs")
    request = {k: v for k, v in o.items() if k in ("jobs", "users", "partitions", "states", "format", "Format",
                                                   "noheader", "long", "start", "me", "names", "nodelist", "array", "sort",
                                                   "clusters", "steps")}
    from .client import NoCluster, request as send

    try:
        reply = send("squeue", request)
    except NoCluster as exc:
        print(f"squeue: error: {exc}", file=sys.stderr)
        return 1
    if not reply.get("ok"):
        lines = reply.get("error") or ["unknown error"]
        for line in lines:   # squeue's own errors carry their prefix; the controller's do not
            print(line if line.startswith(("squeue:", "slurm_")) else f"squeue: error: {line}", file=sys.stderr)
        return 1
    if o.get("long") and not o.get("format") and not o.get("Format") and not o.get("noheader"):
        import time

        print(time.strftime("%a %b %d %H:%M:%S %Y"))
    sys.stdout.write(reply["text"])
    return 0


def main_exit() -> None:
    from .exits import exit_with

    exit_with(main)


if __name__ == "__main__":
    main_exit()
