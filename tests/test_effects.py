"""Orders for the agents derived from what the reducer changed (core/changes, core/effects)."""
from rota.core import events as ev
from rota.core.apply import apply
from rota.core.changes import Changes
from rota.core.effects import launch, launches, orders
from rota.core.orders import Kill, Launch, Update
from rota.core.schedule import schedule
from harness import Harness, make_cluster
from rota.wire import orders as wire
import pytest

pytestmark = pytest.mark.fast    # make test-fast: the core and the front door, no process started


def step(h: Harness, *events: object) -> tuple[Changes, list]:
    """Apply ``events`` as one batch; the changes and the orders they imply."""
    ch = h.batch(*events)
    return ch, orders(h.state, ch)


def started(h: Harness) -> ev.JobsStarted:
    event = schedule(h.state, h.now).event()
    assert event is not None
    return event


def test_a_start_launches_on_the_first_node_and_a_cancel_kills_with_the_signal():
    h = Harness(make_cluster(nodes=2, gpus=4))
    a = h.submit(gpus_per_node=4, nodes=2)
    pending = h.submit(gpus_per_node=4, nodes=2)
    ch, out = step(h, started(h))
    job = h.state.jobs[a]
    assert [(n, o.op, o.job_id) for n, o in out] == [(job.alloc[0].node, "launch", a)]
    (node, order), = out
    assert order == launch(job) and order.nodes == tuple(x.node for x in job.alloc) and order.gpus == job.alloc[0].gpus
    ch, out = step(h, ev.JobCancelled(job_id=a, by_uid=0, signal=2), ev.JobCancelled(job_id=pending, by_uid=0))
    assert out == [(node, Kill(job_id=a, restarts=0, reason="cancelled", signal=2))]
    assert h.state.jobs[pending].state == "CANCELLED" and ch.jobs[pending].state == "PENDING"


def test_requeue_kills_the_old_run_and_the_next_start_launches_the_new_one_in_one_batch():
    h = Harness(make_cluster(nodes=1, gpus=2))
    a = h.submit(gpus_per_node=1)
    step(h, started(h))
    node = h.state.jobs[a].alloc[0].node
    ch = Changes()
    for event in (ev.JobRequeued(job_id=a),):
        env = ev.Envelope(seq=len(h.log) + 1, ts=h.now, actor="t", idem=f"r{len(h.log)}", event=event)
        apply(h.state, env, ch)
        h.log.append(env)
    env = ev.Envelope(seq=len(h.log) + 1, ts=h.now, actor="t", idem="again", event=started(h))
    apply(h.state, env, ch)
    kinds = [(n, o.op, o.restarts) for n, o in orders(h.state, ch)]
    assert kinds == [(node, "kill", 0), (h.state.jobs[a].alloc[0].node, "launch", 1)]


def test_updates_node_failures_and_reported_ends():
    h = Harness(make_cluster(nodes=2, gpus=2))
    a, b = h.submit(gpus_per_node=2), h.submit(gpus_per_node=2)
    step(h, started(h))
    na, nb = h.state.jobs[a].alloc[0].node, h.state.jobs[b].alloc[0].node
    _ch, out = step(h, ev.JobUpdated(job_id=a, time_limit=120))
    assert out == [(na, Update(job_id=a, restarts=0, time_limit=120))]
    _ch, out = step(h, ev.NodeDown(node=nb, reason="gone", by="root"))
    assert out == [(nb, Kill(job_id=b, restarts=0, reason="stopped"))] and h.state.jobs[b].state == "NODE_FAIL"
    ch, out = step(h, ev.JobExited(job_id=a, state="COMPLETED", exit_code=0))
    assert out == [] and a in ch.reported and na in ch.nodes     # its agent knows; the node's resources changed


def test_events_that_fit_no_transition_are_named_with_their_sequence():
    h = Harness(make_cluster(nodes=1, gpus=0))
    a = h.submit()
    ch, _ = step(h, ev.JobExited(job_id=a, state="COMPLETED"), ev.JobCancelled(job_id=999),
                 ev.NodeDrained(node="nowhere", reason="x", by="root"))
    seqs = [seq for seq, _what in ch.invalid]
    assert seqs == [len(h.log) - 2, len(h.log) - 1, len(h.log)]
    assert [what for _s, what in ch.invalid] == [f"job {a} is not running", "job 999 does not exist",
                                                 "node 'nowhere' does not exist"]
    assert h.state.jobs[a].state == "PENDING"


def test_every_running_job_is_launched_again_after_a_rebuild_and_orders_survive_the_wire():
    h = Harness(make_cluster(nodes=2, gpus=2))
    ids = [h.submit(gpus_per_node=1, array="0-2"), h.submit(gpus_per_node=1)]
    step(h, started(h))
    again = launches(h.state)
    assert sorted(o.job_id for _n, o in again) == sorted(h.state.running)
    task = next(o for _n, o in again if o.array_task_id is not None)
    assert (task.array_job_id, task.array_count, task.array_min, task.array_max) == (ids[0], 3, 0, 2)
    for _node, order in again + [("x", Kill(job_id=5, reason="stopped"))]:
        assert wire.decode(wire.encode(order)) == order
    assert wire.message_id(Kill(job_id=5, reason="stopped")) == "kill-5-any"
    assert wire.message_id(Update(job_id=5, time_limit=3)) is None     # a second update is a new order


def test_launching_every_task_of_a_large_array_spells_out_its_indices_once(monkeypatch):
    """Each task's launch carries the array's count, bounds and step; working them out spells out every index,
    so a launch per task doing it again was quadratic in the array (10,000 tasks: seconds on the event loop)."""
    from rota.core import arrays

    h = Harness(make_cluster(nodes=4, gpus=8))
    array = h.submit(gpus_per_node=1, array="1-900:3%50")
    arrays.array_summary.cache_clear()
    spelled = []
    real = arrays.parse_array
    monkeypatch.setattr(arrays, "parse_array", lambda *a: spelled.append(a) or real(*a))
    out = launches(h.state) + step(h, started(h))[1]
    tasks = [o for _n, o in out if isinstance(o, Launch) and o.array_job_id == array]
    assert len(tasks) == 32
    assert {(o.array_count, o.array_min, o.array_max, o.array_step) for o in tasks} == {(300, 1, 898, 3)}
    assert len(spelled) == 1


def test_a_forged_or_broken_order_is_refused_with_the_reason():
    import pytest

    for data, where in ((b'{"op": "launch", "job_id": 1}', "launch.name"), (b"not json", "the message"),
                        (b'{"op": "format-disk", "job_id": 1}', "the message")):
        with pytest.raises(wire.BadOrder) as e:
            wire.decode(data)
        assert str(e.value).startswith(f"not an order: {where}: ")
    assert isinstance(wire.decode(wire.encode(launch_for_test())), Launch)


def launch_for_test() -> Launch:
    h = Harness(make_cluster(nodes=1, gpus=1))
    h.submit()
    step(h, started(h))
    return launch(next(iter(h.state.jobs.values())))
