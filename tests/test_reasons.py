"""One test per pending reason: each scenario's answer is known."""
from hypothesis import given
from hypothesis import strategies as st
import pytest

from rota.core import events as ev
from rota.core.commands import Rejected
from rota.core.schedule import REQ_NODE_NOT_AVAIL_ALL
from harness import Harness, make_cluster

pytestmark = pytest.mark.fast    # make test-fast: the core and the front door, no process started


def reason(h, jid):
    return h.cycle().pending[jid].reason


def fill_cluster(h, minutes=30):
    ids = [h.submit(name=f"fill{i}", gpus_per_node=8, time_limit=minutes * 60) for i in range(4)]
    d = h.cycle()
    assert len(d.starts) == 4
    return ids


def test_resources_for_the_next_job_and_priority_behind_it(h):
    fill_cluster(h)
    first = h.submit(name="wants-gpu-1", gpus_per_node=1)
    second = h.submit(name="wants-gpu-2", gpus_per_node=1)
    d = h.cycle()
    assert d.pending[first].reason == "Resources"
    assert d.pending[second].reason == "Priority"
    assert d.pending[first].rank < d.pending[second].rank
    # both get an expected start when the fillers end
    assert d.pending[first].start == h.now + 1800


def test_priority_when_a_reservation_holds_what_it_needs():
    h = Harness(make_cluster(nodes=2))
    h.submit(name="half", gpus_per_node=8, time_limit=1200)
    h.cycle()
    big = h.submit(name="big", nodes=2, gpus_per_node=8, time_limit=3000)
    small = h.submit(name="small", gpus_per_node=8, time_limit=3000)
    d = h.cycle()
    # gpu02 is free now, but big's reservation needs it in 1200 s and small would run 3000 s
    assert d.pending[big].reason == "Resources"
    assert d.pending[small].reason == "Priority"
    assert small not in {s.job_id for s in d.starts}
    assert d.pending[small].start >= d.pending[big].start + 3000


def test_partition_time_limit(h):
    jid = h.submit(name="too-long", time_limit=7200)
    assert reason(h, jid) == "PartitionTimeLimit"


def test_partition_node_limit(h):
    jid = h.submit(name="five-nodes", nodes=5)
    assert reason(h, jid) == "PartitionNodeLimit"


def test_req_node_not_avail_for_a_drained_required_node(h):
    h.put(ev.NodeDrained(node="gpu04", reason="maintenance", by="root"))
    jid = h.submit(name="wants-gpu04", nodelist=("gpu04",))
    d = h.cycle()
    assert d.pending[jid].reason == "ReqNodeNotAvail"
    assert d.pending[jid].display == "ReqNodeNotAvail, UnavailableNodes:gpu04"


def test_req_node_not_avail_when_every_node_is_drained(h):
    for n in ("gpu01", "gpu02", "gpu03", "gpu04"):
        h.put(ev.NodeDrained(node=n, reason="maintenance", by="root"))
    jid = h.submit(name="any")
    d = h.cycle()
    assert d.pending[jid].reason == "ReqNodeNotAvail"
    assert d.pending[jid].display == REQ_NODE_NOT_AVAIL_ALL


def test_partition_down():
    part = ev.PartitionConfig(name="maint", nodes=("gpu01",), state="DOWN")
    h = Harness(make_cluster(extra_partitions=(part,)))
    jid = h.submit(partitions=("maint",))
    assert reason(h, jid) == "PartitionDown"


def test_held_by_user_and_by_admin(h):
    user = h.submit(name="held-by-user", hold=True)
    admin = h.submit(name="held-by-admin")
    h.put(ev.JobHeld(job_id=admin, admin=True))
    d = h.cycle()
    assert d.pending[user].reason == "JobHeldUser"
    assert d.pending[admin].reason == "JobHeldAdmin"
    h.put(ev.JobReleased(job_id=user))
    assert user in {s.job_id for s in h.cycle().starts}


def test_begin_time(h):
    jid = h.submit(name="begins-later", begin=h.now + 600)
    assert reason(h, jid) == "BeginTime"
    h.advance(600)
    assert jid in {s.job_id for s in h.cycle().starts}


def test_dependency_then_start(h):
    blocker = h.submit(name="blocker")
    h.cycle()
    after = h.submit(name="after-blocker", dependency=f"afterok:{blocker}")
    assert reason(h, after) == "Dependency"
    h.finish(blocker)
    assert after in {s.job_id for s in h.cycle().starts}


def test_dependency_never_satisfied(h):
    blocker = h.submit(name="blocker")
    h.cycle()
    after = h.submit(name="after-blocker", dependency=f"afterok:{blocker}")
    h.finish(blocker, state="FAILED", exit_code=3)
    assert reason(h, after) == "DependencyNeverSatisfied"
    with pytest.raises(Rejected, match="Job dependency problem"):
        h.submit(name="after-unknown", dependency="afterok:999999")


