"""squeue's rows: Slurm's ``-o``/``-O`` formats, filters and order, rendered where the queue lives.

The controller renders the text (and reuses it while the queue and the second are unchanged), so
the ``squeue`` command only sends its options and writes what comes back: 10,000 rows cost a
request, not 10,000 dict decodes and format calls in a freshly started interpreter.
"""
from __future__ import annotations

import re
from typing import Any

from rota.core.arrays import format_indices
from rota.core.states import STATE_CODES
from rota.core.timefmt import format_limit, format_squeue_time
from rota.wire.formats import Column, memory, timestamp


def _when(t: int | None) -> str:
    return timestamp(t, "N/A")

DEFAULT_FORMAT = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R"
LONG_FORMAT = "%.18i %.9P %.8j %.8u %.8T %.10M %.9l %.6D %R"
START_FORMAT = "%.18i %.9P %.8j %.8u %.2t %.19S %.6D %20Y %R"
# -O/--Format names and the specifier each one stands for (width 20 unless given: Name[:[.]width])
FORMAT_NAMES = {"jobid": "A", "jobarrayid": "i", "arrayjobid": "F", "arraytaskid": "K", "partition": "P",
                "name": "j", "username": "u", "userid": "U", "state": "T", "statecompact": "t", "timeused": "M",
                "timelimit": "l", "timeleft": "L", "numnodes": "D", "numcpus": "C", "nodelist": "N",
                "reasonlist": "R", "reason": "r", "starttime": "S", "submittime": "V", "schednodes": "Y",
                "account": "a", "priority": "Q", "qos": "q", "gpuidle": "!"}
# "!" (rota's, -O GpuIdle: every letter is Slurm's) how long a running job's GPUs have been reported idle
SPEC = re.compile(r"%(\.)?(\d+)?([a-zA-Z!])")
MAX_WIDTH = 4096           # a field wider than any terminal; wider would only cost the controller memory


class FormatError(ValueError):
    pass


def job_id_text(job: dict) -> str:
    if job["array_pending"] is not None:
        return f"{job['job_id']}_[{format_indices(job['array_pending'], job['array_throttle'])}]"
    if job["array_task_id"] is not None:
        return f"{job['array_job_id']}_{job['array_task_id']}"
    return str(job["job_id"])


def _running(job: dict) -> bool:
    return job["state"] == "RUNNING"


def _hostlist(nodes: list[str]) -> str:
    from rota.core.hostlist import compress

    return compress(nodes)


def _time_left(job: dict, now: int) -> str:
    if not job["time_limit"]:
        return "UNLIMITED"
    used = now - job["start_time"] if _running(job) else 0
    return format_squeue_time(max(0, job["time_limit"] - used))


def _time_used(j: dict, now: int) -> str:
    if _running(j):
        return format_squeue_time(now - j["start_time"])
    return format_squeue_time(j["end_time"] - j["start_time"]) if j.get("end_time") and j["start_time"] else "0:00"


def _end(j: dict) -> int | None:
    """When a job ends or ended: its end, or its start plus its limit once it has one."""
    if j.get("end_time"):
        return int(j["end_time"])
    start = j["start_time"] if _running(j) else j.get("expected_start")
    return start + j["time_limit"] if start and j.get("time_limit") else None


