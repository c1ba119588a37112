"""The reducer: job and node life cycles, GPU slots, snapshots."""
import pytest

from rota.core import commands
from rota.core.auth import Caller
from rota.core import events as ev
from rota.core.apply import fold
from rota.core.commands import Rejected
from rota.core.state import dump_snapshot, load_snapshot
from harness import Harness, make_cluster

pytestmark = pytest.mark.fast    # make test-fast: the core and the front door, no process started


def test_job_life_cycle_and_gpu_slots(h):
    jid = h.submit(name="train", gpus_per_node=2, cpus_per_task=8, mem_per_node=65536)
    assert h.state.jobs[jid].state == "PENDING"
    h.cycle()
    job = h.state.jobs[jid]
    assert job.state == "RUNNING"
    (alloc,) = job.alloc
    node = h.state.nodes[alloc.node]
    assert [i for i, o in enumerate(node.gpu_owner) if o == jid] == list(alloc.gpus)
    assert (node.alloc_cpus, node.alloc_mem) == (8, 65536)
    assert node.display_state() == "MIXED"
    h.advance(100)
    h.finish(jid, state="OUT_OF_MEMORY", exit_code=0, signal=9, max_rss=70000000, elapsed=100)
    assert job.state == "OUT_OF_MEMORY" and job.max_rss == 70000000 and job.elapsed == 100
    assert node.gpu_owner.count(jid) == 0 and node.alloc_cpus == 0
    assert node.display_state() == "IDLE"


def test_terminal_state_is_never_undone(h):
    jid = h.submit()
    h.cycle()
    h.finish(jid, state="FAILED", exit_code=3)
    h.finish(jid, state="COMPLETED")
    assert h.state.jobs[jid].state == "FAILED" and h.state.jobs[jid].exit_code == 3


def test_drained_node_keeps_running_jobs_takes_no_new_ones_and_never_resumes_by_itself(h):
    jid = h.submit(nodelist=("gpu01",), gpus_per_node=8)
    h.cycle()
    h.put(ev.NodeDrained(node="gpu01", reason="bad fan", by="admin"))
    node = h.state.nodes["gpu01"]
    assert node.display_state() == "DRAINING" and h.state.jobs[jid].state == "RUNNING"
    h.finish(jid)
    assert node.display_state() == "DRAINED"
    assert (node.reason, node.reason_by, node.reason_time) == ("bad fan", "admin", h.now)
    other = h.submit(nodelist=("gpu01",))
    for _ in range(3):
        h.advance(3600)
        h.put(ev.NodeRegistered(node="gpu01", cpus=64, memory=257000,
                                gpus=tuple(ev.GpuInfo(index=i) for i in range(8))))
        d = h.cycle()
        assert other not in {s.job_id for s in d.starts}
    assert node.drain
    h.put(ev.NodeResumed(node="gpu01", by="admin"))
    assert node.display_state() == "IDLE" and node.reason is None
    assert other in {s.job_id for s in h.cycle().starts}


def test_gres_count_lower_than_configured_drains(h):
    h.put(ev.NodeRegistered(node="gpu02", cpus=64, memory=257000,
                            gpus=tuple(ev.GpuInfo(index=i) for i in range(7))))
    node = h.state.nodes["gpu02"]
    assert node.drain and node.invalid_reg
    assert node.reason == "gres/gpu count reported lower than configured (7 < 8)"


def test_health_fault_drains_with_its_reason_and_keeps_the_first(h):
    h.put(ev.HealthFault(node="gpu03", reason="gpu 2: xid 79 (fell off the bus)", gpu_index=2, code="xid:79"))
    h.put(ev.HealthFault(node="gpu03", reason="gpu 5: xid 48 (double bit ECC)", gpu_index=5, code="xid:48"))
    assert h.state.nodes["gpu03"].reason == "gpu 2: xid 79 (fell off the bus)"


@pytest.mark.parametrize("requeue,expected", [(False, "NODE_FAIL"), (True, "PENDING")])
def test_node_down_fails_or_requeues_its_jobs(h, requeue, expected):
    jid = h.submit(nodelist=("gpu01",), requeue=requeue)
    h.cycle()
    h.put(ev.NodeNotResponding(node="gpu01"))
    assert h.state.nodes["gpu01"].not_responding and h.state.jobs[jid].state == "RUNNING"
    h.put(ev.NodeDown(node="gpu01", reason="Not responding", by="rota"))
    job = h.state.jobs[jid]
    assert job.state == expected
    assert h.state.nodes["gpu01"].jobs == [] and h.state.nodes["gpu01"].display_state() == "DOWN"
    if requeue:
        assert job.restarts == 1 and jid in h.state.pending


def test_agent_reregistering_without_a_job_reports_it_lost(h):
    jid = h.submit(nodelist=("gpu02",))
    h.cycle()
    h.put(ev.NodeRegistered(node="gpu02", cpus=64, memory=257000,
                            gpus=tuple(ev.GpuInfo(index=i) for i in range(8)), running=()))
    assert h.state.jobs[jid].state == "NODE_FAIL"


