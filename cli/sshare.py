"""``sshare``: the account tree's shares, decayed usage and fair-share factors, in sshare's layout.

    sshare [-a] [-l] [-A accounts] [-u users] [-n] [-P|-p]
"""
from __future__ import annotations

import sys

from .options import NO, REQUIRED, read_command_line, table

OPTIONS = table(
    ("a", "all", NO, "all"), ("l", "long", NO, "long"), ("A", "accounts", REQUIRED, "accounts"),
    ("u", "users", REQUIRED, "users"), ("n", "noheader", NO, "noheader"), ("P", "parsable2", NO, "parsable2"),
    ("p", "parsable", NO, "parsable"), ("h", "help", NO, "help"), ("", "usage", NO, "usage"),
    ("V", "version", NO, "version"), ("v", "verbose", NO, "verbose"), ("M", "clusters", REQUIRED, "clusters"))
# (header, width, left-justified values)
COLUMNS = {"account": ("Account", 20, True), "user": ("User", 10, False), "raw_shares": ("RawShares", 10, False),
           "norm_shares": ("NormShares", 11, False), "raw_usage": ("RawUsage", 11, False),
           "norm_usage": ("NormUsage", 11, False), "effective_usage": ("EffectvUsage", 13, False),
           "factor": ("FairShare", 10, False), "level_fs": ("LevelFS", 10, False),
           "grp_tres_mins": ("GrpTRESMins", 30, False), "run_mins": ("TRESRunMins", 30, False)}
SHORT = ("account", "user", "raw_shares", "norm_shares", "raw_usage", "effective_usage", "factor")
LONG = ("account", "user", "raw_shares", "norm_shares", "raw_usage", "norm_usage", "effective_usage", "factor",
        "level_fs", "grp_tres_mins", "run_mins")


def cell(row: dict, key: str) -> str:
    """One value as sshare prints it."""
    v = row[key]
    root = row["account"] == "root" and not row["user"]
    if key == "account":
        return " " * row["depth"] + v
    if key == "raw_shares":
        return "" if root else str(v)
    if key in ("norm_shares", "norm_usage", "effective_usage"):
        return f"{v:.6f}"
    if key == "factor":
        return f"{v:.6f}" if row["user"] else ""
    if key == "level_fs":
        return "" if root else "inf" if v is None else f"{v:.6f}"
    if key == "grp_tres_mins":
        return ",".join(f"{k}={n}" for k, n in sorted(v.items()))
    if key == "run_mins":
        return "" if row["user"] else f"cpu={v[0]},gres/gpu={v[1]}"
    return str(v)


def render(reply: dict, o: dict) -> list[str]:
    """sshare's lines for the rows the options select."""
    accounts = {a for a in (o.get("accounts") or "").split(",") if a}
    users = {u for u in (o.get("users") or "").split(",") if u}
    everyone = o.get("all") or bool(users)
    rows = []
    for row in reply["rows"]:
        if row["user"]:
            if not everyone and row["user"] != reply["caller"]:
                continue
            if users and row["user"] not in users:
                continue
        if accounts and row["account"] not in accounts and not (row["account"] == "root" and not row["user"]):
            continue
        rows.append(row)
    keys = LONG if o.get("long") else SHORT
    out: list[str] = []
    sep = "|" if o.get("parsable2") or o.get("parsable") else None
    if sep is not None:
        tail = "|" if o.get("parsable") else ""
        if not o.get("noheader"):
            out.append("|".join(COLUMNS[k][0] for k in keys) + tail)
        out += ["|".join(cell(r, k) for k in keys) + tail for r in rows]
        return out
    if not o.get("noheader"):
        out.append(" ".join(COLUMNS[k][0].rjust(COLUMNS[k][1]) for k in keys))
        out.append(" ".join("-" * COLUMNS[k][1] for k in keys))
    for r in rows:
        parts = []
        for k in keys:
            _head, width, left = COLUMNS[k]
            text = cell(r, k)
            text = text[: width - 1] + "+" if len(text) > width else text
            parts.append(text.ljust(width) if left else text.rjust(width))
        out.append(" ".join(parts))
    return out


def main(argv: list[str] | None = None) -> int:
    read = read_command_line("sshare", sys.argv[1:] if argv is None else argv, OPTIONS)
    if isinstance(read, int):
        return read
    o, _operands = read
    from .client import ask

    reply = ask("sshare", "shares", {})
    if reply is None:
        return 1
    sys.stdout.write("".join(line + "\n" for line in render(reply, o)))
    return 0


def main_exit() -> None:
    from .exits import exit_with

    exit_with(main)


if __name__ == "__main__":
    main_exit()
