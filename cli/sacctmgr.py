"""``sacctmgr``: accounts, users' associations and QOS, in sacctmgr's common syntax.

    sacctmgr [-i] [-n] [-p|-P] add|modify|delete|show account|user|qos|assoc [NAMES] [where K=V ...]
             [set K=V ...] [format=F,...]

Changes are events on the log (``accounting.changed``), made by administrators; anyone may show.
"""
from __future__ import annotations

import sys
from typing import Any, Callable

from rota.wire.formats import Column, fixed_table
from .options import VERSION_LINE

OPS = {"add": "add", "create": "add", "modify": "modify", "update": "modify", "delete": "delete",
       "remove": "delete", "show": "show", "list": "show"}
ENTITIES = {"account": "account", "accounts": "account", "user": "user", "users": "user", "qos": "qos",
            "assoc": "assoc", "association": "assoc", "associations": "assoc"}
USAGE = """\
sacctmgr [<OPTION>] [<COMMAND>]
    Valid <OPTION> values are:
     -h or --help: equivalent to "help" command
     -i or --immediate: commit changes immediately (rota: every change is committed at once)
     -n or --noheader: no header will be added to the beginning of output
     -p or --parsable: output will be '|' delimited with a '|' at the end
     -P or --parsable2: output will be '|' delimited without a '|' at the end
     -V or --version: print the version of the commands ("slurm 22.05.x")

    Valid <COMMAND> values are:
     add <ENTITY> <SPECS>     add entity (also: create)
     delete <ENTITY> where <SPECS>
                              delete the specified entity(s) (also: remove)
     list <ENTITY> [<SPECS>]  display info of the specified entity (also: show)
     modify <ENTITY> where <SPECS> set <SPECS>
                              modify entity (also: update)
     help                     show this page

    <ENTITY> may be "account", "association", "qos" or "user".
    rota keeps one cluster: "modify cluster" and the other cluster, coordinator, event, federation,
    problem, reservation, resource, runawayjobs, transaction, tres and wckey entities are refused.

    <SPECS> are different for each command entity pair:
       add account     - Name=, Description=, Organization=, Parent=, and the limits below
       add user        - Name=, Account=, DefaultAccount=, AdminLevel=, and the limits below
       add qos         - Name=, Priority=, MaxJobsPerUser=, MaxSubmitJobsPerUser=, MaxTRESPerUser=,
                         MaxTRESPerJob=, MaxWall=, GrpTRES=, GrpJobs=, Preempt=, PreemptMode=, GraceTime=
       list associations - Accounts=, Users=, and Format=
       modify account, user or qos - where <SPECS> as above, set <SPECS> as above
       delete account, user or qos - Name= (delete qos removes it from every association)
     limits: Fairshare=, GrpJobs=, GrpSubmitJobs=, GrpTRES=, GrpTRESMins=, MaxJobs=,
             MaxSubmitJobs=, MaxTRES=, MaxWall=, QOS=, DefaultQOS=
"""


def _limit(v: Any) -> str:
    return "" if v is None else str(v)


def _wall(v: Any) -> str:
    from rota.core.timefmt import format_duration

    return "" if v is None else format_duration(v)


def _tres(v: dict) -> str:
    return ",".join(f"{k}={n}" for k, n in sorted(v.items()))


def _columns(*fields: tuple[tuple[str, ...], Column]) -> dict[str, Column]:
    """Each field's names (lower case: its own and sacctmgr's short ones) -> its column."""
    return {name: column for names, column in fields for name in names}


def _get(key: str) -> Callable[[dict], str]:
    return lambda r: str(r[key])


