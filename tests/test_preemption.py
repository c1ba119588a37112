"""Preemption by QOS: who is chosen, how victims stop (cancel, requeue, grace time), what the log keeps."""
from hypothesis import given, settings
from hypothesis import strategies as st

from rota.core import events as ev
from rota.core.effects import orders
from rota.core.orders import Signal, Update
from rota.core.schedule import schedule
from harness import Harness, make_cluster
from rota.core.timetravel import verify
import pytest

pytestmark = pytest.mark.fast    # make test-fast: the core and the front door, no process started


def harness(low_mode: str = "requeue", grace: int = 0, nodes: int = 1, cluster_mode: str = "cancel") -> Harness:
    cfg = make_cluster(nodes=nodes, gpus=8, cpus=16).model_copy(update={"preempt_type": "qos",
                                                                        "preempt_mode": cluster_mode})
    h = Harness(cfg)
    h.put(ev.AccountingChanged(qos=(ev.QosRecord(name="low", priority=0, preempt_mode=low_mode, grace_time=grace),
                                    ev.QosRecord(name="scavenger", priority=0),
                                    ev.QosRecord(name="high", priority=100, preempt=("low", "scavenger")))),
          actor="root")
    return h


def gpu_job(h: Harness, qos: str, gpus: int, **kw) -> int:
    return h.submit(qos=qos, gpus_per_node=gpus, gpu_given=True, cpus_per_task=2, time_limit=3600, requeue=True, **kw)


def two_low_then_high(h: Harness) -> tuple[int, int, int]:
    """Two 4-GPU low-QOS jobs started a minute apart fill the node; then a 4-GPU high-QOS job: (old, young, high)."""
    old = gpu_job(h, "low", 4)
    h.cycle()
    h.advance(60)
    young = gpu_job(h, "low", 4)
    h.cycle()
    h.advance(60)
    high = gpu_job(h, "high", 4)
    return old, young, high


def test_a_high_qos_job_requeues_the_youngest_low_qos_job_and_starts_after_it():
    h = harness()
    old, young, high = two_low_then_high(h)
    d = h.cycle()
    assert d.starts == [] and [(p.by, [v.job_id for v in p.victims], p.candidates) for p in d.preemptions] == \
        [(high, [young], (young, old))]
    assert d.preemptions[0].victims[0].mode == "requeue"
    assert h.state.jobs[young].state == "PENDING" and h.state.jobs[young].restarts == 1
    assert h.state.jobs[old].state == "RUNNING"
    d = h.cycle()
    assert [s.job_id for s in d.starts] == [high]         # what it freed goes to the preemptor
    assert (d.pending[young].reason, d.pending[young].why.asked) == ("BeginTime", 121)   # Slurm's requeue delay
    assert all(div is None for _seq, div in verify(h.log))


def test_cancel_mode_ends_the_victim_preempted_and_no_job_of_another_qos_is_touched():
    h = harness(low_mode="cancel")
    normal = h.submit(gpus_per_node=4, gpu_given=True, cpus_per_task=2, time_limit=3600)
    low = gpu_job(h, "low", 4)
    h.cycle()
    whole = gpu_job(h, "high", 8)
    assert h.cycle().preemptions == []                    # 8 GPUs would need the normal job's too: no use
    h.put(ev.JobCancelled(job_id=whole, by_uid=0))
    high = gpu_job(h, "high", 4)
    h.cycle()
    assert h.state.jobs[low].state == "PREEMPTED" and h.state.jobs[normal].state == "RUNNING"
    assert [s.job_id for s in h.cycle().starts] == [high]


