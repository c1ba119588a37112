"""Usage decay, fair-share (classic and Fair Tree), limits through parent accounts, and fair-share
converging in the simulator, which runs the production policy code."""
from hypothesis import given
from hypothesis import strategies as st

from rota.core import events as ev
from rota.core.fairshare import factors, share_rows
from rota.core.priority import JobSize, PriorityContext, priority_factors
from rota.core.sim import Simulator, TraceJob
from harness import Harness, make_cluster
from rota.core.usage import ONE, charge, decay_factor, decayed, value_at
import pytest

pytestmark = pytest.mark.fast    # make test-fast: the core and the front door, no process started

DAY = 86400


def accounting(*accounts: tuple[str, str, int], users: tuple[tuple[str, str, int], ...]) -> ev.AccountingChanged:
    """accounts: (name, parent, shares); users: (user, account, shares)."""
    return ev.AccountingChanged(
        accounts=tuple(ev.AccountRecord(name=n, parent=p, fairshare=s) for n, p, s in accounts),
        associations=tuple(ev.Association(user=u, account=a, fairshare=s) for u, a, s in users),
        default_accounts={u: a for u, a, _ in users})


def cluster(fair_tree: bool, half_life: int = 7 * DAY, **kw) -> ev.ClusterConfig:
    cfg = make_cluster(**kw)
    prio = cfg.priority.model_copy(update={"fairshare": 10000, "age": 0, "partition": 0, "fair_tree": fair_tree,
                                           "decay_half_life": half_life})
    return cfg.model_copy(update={"priority": prio})


def test_usage_halves_every_half_life_in_integers():
    assert decay_factor(DAY, DAY) == ONE // 2 and decay_factor(0, DAY) == ONE and decay_factor(5, 0) == ONE
    entries: dict = {}
    charge(entries, "a", 1_000_000, 8_000, 100, DAY)
    assert value_at(entries["a"], 100 + DAY, DAY) == (500_000, 4_000)
    assert value_at(entries["a"], 100 + 3 * DAY, DAY) == (125_000, 1_000)
    charge(entries, "a", 500_000, 0, 100 + DAY, DAY)           # decayed to then, then added
    assert entries["a"] == [1_000_000, 4_000, 100 + DAY]
    assert value_at(entries["a"], 100, 0) == (1_000_000, 4_000)   # half-life 0: no decay


@given(st.integers(0, 10**12), st.integers(0, 10 * DAY), st.integers(0, 10 * DAY), st.integers(1, 30 * DAY))
def test_decay_is_monotone_and_composes_within_rounding(value, a, b, half_life):
    once = decayed(value, a + b, half_life)
    twice = decayed(decayed(value, a, half_life), b, half_life)
    assert once <= value and decayed(value, a + b + 1, half_life) <= once
    assert abs(once - twice) <= 2 + value // 10**9


def test_classic_fairshare_is_two_to_the_minus_effective_usage_over_shares():
    h = Harness(cluster(fair_tree=False, half_life=0))
    h.put(accounting(("physics", "root", 1), users=(("alice", "physics", 1), ("bob", "physics", 1))))
    job = h.submit(user="alice", account="physics", cpus_per_task=4, time_limit=3600)
    h.cycle()
    h.advance(1000)
    h.finish(job)
    f = factors(h.state, h.now)
    # root's own root user (1 share, as Slurm's database makes it) halves physics' shares: S = 1/4 each;
    # alice used it all: UE = 1 -> 2^-4; bob: UE = 0 + (1 - 0) / 2 -> 2^(-1/2 / 1/4) = 2^-2
    assert f == {("alice", "physics"): 62_500, ("bob", "physics"): 250_000, ("root", "root"): 1_000_000}
    rows = {(r.account, r.user): r for r in share_rows(h.state, h.now)}
    assert rows[("physics", "alice")].raw_usage == 4000 and rows[("root", "")].raw_usage == 4000


