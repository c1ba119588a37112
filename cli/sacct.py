"""``sacct``: accounting from the projection database (no daemon round trip, no heavy imports)."""
from __future__ import annotations

import os
import sys
import time
from operator import itemgetter

from rota.core.timefmt import format_duration
from rota.projections import queries
from rota.wire.formats import Column, fixed_table, memory, timestamp

from rota.wire.clusters import unknown
from .options import NO, OPTIONAL, REQUIRED, OptionError, parse, unsupported, table

DEFAULT_FORMAT = "JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode"
BRIEF_FORMAT = "JobID,State,ExitCode"
LONG_FORMAT = ("JobID,JobIDRaw,JobName,Partition,MaxRSS,AllocCPUS,Elapsed,State,ExitCode,ReqMem,Submit,Start,End,"
               "NodeList,Timelimit")
# sacct's fields (lower case) as (its name, its default width); a row's values are built by kind (a job, an
# earlier run, a step: see job_values) and each column shows its own
_FIELDS = (
    ("jobid", "JobID", 12), ("jobidraw", "JobIDRaw", 12), ("jobname", "JobName", 10), ("partition", "Partition", 10),
    ("account", "Account", 10), ("alloccpus", "AllocCPUS", 10), ("ncpus", "NCPUS", 10), ("nnodes", "NNodes", 8),
    ("ntasks", "NTasks", 8), ("state", "State", 10), ("exitcode", "ExitCode", 8),
    ("derivedexitcode", "DerivedExitCode", 15), ("maxrss", "MaxRSS", 10), ("elapsed", "Elapsed", 10),
    ("elapsedraw", "ElapsedRaw", 10), ("reqmem", "ReqMem", 10), ("submit", "Submit", 19), ("eligible", "Eligible", 19),
    ("start", "Start", 19), ("end", "End", 19), ("nodelist", "NodeList", 15), ("timelimit", "Timelimit", 10),
    ("user", "User", 9), ("uid", "UID", 6), ("reqtres", "ReqTRES", 10), ("alloctres", "AllocTRES", 10),
    ("reason", "Reason", 22), ("qos", "QOS", 10), ("workdir", "WorkDir", 10), ("restarts", "Restarts", 8),
    ("reqcpus", "ReqCPUS", 8), ("reqnodes", "ReqNodes", 8), ("cputime", "CPUTime", 10),
    ("cputimeraw", "CPUTimeRAW", 10))
COLUMNS: dict[str, Column] = {key: Column(name, itemgetter(key), width, left=key in ("jobid", "jobidraw"))
                              for key, name, width in _FIELDS}


class Usage(Exception):
    pass


def db_path() -> str:
    from rota.wire.paths import projections_db

    return projections_db()


def parse_format(text: str) -> list[tuple[Column, int, bool]]:
    """``JobID,State%20,Reason%-30`` -> [(column, width, left-justified)]."""
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        name, _, width = item.partition("%")
        column = COLUMNS.get(name.lower())
        if column is None:
            raise Usage(f"sacct: error: Invalid field requested: \"{name}\"")
        left, w = column.left, column.width
        if width:
            if not width.removeprefix("-").isdecimal():
                raise Usage(f"sacct: error: Invalid field width: \"{item}\"")
            left = width.startswith("-") or left
            w = abs(int(width))
        out.append((column, w, left))
    return out


def _tres(cpus: int, mem: int, nodes: int, gpus: int) -> str:
    parts = [f"billing={cpus}", f"cpu={cpus}"]
    if gpus:
        parts.append(f"gres/gpu={gpus}")
    parts += [f"mem={memory(mem)}", f"node={nodes}"]
    return ",".join(parts)


def _job_id(r: queries.Row) -> str:
    if r["array_spec"] is not None:
        return f"{r['job_id']}_[{r['array_spec']}]"
    if r["array_task_id"] is not None:
        return f"{r['array_job_id']}_{r['array_task_id']}"
    return str(r["job_id"])


