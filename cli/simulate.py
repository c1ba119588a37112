"""``rota simulate``: replay a workload trace through rota's core on a simulated clock."""
from __future__ import annotations

import gzip
import json
import os
import resource
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, TextIO

from rota.core import events as ev
from rota.core.sim import SimResult, Simulator, TraceJob
from rota.core.traces import TOO_BIG, TraceFormatError, gpu_cluster, read_philly, read_swf, swf_cluster


class SimulateError(Exception):
    """A problem with the trace or options, said plainly."""


@dataclass
class LoadedTrace:
    name: str
    kind: str                    # "swf" or "philly"
    jobs: list[TraceJob]
    config: ev.ClusterConfig
    notes: dict[str, int] = field(default_factory=dict)    # records dropped or changed, by why


def _open_text(path: Path) -> TextIO:
    if not path.exists():
        raise SimulateError(f"trace {path} does not exist")
    if path.suffix == ".gz":
        return gzip.open(path, "rt")
    return open(path)


def load_trace(path: str | os.PathLike, *, nodes: int | None = None, gpus_per_node: int = 8,
               policy: str | None = None, bf_window: int | None = None, config: str | None = None) -> LoadedTrace:
    """Read an SWF or Philly CSV trace, or a Slurm accounting dump (``.sacct``, or any file whose first line is
    sacct's ``-P`` header), and build the cluster it runs on (``config``: a slurm.conf, which a dump needs)."""
    p = Path(path)
    name = p.name
    params = ev.SchedulerParams(policy=policy or "conservative",  # type: ignore[arg-type]
                                bf_window=bf_window or 10**9)
    stem = name[:-3] if name.endswith(".gz") else name
    try:
        with _open_text(p) as fh:
            first = fh.readline()
            fh.seek(0)
            if stem.endswith(".sacct") or first.startswith("JobID"):
                return _sacct(name, fh, config)
            if stem.endswith(".swf") or stem.startswith("lublin"):
                tr = read_swf(fh, source=name)
                return LoadedTrace(name, "swf", tr.jobs, swf_cluster(tr.max_procs, params), tr.notes)
            if stem.endswith(".csv"):
                notes: dict[str, int] = {}
                jobs = read_philly(fh, gpus_per_node=gpus_per_node, source=name, notes=notes)
                machine = nodes or 160
                too_big = sum(1 for j in jobs if j.spec.nodes > machine)
                if too_big:
                    notes[TOO_BIG] = too_big
                return LoadedTrace(name, "philly", jobs, gpu_cluster(machine, gpus_per_node, params=params), notes)
    except (TraceFormatError, UnicodeDecodeError, OSError, EOFError) as exc:
        raise SimulateError(f"cannot read trace {name}: {exc}") from None
    raise SimulateError(f"unknown trace format for {name}: expected .swf[.gz] or a Philly .csv[.gz]")


def _sacct(name: str, fh: TextIO, config: str | None) -> LoadedTrace:
    """A Slurm accounting dump on the cluster its slurm.conf describes."""
    from rota.core.slurmconf import ConfigError, parse_config
    from rota.core.traces import read_sacct

    if config is None:
        raise SimulateError(f"{name} is a Slurm accounting dump: give the cluster it ran on with --config slurm.conf")
    tr = read_sacct(fh, source=name)
    try:
        cfg = parse_config(Path(config).read_text(), config)
    except (ConfigError, OSError) as exc:
        raise SimulateError(f"cannot read {config}: {exc}") from None
    known = {p.name for p in cfg.partitions}
    jobs = []
    for j in tr.jobs:      # a partition the configuration lacks: the default partition runs it
        if any(p not in known for p in j.spec.partitions):
            tr.notes["partition not in the configuration: run in the default partition"] = \
                tr.notes.get("partition not in the configuration: run in the default partition", 0) + 1
            j = TraceJob(j.submit, j.spec.model_copy(update={"partitions": ()}), j.runtime, j.trace_id)
        jobs.append(j)
    return LoadedTrace(name, "sacct", jobs, cfg, tr.notes)