# squeue's -o specifiers: a column over one job (a row of the queue view) at ``now``
COLUMNS: dict[str, Column] = {
    "i": Column("JOBID", lambda j, now: job_id_text(j)),
    "A": Column("JOBID", lambda j, now: str(j["job_id"])),
    "P": Column("PARTITION", lambda j, now: j["partition"]),
    "j": Column("NAME", lambda j, now: j["name"]),
    "u": Column("USER", lambda j, now: j["user"]),
    "t": Column("ST", lambda j, now: STATE_CODES.get(j["state"], j["state"][:2])),
    "T": Column("STATE", lambda j, now: j["state"]),
    "M": Column("TIME", _time_used),
    "l": Column("TIME_LIMIT", lambda j, now: format_limit(j["time_limit"])),
    "L": Column("TIME_LEFT", _time_left),
    "D": Column("NODES", lambda j, now: str(j["num_nodes"])),
    "C": Column("CPUS", lambda j, now: str(j["cpus"])),
    "N": Column("NODELIST", lambda j, now: _hostlist(j["nodes"]) if j["nodes"] else ""),
    "R": Column("NODELIST(REASON)", lambda j, now: _hostlist(j["nodes"]) if _running(j) else f"({j['reason']})"),
    "r": Column("REASON", lambda j, now: "None" if _running(j) else j["reason"]),
    "S": Column("START_TIME", lambda j, now: _when(j["start_time"] if _running(j) else j.get("expected_start"))),
    "V": Column("SUBMIT_TIME", lambda j, now: _when(j["submit_time"])),
    "F": Column("ARRAY_JOB_ID", lambda j, now: str(j["array_job_id"] or j["job_id"])),
    "K": Column("ARRAY_TASK_ID", lambda j, now: str(j["array_task_id"]) if j["array_task_id"] is not None else "N/A"),
    "Y": Column("SCHEDNODES", lambda j, now: _hostlist(j["sched_nodes"]) if j.get("sched_nodes") else "(null)"),
    "a": Column("ACCOUNT", lambda j, now: j.get("account") or "(null)"),
    "U": Column("UID", lambda j, now: str(j.get("uid", 0))),
    "Q": Column("PRIORITY", lambda j, now: str(j.get("priority", 0))),
    "p": Column("PRIORITY", lambda j, now: str(j.get("priority", 0))),
    "q": Column("QOS", lambda j, now: j.get("qos") or "normal"),
    "B": Column("EXEC_HOST", lambda j, now: j.get("exec_host") or "n/a"),
    "c": Column("MIN_CPUS", lambda j, now: str(j.get("min_cpus", 1))),
    "e": Column("END_TIME", lambda j, now: _when(_end(j))),
    "E": Column("DEPENDENCY", lambda j, now: j.get("dependency") or "(null)"),
    "G": Column("GROUP", lambda j, now: str(j.get("gid", 0))),
    "k": Column("COMMENT", lambda j, now: j.get("comment") or "(null)"),
    "m": Column("MIN_MEMORY", lambda j, now: memory(j.get("min_mem") or 0)),
    "y": Column("NICE", lambda j, now: str(j.get("nice", 0))),
    "Z": Column("WORK_DIR", lambda j, now: j.get("workdir") or "/"),
    "!": Column("GPU_IDLE", lambda j, now: format_squeue_time(max(0, now - j["idle_since"]))
                if j.get("idle_since") is not None and _running(j) else "N/A"),
}
NOW_DEPENDENT = frozenset("ML!")   # specifiers whose text for a running job changes every second


def compile_format(fmt: str, columns: dict[str, Column] | None = None) -> tuple[str, list[str]]:
    """A ``-o`` format as a ``str.format`` template and its specifiers, in order: ``%[.][size]X``;
    a size pads and truncates, ``.`` right-justifies."""
    columns = COLUMNS if columns is None else columns
    template: list[str] = []
    codes: list[str] = []
    pos = 0
    for m in SPEC.finditer(fmt):
        code = m.group(3)
        if code not in columns:
            raise FormatError(f"Invalid job format specification: {code}")
        template.append(fmt[pos:m.start()].replace("{", "{{").replace("}", "}}"))
        size = m.group(2)
        if size is not None and (len(size) > 5 or int(size) > MAX_WIDTH):
            raise FormatError(f"Invalid field width: {m.group(0)} (at most {MAX_WIDTH})")
        if size is None:
            template.append("{}")
        else:
            template.append(f"{{:{'>' if m.group(1) else '<'}{int(size)}.{int(size)}}}")
        codes.append(code)
        pos = m.end()
    template.append(fmt[pos:].replace("{", "{{").replace("}", "}}"))
    return "".join(template), codes


def render(fmt: str, jobs: list[dict], now: int, header: bool = True, columns: dict[str, Column] | None = None
           ) -> list[str]:
    """Apply a ``-o`` format to ``jobs`` (rows without trailing blanks, as Slurm prints them)."""
    columns = COLUMNS if columns is None else columns
    template, codes = compile_format(fmt, columns)
    getters = [columns[c].value for c in codes]
    fill = template.format
    rows = []
    if header:
        rows.append(fill(*(columns[c].header for c in codes)).rstrip())
    for job in jobs:
        rows.append(fill(*[g(job, now) for g in getters]).rstrip())
    return rows


def format_from_names(text: str) -> str:
    """``-O JobID:10,Name,State:.8`` -> the equivalent ``-o`` format (Slurm's default width 20)."""
    out = []
    for item in text.split(","):
        name, _, width = item.strip().partition(":")
        code = FORMAT_NAMES.get(name.lower())
        if code is None:
            raise FormatError(f"Invalid job format specification: {name}")
        right = width.startswith(".")
        w = width.lstrip(".") or "20"
        if not w.isdecimal() or len(w) > 5 or int(w) > MAX_WIDTH:
            raise FormatError(f"Invalid field width: {item}")
        out.append(f"%{'.' if right else ''}{w}{code}")
    return "".join(out)   # -O fields are not separated: their widths space them