def job_values(r: queries.Row, now: int) -> dict[str, str]:
    state = r["state"]
    shown = f"CANCELLED by {r['cancel_by']}" if state == "CANCELLED" and r["cancel_by"] is not None else state
    if state == "OUT_OF_MEMORY":
        exit_code = "0:125"
    elif state in ("TIMEOUT", "CANCELLED", "NODE_FAIL"):
        exit_code = "0:0"
    else:
        exit_code = f"{r['exit_code'] or 0}:{r['signal'] or 0}"
    started = bool(r["start"])
    elapsed = r["elapsed"] if state not in ("RUNNING",) else max(0, now - r["start"])
    if not started:
        elapsed = 0
    cpus = r["alloc_cpus"] or r["req_cpus"] or 1
    from rota.core.hostlist import compress

    nodes = r["nodes"].split(",") if r["nodes"] else []
    return {
        "jobid": _job_id(r), "jobidraw": str(r["job_id"]), "jobname": r["name"] or "",
        "partition": r["partition"] or "", "account": r["account"] or "", "alloccpus": str(r["alloc_cpus"] or 0),
        "ncpus": str(cpus), "nnodes": str(r["alloc_nodes"] or r["req_nodes"] or 1), "ntasks": "",
        "state": shown, "exitcode": exit_code, "derivedexitcode": "0:0", "maxrss": "",
        "elapsed": format_duration(elapsed or 0), "elapsedraw": str(elapsed or 0), "reqmem": memory(r["req_mem"]),
        "submit": timestamp(r["submit"]), "eligible": timestamp(r["eligible"]), "start": timestamp(r["start"]),
        "end": timestamp(r["end_time"]), "nodelist": compress(nodes) if nodes else "None assigned",
        "timelimit": format_duration(r["time_limit"]) if r["time_limit"] else "Partition_limit",
        "user": r["user"] or "", "uid": str(r["uid"] or 0),
        "reqtres": _tres(r["req_cpus"] or 1, r["req_mem"] or 0, r["req_nodes"] or 1, r["req_gpus"] or 0),
        "alloctres": _tres(r["alloc_cpus"], r["alloc_mem"], r["alloc_nodes"], r["alloc_gpus"]) if started else "",
        "reason": "None" if started else (r["last_reason"] or r["reason"] or "None"),   # as Slurm clears it at start
        "qos": r["qos"] or "normal", "workdir": r["workdir"] or "", "restarts": str(r["restarts"] or 0),
        "reqcpus": str(r["req_cpus"] or 1), "reqnodes": str(r["req_nodes"] or 1),
        "cputime": format_duration((elapsed or 0) * (r["alloc_cpus"] or 0)),
        "cputimeraw": str((elapsed or 0) * (r["alloc_cpus"] or 0)),
    }


def requeued_values(job: dict[str, str], run: queries.Row) -> dict[str, str]:
    """``sacct -D``: an earlier run of a requeued job, as Slurm lists it (REQUEUED, or PREEMPTED)."""
    from rota.core.hostlist import compress

    v = dict(job)
    elapsed = max(0, (run["end_time"] or 0) - (run["start"] or 0))
    v.update({"state": run["state"] or "REQUEUED", "exitcode": f"{run['exit_code']}:{run['signal']}",
              "start": timestamp(run["start"]),
              "end": timestamp(run["end_time"]), "elapsed": format_duration(elapsed), "elapsedraw": str(elapsed),
              "nodelist": compress(run["nodes"].split(",")) if run["nodes"] else "None assigned",
              "alloccpus": str(run["alloc_cpus"] or 0), "restarts": str(run["restarts"]),
              "cputime": format_duration(elapsed * (run["alloc_cpus"] or 0)),
              "cputimeraw": str(elapsed * (run["alloc_cpus"] or 0))})
    return v


def step_values(job: dict[str, str], r: queries.Row, s: queries.Row, now: int) -> dict[str, str]:
    """A step's row (``N.batch``, ``N.0``, ...): its own state, exit code, MaxRSS, elapsed time, tasks, nodes."""
    from rota.core.hostlist import compress

    v = dict(job)
    running = s["state"] == "RUNNING"
    elapsed = max(0, now - (s["start"] or now)) if running else (s["elapsed"] or 0)
    nodes = (s["nodes"] or "").split(",") if s["nodes"] else []
    batch = s["step"] == "batch"
    v.update({
        "jobid": f"{job['jobid']}.{s['step']}", "jobidraw": f"{r['job_id']}.{s['step']}", "jobname": s["name"] or "",
        "partition": "", "state": s["state"], "exitcode": f"{s['exit_code']}:{s['signal']}",
        "maxrss": "" if running else (f"{s['max_rss']}K" if s["max_rss"] else "0"), "elapsed": format_duration(elapsed),
        "elapsedraw": str(elapsed), "end": "Unknown" if running else timestamp(s["end_time"]),
        "reqmem": "", "timelimit": "", "user": "", "reqtres": "", "reason": "", "qos": "", "derivedexitcode": "",
        "nnodes": str(max(1, len(nodes))), "ntasks": str(s["ntasks"] or 1), "submit": timestamp(s["start"]),
        "eligible": timestamp(s["start"]), "start": timestamp(s["start"]),
        "alloccpus": str(s["cpus"] or 0), "ncpus": str(s["cpus"] or 0),
        "alloctres": _tres(s["cpus"] or 0, r["alloc_mem"] or 0, max(1, len(nodes)), r["alloc_gpus"] or 0)
        if batch else _tres(s["cpus"] or 0, 0, max(1, len(nodes)), 0),
        "nodelist": compress(nodes) if nodes else (r["nodes"] or "").split(",")[0],
        "cputime": format_duration(elapsed * (s["cpus"] or 0)), "cputimeraw": str(elapsed * (s["cpus"] or 0)),
    })
    return v