def simulate(trace: LoadedTrace, policy: str, *, start: int = 0, limit: int | None = None,
             kill_at_limit: bool = True, stop_when_all_started: bool = False,
             record_log: bool = False, sample_every: int = 0,
             progress: Callable[[int, int], None] | None = None) -> tuple[SimResult, float]:
    """Run ``trace.jobs[start:start+limit]``; returns the result and wall seconds."""
    jobs = trace.jobs[start: start + limit if limit else None]
    if not jobs:
        raise SimulateError(f"no jobs to simulate (trace has {len(trace.jobs)} jobs, start {start})")
    t0 = time.perf_counter()
    sim = Simulator(trace.config, policy, record_log=record_log, kill_at_limit=kill_at_limit,
                    start_time=min(j.submit for j in jobs), sample_every=sample_every)
    result = sim.run(jobs, stop_when_all_started=stop_when_all_started, progress=progress)
    return result, time.perf_counter() - t0


def write_log(result: SimResult, path: str) -> None:
    """Write the simulated event log as JSON lines (one envelope per line)."""
    with open(path, "wb") as fh:
        for env in result.log:
            fh.write(ev.encode_envelope(env))
            fh.write(b"\n")


def plot(result: SimResult, path: str, title: str) -> None:
    """Utilisation and queue length over time, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not result.samples:
        raise SimulateError("nothing to plot: the run recorded no samples")
    t0 = result.samples[0][0]
    hours = [(s[0] - t0) / 3600 for s in result.samples]
    use_gpu = result.capacity_gpus > 0
    util = [(s[2] / result.capacity_gpus if use_gpu else s[1] / result.capacity_cpus) * 100
            for s in result.samples]
    queue = [s[3] for s in result.samples]
    fig, (a1, a2) = plt.subplots(2, 1, sharex=True, figsize=(10, 6))
    a1.plot(hours, util, lw=0.8)
    a1.set_ylabel(("GPU" if use_gpu else "CPU") + " utilisation (%)")
    a1.set_ylim(0, 105)
    a2.plot(hours, queue, lw=0.8, color="tab:red")
    a2.set_ylabel("pending jobs")
    a2.set_xlabel("hours since first submit")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---------------------------------------------------------------- the published protocol

LUBLIN_WINDOWS = (1981, 2756, 4299, 8850, 3316, 2714, 5228, 7762, 4022, 7085)
PUBLISHED = {
    # trace file: (avg bsld no backfill, avg bsld with backfill)
    "lublin_256.swf.gz": (7273.77, 235.82),
    "lublin_256_new2.swf.gz": (7842.47, 247.61),
}
PUBLISHED_LUBLIN1_WAIT = (258203.0, 26624.0)
PUBLISHED_LUBLIN1_UTIL = (0.657, 0.868)


def protocol_run(trace: LoadedTrace, policy: str, windows: Iterable[int] = LUBLIN_WINDOWS,
                 size: int = 1024) -> dict[str, float]:
    """RLScheduler's protocol: windows of 1,024 jobs on an empty machine, ended when the last
    job starts, jobs not killed at their estimate; the mean over windows of each average."""
    bsld, wait, util = [], [], []
    for w in windows:
        res, _ = simulate(trace, policy, start=w, limit=size, kill_at_limit=False,
                          stop_when_all_started=True)
        m = res.metrics()
        bsld.append(m["avg_bsld"])
        wait.append(m["avg_wait"])
        util.append(m["util_to_last_start"])
    return {"avg_bsld": statistics.fmean(bsld), "avg_wait": statistics.fmean(wait),
            "util": statistics.fmean(util)}


def validation_rows(trace_dir: str) -> list[dict]:
    """rota's figures beside the published ones, then textbook EASY and conservative."""
    rows = []
    for fname, (pub_nobf, pub_bf) in PUBLISHED.items():
        trace = load_trace(os.path.join(trace_dir, fname))
        for label, policy, published in (("FCFS, no backfill", "fifo", pub_nobf),
                                         ("FCFS + their backfill", "easy_strict", pub_bf),
                                         ("textbook EASY", "easy", None),
                                         ("conservative", "conservative", None)):
            m = protocol_run(trace, policy)
            diff = None if published is None else (m["avg_bsld"] - published) / published * 100
            rows.append({"trace": fname, "mode": label, "policy": policy, "rota_bsld": m["avg_bsld"],
                         "published_bsld": published, "diff_pct": diff, "avg_wait": m["avg_wait"],
                         "util": m["util"]})
    return rows


def dump_json(obj, path: str) -> None:
    with open(path, "w") as fh:
        json.dump(obj, fh, indent=1)
