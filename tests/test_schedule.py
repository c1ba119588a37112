"""Placement and the three policies, on small clusters whose answers are known."""
from rota.core import events as ev
from rota.core.schedule import schedule
from harness import Harness, make_cluster
import pytest

pytestmark = pytest.mark.fast    # make test-fast: the core and the front door, no process started


def started(d):
    return {s.job_id: s for s in d.starts}


def nodes_of(start):
    return [a.node for a in start.alloc]


def test_best_fit_does_not_fragment_an_empty_node():
    h = Harness(make_cluster(nodes=2))
    first = h.submit(gpus_per_node=6, nodelist=("gpu02",))
    h.cycle()
    small = h.submit(gpus_per_node=2)
    s = started(h.cycle())[small]
    assert nodes_of(s) == ["gpu02"] and s.alloc[0].gpus == (6, 7)
    big = h.submit(gpus_per_node=8)
    assert nodes_of(started(h.cycle())[big]) == ["gpu01"]
    assert first


def test_typed_gres_goes_to_nodes_of_that_type():
    cfg = make_cluster(nodes=2)
    h100 = ev.NodeConfig(name="h01", cpus=64, memory=257000, gpus=(ev.GpuConfig(type="h100", count=4),))
    part = ev.PartitionConfig(name="short", nodes=("gpu01", "gpu02", "h01"), max_time=3600, default=True)
    h = Harness(cfg.model_copy(update={"nodes": cfg.nodes + (h100,), "partitions": (part,)}))
    jid = h.submit(gpus_per_node=2, gpu_type="h100")
    assert nodes_of(started(h.cycle())[jid]) == ["h01"]


def test_mixed_gpu_types_on_one_node():
    node = ev.NodeConfig(name="mix01", cpus=32, memory=128000,
                         gpus=(ev.GpuConfig(type="a100", count=2), ev.GpuConfig(type="t4", count=2)))
    part = ev.PartitionConfig(name="p", nodes=("mix01",), default=True)
    h = Harness(ev.ClusterConfig(nodes=(node,), partitions=(part,)))
    t4 = h.submit(gpus_per_node=2, gpu_type="t4")
    a100 = h.submit(gpus_per_node=1, gpu_type="a100")
    more_t4 = h.submit(gpus_per_node=1, gpu_type="t4")
    d = h.cycle()
    assert started(d)[t4].alloc[0].gpus == (2, 3)
    assert started(d)[a100].alloc[0].gpus == (0,)
    assert more_t4 not in started(d)
    assert d.pending[more_t4].reason == "Resources"


def test_multi_node_job_gets_distinct_nodes_with_tasks_spread(h):
    jid = h.submit(nodes=2, ntasks=8, ntasks_per_node=4, cpus_per_task=2, gpus_per_node=4)
    s = started(h.cycle())[jid]
    assert len(set(nodes_of(s))) == 2
    assert all(a.cpus == 8 and len(a.gpus) == 4 for a in s.alloc)


