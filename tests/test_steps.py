"""Steps in the core: layout over a job's allocation, refusals in Slurm's words, the reducer's step
transitions, the orders they imply, and the invariant that steps never take more than their job holds."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rota.core import events as ev
from rota.core.apply import apply
from rota.core.auth import Caller
from rota.core.changes import Changes
from rota.core.commands import Rejected, check_report, step_create
from rota.core.effects import orders
from rota.core.orders import StepKill, StepLaunch
from rota.core.schedule import schedule
from rota.core.signals import parse_warning
from rota.core.state import dump_snapshot, load_snapshot
from rota.core.steps import StepAsk, StepRefused, layout
from harness import Harness, make_cluster

pytestmark = pytest.mark.fast    # make test-fast: the core and the front door, no process started

FIELDS = {"name": "t", "argv": ("true",)}


def batch(h: Harness, *events: object) -> tuple[Changes, list]:
    ch = h.batch(*events)
    return ch, orders(h.state, ch)


def running(h: Harness, **spec) -> int:
    jid = h.submit(**spec)
    event = schedule(h.state, h.now).event()
    assert event is not None
    batch(h, event)
    assert h.state.jobs[jid].state == "RUNNING"
    return jid


def test_a_plain_step_takes_the_jobs_tasks_on_all_its_nodes():
    h = Harness(make_cluster(nodes=2, gpus=4, cpus=8))
    jid = running(h, nodes=2, nodes_given=True, ntasks_per_node=2, gpus_per_node=4, gpu_given=True)
    alloc, warnings = layout(h.state.jobs[jid], StepAsk())
    assert [(a.tasks, a.cpus, a.gpus) for a in alloc] == [((0, 1), 2, (0, 1, 2, 3)), ((2, 3), 2, (0, 1, 2, 3))]
    assert warnings == []
    alloc, _ = layout(h.state.jobs[jid], StepAsk(gpus_per_task=2))
    assert [(a.tasks, a.gpus, a.gpus_per_task) for a in alloc] == [((0, 1), (0, 1, 2, 3), 2), ((2, 3), (0, 1, 2, 3), 2)]


def test_slurms_words_for_steps_that_can_never_fit():
    h = Harness(make_cluster(nodes=2, gpus=4, cpus=8))
    job = h.state.jobs[running(h, nodes=2, nodes_given=True, ntasks=2, ntasks_given=True, gpus_per_node=1,
                               gpu_given=True, mem_per_node=100)]
    for ask, words in ((StepAsk(nodes=3), "Only allocated 2 nodes asked for 3"),
                       (StepAsk(ntasks=5), "More processors requested than permitted"),
                       (StepAsk(gpus_per_task=2), "Invalid generic resource (gres) specification"),
                       (StepAsk(mem=200), "Memory required by task is not available"),
                       (StepAsk(nodelist=("gpu09",)), "Requested node configuration is not available")):
        with pytest.raises(StepRefused) as refused:
            layout(job, ask)
        assert refused.value.words == words and not refused.value.busy
    _alloc, warnings = layout(job, StepAsk(nodes=2, ntasks=1))
    assert warnings == ["can't run 1 processes on 2 nodes, setting nnodes to 1"]


def test_one_task_steps_spread_over_the_nodes_with_room_and_overcommit_runs_more_tasks_than_cpus():
    h = Harness(make_cluster(nodes=4, gpus=0, cpus=8))
    jid = running(h, nodes=4, nodes_given=True)            # one CPU on each node
    placed = []
    for _ in range(4):
        event, _ = step_create(h.state, jid, StepAsk(ntasks=1), Caller(0, 0, "root"), **FIELDS)
        batch(h, event)
        placed.append(event.alloc[0].node)
    assert placed == ["gpu01", "gpu02", "gpu03", "gpu04"]   # each on a node with a CPU free, as Slurm places them
    with pytest.raises(Rejected) as busy:
        step_create(h.state, jid, StepAsk(ntasks=1), Caller(0, 0, "root"), **FIELDS)
    assert busy.value.code == "busy"
    lone = h.state.jobs[running(h, overcommit=True, ntasks=5, ntasks_given=True)]
    assert [a.cpus for a in lone.alloc] == [1]                # -O: CPUs as for one task
    alloc, _ = layout(lone, StepAsk(ntasks=5, overcommit=True))
    assert [(a.tasks, a.cpus) for a in alloc] == [((0, 1, 2, 3, 4), 1)]
    with pytest.raises(StepRefused, match="More processors requested than permitted"):
        layout(lone, StepAsk(ntasks=5))


def test_a_step_started_ended_and_accounted_through_the_reducer_and_the_orders():
    h = Harness(make_cluster(nodes=2, gpus=4, cpus=8))
    jid = running(h, nodes=2, nodes_given=True, ntasks_per_node=1)
    job = h.state.jobs[jid]
    event, _ = step_create(h.state, jid, StepAsk(), Caller(0, 0, "root"), **FIELDS)
    assert event.step_id == 0 and [a.node for a in event.alloc] == ["gpu01", "gpu02"]
    ch, out = batch(h, event)
    assert [(n, type(o)) for n, o in out] == [("gpu01", StepLaunch), ("gpu02", StepLaunch)]
    assert out[1][1].job.node_index == 1 and out[1][1].step == event
    assert job.steps[0].state == "RUNNING" and job.next_step == 1
    # busy while it runs: a second step would fit only once this one ends (or shares, with --overlap)
    with pytest.raises(Rejected) as busy:
        step_create(h.state, jid, StepAsk(), Caller(0, 0, "root"), **FIELDS)
    assert busy.value.code == "busy" and busy.value.lines[-1] == "Requested nodes are busy"
    assert step_create(h.state, jid, StepAsk(overlap=True), Caller(0, 0, "root"), **FIELDS)[0].step_id == 1
    end1 = ev.StepEnded(job_id=jid, step_id=0, node="gpu01", state="COMPLETED", max_rss=10)
    end2 = ev.StepEnded(job_id=jid, step_id=0, node="gpu02", state="FAILED", exit_code=3, max_rss=20)
    assert check_report(h.state, "gpu02", end2) == end2
    with pytest.raises(Rejected):
        check_report(h.state, "gpu03", end1.model_copy(update={"node": "gpu03"}))   # not one of its nodes
    ch, out = batch(h, end1)
    assert job.steps[0].state == "RUNNING" and out == []
    ch, out = batch(h, end2)
    (step, new), = ch.steps.values()
    assert (step.state, step.exit_code, step.max_rss, new) == ("FAILED", 3, 20, False) and not job.steps
    assert out == []          # every node already reported: nothing to stop
    with pytest.raises(Rejected):
        check_report(h.state, "gpu01", end1)     # a step that has ended is not reported twice


def test_a_job_that_ends_ends_its_steps_and_their_nodes_are_told_to_stop_them():
    h = Harness(make_cluster(nodes=2, gpus=4, cpus=8))
    jid = running(h, nodes=2, nodes_given=True)
    event, _ = step_create(h.state, jid, StepAsk(), Caller(0, 0, "root"), **FIELDS)
    batch(h, event)
    batch(h, ev.StepEnded(job_id=jid, step_id=0, node="gpu02", state="COMPLETED"))
    ch, out = batch(h, ev.JobExited(job_id=jid, state="COMPLETED", node="gpu01"))
    assert [(n, o) for n, o in out if isinstance(o, StepKill)] == [("gpu01", StepKill(job_id=jid, step_id=0))]
    (step, _new), = ch.steps.values()
    assert step.state == "CANCELLED"
    late = ev.StepEnded(job_id=jid, step_id=0, node="gpu01", state="COMPLETED")
    seen = Changes()
    apply(h.state, ev.Envelope(seq=99, ts=h.now, event=late), seen)
    assert seen.invalid     # the step already ended with its job: a late report changes nothing


def test_steps_of_other_users_or_of_jobs_not_running_are_refused():
    h = Harness(make_cluster(nodes=1))
    jid = running(h, user="alice", uid=1001)
    with pytest.raises(Rejected) as other:
        step_create(h.state, jid, StepAsk(), Caller(1002, 1002, "bob"), **FIELDS)
    assert other.value.lines[-1] == "Access/permission denied"
    pending = h.submit(nodes=2, nodes_given=True)
    with pytest.raises(Rejected) as waiting:
        step_create(h.state, pending, StepAsk(), Caller(0, 0, "root"), **FIELDS)
    assert waiting.value.lines[-1] == "Job is pending execution"
    assert step_create(h.state, jid, StepAsk(), Caller(1001, 1001, "alice"), **FIELDS)[0].job_id == jid


def test_a_running_step_survives_a_snapshot_and_a_requeue_starts_step_ids_over():
    h = Harness(make_cluster(nodes=2))
    jid = running(h)
    event, _ = step_create(h.state, jid, StepAsk(), Caller(0, 0, "root"), **FIELDS)
    batch(h, event)
    back = load_snapshot(dump_snapshot(h.state))
    assert back.jobs[jid].steps[0].started == event and back.jobs[jid].next_step == 1
    ch, out = batch(h, ev.JobRequeued(job_id=jid))
    assert h.state.jobs[jid].next_step == 0 and not h.state.jobs[jid].steps
    assert any(isinstance(o, StepKill) for _n, o in out)


def test_signal_specifications_read_as_slurm_reads_them():
    assert parse_warning("USR2@90") == (12, 90, False)
    assert parse_warning("B:TERM") == (15, 60, True)
    assert parse_warning("R:SIGUSR1@5") == (10, 5, False)
    for bad in ("FOO", "USR1@x", "Q:USR1", "USR1@99999"):
        with pytest.raises(ValueError):
            parse_warning(bad)


asks = st.builds(StepAsk, ntasks=st.one_of(st.none(), st.integers(1, 20)), nodes=st.one_of(st.none(), st.integers(1, 4)),
                 ntasks_per_node=st.one_of(st.none(), st.integers(1, 6)),
                 cpus_per_task=st.one_of(st.none(), st.integers(1, 4)),
                 gpus_per_task=st.one_of(st.none(), st.integers(1, 3)), mem=st.one_of(st.none(), st.integers(1, 3000)),
                 overlap=st.just(False))


@settings(max_examples=150, deadline=None)
@given(nodes=st.integers(1, 3), tasks=st.integers(1, 6), gpus=st.integers(0, 4), wanted=st.lists(asks, max_size=6))
def test_running_steps_never_hold_more_than_their_job_has_on_any_node(nodes, tasks, gpus, wanted):
    h = Harness(make_cluster(nodes=3, gpus=4, cpus=16))
    jid = running(h, nodes=nodes, nodes_given=True, ntasks_per_node=tasks, gpus_per_node=gpus, gpu_given=bool(gpus),
                  mem_per_node=2000)
    job = h.state.jobs[jid]
    for ask in wanted:
        try:
            event, _ = step_create(h.state, jid, ask, Caller(0, 0, "root"), **FIELDS)
        except Rejected:
            continue
        batch(h, event)
    held = {a.node: a for a in job.alloc}
    for node, have in held.items():
        parts = [a for s in (job.steps or {}).values() for a in s.started.alloc if a.node == node]
        assert sum(a.cpus for a in parts) <= have.cpus
        assert all(set(a.gpus) <= set(have.gpus) and a.mem <= have.mem for a in parts)
        explicit = [g for a in parts if a.gpus_per_task for g in a.gpus]
        assert len(explicit) == len(set(explicit))        # GPUs asked for by name are never shared
        assert all(len(a.gpus) == len(a.tasks) * a.gpus_per_task for a in parts if a.gpus_per_task)
