"""Shared GPUs (--gres=shard:N): small jobs pack onto one card, never over it, and a whole-GPU job waits for it."""
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pytest

from harness import Harness
from rota.core.commands import Rejected
from rota.core.slurmconf import parse_config
from rota.core.state import SHARED

pytestmark = pytest.mark.fast

CONF = ("GresTypes=gpu,shard\nNodeName=n1 CPUs=16 RealMemory=64000 Gres=gpu:a100:{gpus},shard:{shards}\n"
        "PartitionName=p Nodes=n1 Default=YES MaxTime=1-0\n")


def harness(gpus: int = 1, shards: int = 4) -> Harness:
    return Harness(parse_config(CONF.format(gpus=gpus, shards=shards), "slurm.conf"))


def test_two_shard_jobs_share_a_card_and_a_third_waits_with_a_reason():
    h = harness()
    a = h.submit(user="ann", shards_per_node=2, time_limit=600)
    b = h.submit(user="bob", shards_per_node=2, time_limit=1200)
    c = h.submit(user="cat", shards_per_node=1, time_limit=600)
    d = h.cycle()
    assert [h.state.jobs[j].state for j in (a, b, c)] == ["RUNNING", "RUNNING", "PENDING"]
    assert [h.state.jobs[j].alloc[0].gpus for j in (a, b)] == [(0,), (0,)]
    assert [h.state.jobs[j].alloc[0].shards for j in (a, b)] == [2, 2]
    node = h.state.nodes["n1"]
    assert (node.gpu_owner, node.shard_used) == ([SHARED], [4])
    assert d.pending_of(c).reason == "Resources"
    h.advance(600)
    h.finish(a)
    h.cycle()
    assert h.state.jobs[c].state == "RUNNING" and h.state.nodes["n1"].shard_used == [3]


def test_a_whole_gpu_job_waits_until_the_last_shard_job_of_the_card_ends():
    h = harness()
    a = h.submit(user="ann", shards_per_node=1, time_limit=600)
    h.cycle()
    b = h.submit(user="bob", shards_per_node=1, time_limit=1800)     # beside a: the card is held until 1800
    whole = h.submit(user="cat", gpus_per_node=1, gpu_given=True, time_limit=600)
    d = h.cycle()
    assert h.state.jobs[b].state == "RUNNING" and h.state.jobs[whole].state == "PENDING"
    assert d.reservations[whole].start == h.now + 1800
    h.advance(600)
    h.finish(a)
    h.cycle()
    assert h.state.jobs[whole].state == "PENDING" and h.state.nodes["n1"].gpu_owner == [SHARED]
    h.advance(1200)
    h.finish(b)
    h.cycle()
    assert h.state.jobs[whole].state == "RUNNING" and h.state.nodes["n1"].shard_used == [0]


def test_a_shard_job_never_delays_a_planned_whole_gpu_job():
    h = harness()
    a = h.submit(user="ann", shards_per_node=1, time_limit=600)
    h.cycle()
    whole = h.submit(user="cat", gpus_per_node=1, gpu_given=True, time_limit=600)    # planned at 600
    late = h.submit(user="bob", shards_per_node=1, time_limit=3600)                  # would hold the card past it
    short = h.submit(user="dan", shards_per_node=1, time_limit=300)                  # ends before it
    d = h.cycle()
    assert h.state.jobs[late].state == "PENDING" and h.state.jobs[short].state == "RUNNING"
    assert d.reservations[whole].start == h.state.jobs[a].start_time + 600


def test_shard_requests_are_checked_at_submit():
    h = harness()
    with pytest.raises(Rejected, match="Requested node configuration is not available"):
        h.submit(user="ann", shards_per_node=8, time_limit=60)
    with pytest.raises(Rejected, match="GPUs or for shards"):
        h.submit(user="ann", shards_per_node=1, gpus_per_node=1, gpu_given=True, time_limit=60)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["shard", "shard", "gpu", "finish", "cycle"]), st.integers(1, 4),
                          st.integers(1, 6)), min_size=4, max_size=30))
def test_never_more_shards_than_a_card_has_nor_a_card_both_shared_and_whole(ops):
    h = harness(gpus=2, shards=8)
    for op, n, t in ops:
        if op == "shard":
            h.submit(user=f"u{n}", shards_per_node=n, time_limit=300 * t)
        elif op == "gpu":
            h.submit(user=f"u{n}", gpus_per_node=1 + n % 2, gpu_given=True, time_limit=300 * t)
        elif op == "finish" and h.state.running:
            h.advance(60 * t)
            h.finish(sorted(h.state.running)[n % len(h.state.running)])
        h.cycle()
        node = h.state.nodes["n1"]
        for g in range(2):
            on = [j for j in h.state.running for a in h.state.jobs[j].alloc if a.gpus[:1] == (g,) or g in a.gpus]
            shards = sum(a.shards for j in on for a in h.state.jobs[j].alloc if a.shards and a.gpus == (g,))
            whole = [j for j in on if not h.state.jobs[j].alloc[0].shards]
            assert shards == node.shard_used[g] <= 4
            assert len(whole) <= 1 and not (whole and shards)
            assert node.gpu_owner[g] == (SHARED if shards else whole[0] if whole else 0)


def test_a_cycle_judges_each_shape_once_and_a_shard_count_no_card_has_apart(monkeypatch):
    """The capacity verdict (can any node ever hold this?) is made once per shape in a cycle, and the shards a job
    asks are part of its shape: a job asking more shards than any card has (recorded by some other path than
    sbatch, which refuses it) can never run, whatever verdict a job asking fewer got."""
    from rota.core import events as ev
    from rota.core import static_reasons

    judged = []
    real = static_reasons.capacity_verdict
    monkeypatch.setattr(static_reasons, "capacity_verdict", lambda *a: judged.append(a[1].shards_per_node) or real(*a))
    h = harness(gpus=1, shards=4)
    fits = [h.submit(user="ann", shards_per_node=2, time_limit=600, hold=True) for _ in range(20)]
    never = h.state.next_job_id
    h.put(ev.JobSubmitted(job_id=never, spec=ev.JobSpec(user="bob", shards_per_node=8, time_limit=600)))
    d = h.cycle()
    assert judged == [8] and all(d.pending[j].reason == "JobHeldUser" for j in fits)
    for j in fits:
        h.put(ev.JobReleased(job_id=j))
    judged.clear()
    d = h.cycle()
    assert sorted(judged) == [2, 8]
    assert d.pending[never].reason == "Resources" and "large enough" in (d.pending[never].why.note or "")
    assert len([s for s in d.starts if s.job_id in fits]) == 2     # two shard:2 jobs fill the card's 4
