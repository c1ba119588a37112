"""Incremental conservative planning (rota.core.replan): cycle after cycle, the plan kept from the last cycle
and repaired gives exactly the full plan, and keeps most placements where little changed."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import pytest

from rota.core import events as ev
from rota.core.replan import PlanMemory
from rota.core.schedule import Decision, schedule
from harness import Harness
from test_properties import GPU_TYPES, NODE_OPS, apply_step, job_specs as plain_specs

pytestmark = pytest.mark.fast


@st.composite
def clusters(draw):
    nodes = []
    for i in range(draw(st.integers(1, 6))):
        gpus = draw(st.sampled_from([0, 2, 4, 8]))
        kinds = draw(st.sampled_from([(0,), (0,), (1,), (0, 1)]))     # the last: a node with both types
        nodes.append(ev.NodeConfig(
            name=f"n{i:02d}", cpus=draw(st.sampled_from([4, 16, 64])),
            memory=draw(st.sampled_from([8000, 64000, 256000])),
            gpus=tuple(ev.GpuConfig(type=GPU_TYPES[k], count=gpus // len(kinds)) for k in kinds) if gpus else (),
            weight=draw(st.sampled_from([1, 1, 1, 5])),
            features=tuple(draw(st.lists(st.sampled_from(["ib", "nvme"]), max_size=2, unique=True)))))
    names = tuple(n.name for n in nodes)
    # ages that cap soon and a job-size factor: the priority order changes as jobs wait
    prio = ev.PriorityWeights(age=1000, max_age=draw(st.sampled_from([600, 3000, 86400])), job_size=1500,
                              favor_small=draw(st.booleans()))
    sched = ev.SchedulerParams(policy="conservative", bf_window=draw(st.sampled_from([3600, 10**7])),
                               reserve=draw(st.sampled_from(["resources", "resources", "nodes"])))
    parts = [ev.PartitionConfig(name="p", nodes=names, max_time=0, default=True)]
    if len(names) > 2 and draw(st.booleans()):
        parts.append(ev.PartitionConfig(name="q", nodes=names[:2], max_time=0, priority_tier=2))
    return ev.ClusterConfig(nodes=tuple(nodes), partitions=tuple(parts), scheduler=sched, priority=prio)


# the property tests' jobs, some naming the second partition (first, or before the default one)
job_specs = st.tuples(plain_specs(), st.sampled_from([(), (), (), ("q",), ("q", "p")])).map(
    lambda spec_parts: {**spec_parts[0], "partitions": spec_parts[1]})

JOB_OPS = st.sampled_from([None] * 4 + ["cancel", "hold", "release", "limit", "nice"])

STEP = st.tuples(
    st.lists(job_specs, max_size=6),         # submits
    st.integers(0, 3),                       # running jobs that end
    st.tuples(NODE_OPS, st.integers(0, 5)),  # an admin's action on a node
    st.tuples(JOB_OPS, st.integers(0, 50)),  # and on a pending job
    st.integers(0, 3000),                    # seconds that pass
)


def _job_op(h: Harness, op: str | None, i: int) -> None:
    pending = sorted(h.state.pending)
    if op is None or not pending:
        return
    jid = pending[i % len(pending)]
    event = {"cancel": ev.JobCancelled(job_id=jid), "hold": ev.JobHeld(job_id=jid),
             "release": ev.JobReleased(job_id=jid), "limit": ev.JobUpdated(job_id=jid, time_limit=120 + 60 * i),
             "nice": ev.JobUpdated(job_id=jid, nice=100 * i)}[op]
    if op == "release" and h.state.jobs[jid].hold is None:
        return
    h.put(event, actor="root")


def _same(full: Decision, kept: Decision) -> None:
    assert kept.starts == full.starts
    assert kept.reservations == full.reservations
    assert kept.pending == full.pending
    assert kept.order == full.order and kept.untested == full.untested


def _drive(cfg: ev.ClusterConfig, steps: list) -> PlanMemory:
    h = Harness(cfg)
    memory = PlanMemory()
    for submits, ends, (node_op, node_i), (job_op, job_i), wait in steps:
        apply_step(h, submits, ends, node_op, node_i)
        _job_op(h, job_op, job_i)
        h.advance(wait)
        kept = schedule(h.state, h.now, "conservative", memory=memory)
        _same(h.cycle(explain=False), kept)
    return memory


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), st.lists(STEP, min_size=1, max_size=25))
def test_the_kept_plan_repaired_is_the_full_plan_cycle_after_cycle(cfg, steps):
    _drive(cfg, steps)


def _queue(nodes: int = 40) -> Harness:
    cfg = ev.ClusterConfig(
        nodes=tuple(ev.NodeConfig(name=f"n{i}", cpus=16, memory=64000, gpus=(ev.GpuConfig(type="a100", count=4),))
                    for i in range(nodes)),
        partitions=(ev.PartitionConfig(name="p", nodes=tuple(f"n{i}" for i in range(nodes)), max_time=0,
                                       default=True),),
        scheduler=ev.SchedulerParams(policy="conservative", bf_window=10**7))
    h = Harness(cfg)
    for i in range(400):
        h.submit(gpus_per_node=1 + i % 4, time_limit=600 + 60 * (i % 7), cpus_per_task=2)
    return h


def test_a_quiet_cycle_keeps_every_placement_and_an_early_end_searches_only_what_it_moves():
    h = _queue()
    memory = PlanMemory()
    h.cycle(explain=False)
    schedule(h.state, h.now, memory=memory)
    assert memory.reused == 0 and memory.searched > 150
    h.advance(30)                                   # nothing changes but the time
    _same(schedule(h.state, h.now), schedule(h.state, h.now, memory=memory))
    assert memory.searched == 0 and memory.reused > 150
    h.finish(sorted(h.state.running)[0])            # one job ends early: its node frees up
    _same(schedule(h.state, h.now), schedule(h.state, h.now, memory=memory))
    assert memory.searched > 0
    assert memory.reused > 0


def test_a_change_on_most_nodes_gives_up_keeping_and_still_plans_the_same():
    h = _queue()
    memory = PlanMemory()
    h.cycle(explain=False)
    schedule(h.state, h.now, memory=memory)
    for jid in sorted(h.state.running)[:30]:      # ends on most of the nodes
        h.finish(jid)
    _same(schedule(h.state, h.now), schedule(h.state, h.now, memory=memory))
    assert memory.reused == 0


def test_a_new_configuration_starts_the_memory_afresh():
    h = _queue()
    memory = PlanMemory()
    schedule(h.state, h.now, memory=memory)
    assert h.state.config is not None
    h.state.config = h.state.config.model_copy(update={"priority": ev.PriorityWeights(age=10)})
    _same(schedule(h.state, h.now), schedule(h.state, h.now, memory=memory))
    assert memory.reused == 0
