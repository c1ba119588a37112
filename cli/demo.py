"""A small simulated demo through the core: four GPU nodes, a morning's queue, backfill at work.

Every event is logged at the time the demo narrates it, and every job ends at its own run time (never
past its limit), with a cycle after each change as the controller runs one: `rota verify` and
`rota why` over the demo's log tell the same story as its printout.
"""
from __future__ import annotations

from typing import Any

from rota.core import commands
from rota.core import events as ev
from rota.core.schedule import Decision, schedule
from rota.core.slurmconf import make_cluster
from rota.core.state import State
from rota.core.timefmt import format_duration
from rota.core.timeline import Timeline

# how long each job really runs (seconds; within its time limit)
RUNTIMES = {"llm-pretrain": 3 * 3600 + 40 * 60, "sweep": 40 * 60, "finetune": 100 * 60, "big-eval": 50 * 60,
            "quick-test": 20 * 60, "long-debug": 5 * 3600}
T0 = 1_800_000_000


class Demo:
    """The demo's cluster: its log in memory, a clock the story moves, a cycle after each change."""

    def __init__(self, config: ev.ClusterConfig, now: int) -> None:
        self.log: list[ev.Envelope] = []
        self.timeline = Timeline(idem="demo-", record=self.log)
        self.state: State = self.timeline.state
        self.now = now
        self.put(ev.ClusterConfigured(config=config, source="demo"), actor="admin")

    def put(self, event: Any, actor: str) -> ev.Envelope:
        return self.timeline.put(self.now, event, actor)

    def submit(self, **spec: Any) -> int:
        """Validate and append a job, as sbatch with those options would (the flags named are given)."""
        for flag in ("nodes", "ntasks", "cpus_per_task"):
            if flag in spec:
                spec[f"{flag}_given"] = True
        job_id = self.state.next_job_id
        self.put(commands.submit(self.state, ev.JobSpec(**spec), job_id), actor=spec["user"])
        return job_id

    def cycle(self) -> Decision:
        d = schedule(self.state, self.now, explain=True)
        event = d.event()
        if event is not None:
            self.put(event, actor="controller")
        return d

    def finish(self, job_id: int, elapsed: int) -> None:
        self.put(ev.JobExited(job_id=job_id, state="COMPLETED", exit_code=0, elapsed=elapsed), actor="agent")


def _queue_table(h: Demo, d: Decision) -> list[str]:
    rows = []
    for jid in sorted(h.state.jobs):
        job = h.state.jobs[jid]
        if job.state == "RUNNING":
            where = ",".join(a.node for a in job.alloc)
            rows.append(f"{jid:>6} {job.spec.name:<14} {job.spec.user:<7} R  {where}")
        elif job.state == "PENDING":
            p = d.pending_of(jid)
            start = f" start in {format_duration(p.start - h.now)}" if p and p.start else ""
            rows.append(f"{jid:>6} {job.spec.name:<14} {job.spec.user:<7} PD ({p.display if p else 'None'}){start}")
    return rows


def _run_until(h: Demo, t: int) -> None:
    """Let the cluster run to time ``t``: each job ends at its start plus its run time, and a cycle
    follows every change, as the controller runs one."""
    while True:
        ends = sorted((job.start_time + RUNTIMES[job.spec.name], jid) for jid, job in h.state.jobs.items()
                      if job.state == "RUNNING")
        if not ends or ends[0][0] > t:
            break
        h.now = ends[0][0]
        for end, jid in ends:
            if end == h.now:
                job = h.state.jobs[jid]
                h.finish(jid, elapsed=end - job.start_time)
        h.cycle()
    h.now = t


def _clock(h: Demo) -> str:
    minutes = (h.now - T0) // 60
    return f"t+{minutes // 60}:{minutes % 60:02d}"


def run_demo(echo=print) -> Demo:
    """Run the demo, printing what a user would see as it goes."""
    h = Demo(make_cluster(nodes=4, gpus=8, max_time=86400), now=T0)
    from rota.core import __version__

    h.put(ev.ControllerStarted(version=__version__, policy="conservative"), actor="controller")
    echo("rota demo: 4 nodes x 8 A100, conservative backfill, simulated clock\n")
    h.submit(name="llm-pretrain", user="ana", nodes=2, gpus_per_node=8, time_limit=4 * 3600)
    h.submit(name="sweep", user="bo", gpus_per_node=1, time_limit=3600, array="0-7%4")
    h.submit(name="finetune", user="chen", gpus_per_node=4, time_limit=2 * 3600)
    d = h.cycle()
    echo(f"{_clock(h)}  {len(d.starts)} jobs started")
    big = h.submit(name="big-eval", user="dee", nodes=4, gpus_per_node=8, time_limit=3600)
    h.submit(name="quick-test", user="eve", gpus_per_node=2, time_limit=1800)
    h.submit(name="long-debug", user="eve", gpus_per_node=2, time_limit=6 * 3600)
    d = h.cycle()
    echo(f"{_clock(h)}  four-node job {big} queued behind the running work:")
    for line in _queue_table(h, d):
        echo("   " + line)
    for s in (s for s in d.starts if s.backfilled):
        echo(f"   backfilled job {s.job_id} ({h.state.jobs[s.job_id].spec.name}): it ends before "
             f"job {big}'s reserved start, so it delays nobody")
    _run_until(h, T0 + 3600)
    h.put(ev.NodeDrained(node="gpu04", reason="fan failure", by="admin"), actor="admin")
    d = h.cycle()
    echo(f"\n{_clock(h)}  gpu04 drained by admin (fan failure); the queue now:")
    for line in _queue_table(h, d):
        echo("   " + line)
    p = d.pending_of(big)
    if p is not None:
        echo(f"\n   why is job {big} waiting? {p.display}: {p.detail}")
    _run_until(h, T0 + 5 * 3600)
    h.put(ev.NodeResumed(node="gpu04", by="admin"), actor="admin")
    d = h.cycle()
    echo(f"\n{_clock(h)}  gpu04 resumed by admin; the queue now:")
    for line in _queue_table(h, d):
        echo("   " + line)
    _run_until(h, T0 + 12 * 3600)
    echo(f"\n{_clock(h)}  all done: {len(h.state.running)} running, {len(h.state.pending)} pending, "
         f"log of {len(h.log)} events")
    return h
