"""Readers for workload traces (pure: they take lines, the caller opens the file).

- Standard Workload Format (Parallel Workloads Archive): one machine of ``MaxProcs`` cores;
  a job's processors become CPU cores on it.
- Philly-derived GPU trace (Chronus artifact CSV): GPU jobs on nodes of 8 GPUs.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from typing import Iterable

from .events import ClusterConfig, GpuConfig, JobSpec, NodeConfig, PartitionConfig, SchedulerParams
from .sim import TraceJob


class TraceFormatError(ValueError):
    """A trace line that cannot be read."""


# why a record was dropped or changed, as `rota simulate` reports it
NO_RUNTIME = "no run time: dropped"
NEGATIVE_RUNTIME = "negative run time: set to 10 s"
NO_PROCESSORS = "no processors: dropped"
SHORT_ESTIMATE = "estimate below run time: killed at the estimate (unless --no-kill)"
TOO_BIG = "larger than the machine: never start"


@dataclass(slots=True)
class SwfTrace:
    max_procs: int
    jobs: list[TraceJob]
    header: dict[str, str]
    notes: dict[str, int]         # records dropped or changed, by why


def _note(notes: dict[str, int] | None, why: str) -> None:
    if notes is not None:
        notes[why] = notes.get(why, 0) + 1


def read_swf(lines: Iterable[str], *, source: str = "trace") -> SwfTrace:
    """Parse SWF. Estimate = field 9, else field 4; processors = max(field 5, field 8);
    run time 0 dropped, negative run time becomes 10 s (the RLScheduler protocol)."""
    header: dict[str, str] = {}
    jobs: list[TraceJob] = []
    notes: dict[str, int] = {}
    for lineno, line in enumerate(lines, start=1):
        s = line.strip()
        if not s:
            continue
        if s.startswith(";"):
            key, colon, value = s[1:].partition(":")
            if colon:
                header[key.strip()] = value.strip()
            continue
        job = _swf_job(s.split(), f"{source}:{lineno}", notes)
        if job is not None:
            jobs.append(job)
    procs_s = header.get("MaxProcs") or header.get("MaxNodes")
    if procs_s is None:
        max_procs = max((j.spec.ntasks for j in jobs), default=1)
    else:
        max_procs = int(procs_s.split()[0])
    too_big = sum(1 for j in jobs if j.spec.ntasks > max_procs)
    if too_big:
        notes[TOO_BIG] = too_big
    return SwfTrace(max_procs, jobs, header, notes)


def _swf_job(f: list[str], where: str, notes: dict[str, int]) -> TraceJob | None:
    """One SWF record as a job (None: dropped, and noted why)."""
    if len(f) < 18:
        raise TraceFormatError(f"{where}: expected 18 SWF fields, found {len(f)}")
    try:
        jid, submit, run = int(f[0]), int(float(f[1])), int(float(f[3]))
        procs = max(int(f[4]), int(f[7]))
        req_time = int(float(f[8]))
        user = int(f[11])
    except ValueError as exc:
        raise TraceFormatError(f"{where}: {exc}") from None
    if run == 0:
        _note(notes, NO_RUNTIME)
        return None
    if run < 0:
        _note(notes, NEGATIVE_RUNTIME)
        run = 10
    if procs <= 0:
        _note(notes, NO_PROCESSORS)
        return None
    estimate = req_time if req_time > 0 else run
    if estimate < run:
        _note(notes, SHORT_ESTIMATE)
    spec = JobSpec(name=f"swf{jid}", user=f"u{user}" if user >= 0 else "u0", uid=max(user, 0),
                   ntasks=procs, ntasks_given=True, time_limit=estimate, mem_per_node=None)
    return TraceJob(submit=submit, spec=spec, runtime=run, trace_id=jid)


def swf_cluster(max_procs: int, params: SchedulerParams | None = None) -> ClusterConfig:
    """One machine whose cores are the trace's processors (1 GiB each)."""
    node = NodeConfig(name="swf", cpus=max_procs, memory=max_procs * 1024)
    part = PartitionConfig(name="batch", nodes=("swf",), max_time=0, default=True)
    return ClusterConfig(cluster_name="swf", nodes=(node,), partitions=(part,),
                         scheduler=params or SchedulerParams())