def test_fair_tree_ranks_users_of_the_account_furthest_under_its_share_first():
    h = Harness(cluster(fair_tree=True, half_life=0))
    h.put(accounting(("chem", "root", 1), ("bio", "root", 1),
                     users=(("ann", "chem", 1), ("ben", "chem", 1), ("cat", "bio", 1), ("dan", "bio", 1))))
    for user, account, seconds in (("ann", "chem", 100), ("cat", "bio", 300), ("dan", "bio", 100)):
        job = h.submit(user=user, account=account, time_limit=3600)
        h.cycle()
        h.advance(seconds)
        h.finish(job)
    f = factors(h.state, h.now)
    # root's own root user (no usage) first, as in Slurm; chem used 100 of 500 (LF 2.5) before bio (LF 0.625);
    # in chem ben (no usage) before ann; in bio dan before cat
    assert f == {("root", "root"): 1_000_000, ("ben", "chem"): 800_000, ("ann", "chem"): 600_000,
                 ("dan", "bio"): 400_000, ("cat", "bio"): 200_000}


def test_fairshare_feeds_priority_and_sprio_factors_add_up():
    h = Harness(cluster(fair_tree=False, half_life=0))
    h.put(accounting(("physics", "root", 1), users=(("alice", "physics", 1), ("bob", "physics", 1))))
    first = h.submit(user="alice", account="physics", time_limit=3600)
    h.cycle()
    h.advance(60)
    h.finish(first)
    a = h.submit(user="alice", account="physics", time_limit=3600, hold=True)
    b = h.submit(user="bob", account="physics", time_limit=3600, hold=True)
    cfg = h.state.config
    ctx = PriorityContext(cfg, 256, h.state.qos, factors(h.state, h.now))
    fa = priority_factors(h.state.jobs[a], h.now, cfg.partitions[0], JobSize(1, 1), ctx)
    fb = priority_factors(h.state.jobs[b], h.now, cfg.partitions[0], JobSize(1, 1), ctx)
    assert (fa.fairshare, fb.fairshare) == (625, 2500)        # 2^-4 and 2^-2: root's root user holds half the shares
    assert fb.fairshare + fb.age + fb.job_size + fb.partition + fb.qos - fb.nice == 2500


def test_an_accounts_grp_limits_count_its_sub_accounts_jobs():
    cfg = make_cluster(nodes=2).model_copy(update={"accounting_enforce": ("associations", "limits")})
    h = Harness(cfg)
    change = accounting(("physics", "root", 1), ("theory", "physics", 1), users=(("alice", "theory", 1),))
    h.put(change.model_copy(update={"accounts": (change.accounts[0].model_copy(update={"grp_jobs": 1}),
                                                 change.accounts[1])}))
    a = h.submit(user="alice", account="theory", time_limit=600)
    b = h.submit(user="alice", account="theory", time_limit=600)
    d = h.cycle()
    assert [s.job_id for s in d.starts] == [a]
    why = d.pending[b].why
    assert (why.code, why.about, why.asked, why.limit) == ("AssocGrpJobsLimit", "physics", 1, 1)
    h.finish(a)
    assert [s.job_id for s in h.cycle().starts] == [b]        # lifted by the end that freed it


def week_of_two_accounts(fairshare: bool) -> dict[str, int]:
    """Two accounts with equal shares on 8 CPUs; 'big' queues 1,200 one-hour jobs, 'small' 800 (both more
    than half a week's capacity of 1,344), 'big' submitting first. CPU-hours each got in the week."""
    cfg = cluster(fair_tree=True, half_life=DAY, nodes=1, cpus=8, gpus=0, policy="fifo")
    if not fairshare:
        cfg = cfg.model_copy(update={"priority": cfg.priority.model_copy(update={"fairshare": 0})})
    setup = accounting(("big", "root", 1), ("small", "root", 1),
                       users=(("b1", "big", 1), ("b2", "big", 1), ("s1", "small", 1)))
    jobs = [TraceJob(0, ev.JobSpec(user=("b1", "b2")[i % 2], account="big", time_limit=3600), 3600, i)
            for i in range(1200)]
    jobs += [TraceJob(0, ev.JobSpec(user="s1", account="small", time_limit=3600), 3600, 1200 + i) for i in range(800)]
    result = Simulator(cfg, setup=[setup], record_log=False).run(jobs)
    got = {"big": 0, "small": 0}
    for o in result.outcomes.values():
        if 0 <= o.start < 7 * DAY:
            got["big" if o.trace_id < 1200 else "small"] += o.cpus
    return got


