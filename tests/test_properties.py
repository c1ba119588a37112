"""Property tests over random clusters and job streams (hypothesis)."""
from __future__ import annotations

import copy
import os
from pathlib import Path
import subprocess
import sys
import textwrap

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rota.core import events as ev
from rota.core import effects
from rota.core.apply import fold
from rota.core.changes import Changes
from rota.core.schedule import schedule
from rota.core.state import RUNNING, dump_snapshot, load_snapshot
from harness import Harness

from reference import check_capacity, fits, usage_plan
import pytest

pytestmark = pytest.mark.fast    # make test-fast: the core and the front door, no process started

GPU_TYPES = ("a100", "h100")


@st.composite
def clusters(draw):
    n = draw(st.integers(1, 5))
    nodes = []
    for i in range(n):
        gpus = draw(st.sampled_from([0, 2, 4, 8]))
        gtype = draw(st.sampled_from(GPU_TYPES))
        nodes.append(ev.NodeConfig(
            name=f"n{i:02d}", cpus=draw(st.sampled_from([4, 16, 64])),
            memory=draw(st.sampled_from([8000, 64000, 256000])),
            gpus=(ev.GpuConfig(type=gtype, count=gpus),) if gpus else (),
            features=tuple(draw(st.lists(st.sampled_from(["ib", "nvme"]), max_size=2, unique=True)))))
    names = tuple(x.name for x in nodes)
    policy = draw(st.sampled_from(["fifo", "easy", "easy_strict", "conservative"]))
    part = ev.PartitionConfig(name="p", nodes=names, max_time=0, default=True)
    return ev.ClusterConfig(nodes=tuple(nodes), partitions=(part,),
                            scheduler=ev.SchedulerParams(policy=policy, bf_window=10**7))


@st.composite
def job_specs(draw):
    gpus = draw(st.sampled_from([0, 0, 1, 1, 2, 4, 8]))
    return dict(
        nodes=draw(st.sampled_from([1, 1, 1, 1, 2, 3])), nodes_given=True,
        cpus_per_task=draw(st.sampled_from([1, 1, 2, 4, 16])), cpus_per_task_given=True,
        mem_per_node=draw(st.sampled_from([None, None, 1000, 4000, 60000])),
        gpus_per_node=gpus,
        gpu_type=draw(st.sampled_from([None, None, None, "a100", "h100"])) if gpus else None,
        time_limit=draw(st.sampled_from([60, 300, 900, 3600, 7200])),
        constraint=draw(st.sampled_from([None, None, None, "ib", "nvme|ib"])),
        exclusive=draw(st.sampled_from([False] * 9 + [True])),
        array=draw(st.sampled_from([None] * 8 + ["0-3", "1-5%2"])),
    )


NODE_OPS = st.sampled_from([None] * 8 + ["drain", "resume", "down"])

STEP = st.tuples(
    st.lists(job_specs(), max_size=6),       # submits
    st.integers(0, 3),                       # jobs that finish
    st.tuples(NODE_OPS, st.integers(0, 4)),  # admin action on a node
    st.integers(0, 3000),                    # seconds that pass
)


def apply_step(h, submits, finishes, node_op, node_i):
    """One step's submits (refused ones dropped), ends of the first running jobs, and admin action on a node."""
    from rota.core import commands

    for spec in submits:
        try:
            h.submit(**spec)
        except commands.Rejected:
            pass
    for jid in sorted(h.state.running)[:finishes]:
        h.finish(jid)
    names = [n.name for n in h.state.config.nodes]
    node = names[node_i % len(names)]
    if node_op == "drain":
        h.put(ev.NodeDrained(node=node, reason="test", by="root"))
    elif node_op == "down":
        h.put(ev.NodeDown(node=node, reason="test", by="root"))
    elif node_op == "resume" and (h.state.nodes[node].drain or h.state.nodes[node].down):
        h.put(ev.NodeResumed(node=node, by="root"))


