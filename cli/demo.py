"""A small simulated demo through the core: four GPU nodes, a morning's queue, backfill at work."""
from __future__ import annotations

from rota.core import events as ev
from rota.core.testing import Harness, make_cluster
from rota.core.timefmt import format_duration


def _queue_table(h: Harness, d) -> list[str]:
    rows = []
    for jid in sorted(h.state.jobs):
        job = h.state.jobs[jid]
        if job.state == "RUNNING":
            where = ",".join(a.node for a in job.alloc)
            rows.append(f"{jid:>6} {job.spec.name:<14} {job.spec.user:<7} R  {where}")
        elif job.state == "PENDING":
            p = d.pending.get(jid)
            start = f" start in {format_duration(p.start - h.now)}" if p and p.start else ""
            rows.append(f"{jid:>6} {job.spec.name:<14} {job.spec.user:<7} PD ({p.display if p else 'None'}){start}")
    return rows


def run_demo(echo=print) -> Harness:
    """Run the demo, printing what a user would see after each scheduling cycle."""
    h = Harness(make_cluster(nodes=4, gpus=8, max_time=86400), now=1_800_000_000)
    from rota.core import __version__

    h.put(ev.ControllerStarted(version=__version__, policy="conservative"), actor="controller")
    echo("rota demo: 4 nodes x 8 A100, conservative backfill, simulated clock\n")
    h.submit(name="llm-pretrain", user="ana", nodes=2, gpus_per_node=8, time_limit=4 * 3600)
    h.submit(name="sweep", user="bo", gpus_per_node=1, time_limit=3600, array="0-7%4")
    h.submit(name="finetune", user="chen", gpus_per_node=4, time_limit=2 * 3600)
    d = h.cycle()
    echo(f"t+0:00  {len(d.starts)} jobs started")
    big = h.submit(name="big-eval", user="dee", nodes=4, gpus_per_node=8, time_limit=3600)
    h.submit(name="quick-test", user="eve", gpus_per_node=2, time_limit=1800)
    h.submit(name="long-debug", user="eve", gpus_per_node=2, time_limit=6 * 3600)
    d = h.cycle()
    echo("t+0:00  four-node job queued behind the running work:")
    for line in _queue_table(h, d):
        echo("   " + line)
    bf = [s for s in d.starts if s.backfilled]
    for s in bf:
        echo(f"   backfilled job {s.job_id} ({h.state.jobs[s.job_id].spec.name}): it ends before "
             f"job {big}'s reserved start, so it delays nobody")
    h.put(ev.NodeDrained(node="gpu04", reason="fan failure", by="admin"))
    h.advance(3600)
    for jid in list(h.state.running):
        job = h.state.jobs[jid]
        if job.start_time + (job.time_limit or 0) <= h.now:
            h.finish(jid, elapsed=job.time_limit or 0)
    d = h.cycle()
    echo("\nt+1:00  gpu04 drained by admin (fan failure); finished jobs left:")
    for line in _queue_table(h, d):
        echo("   " + line)
    p = d.pending.get(big)
    if p is not None:
        echo(f"\n   why is job {big} waiting? {p.display}: {p.detail}")
    h.put(ev.NodeResumed(node="gpu04", by="admin"))
    h.advance(4 * 3600)
    for jid in list(h.state.running):
        h.finish(jid)
    h.cycle()
    echo(f"\nt+5:00  gpu04 resumed; state of the queue: "
         f"{len(h.state.running)} running, {len(h.state.pending)} pending, log of {len(h.log)} events")
    return h