def test_fairshare_evens_out_two_accounts_usage_over_a_simulated_week():
    fair = week_of_two_accounts(True)
    assert sum(fair.values()) == 7 * 24 * 8                    # the machine never idled
    assert abs(fair["big"] - fair["small"]) <= 0.05 * sum(fair.values())
    unfair = week_of_two_accounts(False)                         # first come, first served
    assert unfair["big"] == 1200 and unfair["small"] == 7 * 24 * 8 - 1200


def test_fair_tree_gives_everyone_the_top_rank_while_nobody_has_used_anything():
    h = Harness(cluster(fair_tree=True, half_life=0))
    h.put(accounting(("chem", "root", 40), ("phys", "root", 60), users=(("ann", "chem", 1), ("bob", "phys", 1))))
    assert factors(h.state, h.now) == {("ann", "chem"): 1_000_000, ("bob", "phys"): 1_000_000,
                                       ("root", "root"): 1_000_000}


def test_why_names_the_priority_factors_that_ranked_a_job_behind_another():
    from rota.cli.timetravel import why_text
    from rota.core.timetravel import why

    h = Harness(cluster(fair_tree=False, half_life=0, nodes=1, gpus=8))
    h.put(accounting(("physics", "root", 1), users=(("alice", "physics", 1), ("bob", "physics", 1))))
    used = h.submit(user="alice", account="physics", gpus_per_node=8, gpu_given=True, time_limit=3600)
    h.cycle()
    h.advance(600)
    h.finish(used)
    blocker = h.submit(user="carol", account="", gpus_per_node=8, gpu_given=True, time_limit=3600)
    h.cycle()
    mine = h.submit(user="alice", account="physics", gpus_per_node=8, gpu_given=True, time_limit=3600)
    theirs = h.submit(user="bob", account="physics", gpus_per_node=8, gpu_given=True, time_limit=3600)
    h.advance(60)
    h.cycle()
    assert h.state.jobs[blocker].state == "RUNNING"
    text = "\n".join(why_text(why(h.log, mine), {}))
    assert f"Ranked behind job {theirs} (?) by its priority factors: 2500 (fair-share 2500), against this job's " \
           "625 (fair-share 625)." in text, text


def test_a_cycles_priorities_are_sprios_factors_summed():
    """The cycle sums the factors jobs share once per (partition, size, QOS); sprio adds each job's up."""
    from rota.core.schedule import factors_of

    wide = ev.PartitionConfig(name="wide", nodes=("gpu01", "gpu02"), max_time=3600, priority_job_factor=3)
    cfg = cluster(fair_tree=False, half_life=0, nodes=2, gpus=0, extra_partitions=(wide,))
    cfg = cfg.model_copy(update={
        "priority": cfg.priority.model_copy(update={"age": 700, "job_size": 900, "partition": 400, "qos": 300,
                                                    "max_age": 1000}),
        "qos": (ev.QosConfig(name="normal"), ev.QosConfig(name="high", priority=7))})
    h = Harness(cfg)
    h.put(accounting(("physics", "root", 1), users=(("alice", "physics", 1), ("bob", "physics", 2))))
    blocker = h.submit(user="bob", account="physics", nodes=2, cpus_per_task=64, exclusive=True, time_limit=3600)
    h.cycle()
    ids = []
    for i in range(12):
        h.advance(97)
        ids.append(h.submit(user=("alice", "bob")[i % 2], account="physics", cpus_per_task=1 + i % 5,
                            partitions=(("short",), ("wide",))[i % 3 == 0], qos=("normal", "high")[i % 4 == 1],
                            nice=(0, 50)[i % 5 == 2], time_limit=600))
    h.advance(300)
    d = h.cycle()
    assert h.state.jobs[blocker].state == "RUNNING" and not d.starts
    sprio = factors_of(h.state, h.now, ids)
    assert {jid: sprio[jid][1].priority for jid in ids} == {jid: d.priorities[jid] for jid in ids}
    assert len({d.priorities[jid] for jid in ids}) == len(ids)      # every factor told them apart