def order(job: dict) -> tuple:
    """Slurm's default order "P,t,-p": partition, then state (pending first), then priority, highest first;
    an array's members together, in task order."""
    return (job["partition"], 0 if job["state"] == "PENDING" else 1, -job.get("priority", 0),
            job["array_job_id"] or job["job_id"], -1 if job["array_task_id"] is None else job["array_task_id"])


# -S/--sort fields: what each sorts by
SORT_KEYS = {
    "i": lambda j: (j["array_job_id"] or j["job_id"], -1 if j["array_task_id"] is None else j["array_task_id"]),
    "A": lambda j: j["job_id"], "P": lambda j: j["partition"], "j": lambda j: j["name"], "u": lambda j: j["user"],
    "U": lambda j: j.get("uid", 0), "t": lambda j: j["state"], "T": lambda j: j["state"],
    "p": lambda j: j.get("priority", 0), "Q": lambda j: j.get("priority", 0), "V": lambda j: j["submit_time"],
    "S": lambda j: j["start_time"] or j.get("expected_start") or 0, "D": lambda j: j["num_nodes"],
    "C": lambda j: j["cpus"], "l": lambda j: j["time_limit"] or 0, "M": lambda j: -(j["start_time"] or 0),
    "N": lambda j: ",".join(j["nodes"]), "r": lambda j: j["reason"], "R": lambda j: j["reason"],
}


def sort_jobs(jobs: list[dict], spec: str) -> list[dict]:
    """``-S`` (``--sort``): comma-separated specifiers, each ascending or, with a leading ``-``, descending;
    applied last key first, so the first one decides."""
    for item in reversed([x.strip() for x in spec.split(",") if x.strip()]):
        descending = item.startswith("-")
        code = item.lstrip("+-")
        key = SORT_KEYS.get(code)
        if key is None:
            raise FormatError(f"Invalid sort specification: {item}")
        jobs = sorted(jobs, key=key, reverse=descending)
    return jobs


def expand_arrays(jobs: list[dict]) -> list[dict]:
    """``-r``: an array's pending remainder as one row per pending task, as Slurm lists them."""
    out: list[dict] = []
    for j in jobs:
        if j["array_pending"] is None:
            out.append(j)
            continue
        head = j["array_job_id"] or j["job_id"]
        out.extend({**j, "array_pending": None, "array_job_id": head, "array_task_id": i} for i in j["array_pending"])
    return out


STATE_NAMES = {"PD": "PENDING", "R": "RUNNING", "CG": "COMPLETING", "S": "SUSPENDED", "CF": "CONFIGURING",
               "CD": "COMPLETED", "F": "FAILED", "CA": "CANCELLED", "TO": "TIMEOUT", "OOM": "OUT_OF_MEMORY",
               "NF": "NODE_FAIL"}
ENDED = frozenset(("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"))


def _state_names(states_text: str) -> set[str]:
    """The states ``-t`` names, short forms (``PD``, ``R``...) resolved."""
    return {STATE_NAMES.get(s.upper(), s.upper()) for s in states_text.split(",")}


def _state_filter(states_text: str | None) -> set[str] | None:
    """The states ``-t`` keeps; None for every state (no ``-t``, or ``-t all``)."""
    return None if not states_text or states_text.lower() == "all" else _state_names(states_text)


def wants_ended(states_text: str | None) -> bool:
    """Whether ``-t`` asks for jobs that have ended (``all``, or an end state): they are held MinJobAge."""
    if not states_text:
        return False
    names = _state_names(states_text)
    return "ALL" in names or bool(names & ENDED)


def requested_ids(text: str) -> set[int] | str:
    """The job ids of ``squeue -j`` (an array task counts as its array), or the first item that is not one."""
    ids = set()
    for item in text.split(","):
        base = item.split("_")[0]
        if not base.isdecimal():
            return item
        ids.add(int(base))
    return ids


class _Refused(Exception):
    """A request squeue refuses, in Slurm's words, with its code."""

    def __init__(self, line: str, code: str) -> None:
        super().__init__(line)
        self.line, self.code = line, code


def answer(jobs: list[dict], request: dict, now: int) -> dict:
    """squeue's output for ``request`` (what the command line asked) over the queue view ``jobs``.

    ``{"ok": True, "text": ..., "now_dependent": bool}`` (whether the text changes with the second:
    running jobs' times are shown), or ``{"ok": False, "error": [line], "code": ...}`` with Slurm's wording.
    """
    try:
        jobs = _in_order(_chosen(jobs, request), request)
        if request.get("Format"):
            fmt = format_from_names(request["Format"])
        else:
            fmt = request.get("format") or (START_FORMAT if request.get("start") else LONG_FORMAT if request.get("long")
                                            else DEFAULT_FORMAT)
        rows = render(fmt, jobs, now, header=not request.get("noheader"))
        if request.get("clusters"):
            rows = _cluster_heading(request) + rows
    except _Refused as r:
        return {"ok": False, "error": [r.line], "code": r.code}
    except FormatError as exc:
        return {"ok": False, "error": [f"squeue: error: {exc}"], "code": "invalid"}
    return {"ok": True, "text": "".join(row + "\n" for row in rows),
            "now_dependent": any(j["state"] == "RUNNING" for j in jobs) and bool(NOW_DEPENDENT & set(fmt))}