def parse_time(text: str, now: float) -> int:
    """sacct -S/-E: Slurm's time forms (see :mod:`rota.cli.timespec`)."""
    from .timespec import MomentError, parse_moment

    try:
        return parse_moment(text, now)
    except MomentError:
        raise Usage(f"sacct: error: Invalid time specification (pos=0): {text}") from None


OPTIONS = table(
    ("A", "accounts", REQUIRED, "!accounts", False), ("X", "allocations", NO, "allocations", False),
    ("L", "allclusters", NO, "allclusters", False), ("a", "allusers", NO, "allusers", False),
    ("", "array", NO, "!array", False), ("x", "associations", REQUIRED, "!associations", False),
    ("b", "brief", NO, "brief", False), ("M", "clusters", REQUIRED, "clusters", False),
    ("c", "completion", NO, "!completion", False), ("C", "constraints", REQUIRED, "!constraints", False),
    ("", "delimiter", REQUIRED, "delimiter", False), ("D", "duplicates", NO, "duplicates", False),
    ("E", "endtime", REQUIRED, "endtime", False), ("", "env-vars", NO, "!env-vars", False),
    ("", "federation", NO, "federation", False), ("f", "file", REQUIRED, "!file", False),
    ("o", "format", REQUIRED, "format", True), ("g", "group", REQUIRED, "!group", False),
    ("h", "help", NO, "help", False), ("e", "helpformat", NO, "helpformat", False), ("", "json", NO, "json", False),
    ("", "local", NO, "local", False), ("l", "long", NO, "long", False), ("", "name", REQUIRED, "name", True),
    ("i", "nnodes", REQUIRED, "!nnodes", False), ("", "noconvert", NO, "noconvert", False),
    ("n", "noheader", NO, "noheader", False), ("p", "parsable", NO, "parsable", False),
    ("P", "parsable2", NO, "parsable2", False), ("r", "partition", REQUIRED, "partition", True),
    ("q", "qos", REQUIRED, "!qos", False), ("R", "reason", REQUIRED, "!reason", False),
    ("S", "starttime", REQUIRED, "starttime", False), ("s", "state", REQUIRED, "state", True),
    ("K", "timelimit-max", REQUIRED, "!timelimit-max", False), ("k", "timelimit-min", REQUIRED, "!timelimit-min", False),
    ("T", "truncate", NO, "truncate", False), ("u", "user uid", REQUIRED, "user", True),
    ("", "units", REQUIRED, "!units", False), ("", "usage", NO, "usage", False),
    ("", "use-local-uid", NO, "use_local_uid", False), ("v", "verbose", NO, "verbose", False),
    ("V", "version", NO, "version", False), ("W", "wckeys", REQUIRED, "!wckeys", False),
    ("", "whole-hetjob", OPTIONAL, "whole_hetjob", False), ("j", "jobs", REQUIRED, "jobs", True),
    ("", "yaml", NO, "!yaml", False))


class _Namespace:
    """Parsed options as attributes (appending options default to [], flags to False)."""

    def __init__(self, values: dict) -> None:
        self.__dict__.update(values)

    def __getattr__(self, name: str):
        return [] if name in ("jobs", "user", "state", "name", "partition", "format") else None


def _job_id_ok(text: str) -> bool:
    """``N``, ``N_T``, either with a step (``.batch``, ``.extern``, ``.0``...)."""
    text, dot, step = text.partition(".")
    head, underscore, task = text.partition("_")
    return head.isdecimal() and (task.isdecimal() if underscore else True) and \
        (step in ("batch", "extern") or step.isdecimal() if dot else True)


STATE_ALIASES = {"pd": "PENDING", "r": "RUNNING", "cd": "COMPLETED", "f": "FAILED", "to": "TIMEOUT",
                 "ca": "CANCELLED", "nf": "NODE_FAIL", "oom": "OUT_OF_MEMORY"}