def test_job_size_follows_the_nodes_and_cpus_a_job_will_hold_as_slurm_computes_it():
    cfg = make_cluster(nodes=4).model_copy(update={"priority": ev.PriorityWeights(age=0, partition=0, job_size=1000)})
    h = Harness(cfg)
    wide = h.submit(user="alice", nodes=4, nodes_given=True, exclusive=True)   # (4/4 + 4/256) / 2: a CPU a node
    one = h.submit(user="alice", cpus_per_task=8)                              # (1/4 + 8/256) / 2
    pair = h.submit(user="alice", nodes=2, nodes_given=True, ntasks=2, ntasks_given=True)
    from rota.core.cycle import Cycle

    cy = Cycle(h.state, h.now, "conservative", False, timelines=False)
    assert [cy.job_size(h.state.jobs[j], "short") for j in (wide, one, pair)] == \
        [JobSize(4, 4, 10), JobSize(1, 8, 10), JobSize(2, 2, 10)]
    assert priority_factors(h.state.jobs[wide], h.now, cfg.partitions[0], JobSize(4, 4), cy.prio_ctx).job_size == 508
    ctx = PriorityContext(cfg, 256, node_count=4)
    assert priority_factors(h.state.jobs[one], h.now, cfg.partitions[0], JobSize(1, 8), ctx).job_size == 141
    assert priority_factors(h.state.jobs[pair], h.now, cfg.partitions[0], JobSize(2, 2), ctx).job_size == 254
    small = ev.PriorityWeights(age=0, partition=0, job_size=1000, favor_small=True)
    ctx = PriorityContext(cfg.model_copy(update={"priority": small}), 256, node_count=4)
    assert priority_factors(h.state.jobs[one], h.now, cfg.partitions[0], JobSize(1, 8), ctx).job_size == 859


def test_the_priority_truncates_the_sum_of_the_factors_not_each_factor():
    cfg = make_cluster(nodes=4).model_copy(update={"priority": ev.PriorityWeights(
        age=1000, max_age=3, partition=0, job_size=1000)})
    h = Harness(cfg)
    job = h.submit(user="alice", cpus_per_task=8)
    h.advance(1)
    ctx = PriorityContext(cfg, 256, node_count=4)
    f = priority_factors(h.state.jobs[job], h.now, cfg.partitions[0], JobSize(1, 8), ctx)
    assert (f.age, f.job_size) == (333, 141)             # 333.33 and 140.625, rounded as sprio shows them
    assert f.priority == 473                              # Slurm: int(473.96)
    h.advance(1)
    f = priority_factors(h.state.jobs[job], h.now, cfg.partitions[0], JobSize(1, 8), ctx)
    assert (f.age, f.job_size, f.priority) == (667, 141, 807)    # 666.67 + 140.625 = 807.29; 806 if each were cut


def test_nice_lowers_a_jobs_priority_and_sbatch_takes_it():
    from rota.cli.sbatch import build_spec

    spec, _ = build_spec(["--nice", "--wrap", "true"])
    assert spec["nice"] == 100
    spec, _ = build_spec(["--nice=250", "--wrap", "true"])
    assert spec["nice"] == 250
    cfg = make_cluster(nodes=1).model_copy(update={"priority": ev.PriorityWeights(age=0, partition=1000)})
    h = Harness(cfg)
    h.submit(user="alice", nodes=1, exclusive=True)
    h.cycle()
    plain = h.submit(user="alice")
    nice = h.submit(user="bob", nice=250)
    d = h.cycle()
    assert (d.pending[plain].priority, d.pending[nice].priority) == (1000, 750)