def run_ops(cfg, steps, check=None):
    """Drive a harness through steps; after every cycle, call ``check(h, state_before, decision)``."""
    h = Harness(cfg)
    for submits, finishes, (node_op, node_i), wait in steps:
        apply_step(h, submits, finishes, node_op, node_i)
        h.advance(wait)
        before = copy.deepcopy(h.state) if check is not None else None
        d = h.cycle()
        if check is not None:
            check(h, before, d)
    return h


def assert_no_overallocation(state):
    used = {}
    for jid in state.running:
        job = state.jobs[jid]
        for a in job.alloc:
            c, m, g = used.get(a.node, (0, 0, []))
            used[a.node] = (c + a.cpus, m + a.mem, g + list(a.gpus))
    for name, node in state.nodes.items():
        c, m, g = used.get(name, (0, 0, []))
        assert c == node.alloc_cpus <= node.cpus
        assert m == node.alloc_mem <= node.memory
        assert len(g) == len(set(g)), f"GPU given twice on {name}: {g}"
        assert sorted(g) == sorted(i for i, o in enumerate(node.gpu_owner) if o)
        for i in g:
            assert state.jobs[node.gpu_owner[i]].state == RUNNING


def check_cycle(h, before, d):
    from rota.core.cycle import Cycle as _Cycle

    state = h.state
    assert_no_overallocation(state)
    cy = _Cycle(before, d.now, d.policy, False)
    for s in d.starts:
        spec = state.jobs[s.job_id].spec
        req = cy.request(before.jobs[s.array_job_id or s.job_id], s.partition)
        assert len(s.alloc) == req.nnodes
        for a in s.alloc:
            assert (a.cpus, a.mem, len(a.gpus)) == _req_on(before, a.node, req), "allocation differs from request"
            node = before.nodes[a.node]
            assert node.usable, f"job {s.job_id} started on unusable node {a.node}"
            if spec.gpu_type:
                assert all(node.gpu_types[i] == spec.gpu_type for i in a.gpus)
    # the whole plan (running + starts + reservations) never over-commits a node
    check_capacity(before, usage_plan(before, d))


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(clusters(), st.lists(STEP, min_size=1, max_size=25))
def test_never_overallocates_and_never_uses_unusable_nodes(cfg, ops):
    run_ops(cfg, ops, check_cycle)


def _reservation_plan(before, d):
    """Plan including reservations: checks every reservation fits where it was placed."""
    from rota.core.profile import UNLIMITED_DURATION
    from rota.core.cycle import Cycle as _Cycle

    cy = _Cycle(before, d.now, d.policy, False)
    plan = usage_plan(before, d)
    for jid in d.order:
        r = d.reservations.get(jid)
        if r is None:
            continue
        job = before.jobs[jid]
        req = cy.request(job, r.partition)
        dur = (r.end - r.start)
        for name in r.nodes:
            n = before.nodes[name]
            c = n.cpus if req.whole_cpus else req.cpus
            m = n.memory if req.whole_mem else req.mem
            g = n.gpu_count if req.whole_gpus else req.gpus
            assert fits(before, plan, name, r.start, dur, c, m, g), f"reservation of {jid} does not fit"
            plan[name].append((r.start, r.end, c, m, g, jid))
        assert dur <= UNLIMITED_DURATION
    return plan


@SETTINGS
@given(clusters(), st.lists(STEP, min_size=1, max_size=25))
def test_reservations_are_feasible_and_backfill_never_delays_them(cfg, ops):
    def check(h, before, d):
        if d.policy == "fifo":
            return
        _reservation_plan(before, d)
        rank = {jid: i for i, jid in enumerate(d.order)}
        for s in d.starts:
            if not s.backfilled or s.job_id not in rank:
                continue
            without = copy.deepcopy(before)
            del without.jobs[s.job_id]
            without.pending.pop(s.job_id)
            d2 = schedule(without, d.now, d.policy)
            for jid, r in d.reservations.items():
                if rank[jid] < rank[s.job_id]:
                    assert jid in d2.reservations
                    assert r.start <= d2.reservations[jid].start, (
                        f"backfilled job {s.job_id} delayed job {jid}")
    run_ops(cfg, ops, check)


