"""``squeue``: the queue in Slurm's layouts (first version: default format, -o, -j, -h, -u, -t)."""
from __future__ import annotations

import argparse
import re
import sys
import time

from rota.core.arrays import format_indices
from rota.core.states import STATE_CODES
from rota.core.timefmt import format_limit, format_squeue_time

DEFAULT_FORMAT = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R"
LONG_FORMAT = "%.18i %.9P %.8j %.8u %.8T %.10M %.9l %.6D %R"
HEADERS = {"i": "JOBID", "A": "JOBID", "P": "PARTITION", "j": "NAME", "u": "USER", "t": "ST",
           "T": "STATE", "M": "TIME", "l": "TIME_LIMIT", "D": "NODES", "R": "NODELIST(REASON)",
           "r": "REASON", "N": "NODELIST", "C": "CPUS", "S": "START_TIME", "V": "SUBMIT_TIME",
           "L": "TIME_LEFT", "F": "ARRAY_JOB_ID", "K": "ARRAY_TASK_ID", "Y": "SCHEDNODES", "a": "ACCOUNT",
           "U": "UID", "Q": "PRIORITY", "p": "PRIORITY", "q": "QOS"}
START_FORMAT = "%.18i %.9P %.8j %.8u %.2t %.19S %.6D %20Y %R"
# -O/--Format names and the specifier each one stands for (width 20 unless given: Name[:[.]width])
FORMAT_NAMES = {"jobid": "A", "jobarrayid": "i", "arrayjobid": "F", "arraytaskid": "K", "partition": "P",
                "name": "j", "username": "u", "userid": "U", "state": "T", "statecompact": "t", "timeused": "M",
                "timelimit": "l", "timeleft": "L", "numnodes": "D", "numcpus": "C", "nodelist": "N",
                "reasonlist": "R", "reason": "r", "starttime": "S", "submittime": "V", "schednodes": "Y",
                "account": "a", "priority": "Q", "qos": "q"}
SPEC = re.compile(r"%(\.)?(\d+)?([a-zA-Z])")


class FormatError(ValueError):
    pass


def job_id_text(job: dict) -> str:
    if job["array_pending"] is not None:
        return f"{job['job_id']}_[{format_indices(job['array_pending'], job['array_throttle'])}]"
    if job["array_task_id"] is not None:
        return f"{job['array_job_id']}_{job['array_task_id']}"
    return str(job["job_id"])


def _iso(ts: int | None) -> str:
    if not ts:
        return "N/A"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(ts))


def field(job: dict, code: str, now: int) -> str:
    running = job["state"] == "RUNNING"
    if code == "i":
        return job_id_text(job)
    if code == "A":
        return str(job["job_id"])
    if code == "P":
        return job["partition"]
    if code == "j":
        return job["name"]
    if code == "u":
        return job["user"]
    if code == "t":
        return STATE_CODES.get(job["state"], job["state"][:2])
    if code == "T":
        return job["state"]
    if code == "M":
        return format_squeue_time(now - job["start_time"]) if running else "0:00"
    if code == "l":
        return format_limit(job["time_limit"])
    if code == "L":
        if not job["time_limit"]:
            return "UNLIMITED"
        used = now - job["start_time"] if running else 0
        return format_squeue_time(max(0, job["time_limit"] - used))
    if code == "D":
        return str(job["num_nodes"])
    if code == "C":
        return str(job["cpus"])
    if code == "N":
        from rota.core.hostlist import compress

        return compress(job["nodes"]) if job["nodes"] else ""
    if code == "R":
        if running:
            from rota.core.hostlist import compress

            return compress(job["nodes"])
        return f"({job['reason']})"
    if code == "r":
        return job["reason"] if not running else "None"
    if code == "S":
        return _iso(job["start_time"] if running else job.get("expected_start"))
    if code == "V":
        return _iso(job["submit_time"])
    if code == "F":
        return str(job["array_job_id"] or job["job_id"])
    if code == "K":
        return str(job["array_task_id"]) if job["array_task_id"] is not None else "N/A"
    if code == "Y":
        from rota.core.hostlist import compress

        return compress(job["sched_nodes"]) if job.get("sched_nodes") else "(null)"
    if code == "a":
        return job.get("account") or "(null)"
    if code == "U":
        return str(job.get("uid", 0))
    if code in ("Q", "p"):
        return str(job.get("priority", 0))
    if code == "q":
        return "normal"
    raise FormatError(f"unsupported format specifier %{code}")