# each entity's fields as columns over its records
COLUMNS: dict[str, dict[str, Column]] = {
    "account": _columns((("account",), Column("Account", _get("name"), 10)),
                        (("descr", "description"), Column("Descr", _get("description"), 20)),
                        (("org", "organization"), Column("Org", _get("organization"), 20)),
                        (("parentname", "parent"), Column("Par Name", _get("parent"), 10)),
                        (("share", "fairshare"), Column("Share", _get("fairshare"), 9))),
    "user": _columns((("user",), Column("User", _get("user"), 10)),
                     (("defaultaccount", "defacct"), Column("Def Acct", _get("default"), 10)),
                     (("admin",), Column("Admin", lambda r: "None", 9))),
    "qos": _columns((("name",), Column("Name", _get("name"), 10)),
                    (("priority",), Column("Priority", _get("priority"), 10)),
                    (("maxwall",), Column("MaxWall", lambda r: _wall(r["max_wall"]), 11)),
                    (("maxtrespu", "maxtresperuser"), Column("MaxTRESPU", lambda r: _tres(r["max_tres_per_user"]), 13)),
                    (("maxjobspu", "maxjobsperuser"), Column("MaxJobsPU", lambda r: _limit(r["max_jobs_per_user"]), 9)),
                    (("maxsubmitpu", "maxsubmitjobsperuser"),
                     Column("MaxSubmitPU", lambda r: _limit(r["max_submit_jobs_per_user"]), 11)),
                    (("preempt",), Column("Preempt", lambda r: ",".join(r["preempt"]), 10)),
                    (("preemptmode",), Column("PreemptMode", _get("preempt_mode"), 11)),
                    (("gracetime",), Column("GraceTime", lambda r: _wall(r.get("grace_time", 0)), 10)),
                    (("descr", "description"), Column("Descr", _get("description"), 11))),
    "assoc": _columns((("cluster",), Column("Cluster", _get("cluster"), 10)),
                      (("account",), Column("Account", _get("account"), 10)),
                      (("user",), Column("User", _get("user"), 10)),
                      (("share", "fairshare"), Column("Share", _get("fairshare"), 9)),
                      (("maxjobs",), Column("MaxJobs", lambda r: _limit(r["max_jobs"]), 7)),
                      (("maxsubmit", "maxsubmitjobs"), Column("MaxSubmit", lambda r: _limit(r["max_submit_jobs"]), 9)),
                      (("qos",), Column("QOS", lambda r: ",".join(r["qos"]), 20)),
                      (("defaultqos", "defqos"), Column("Def QOS", _get("default_qos"), 9))),
}
DEFAULT_FORMAT = {"account": "account,descr,org", "user": "user,defaultaccount,admin",
                  "qos": "name,priority,gracetime,preempt,preemptmode,maxwall,maxtrespu,maxjobspu,maxsubmitpu",
                  "assoc": "cluster,account,user,share,maxjobs,maxsubmit,qos,defqos"}
TITLES = {"account": "Account(s)", "user": "User(s)", "qos": "QOS(s)"}


# sacctmgr's flags -> (the setting it changes, its value); ("", None): accepted, changes nothing here
FLAGS: dict[str, tuple[str, Any]] = {
    "-i": ("immediate", True), "--immediate": ("immediate", True), "-n": ("noheader", True),
    "--noheader": ("noheader", True), "-P": ("parsable", "|"), "--parsable2": ("parsable", "|"),
    "-p": ("parsable", "|+"), "--parsable": ("parsable", "|+"),
    **{q: ("", None) for q in ("-Q", "--quiet", "-v", "--verbose")},
}


class Usage(Exception):
    """A command line sacctmgr cannot read (the message is its error line)."""


def parse(argv: list[str]) -> tuple[dict, str, str, list[str], dict[str, str], dict[str, str], str | None]:
    """(flags, op, entity, names, where, values, format) of a sacctmgr command line."""
    flags: dict[str, Any] = {"immediate": False, "noheader": False, "parsable": None}
    words: list[str] = []
    for a in argv:
        flag = FLAGS.get(a)
        if flag is not None:
            if flag[0]:
                flags[flag[0]] = flag[1]
        elif a.startswith("-") and a not in ("-1",):
            raise Usage(f"sacctmgr: error: unrecognized option '{a}'")
        else:
            words.append(a)
    if len(words) < 2:
        raise Usage("sacctmgr: error: give a command and an entity, e.g. sacctmgr show qos")
    op, entity = OPS.get(words[0].lower()), ENTITIES.get(words[1].lower())
    if op is None:
        raise Usage(f"sacctmgr: error: Unknown command: {words[0]} (add, modify, delete or show)")
    if entity is None or (entity == "assoc" and op != "show"):
        raise Usage(f"sacctmgr: error: Unknown entity: {words[1]} (account, user, qos; assoc for show)")
    names, where, values, fmt = _operands(words[2:], op)
    return flags, op, entity, names, where, values, fmt


def _operands(words: list[str], op: str) -> tuple[list[str], dict[str, str], dict[str, str], str | None]:
    """The names, ``where`` conditions, ``set`` values and ``format=`` after the command and entity."""
    names: list[str] = []
    where: dict[str, str] = {}
    values: dict[str, str] = {}
    fmt: str | None = None
    target = values if op == "add" else where
    for w in words:
        low = w.lower()
        if low == "where":
            target = where
        elif low == "set":
            target = values
        elif "=" in w:
            key, _, value = w.partition("=")
            key = key.strip().lower()
            if key == "format":
                fmt = value
            elif key in target and key in ("account", "name"):
                target[key] = f"{target[key]},{value}"
            else:
                target[key] = value
        else:
            names.extend(n for n in w.split(",") if n)
    return names, where, values, fmt