def test_job_array_task_limit(h):
    arr = h.submit(name="arr", array="0-7%2", gpus_per_node=1)
    d = h.cycle()
    assert [s.array_task_id for s in d.starts] == [0, 1]
    assert d.pending[arr].reason == "JobArrayTaskLimit"
    assert reason(h, arr) == "JobArrayTaskLimit"


def test_bad_constraints_after_a_config_change():
    h = Harness(make_cluster(features=("ib",)))
    jid = h.submit(name="needs-ib", constraint="ib")
    h.put(ev.JobHeld(job_id=jid, admin=True))
    h.put(ev.ClusterConfigured(config=make_cluster(features=())))
    h.put(ev.JobReleased(job_id=jid))
    assert reason(h, jid) == "BadConstraints"


def test_reasons_are_a_closed_ranked_set_with_sentences_and_numbers():
    from rota.core.reasons import CODES, SENTENCES, TIERS, Amounts, Reason, most_severe

    assert set(SENTENCES) == set(CODES) and sorted(TIERS.values()) == list(range(len(CODES)))
    assert TIERS["JobHeldAdmin"] < TIERS["JobHeldUser"] < TIERS["PartitionDown"] < TIERS["Dependency"] \
        < TIERS["BeginTime"] < TIERS["Priority"]
    down, limit = Reason("PartitionDown", about="a"), Reason("PartitionTimeLimit", about="b", asked=9000, limit=7200)
    assert most_severe([limit, down]) is down and most_severe([]) is None
    assert limit.numbers() == "time limit 9000s exceeds partition b MaxTime 7200s"
    r = Reason("Resources", needs=Amounts(2, 8, 1000, 1, "a100"), free=Amounts(1, 4, 500, 0), limit=3)
    assert r.numbers() == ("needs 2 nodes with 8 CPUs, 1000 MiB, 1 GPU(s) of type a100 each; 1 of the 3 usable "
                           "nodes could hold that now")
    r = Reason("Resources", needs=Amounts(1, 8, 1000, 1), free=Amounts(0, 4, 500, 0), limit=3)
    assert r.numbers() == "needs 1 node with 8 CPUs, 1000 MiB, 1 GPU(s); the freest usable node now has 4 CPUs, " \
                          "500 MiB, 0 GPU(s) free"
    assert Reason("ReqNodeNotAvail", text="ReqNodeNotAvail, UnavailableNodes:gpu04").display.endswith("gpu04")


def test_a_held_job_with_a_dependency_is_held_first():
    h = Harness(make_cluster(nodes=1, gpus=0))
    first = h.submit(time_limit=600)
    h.cycle()
    held = h.submit(hold=True, dependency=f"afterok:{first}", time_limit=7200)
    d = h.cycle()
    assert d.pending[held].reason == "JobHeldUser" and d.pending[held].why.tier == 1


def test_a_job_of_another_partition_on_nodes_held_for_a_blocked_job_says_so_as_slurm_does():
    names = tuple(f"gpu{i:02d}" for i in range(1, 3))
    long = ev.PartitionConfig(name="long", nodes=names, max_time=86400)
    h = Harness(make_cluster(nodes=2, extra_partitions=(long,)))
    for _ in range(2):
        h.submit(user="alice", exclusive=True, time_limit=1800)
    h.cycle()
    first = h.submit(user="bob", exclusive=True, time_limit=600)
    other = h.submit(user="bob", exclusive=True, time_limit=600, partitions=("long",))
    behind = h.submit(user="bob", exclusive=True, time_limit=600, partitions=("long",))
    d = h.cycle()
    assert (d.pending[first].reason, d.pending[first].display) == ("Resources", "Resources")
    assert d.pending[other].reason == "Resources"
    assert d.pending[other].display == ("Nodes required for job are DOWN, DRAINED or reserved for jobs in higher "
                                        "priority partitions")
    assert d.pending[behind].display == "Priority"


def test_why_says_an_exclusive_job_needs_whole_nodes_not_one_cpu():
    h = Harness(make_cluster(nodes=2))
    for _ in range(2):
        h.submit(user="alice", cpus_per_task=4, time_limit=1800)
    h.cycle()
    wide = h.submit(user="bob", exclusive=True, nodes=2, nodes_given=True, time_limit=600)
    why = h.cycle(explain=True).pending[wide].why
    assert why.numbers().startswith("needs 2 nodes each with all of its CPUs and memory (--exclusive); 1 of the 2 usable")


def test_a_begin_time_reads_as_a_moment_not_an_epoch():
    h = Harness(make_cluster(nodes=1))
    job = h.submit(user="alice", begin=h.now + 3600)
    assert h.cycle().pending[job].why.numbers() == "not before 1970-01-12T14:46:40 UTC (3600s from now)"


@given(st.integers(0, 253402300799))
def test_moments_are_written_as_the_calendar_has_them(epoch):
    import datetime

    from rota.core.timefmt import format_utc

    assert format_utc(epoch) == datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%S")