def test_cancel_pending_and_running(h):
    pend = h.submit(hold=True, uid=1001)
    run = h.submit(uid=1001)
    h.cycle()
    alice = Caller(1001, 1001, "alice")
    h.put(commands.cancel(h.state, pend, alice))
    assert h.state.jobs[pend].state == "CANCELLED" and h.state.jobs[pend].cancel_by == 1001
    h.put(commands.cancel(h.state, run, alice))
    assert h.state.jobs[run].state == "RUNNING" and h.state.jobs[run].cancel_by == 1001
    h.finish(run, state="CANCELLED", signal=15)
    assert h.state.jobs[run].state == "CANCELLED"


def test_update_time_limit_and_priority(h):
    a = h.submit(name="a", hold=True)
    b = h.submit(name="b", hold=True)
    h.put(commands.update_job(h.state, b, priority=10_000_000))
    h.put(commands.update_job(h.state, a, time_limit=120))
    assert h.state.jobs[a].time_limit == 120
    h.put(ev.JobReleased(job_id=a))
    h.put(ev.JobReleased(job_id=b))
    d = h.cycle()
    assert d.order[:2] == [b, a]


def test_array_tasks_split_off_with_new_ids_and_the_last_keeps_the_array_id(h):
    arr = h.submit(name="arr", array="0-3", gpus_per_node=8)
    d = h.cycle()
    started = {s.array_task_id: s.job_id for s in d.starts}
    assert started[3] == arr and sorted(started) == [0, 1, 2, 3]
    assert len(set(started.values())) == 4
    assert h.state.jobs[arr].array_pending is None
    assert sorted(h.state.array_tasks[arr]) == sorted(started.values())
    assert h.state.next_job_id > max(started.values())


def test_snapshot_round_trip_is_exact(h):
    h.submit(name="a", gpus_per_node=2, array="0-9%3")
    h.submit(name="b", dependency="afterany:1", hold=True)
    h.cycle()
    h.put(ev.NodeDrained(node="gpu04", reason="x", by="root"))
    data = dump_snapshot(h.state)
    loaded = load_snapshot(data)
    assert loaded == h.state
    assert dump_snapshot(loaded) == data


def test_snapshot_rejects_an_unknown_version():
    with pytest.raises(ValueError, match="unsupported snapshot version"):
        load_snapshot(b'{"snapshot_version": 99}')


def test_config_change_keeps_node_state():
    h = Harness(make_cluster(nodes=2))
    jid = h.submit(nodelist=("gpu01",), gpus_per_node=2)
    h.cycle()
    h.put(ev.NodeDrained(node="gpu02", reason="r", by="root"))
    h.put(ev.ClusterConfigured(config=make_cluster(nodes=3)))
    assert h.state.nodes["gpu01"].gpu_owner.count(jid) == 2
    assert h.state.nodes["gpu02"].drain
    assert "gpu03" in h.state.nodes


def test_finished_jobs_are_purged_after_min_job_age_and_dependencies_still_resolve():
    h = Harness(make_cluster(min_job_age=300))
    ok, bad = h.submit(name="ok"), h.submit(name="bad")
    h.cycle()
    h.finish(ok)
    h.finish(bad, state="FAILED", exit_code=2)
    after_ok = h.submit(name="after-ok", dependency=f"afterok:{ok}", hold=True)
    after_bad = h.submit(name="after-bad", dependency=f"afterok:{bad}", hold=True)
    not_ok = h.submit(name="notok", dependency=f"afternotok:{bad}", hold=True)
    h.advance(299)
    h.put(ev.NodeDrained(node="gpu04", reason="x", by="root"))
    assert ok in h.state.jobs and bad in h.state.jobs      # younger than MinJobAge: still shown
    h.advance(1)
    h.put(ev.NodeResumed(node="gpu04", by="root"))
    assert ok not in h.state.jobs and bad not in h.state.jobs
    assert h.state.ended == {ok: (1, 0), bad: (0, 1)}
    for jid in (after_ok, after_bad, not_ok):
        h.put(ev.JobReleased(job_id=jid))
    d = h.cycle()
    assert {s.job_id for s in d.starts} == {after_ok, not_ok}
    assert d.pending[after_bad].reason == "DependencyNeverSatisfied"
    with pytest.raises(Rejected, match="Job dependency problem"):   # too old to depend on
        h.submit(name="late", dependency=f"afterok:{ok}")
    assert fold(h.log) == h.state