def render(fmt: str, jobs: list[dict], now: int, header: bool = True) -> list[str]:
    """Apply a ``-o`` format: ``%[.][size]X``; a size pads and truncates, ``.`` right-justifies."""
    parts: list[tuple[str, bool, int | None, str]] = []
    pos = 0
    for m in SPEC.finditer(fmt):
        if m.group(3) not in HEADERS:
            raise FormatError(f"Invalid job format specification: {m.group(3)}")
        parts.append((fmt[pos:m.start()], bool(m.group(1)), int(m.group(2)) if m.group(2) else None, m.group(3)))
        pos = m.end()
    tail = fmt[pos:]

    def line(values: list[str]) -> str:
        out = []
        for (lit, right, size, _code), v in zip(parts, values):
            if size is not None:
                v = v[:size]
                v = v.rjust(size) if right else v.ljust(size)
            out.append(lit + v)
        return ("".join(out) + tail).rstrip()

    rows = []
    if header:
        rows.append(line([HEADERS[c] for *_x, c in parts]))
    for job in jobs:
        rows.append(line([field(job, c, now) for *_x, c in parts]))
    return rows


STATE_NAMES = {"PD": "PENDING", "R": "RUNNING"}


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
        if not w.isdigit():
            raise FormatError(f"Invalid field width: {item}")
        out.append(f"%{'.' if right else ''}{w}{code}")
    return "".join(out)   # -O fields are not separated: their widths space them


def order(job: dict) -> tuple:
    """Slurm's default order "P,t,-p": partition, then state (pending first), then priority, highest first."""
    return job["partition"], 0 if job["state"] == "PENDING" else 1, -job.get("priority", 0), job["job_id"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="squeue", allow_abbrev=False, add_help=False)
    p.add_argument("-o", "--format")
    p.add_argument("-j", "--jobs")
    p.add_argument("-u", "--user")
    p.add_argument("-t", "--states")
    p.add_argument("-p", "--partition")
    p.add_argument("-h", "--noheader", action="store_true")
    p.add_argument("-l", "--long", action="store_true")
    p.add_argument("-O", "--Format")
    p.add_argument("--start", action="store_true")
    p.add_argument("--me", action="store_true")
    p.add_argument("--nats", help=argparse.SUPPRESS)
    p.add_argument("--help", action="help")
    p.add_argument("job", nargs="?")
    try:
        o = p.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:
        return 1 if exc.code else 0
    from .client import NoCluster, request

    try:
        reply = request("queue", {}, url=o.nats)
    except NoCluster as exc:
        print(f"squeue: error: {exc}", file=sys.stderr)
        return 1
    jobs = reply["jobs"]
    wanted_ids = o.jobs or o.job
    if wanted_ids:
        ids = {int(x.split("_")[0]) for x in wanted_ids.split(",") if x.split("_")[0].isdigit()}
        jobs = [j for j in jobs if j["job_id"] in ids or j["array_job_id"] in ids]
        if not jobs and len(ids) == 1:
            print("slurm_load_jobs error: Invalid job id specified", file=sys.stderr)
            return 1
    if o.me:
        import getpass

        o.user = getpass.getuser()
    if o.user:
        users = set(o.user.split(","))
        jobs = [j for j in jobs if j["user"] in users]
    if o.partition:
        parts = set(o.partition.split(","))
        jobs = [j for j in jobs if j["partition"] in parts]
    if o.states and o.states.lower() != "all":
        states = {STATE_NAMES.get(s.upper(), s.upper()) for s in o.states.split(",")}
        jobs = [j for j in jobs if j["state"] in states]
    jobs.sort(key=order)
    if o.start:   # Slurm: --sort=S --states=PENDING
        jobs = [j for j in jobs if j["state"] == "PENDING"]
        jobs.sort(key=lambda j: (j.get("expected_start") or float("inf"), j["job_id"]))
    try:
        fmt = format_from_names(o.Format) if o.Format else \
            o.format or (START_FORMAT if o.start else LONG_FORMAT if o.long else DEFAULT_FORMAT)
    except FormatError as exc:
        print(f"squeue: error: {exc}", file=sys.stderr)
        return 1
    if o.long and not o.format and not o.noheader:
        print(time.strftime("%a %b %d %H:%M:%S %Y"))
    try:
        for row in render(fmt, jobs, reply["now"], header=not o.noheader):
            print(row)
    except FormatError as exc:
        print(f"squeue: error: {exc}", file=sys.stderr)
        return 1
    return 0


def main_exit() -> None:
    sys.exit(main())


if __name__ == "__main__":
    main_exit()