def run(argv: list[str], out=sys.stdout, err=sys.stderr, *, db: str | None = None, uid: int | None = None,
        only_uid: int | None = None) -> int:
    """sacct over the projection database ``db`` (default: the local cluster's; when this user cannot
    read it, the controller answers from its own, as this user), showing the jobs of ``uid`` unless
    told otherwise (default: who runs it), and never anyone's but ``only_uid``'s when that is given."""
    now = time.time()
    try:
        ns = _command_line(argv, out, err)
        if ns is None:
            return 0
        fields = parse_format(",".join(ns.format) or (BRIEF_FORMAT if ns.brief else LONG_FORMAT if ns.long else
                                                    os.environ.get("SACCT_FORMAT") or DEFAULT_FORMAT))
        query = _query(ns, now, os.geteuid() if uid is None else uid, only_uid)
    except Usage as exc:
        err.write(f"{exc}\n")
        return 1
    path = db or db_path()
    if not os.access(path, os.R_OK):
        if db is None:   # the projection is the administrator's: the controller answers, as this user
            from .client import remote_command

            return remote_command("sacct", argv, out, err)
        err.write(f"sacct: error: Problem talking to the database: no rota accounting at {path}; "
                  "is `rota up` running (or ROTA_STATE_DIR set)?\n")
        return 1
    try:
        conn = queries.connect(path)
        jobs = queries.jobs(conn, query)
        if ns.clusters and unknown(ns.clusters, queries.cluster_name(conn)):
            jobs = []     # Slurm's sacct shows no jobs of a cluster it does not keep
        steps = {} if ns.allocations else queries.steps(conn, [r["job_id"] for r in jobs])
        earlier = queries.runs(conn, [r["job_id"] for r in jobs if r["restarts"]]) if ns.duplicates else {}
    except queries.Error as exc:
        err.write(f"sacct: error: Problem talking to the database: {exc}\n")
        return 1
    if ns.json:
        import json

        out.write(json.dumps({"jobs": [dict(r) for r in jobs]}, indent=2) + "\n")
        return 0
    parsable = None
    if ns.parsable2:
        parsable = ns.delimiter or "|"
    elif ns.parsable:
        parsable = (ns.delimiter or "|") + "+"
    for line in fixed_table(fields, _rows(jobs, steps, earlier, int(now)), not ns.noheader, parsable):
        out.write(line + "\n")
    return 0


def _rows(jobs: list[queries.Row], steps: dict, earlier: dict, now: int) -> list[dict[str, str]]:
    """Each job's values, after those of its earlier runs (-D) and followed by its steps'."""
    rows = []
    for r in jobs:
        v = job_values(r, now)
        rows += [requeued_values(v, run) for run in earlier.get(r["job_id"], ())]
        rows.append(v)
        rows += [step_values(v, r, s, now) for s in steps.get(r["job_id"], ())]
    return rows


TIME_FORMATS = """
    Note, valid start/end time formats are...
                   HH:MM[:SS][AM|PM]
                   MMDD[YY][-HH:MM[:SS]]
                   MM.DD[.YY][-HH:MM[:SS]]
                   MM/DD[/YY][-HH:MM[:SS]]
                   YYYY-MM-DD[THH:MM[:SS]]
                   today, midnight, noon, now[{+|-}[seconds|minutes|hours|days|weeks]]"""


def _command_line(argv: list[str], out, err) -> _Namespace | None:
    """The options (None: --help or --version, answered); warnings for ignored ones go to ``err``."""
    try:
        values, rest = parse("sacct", argv, OPTIONS)
    except OptionError as exc:
        raise Usage(f"{exc}\nTry \"sacct --help\" for more information") from None
    ns = _Namespace(values)
    from .helptext import answered

    if answered("sacct", values, OPTIONS, out, colon=True, extra=TIME_FORMATS):
        return None
    try:
        for warning in unsupported("sacct", values):
            err.write(warning + "\n")
    except OptionError as exc:
        raise Usage(str(exc)) from None
    if rest:
        raise Usage(f"sacct: error: Unrecognized option: {rest[0]}")
    return ns


def _query(ns: _Namespace, now: float, uid: int, only_uid: int | None) -> queries.JobQuery:
    """Which jobs the options select (a user's own, today's, unless told otherwise)."""
    ids = [i for arg in ns.jobs for i in arg.split(",") if i]
    for i in ids:
        if not _job_id_ok(i):
            raise Usage(f"sacct: error: Invalid job id: {i}")
    query = queries.JobQuery(only_uid=only_uid, start=parse_time(ns.starttime, now) if ns.starttime else None,
                             end=parse_time(ns.endtime, now) if ns.endtime else None)
    for i in ids:
        base, _, task = i.split(".")[0].partition("_")
        query.ids.append((int(base), int(task) if task else None))
    if not ids and query.start is None:
        query.start = parse_time("today", now)
    query.users = [u for arg in ns.user for u in arg.split(",") if u]
    if not query.users and not ns.allusers and not ids and uid != 0:
        query.uid = uid
    query.states = [STATE_ALIASES.get(s.lower(), s.upper()) for arg in ns.state for s in arg.split(",") if s]
    query.names = [n for arg in ns.name for n in arg.split(",") if n]
    query.partitions = [p for arg in ns.partition for p in arg.split(",") if p]
    return query


def main_exit() -> None:
    from .exits import exit_with

    exit_with(run)


if __name__ == "__main__":
    main_exit()