@SETTINGS
@given(clusters(), st.lists(STEP, min_size=1, max_size=25))
def test_conservative_reservations_are_the_earliest_possible(cfg, ops):
    """Brute force: no higher-priority plan leaves room for any reserved job earlier."""
    cfg = cfg.model_copy(update={"scheduler": cfg.scheduler.model_copy(update={"policy": "conservative"})})

    def check(h, before, d):
        from rota.core.cycle import Cycle as _Cycle
        cy = _Cycle(before, d.now, d.policy, False)
        plan = usage_plan(before, d)
        placed = {s.job_id for s in d.starts}
        for jid in d.order:
            r = d.reservations.get(jid)
            if jid in placed or r is None:
                continue
            job = before.jobs[jid]
            req = cy.request(job, r.partition)
            dur = r.end - r.start
            tls, _ = cy.eligible(job.spec, r.partition)
            names = [t.name for t in tls]
            candidates = sorted({d.now} | {e for n in names for (_s, e, *_x) in plan[n] if d.now < e < r.start})
            for t in candidates:
                ok = [n for n in names if fits(before, plan, n, t, dur, *_req_on(before, n, req))]
                assert len(ok) < req.nnodes, f"job {jid} could start at {t} < reserved {r.start}"
            for name in r.nodes:
                c, m, g = _req_on(before, name, req)
                plan[name].append((r.start, r.end, c, m, g, jid))
    run_ops(cfg, ops, check)


def _req_on(state, name, req):
    n = state.nodes[name]
    return (n.cpus if req.whole_cpus else req.cpus, n.memory if req.whole_mem else req.mem,
            n.gpu_count if req.whole_gpus else req.gpus)


@SETTINGS
@given(clusters(), st.lists(STEP, min_size=1, max_size=25), st.integers(0, 100))
def test_replay_and_snapshot_plus_tail_equal_the_live_state(cfg, ops, cut):
    h = run_ops(cfg, ops)
    replayed = fold(h.log)
    assert replayed == h.state
    recounted: dict = {}
    for job in h.state.jobs.values():
        if job.state in ("PENDING", "RUNNING"):
            n = len(job.array_pending) if job.array_pending is not None else 1
            mine = recounted.setdefault(job.spec.user, {})
            mine[job.spec.qos, job.spec.account] = mine.get((job.spec.qos, job.spec.account), 0) + n
    # kept event by event, as counted anew
    assert h.state.active_in == {u: {k: n for k, n in mine.items() if n} for u, mine in recounted.items()
                                 if any(mine.values())}
    assert h.state.active_total == sum(sum(mine.values()) for mine in recounted.values())
    k = cut * len(h.log) // 100
    snap = load_snapshot(dump_snapshot(fold(h.log[:k])))
    assert fold(h.log[k:], snap) == h.state
    # decisions replay too: the same state gives the same decision
    assert schedule(replayed, h.now).starts == schedule(h.state, h.now).starts