def test_mem_per_cpu_and_default_memory(h):
    a = h.submit(cpus_per_task=4, mem_per_cpu=1000)
    b = h.submit(cpus_per_task=2)
    d = started(h.cycle())
    assert d[a].alloc[0].mem == 4000
    assert d[b].alloc[0].mem == 2 * (257000 // 64)


def test_exclusive_takes_the_whole_node(h):
    jid = h.submit(exclusive=True)
    a = started(h.cycle())[jid].alloc[0]
    assert (a.cpus, a.mem, len(a.gpus)) == (64, 257000, 8)


def test_constraint_nodelist_and_exclude():
    cfg = make_cluster(nodes=3)
    nodes = list(cfg.nodes)
    nodes[2] = nodes[2].model_copy(update={"features": ("ib", "nvlink")})
    h = Harness(cfg.model_copy(update={"nodes": tuple(nodes)}))
    c = h.submit(constraint="ib&nvlink")
    w = h.submit(nodelist=("gpu02",))
    x = h.submit(exclude=("gpu01", "gpu02"))
    d = started(h.cycle())
    assert nodes_of(d[c]) == ["gpu03"] and nodes_of(d[w]) == ["gpu02"] and nodes_of(d[x]) == ["gpu03"]


def test_multiple_partitions_earliest_start_wins():
    cfg = make_cluster(nodes=2)
    other = ev.PartitionConfig(name="long", nodes=("gpu02",), max_time=0)
    part = ev.PartitionConfig(name="short", nodes=("gpu01",), max_time=3600, default=True)
    h = Harness(cfg.model_copy(update={"partitions": (part, other)}))
    h.submit(gpus_per_node=8, partitions=("short",))
    h.cycle()
    jid = h.submit(gpus_per_node=8, partitions=("short", "long"))
    s = started(h.cycle())[jid]
    assert s.partition == "long" and nodes_of(s) == ["gpu02"]


def blocked_head_scenario(policy):
    """gpu01 busy 1000 s; gpu02 busy 3000 s. Head wants 2 nodes; a short and a long 1-node job follow."""
    h = Harness(make_cluster(nodes=3, policy=policy, max_time=0))
    h.submit(gpus_per_node=8, nodelist=("gpu01",), time_limit=1000)
    h.submit(gpus_per_node=8, nodelist=("gpu02",), time_limit=3000)
    h.cycle()
    head = h.submit(name="head", nodes=2, gpus_per_node=8, time_limit=5000)
    short = h.submit(name="short", gpus_per_node=8, time_limit=900)
    long_ = h.submit(name="long", gpus_per_node=8, time_limit=4000)
    late = h.submit(name="late", nodes=3, gpus_per_node=8, time_limit=100)
    return h, head, short, long_, late


def test_fifo_starts_nothing_behind_a_blocked_head():
    h, head, short, long_, late = blocked_head_scenario("fifo")
    d = h.cycle()
    # the head fits now on gpu01? no: it needs 2 free nodes, only gpu03 is free
    assert not d.starts
    assert d.pending[head].reason == "Resources" and d.pending[short].reason == "Priority"
    assert not d.reservations


def test_easy_backfills_a_job_that_ends_before_the_reservation():
    h, head, short, long_, late = blocked_head_scenario("easy")
    d = h.cycle()
    assert d.reservations[head].start == h.now + 1000
    assert set(d.reservations) == {head}
    s = started(d)
    assert short in s and s[short].backfilled and nodes_of(s[short]) == ["gpu03"]
    assert long_ not in s
    assert d.checked[short] == (head,)


def test_conservative_reserves_for_every_job_in_order():
    h, head, short, long_, late = blocked_head_scenario("conservative")
    d = h.cycle()
    assert short in started(d)
    r = d.reservations
    assert r[head].start == h.now + 1000                 # gpu01 + gpu03 (after short ends)
    assert r[long_].start == h.now + 3000                # gpu02 frees; head holds gpu01/gpu03
    assert r[late].start == h.now + 7000                 # every node, after head and long end
    assert d.pending[late].start == r[late].start


def test_expected_start_moves_earlier_when_a_job_ends_early():
    h, head, short, long_, late = blocked_head_scenario("conservative")
    h.cycle()
    h.advance(100)
    h.finish(1, elapsed=100)                               # gpu01's job ends 900 s early
    d = h.cycle()
    assert d.pending[head].start == h.now + 800            # short (900 s) still holds gpu03


def test_jobs_never_go_to_a_down_node(h):
    h.put(ev.NodeDown(node="gpu01", reason="dead", by="root"))
    ids = [h.submit(gpus_per_node=8) for _ in range(4)]
    d = h.cycle()
    assert all("gpu01" not in nodes_of(s) for s in d.starts)
    assert len(d.starts) == 3 and d.pending[ids[3]].reason == "Resources"


def test_tier_orders_before_priority():
    cfg = make_cluster(nodes=1)
    hi = ev.PartitionConfig(name="hi", nodes=("gpu01",), priority_tier=10)
    h = Harness(cfg.model_copy(update={"partitions": cfg.partitions + (hi,)}))
    a = h.submit(gpus_per_node=8)
    b = h.submit(gpus_per_node=8, partitions=("hi",))
    d = h.cycle()
    assert d.order == [b, a] and b in started(d)


def test_bf_max_job_test_marks_untested_jobs():
    h = Harness(make_cluster(nodes=1, bf_max_job_test=2))
    ids = [h.submit(gpus_per_node=8) for _ in range(4)]
    d = h.cycle()
    assert d.pending_of(ids[2]).reason == "Priority"
    last = d.pending_of(ids[3])
    assert last.evaluated is False and ids[3] not in d.reservations
    assert (last.rank, last.priority) == (4, d.priorities[ids[3]]) and d.order == ids
    assert ids[3] not in d.pending and d.pending_of(ids[1]) is d.pending[ids[1]]   # made only when asked


def test_explain_names_the_blockers(h):
    ids = [h.submit(gpus_per_node=8, time_limit=600 * (i + 1)) for i in range(4)]
    h.cycle()
    waiting = h.submit(gpus_per_node=8)
    d = h.cycle()
    p = d.pending[waiting]
    assert p.start == h.now + 600 and p.blockers == (ids[0],)
    assert "8 GPU(s)" in p.detail and "0 GPU(s) free" in p.detail


def test_a_long_pass_gives_way_between_slices_and_decides_the_same():
    h = Harness(make_cluster(nodes=1, gpus=0))
    for _ in range(2100):
        h.submit(cpus_per_task=64)
    calls = []
    given = schedule(h.state, h.now, give_way=lambda: calls.append(len(calls)))
    assert len(calls) == 3 and given == schedule(h.state, h.now)
