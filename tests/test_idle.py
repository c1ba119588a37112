"""Forgotten GPUs: idleness sampled by the agent's GpuUse, and the cluster's policy over the log (rota.core.idle)."""
from types import SimpleNamespace

import pytest

from harness import Harness
from rota.agents.gpuuse import GpuUse
from rota.core import events as ev
from rota.core.idle import idle_actions, idle_jobs
from rota.core.slurmconf import parse_config

pytestmark = pytest.mark.fast


def test_gpu_use_reports_idle_after_a_while_with_its_samples_and_busy_when_work_comes_back():
    util = {0: 0, 1: 0}
    use = GpuUse("n1", lambda g: (util[g], 100), report_after=30)
    runs = {7: SimpleNamespace(order=SimpleNamespace(gpus=(0, 1), restarts=0))}
    assert use.sample(runs, 100) == [] and use.sample(runs, 120) == []
    (idle,) = use.sample(runs, 130)
    assert isinstance(idle, ev.GpuIdle) and (idle.job_id, idle.since) == (7, 100)
    assert [(s.t, s.gpu, s.util) for s in idle.samples][:2] == [(100, 0, 0), (100, 1, 0)] and len(idle.samples) == 6
    assert use.sample(runs, 140) == []                          # told once
    util[1] = 85                                               # one GPU at work: the job is not idle
    (busy,) = use.sample(runs, 150)
    assert isinstance(busy, ev.GpuBusy) and busy.job_id == 7
    assert use.sample({}, 160) == [] and use.tracks == {}       # an ended job is forgotten


def harness(policy: str) -> tuple[Harness, int, int]:
    text = (f"RotaIdleGpu={policy}\nGresTypes=gpu\nNodeName=gpu01 CPUs=8 RealMemory=64000 Gres=gpu:a100:4\n"
            "PartitionName=gpu Nodes=gpu01 Default=YES MaxTime=1-0\n")
    h = Harness(parse_config(text, "slurm.conf"))
    idle = h.submit(user="ann", gpus_per_node=2, time_limit=3600, partitions=("gpu",))
    spared = h.submit(user="bob", gpus_per_node=1, time_limit=3600, partitions=("gpu",), qos="long")
    h.cycle()
    for jid in (idle, spared):
        h.put(ev.GpuIdle(node="gpu01", job_id=jid, since=h.now, samples=(ev.GpuSample(t=h.now, gpu=0, util=0, mem=0),)),
              actor="agent")
    return h, idle, spared


def test_the_policy_cancels_after_its_idle_time_and_grace_and_spares_an_exempt_qos():
    h, idle, spared = harness("after=1h,action=cancel,grace=30m,exempt_qos=long")
    since = h.state.jobs[idle].idle_since
    assert idle_actions(h.state, since + 5399) == []
    (cancel,) = idle_actions(h.state, since + 5400)
    assert isinstance(cancel, ev.JobCancelled) and cancel.job_id == idle and "idle from" in cancel.reason
    rows = {j.job_id: j for j in idle_jobs(h.state, since + 3600)}
    assert rows[idle].gpu_hours == 2.0 and rows[spared].gpu_hours == 1.0        # both listed, one spared
    h.put(ev.GpuBusy(node="gpu01", job_id=idle), actor="agent")
    assert idle_actions(h.state, since + 9999) == []                            # it went back to work


def test_requeue_and_warn_only_policies():
    h, idle, other = harness("after=10m,action=requeue")           # no QOS exempt: both go back to the queue
    due = idle_actions(h.state, h.state.jobs[idle].idle_since + 600)
    assert [(type(a), a.job_id) for a in due] == [(ev.JobRequeued, idle), (ev.JobRequeued, other)]
    h, idle, _ = harness("after=10m")
    assert idle_actions(h.state, h.state.jobs[idle].idle_since + 99999) == []    # action=warn: only the notice


def test_a_policy_the_configuration_cannot_read_is_named_with_its_line():
    from rota.core.slurmconf import ConfigError

    with pytest.raises(ConfigError) as exc:
        parse_config("RotaIdleGpu=after=1h,action=explode\nNodeName=n1 CPUs=1 RealMemory=100\n"
                     "PartitionName=p Nodes=n1 Default=YES\n", "slurm.conf")
    assert "RotaIdleGpu: 'action=explode' is not understood" in str(exc.value.diagnostics[0])


def test_squeue_shows_how_long_a_jobs_gpus_have_been_idle():
    from rota.controller.squeue_view import format_from_names, render

    row = {"job_id": 7, "array_job_id": None, "array_task_id": None, "array_pending": None, "state": "RUNNING",
           "idle_since": 1000, "nodes": ["gpu01"], "reason": "None"}
    busy = dict(row, job_id=8, idle_since=None)
    fmt = format_from_names("JobID:5,GpuIdle:.10")
    assert render(fmt, [row, busy], now=1000 + 3725) == ["JOBID  GPU_IDLE", "7       1:02:05", "8           N/A"]