@SETTINGS
@given(clusters(), st.lists(STEP, min_size=1, max_size=25), st.integers(0, 100))
def test_changes_name_every_job_and_node_the_events_changed(cfg, ops, cut):
    """What the reducer reports changed covers everything that did: rows written only for ``changes``
    (the projector) and orders derived only from them (the controller) miss nothing."""
    h = run_ops(cfg, ops)
    k = cut * len(h.log) // 100
    before = fold(h.log[:k])
    after = fold(h.log[:k])
    changes = Changes()
    fold(h.log[k:], after, changes)
    assert after == h.state
    for jid, job in after.jobs.items():
        old = before.jobs.get(jid)
        if old != job:
            assert jid in changes.jobs, f"job {jid} changed unreported"
            assert changes.jobs[jid].state == (old.state if old is not None else None)
            assert changes.jobs[jid].job is job
    for name, node in after.nodes.items():
        if before.nodes.get(name) != node:
            assert name in changes.nodes or changes.config, f"node {name} changed unreported"
    for jid, b in changes.jobs.items():       # and every running job that stopped or moved is told
        job = after.jobs.get(jid, b.job)
        stopped = b.state == RUNNING and (job.state != RUNNING or job.restarts != b.restarts)
        kills = [(n, o) for n, o in effects.orders(after, changes) if o.job_id == jid and o.op == "kill"]
        assert bool([o for n, o in kills if n == b.node]) == (stopped and jid not in changes.reported)
        # its other nodes are told whenever it stops (what its steps left there goes)
        assert {n for n, _o in kills if n != b.node} == (set(b.nodes[1:]) if stopped else set())


DETERMINISM_SCRIPT = textwrap.dedent("""
    import hashlib, random, sys
    from rota.core import events as ev
    from harness import Harness, make_cluster
    from rota.core.state import dump_snapshot
    rng = random.Random(7)
    h = Harness(make_cluster(nodes=6, gpus=4))
    out = hashlib.sha256()
    for step in range(300):
        r = rng.random()
        if r < 0.5:
            h.submit(name=rng.choice(["a", "b", "c"]), user=rng.choice(["u1", "u2"]),
                     gpus_per_node=rng.choice([0, 1, 2, 4]), time_limit=rng.choice([60, 600, 3600]),
                     nodes=rng.choice([1, 1, 2]), dependency=rng.choice([None, None, "singleton"]))
        elif r < 0.7 and h.state.running:
            h.finish(rng.choice(sorted(h.state.running)))
        else:
            h.advance(rng.randint(1, 900))
            d = h.cycle(explain=True)
            out.update(repr([(s.job_id, s.alloc) for s in d.starts]).encode())
            out.update(repr(sorted((j, r.start, r.nodes) for j, r in d.reservations.items())).encode())
            out.update(repr(sorted((j, p.reason, p.blockers) for j, p in d.pending.items())).encode())
    out.update(dump_snapshot(h.state))
    print(out.hexdigest())
""")


def test_same_stream_same_state_and_decisions_under_any_hash_seed():
    digests = set()
    for seed in ("0", "1", "4242"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        res = subprocess.run([sys.executable, "-c", DETERMINISM_SCRIPT], env=env, cwd=Path(__file__).parent,
                             capture_output=True, text=True, check=True)
        digests.add(res.stdout.strip())
    assert len(digests) == 1, digests


SINGLETON_OP = st.tuples(st.sampled_from(["submit", "cycle", "finish"]), st.integers(0, 1), st.integers(0, 1))


@SETTINGS
@given(st.lists(SINGLETON_OP, min_size=1, max_size=30))
def test_singleton_read_from_the_cycles_index_is_the_scan_of_every_job(ops):
    from harness import make_cluster
    from rota.core.deps import dependency_status, parse_dependency, singletons

    h = Harness(make_cluster(nodes=1, gpus=2))
    for op, user, name in ops:
        if op == "submit":
            h.submit(user=f"u{user}", name=f"n{name}", gpus_per_node=1, dependency="singleton")
        elif op == "cycle":
            h.cycle()
        elif h.state.running:
            h.finish(sorted(h.state.running)[user % len(h.state.running)])
    st_, dep, index = h.state, parse_dependency("singleton"), singletons(h.state)
    for jid in st_.pending:
        me = st_.jobs[jid]
        blocked = any(o.spec.user == me.spec.user and o.spec.name == me.spec.name
                      and (o.state == RUNNING or o.submit_seq < me.submit_seq)
                      for oid in [*st_.running, *st_.pending] if oid != jid for o in [st_.jobs[oid]])
        assert dependency_status(st_, dep, jid, h.now, index) == ("wait" if blocked else "ok")