def read_philly(lines: Iterable[str], *, gpus_per_node: int = 8, cpus_per_gpu: int = 4,
                source: str = "trace", notes: dict[str, int] | None = None) -> list[TraceJob]:
    """Parse the Chronus/Philly CSV; the run time doubles as the job's (exact) time limit. Records
    dropped are counted in ``notes`` by why."""
    reader = csv.DictReader(lines)
    need = {"job_id", "user", "num_gpu", "submit_time", "duration"}
    if reader.fieldnames is None or not need.issubset(reader.fieldnames):
        raise TraceFormatError(f"{source}: expected columns {sorted(need)}, found {reader.fieldnames}")
    jobs: list[TraceJob] = []
    for lineno, row in enumerate(reader, start=2):
        try:
            jid, gpus = int(row["job_id"]), int(row["num_gpu"])
            submit, duration = int(float(row["submit_time"])), int(float(row["duration"]))
        except ValueError as exc:
            raise TraceFormatError(f"{source}:{lineno}: {exc}") from None
        if duration <= 0:
            _note(notes, NO_RUNTIME)
            continue
        if gpus <= gpus_per_node:
            nodes, per_node = 1, gpus
        else:
            nodes = -(-gpus // gpus_per_node)
            per_node = -(-gpus // nodes)
        cpus = max(1, per_node * cpus_per_gpu)
        spec = JobSpec(name=f"philly{jid}", user=row["user"][:12], nodes=nodes, nodes_given=True,
                       ntasks=nodes, ntasks_per_node=1, cpus_per_task=cpus,
                       gpus_per_node=per_node, time_limit=duration)
        jobs.append(TraceJob(submit=submit, spec=spec, runtime=duration, trace_id=jid))
    return jobs


def gpu_cluster(nodes: int, gpus_per_node: int = 8, cpus: int = 64, memory: int = 512 * 1024,
                gpu_type: str = "v100", params: SchedulerParams | None = None) -> ClusterConfig:
    """A homogeneous GPU cluster ``node[001-N]``."""
    width = max(3, len(str(nodes)))
    names = tuple(f"node{i:0{width}d}" for i in range(1, nodes + 1))
    node_cfgs = tuple(NodeConfig(name=n, cpus=cpus, memory=memory,
                                 gpus=(GpuConfig(type=gpu_type, count=gpus_per_node),)) for n in names)
    part = PartitionConfig(name="gpu", nodes=names, max_time=0, default=True)
    return ClusterConfig(cluster_name="sim", nodes=node_cfgs, partitions=(part,),
                         scheduler=params or SchedulerParams())


# the fields a Slurm accounting dump must have for rota simulate / whatif (sacct -a -X -P -o ...)
SACCT_FIELDS = ("JobIDRaw", "User", "Account", "Partition", "Submit", "Start", "End", "Elapsed", "Timelimit",
                "NNodes", "NCPUS", "ReqMem", "ReqTRES", "State")
SACCT_COMMAND = "sacct -a -X -P -S START -E END -o " + ",".join(SACCT_FIELDS)
NEVER_STARTED = "never started (cancelled or still pending): dropped"
NOT_ENDED = "still running when dumped: dropped"
NO_LIMIT = "no time limit: run to its end"


@dataclass(slots=True)
class SacctTrace:
    jobs: list[TraceJob]
    partitions: tuple[str, ...]     # the partitions its jobs ran in, as named
    notes: dict[str, int]


def read_sacct(lines: Iterable[str], *, source: str = "sacct") -> SacctTrace:
    """A site's own history from ``sacct -a -X -P -o`` with :data:`SACCT_FIELDS` (any order, more are
    ignored): each job that ran, at its submit time, with its nodes, CPUs, memory, GPUs and time limit,
    running as long as it really did. Jobs that never started or had not ended are counted in ``notes``."""
    it = iter(lines)
    head = next(it, "").strip().split("|")
    missing = [f for f in SACCT_FIELDS if f not in head]
    if missing:
        raise TraceFormatError(f"{source}:1: the dump lacks {', '.join(missing)}; dump it with: {SACCT_COMMAND}")
    col = {name: i for i, name in enumerate(head)}
    jobs: list[TraceJob] = []
    notes: dict[str, int] = {}
    users: dict[str, int] = {}
    parts: dict[str, None] = {}
    for lineno, line in enumerate(it, start=2):
        if not line.strip():
            continue
        f = line.rstrip("\n").split("|")
        if len(f) < len(head):
            raise TraceFormatError(f"{source}:{lineno}: expected {len(head)} fields, found {len(f)}")
        job = _sacct_job({k: f[i] for k, i in col.items()}, f"{source}:{lineno}", notes, users)
        if job is not None:
            jobs.append(job)
            parts.update(dict.fromkeys(job.spec.partitions))
    return SacctTrace(jobs, tuple(parts), notes)


def _sacct_job(r: dict[str, str], where: str, notes: dict[str, int], users: dict[str, int]) -> TraceJob | None:
    from .timefmt import TimeSpecError, parse_time_limit, parse_utc

    try:
        submit = parse_utc(r["Submit"])
    except ValueError as exc:
        raise TraceFormatError(f"{where}: Submit: {exc}") from None
    try:
        parse_utc(r["Start"])
    except ValueError:
        _note(notes, NEVER_STARTED)
        return None
    if r["End"].strip() in ("Unknown", "None", "") or r["State"].startswith(("RUNNING", "PENDING")):
        _note(notes, NOT_ENDED)
        return None
    try:
        run = _elapsed(r["Elapsed"])
        limit = None if r["Timelimit"] in ("UNLIMITED", "Partition_Limit", "") else parse_time_limit(r["Timelimit"])
        nodes, cpus = int(r["NNodes"] or 1), int(r["NCPUS"] or 1)
    except (TimeSpecError, ValueError) as exc:
        raise TraceFormatError(f"{where}: {exc}") from None
    if run <= 0:
        _note(notes, NO_RUNTIME)
        return None
    if limit is None:
        _note(notes, NO_LIMIT)
    tres = dict(kv.partition("=")[::2] for kv in r["ReqTRES"].split(",") if "=" in kv)
    gpus = int(tres.get("gres/gpu", "0") or 0)
    asked = int(tres["cpu"]) if tres.get("cpu", "").isdecimal() else cpus
    exclusive = cpus > asked         # it was given more CPUs than it asked: whole nodes
    user = r["User"] or "nobody"
    uid = users.setdefault(user, 10000 + len(users))
    spec = JobSpec(name=f"sacct{r['JobIDRaw']}", user=user, uid=uid, account=r["Account"],
                   partitions=(r["Partition"],) if r["Partition"] else (), nodes=nodes, nodes_given=True,
                   ntasks=asked, ntasks_given=True, exclusive=exclusive, time_limit=limit,
                   mem_per_node=None if exclusive else _mib(r["ReqMem"], tres, nodes),
                   gpus_total=gpus or None, gpu_given=bool(gpus))
    raw = r["JobIDRaw"].split("_")[0]
    return TraceJob(submit=submit, spec=spec, runtime=run, trace_id=int(raw) if raw.isdecimal() else 0)


def _elapsed(text: str) -> int:
    """sacct's Elapsed (``[D-]HH:MM:SS``, ``MM:SS``) in seconds."""
    days, _, clock = text.strip().rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if not 2 <= len(parts) <= 3 or any(p < 0 for p in parts):
        raise ValueError(f"Elapsed {text!r} is not [D-]HH:MM:SS")
    h, m, sec = ([0] * (3 - len(parts)) + parts)
    return (int(days) if days else 0) * 86400 + h * 3600 + m * 60 + sec


def _mib(req_mem: str, tres: dict[str, str], nodes: int) -> int | None:
    """A node's memory in MiB from ReqTRES' mem (the whole job's) or ReqMem (``4000M``, ``2G``; a ``c``/``n``
    suffix from older sacct: per CPU / per node); None when neither says."""
    text = tres.get("mem") or req_mem
    if not text:
        return None
    text = text.rstrip("cn")
    scale = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}.get(text[-1:].upper())
    try:
        value = float(text[:-1]) * scale if scale is not None else float(text)
    except ValueError:
        return None
    return max(1, int(value) // max(1, nodes) if "mem" in tres else int(value))