def test_an_array_is_purged_only_once_all_of_it_has_ended():
    h = Harness(make_cluster(nodes=1, gpus=2, min_job_age=100))
    arr = h.submit(name="arr", array="0-2", gpus_per_node=1)
    waiter = h.submit(name="waiter", dependency=f"afternotok:{arr}", hold=True)   # reads how the array ended
    first = [s.job_id for s in h.cycle().starts]
    assert len(first) == 2
    for jid in first:
        h.finish(jid)
    h.advance(50)
    last = [s.job_id for s in h.cycle().starts]
    h.advance(200)
    h.put(ev.NodeDrained(node="gpu01", reason="x", by="root"))
    assert all(j in h.state.jobs for j in first + last), "purged while a task still runs"
    h.finish(last[0], state="FAILED", exit_code=1)
    h.advance(100)
    h.put(ev.NodeResumed(node="gpu01", by="root"))
    assert not any(j in h.state.jobs for j in first + last + [arr])
    assert h.state.ended == {arr: (2, 1)} and arr not in h.state.array_tasks
    h.put(ev.JobCancelled(job_id=waiter, by_uid=0))
    assert h.state.ended == {arr: (2, 1)}                     # a reader that ended stays a while, and may come back
    h.advance(100)
    h.put(ev.NodeDrained(node="gpu01", reason="y", by="root"))
    assert h.state.ended == {} and h.state.dep_refs == {}      # its last reader gone, the outcome goes too
    assert fold(h.log) == h.state


def test_snapshot_keeps_purge_history_and_purges_like_the_live_state():
    h = Harness(make_cluster(min_job_age=60))
    jobs = [h.submit(name=f"j{i}") for i in range(6)]
    h.submit(name="reader", dependency="afterok:" + ":".join(map(str, jobs)), hold=True)
    h.cycle()
    for jid in jobs:
        h.advance(20)
        h.finish(jid)
    k = len(h.log)
    h.advance(30)
    h.put(ev.NodeDrained(node="gpu02", reason="x", by="root"))
    h.advance(20)
    h.put(ev.NodeResumed(node="gpu02", by="root"))
    snap = load_snapshot(dump_snapshot(fold(h.log[:k])))
    assert fold(h.log[k:], snap) == h.state
    assert sorted(h.state.ended) == jobs[:5] and jobs[5] in h.state.jobs


def test_min_job_age_zero_keeps_finished_jobs():
    h = Harness(make_cluster(min_job_age=0))
    jid = h.submit(name="a")
    h.cycle()
    h.finish(jid)
    h.advance(100_000)
    h.put(ev.NodeDrained(node="gpu02", reason="x", by="root"))
    assert h.state.jobs[jid].state == "COMPLETED" and not h.state.ended


def test_a_node_with_all_its_gpus_taken_but_cpus_free_is_mixed_as_in_slurm():
    h = Harness(make_cluster(nodes=1, gpus=8, cpus=64))
    h.submit(gpus_per_node=8, cpus_per_task=4)
    h.cycle()
    node = h.state.nodes["gpu01"]
    assert node.free_gpus == 0 and node.alloc_cpus < node.cpus
    assert node.display_state() == node.base_state() == "MIXED"
    h.submit(cpus_per_task=60, gpus_per_node=0)
    h.cycle()
    assert node.alloc_cpus == node.cpus and node.display_state() == "ALLOCATED"


def test_a_purged_jobs_outcome_leaves_with_its_last_reader_and_afterany_on_a_gone_job_is_met():
    h = Harness(make_cluster(min_job_age=60))
    jobs = [h.submit(name=f"j{i}") for i in range(5)]
    h.cycle()
    for jid in jobs:
        h.finish(jid)
    h.advance(61)
    h.put(ev.NodeDrained(node="gpu02", reason="x", by="root"))
    assert not any(j in h.state.jobs for j in jobs) and h.state.ended == {}   # nobody reads how they ended
    after = h.submit(name="after", dependency=f"afterany:{jobs[0]}")
    assert after in {s.job_id for s in h.cycle().starts}     # gone: done, as Slurm assumes of a job it no longer has
    # a job that read an outcome keeps it while it is in the state: requeued after it ran, it may start again
    x = h.submit(name="x")
    h.cycle()
    reader = h.submit(name="reader", dependency=f"afterok:{x}")
    h.finish(x)
    h.advance(61)
    h.put(ev.NodeResumed(node="gpu02", by="root"))
    assert x not in h.state.jobs and reader in {s.job_id for s in h.cycle().starts}
    h.finish(reader)
    h.put(ev.JobRequeued(job_id=reader))
    assert reader in {s.job_id for s in h.cycle().starts} and h.state.ended == {x: (1, 0)}
    h.put(ev.JobSubmitted(job_id=jobs[1], spec=ev.JobSpec(name="again")))
    assert jobs[1] not in h.state.jobs                      # an id is never handed out twice
    # a state saved before outcomes left with their last reader keeps, once loaded, only those still read
    old = fold(h.log)
    old.ended[jobs[2]] = (1, 0)
    assert load_snapshot(dump_snapshot(old)).ended == {x: (1, 0)} and fold(h.log) == h.state
