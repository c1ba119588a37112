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