def main(argv: list[str] | None = None, out=None, err=None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help", "--usage"):
        out.write(USAGE)
        return 0
    if args[0] in ("-V", "--version"):
        out.write(VERSION_LINE + "\n")
        return 0
    from .client import NoCluster, request

    try:
        flags, op, entity, names, where, values, fmt = parse(args)
        if op == "show":
            reply = request("acct_show", {})
            if not reply.get("ok"):
                raise Usage(f"sacctmgr: error: {(reply.get('error') or ['unknown error'])[-1]}")
            for line in show(reply, entity, names, where, fmt, flags):
                out.write(line + "\n")
            return 0
        if not flags["immediate"] and sys.stdin.isatty():
            out.write(f" {op.capitalize()} {TITLES[entity]}: {', '.join(names) or where.get('name', '')}\n")
            out.write("Would you like to commit changes? (You have 30 seconds to decide)\n(N/y): ")
            out.flush()
            if sys.stdin.readline().strip().lower() not in ("y", "yes"):
                out.write(" Changes Discarded\n")
                return 0
        reply = request("acct_change", {"op": op, "entity": entity, "names": names, "where": where,
                                        "values": values})
        if not reply.get("ok"):
            lines = reply.get("error") or ["unknown error"]
            prefix = " Error with request: " if reply.get("code") == "accounting" else "sacctmgr: error: "
            err.write(prefix + lines[-1] + "\n")
            return 1
        out.write(_said(op, entity, reply.get("change") or {}))
        return 0
    except Usage as exc:
        err.write(f"{exc}\n")
        return 1
    except NoCluster as exc:
        err.write(f"sacctmgr: error: {exc}\n")
        return 1


def _said(op: str, entity: str, change: dict) -> str:
    """What sacctmgr says it did."""
    verb = {"add": "Adding", "modify": "Modified", "delete": "Deleting"}[op]
    if entity == "account":
        names = [a["name"] for a in change.get("accounts", ())] or list(change.get("deleted_accounts", ()))
    elif entity == "qos":
        names = [q["name"] for q in change.get("qos", ())] or list(change.get("deleted_qos", ()))
    else:
        names = [f"{a['user']} account={a['account']}" for a in change.get("associations", ())] or \
            [f"{u} account={a}" for u, a in change.get("deleted_associations", ())] or \
            [f"{u} default account={a}" for u, a in change.get("default_accounts", {}).items()]
    return f" {verb} {TITLES[entity]}\n" + "".join(f"  {n}\n" for n in names)


def show(reply: dict, entity: str, names: list[str], where: dict[str, str], fmt: str | None,
         flags: dict) -> list[str]:
    """sacctmgr's table (or -p/-P lines) of the records asked for."""
    wanted = set(names) | {n for n in where.get("name", "").split(",") if n}
    if entity == "account":
        rows = [a for a in reply["accounts"] if not wanted or a["name"] in wanted]
    elif entity == "qos":
        rows = [q for q in reply["qos"] if not wanted or q["name"] in wanted]
        if not any(q["name"] == "normal" for q in reply["qos"]) and (not wanted or "normal" in wanted):
            rows.insert(0, {"name": "normal", "priority": 0, "max_wall": None, "max_tres_per_user": {},
                            "max_jobs_per_user": None, "max_submit_jobs_per_user": None, "preempt": [],
                            "preempt_mode": "cluster", "grace_time": 0,
                            "description": "Normal QOS default"})
    elif entity == "user":
        users = sorted({a["user"] for a in reply["associations"]})
        rows = [{"user": u, "default": reply["defaults"].get(u, "")} for u in users if not wanted or u in wanted]
    else:
        in_accounts = {a for a in where.get("account", "").split(",") if a}
        of_users = {u for u in where.get("user", "").split(",") if u} | wanted
        rows = [{**a, "cluster": reply["cluster"]} for a in sorted(reply["associations"],
                                                                  key=lambda a: (a["account"], a["user"]))
                if (not in_accounts or a["account"] in in_accounts) and (not of_users or a["user"] in of_users)]
    table = COLUMNS[entity]
    fields: list[tuple[Column, int, bool]] = []
    for item in (fmt or DEFAULT_FORMAT[entity]).split(","):
        name, _, width = item.strip().partition("%")
        column = table.get(name.lower())
        if column is None:
            raise Usage(f"sacctmgr: error: Unknown field '{name}' (one of: {', '.join(sorted(table))})")
        if width and not width.isdecimal():
            raise Usage(f"sacctmgr: error: bad width in {item!r}")
        fields.append((column, int(width) if width else column.width, False))
    return fixed_table(fields, rows, not flags["noheader"], flags["parsable"])


def main_exit() -> None:
    from .exits import exit_with

    exit_with(main)


if __name__ == "__main__":
    main_exit()