def test_the_cluster_preempt_mode_applies_to_a_qos_that_names_none_and_off_protects():
    h = harness(low_mode="cluster", cluster_mode="off")
    gpu_job(h, "low", 8)
    h.cycle()
    gpu_job(h, "high", 8)
    assert h.cycle().preemptions == []                    # PreemptMode=OFF: nothing may be preempted
    h = harness(low_mode="cluster", cluster_mode="cancel")
    low = gpu_job(h, "low", 8)
    h.cycle()
    gpu_job(h, "high", 8)
    h.cycle()
    assert h.state.jobs[low].state == "PREEMPTED"


def test_grace_time_sends_sigterm_now_and_stops_the_victim_when_it_runs_out():
    h = harness(low_mode="requeue", grace=120)
    low = gpu_job(h, "low", 8)
    h.cycle()
    h.advance(600)
    high = gpu_job(h, "high", 8)
    d = schedule(h.state, h.now)
    assert d.preemptions[0].victims[0].grace == 120
    changes = h.batch(d.event())
    job = h.state.jobs[low]
    assert job.state == "RUNNING" and job.preempted_by == high and job.time_limit == 720
    told = orders(h.state, changes)
    assert ("gpu01", Update(job_id=low, restarts=0, time_limit=720)) in told
    # its steps are told, as Slurm tells them; the batch script is not (it runs on until its grace runs out)
    assert ("gpu01", Signal(job_id=low, restarts=0, signal=15, batch=False, steps=True)) in told
    d = h.cycle()
    assert d.preemptions == [] and d.pending[high].start == h.now + 120   # nothing more preempted: it waits
    h.advance(120)
    h.finish(low, state="TIMEOUT")                        # its agent stopped it at the new limit
    assert h.state.jobs[low].state == "PENDING" and h.state.jobs[low].restarts == 1
    assert h.state.jobs[low].preempted_by is None
    assert [s.job_id for s in h.cycle().starts] == [high]


def test_victims_are_the_fewest_that_make_room():
    h = harness(low_mode="cancel", nodes=2)
    small = [gpu_job(h, "low", 4, nodelist=("gpu01",)) for _ in range(2)]
    big = gpu_job(h, "low", 8, nodelist=("gpu02",))
    h.cycle()
    assert all(h.state.jobs[j].state == "RUNNING" for j in small + [big])
    gpu_job(h, "high", 8)
    d = h.cycle()
    assert [v.job_id for v in d.preemptions[0].victims] == [big]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["low", "scavenger", "normal", "high"]), st.integers(1, 8)),
                min_size=1, max_size=12))
def test_no_job_of_a_qos_its_preemptor_may_not_preempt_is_ever_a_victim(jobs):
    h = harness(low_mode="requeue", nodes=2)
    qos_of: dict[int, str] = {}
    for qos, gpus in jobs:
        jid = gpu_job(h, qos, gpus)
        qos_of[jid] = qos
        for _ in range(3):
            d = h.cycle()
            for p in d.preemptions:
                assert qos_of[p.by] == "high"
                for v in p.victims:
                    assert qos_of[v.job_id] in ("low", "scavenger")   # the QOS high may preempt
            if not d.preemptions:
                break
        h.advance(10)
    for job in h.state.jobs.values():
        if job.restarts or job.state == "PREEMPTED":
            assert job.spec.qos in ("low", "scavenger")


def test_why_says_who_preempted_a_victim_and_how_it_was_chosen():
    from rota.cli.timetravel import why_text
    from rota.core.timetravel import why

    h = harness()
    old, young, high = two_low_then_high(h)
    h.cycle()
    rep = why(h.log, young)
    assert [(p["by"]["job_id"], p["mode"], [c["job_id"] for c in p["candidates"]]) for p in rep.preempted] == \
        [(high, "requeue", [young, old])]
    text = "\n".join(why_text(rep, {}))
    assert f"job {high} (alice, QOS high) preempted it" in text and "QOS high may preempt low, scavenger" in text
    assert f"job {young} (alice, QOS low priority 0" in text and "- chosen" in text
    assert [v["job_id"] for p in why(h.log, high).preempting for v in p["victims"]] == [young]