def _cluster_heading(request: dict) -> list[str]:
    """``-M``: the heading above this cluster's table; Slurm's refusal of any other cluster."""
    from rota.wire.clusters import heading, refusal, unknown

    name = request.get("_cluster") or "rota"
    bad = unknown(request["clusters"], name)
    if bad:
        raise _Refused(refusal("squeue", bad), "invalid")
    return [] if request.get("noheader") else [heading(name)]


def _chosen(jobs: list[dict], request: dict) -> list[dict]:
    """The jobs that pass the request's filters: ids, names, nodes, users, partitions, states."""
    wanted_ids = request.get("jobs")
    if wanted_ids:
        ids = requested_ids(wanted_ids)
        if isinstance(ids, str):
            raise _Refused(f"squeue: error: Invalid job id: {ids}", "invalid")
        jobs = [j for j in jobs if j["job_id"] in ids or j["array_job_id"] in ids]
        # a job that has just ended (the controller still holds it) gets the header alone, as in Slurm
        if not jobs and len(ids) == 1 and not set(request.get("_ended") or ()) & ids:
            raise _Refused("slurm_load_jobs error: Invalid job id specified", "no_job")
    if request.get("nodelist"):
        from rota.core.hostlist import expand

        try:
            wanted_nodes = set(expand(request["nodelist"]))
        except ValueError as exc:
            raise _Refused(f"squeue: error: Invalid node name {request['nodelist']}: {exc}", "invalid") from None
        jobs = [j for j in jobs if wanted_nodes.intersection(j["nodes"])]
    for key, keep in (("names", lambda j, v: j["name"] in v),
                      ("users", lambda j, v: j["user"] in v or str(j.get("uid")) in v),
                      ("partitions", lambda j, v: j["partition"] in v)):
        if request.get(key):
            values = set(request[key].split(","))
            jobs = [j for j in jobs if keep(j, values)]
    states = _state_filter(request.get("states"))
    return jobs if states is None else [j for j in jobs if j["state"] in states]


def _in_order(jobs: list[dict], request: dict) -> list[dict]:
    """Slurm's order (or --sort's), array tasks one per line with -r; --start: pending by expected start."""
    jobs = sorted(jobs, key=order)
    if request.get("array"):
        jobs = expand_arrays(jobs)
    if request.get("sort"):
        jobs = sort_jobs(jobs, request["sort"])
    if request.get("start"):   # Slurm: --sort=S --states=PENDING
        jobs = [j for j in jobs if j["state"] == "PENDING"]
        jobs.sort(key=lambda j: (j.get("expected_start") or float("inf"), j["job_id"]))
    return jobs


def select_jobs(state: Any, request: dict) -> list[Any] | None:
    """The live jobs that may pass a request's job id, user, partition and state filters, found from the
    jobs themselves (so only their rows are made): never fewer than :func:`answer` keeps. None when the
    request names none of those filters (every job is a candidate) or a job id it will refuse."""
    ids_text, users_text, parts_text = request.get("jobs"), request.get("users"), request.get("partitions")
    states = _state_filter(request.get("states"))
    if not (ids_text or users_text or parts_text or states):
        return None
    jobs = state.jobs
    if ids_text:
        ids = requested_ids(ids_text)
        if isinstance(ids, str):
            return None
        wanted = set(ids)
        for i in ids:
            wanted.update(state.array_tasks.get(i, ()))
        # the other filters apply after the ids (an id that is live but filtered out is not an error)
        return [jobs[jid] for jid in wanted if jid in state.pending or jid in state.running]
    chosen = [jobs[jid] for jid in (*(state.pending if states is None or "PENDING" in states else ()),
                                    *(state.running if states is None or "RUNNING" in states else ()))]
    if users_text:
        users = set(users_text.split(","))
        chosen = [j for j in chosen if j.spec.user in users or str(j.spec.uid) in users]
    if parts_text:
        parts = set(parts_text.split(","))
        chosen = [j for j in chosen if j.partition in parts]
    if states is not None:
        chosen = [j for j in chosen if j.state in states]
    return chosen
