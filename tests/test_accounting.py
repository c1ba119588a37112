"""Accounts, associations and QOS (sacctmgr) in the core: plans, refusals, the submit rule, snapshots."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rota.core import events as ev
from rota.core.accounting import AccountingError, check_submit, plan
from rota.core.auth import Caller
from rota.core.commands import Rejected, change_accounting, submit
from rota.core.slurmconf import ConfigError, parse_config
from rota.core.state import dump_snapshot, load_snapshot
from harness import Harness, make_cluster
from rota.core.usage import value_at

pytestmark = pytest.mark.fast    # make test-fast: the core and the front door, no process started

ALICE = Caller(1001, 1001, "alice")


def harness(enforce: tuple[str, ...] = ("associations",)) -> Harness:
    h = Harness(make_cluster(nodes=2).model_copy(update={"accounting_enforce": enforce}))
    for args in (("add", "account", ["physics"], {}, {"description": "Physics"}),
                 ("add", "account", ["theory"], {}, {"parent": "physics"}),
                 ("add", "qos", ["gpu"], {}, {"priority": "10", "maxjobsperuser": "2",
                                              "maxtresperuser": "gres/gpu=4", "maxwall": "2:00:00"}),
                 ("add", "user", ["alice"], {}, {"account": "physics,theory", "qos": "normal,gpu",
                                                 "defaultaccount": "theory"})):
        h.put(plan(h.state, *args, by="root"), actor="root")
    return h


def test_sacctmgr_plans_become_records_in_the_state():
    h = harness()
    s = h.state
    assert s.accounts["theory"].parent == "physics" and s.accounts["physics"].description == "Physics"
    assert s.qos["gpu"].max_tres_per_user == {"gres/gpu": 4} and s.qos["gpu"].max_wall == 7200
    assert s.associations[("alice", "physics")].qos == ("normal", "gpu") and s.default_accounts["alice"] == "theory"
    h.put(plan(s, "modify", "qos", [], {"name": "gpu"}, {"maxjobsperuser": "-1", "priority": "20"}))
    assert s.qos["gpu"].max_jobs_per_user is None and s.qos["gpu"].priority == 20
    h.put(plan(s, "modify", "user", ["alice"], {"account": "physics"}, {"maxjobs": "5"}))
    assert s.associations[("alice", "physics")].max_jobs == 5 and s.associations[("alice", "theory")].max_jobs is None
    back = load_snapshot(dump_snapshot(s))
    assert (back.accounts, back.associations, back.default_accounts, back.qos) == \
        (s.accounts, s.associations, s.default_accounts, s.qos)
    h.put(plan(s, "delete", "user", ["alice"], {"account": "theory"}, {}))
    assert ("alice", "theory") not in s.associations and "alice" not in s.default_accounts


@pytest.mark.parametrize("args, words", [
    (("add", "account", ["physics"], {}, {}), "account physics already exists"),
    (("add", "user", ["bob"], {}, {"account": "chemistry"}), "account chemistry does not exist"),
    (("add", "user", ["bob"], {}, {}), "sacctmgr add user NAME Account=ACCOUNT"),
    (("add", "user", ["bob"], {}, {"account": "physics", "qos": "fast"}), "qos fast does not exist"),
    (("add", "qos", ["fast"], {}, {"maxwall": "soon"}), "MaxWall=soon: not a time"),
    (("add", "qos", ["fast"], {}, {"maxtresperuser": "disk=4"}), "TRES 'disk=4'"),
    (("add", "qos", ["fast"], {}, {"preemptmode": "suspend"}), "PreemptMode=suspend: use cluster, off, cancel or requeue"),
    (("delete", "account", ["physics"], {}, {}), "account physics still has users (alice)"),
    (("delete", "qos", ["gpu"], {}, {}), "qos gpu is still allowed to alice/physics"),
    (("modify", "qos", ["nope"], {}, {"priority": "1"}), "qos nope does not exist"),
    (("add", "account", ["bad name"], {}, {}), "invalid name 'bad name'"),
])
def test_sacctmgr_refusals_say_what_and_how(args, words):
    with pytest.raises(AccountingError) as refused:
        plan(harness().state, *args)
    assert words in str(refused.value)


def test_only_administrators_change_accounting():
    h = harness()
    with pytest.raises(Rejected) as refused:
        change_accounting(h.state, "add", "qos", ["mine"], {}, {}, ALICE)
    assert refused.value.lines[-1] == "Access/permission denied"


def test_submits_name_an_association_when_accounting_is_enforced():
    h = harness()
    spec = ev.JobSpec(user="alice", uid=1001)
    job = submit(h.state, spec, 9, ALICE)
    assert (job.spec.account, job.spec.qos) == ("theory", "normal")      # the user's default account
    assert submit(h.state, spec.model_copy(update={"account": "physics", "qos": "gpu"}), 9, ALICE).spec.qos == "gpu"
    for change, words in (({"account": "chemistry"}, "Invalid account or account/partition combination specified"),
                          ({"qos": "fast"}, "Invalid qos specification"),
                          ({"user": "bob", "uid": 1002}, "Invalid account or account/partition combination specified")):
        who = Caller(1002, 1002, "bob") if "user" in change else ALICE
        with pytest.raises(Rejected) as refused:
            submit(h.state, spec.model_copy(update=change), 9, who)
        assert refused.value.lines[-1] == words
    assert check_submit(harness(()).state, "bob", "anything", "normal") == ("anything", "normal")   # not enforced


def test_accounting_storage_enforce_is_read_as_slurm_reads_it():
    base = "NodeName=n1 CPUs=4 RealMemory=1000\nPartitionName=p Nodes=n1 Default=YES\n"
    cfg = parse_config(base + "AccountingStorageEnforce=limits,qos\n")
    assert cfg.accounting_enforce == ("associations", "limits", "qos")
    assert parse_config(base + "AccountingStorageEnforce=none\n").accounting_enforce == ()
    with pytest.raises(ConfigError) as bad:
        parse_config(base + "AccountingStorageEnforce=limits,bogus\n")
    assert "'bogus' is not one of its words" in str(bad.value)


# ---------------------------------------------------------------- QOS limits in the scheduler


def limited(enforce=("associations", "limits")) -> Harness:
    h = harness(enforce)
    h.put(plan(h.state, "modify", "qos", ["gpu"], {}, {"maxjobsperuser": "2", "maxtresperuser": "gres/gpu=4",
                                                       "maxsubmitjobsperuser": "4"}))
    return h


def test_qos_max_jobs_per_user_holds_a_job_until_one_of_the_users_jobs_ends():
    h = limited()
    jobs = [h.submit(user="alice", uid=1001, account="physics", qos="gpu", time_limit=600) for _ in range(3)]
    d = h.cycle()
    assert [s.job_id for s in d.starts] == jobs[:2]
    why = d.pending[jobs[2]].why
    assert (why.code, why.asked, why.limit, why.about) == ("QOSMaxJobsPerUserLimit", 2, 2, "gpu")
    assert "2 of the user's jobs running under QOS gpu, MaxJobsPerUser 2" in why.numbers()
    h.finish(jobs[0])
    assert [s.job_id for s in h.cycle().starts] == [jobs[2]]


def test_every_job_of_a_user_at_max_jobs_says_so_and_others_users_jobs_still_start():
    h = limited()
    h.put(plan(h.state, "add", "user", ["bob"], {}, {"account": "physics", "qos": "normal,gpu"}, by="root"),
          actor="root")
    alice = [h.submit(user="alice", uid=1001, account="physics", qos="gpu", time_limit=600) for _ in range(4)]
    bob = h.submit(user="bob", uid=1002, account="physics", qos="gpu", time_limit=600)
    d = h.cycle()
    assert sorted(s.job_id for s in d.starts) == sorted([*alice[:2], bob])
    for jid in alice[2:]:
        why = d.pending[jid].why
        assert (why.code, why.asked, why.limit) == ("QOSMaxJobsPerUserLimit", 2, 2)


def test_qos_max_gres_per_user_counts_the_gpus_the_users_jobs_hold():
    h = limited()
    a = h.submit(user="alice", uid=1001, account="physics", qos="gpu", gpus_per_node=3, gpu_given=True)
    b = h.submit(user="alice", uid=1001, account="physics", qos="gpu", gpus_per_node=2, gpu_given=True)
    d = h.cycle()
    assert [s.job_id for s in d.starts] == [a]
    why = d.pending[b].why
    assert (why.code, why.asked, why.limit, why.note) == ("QOSMaxGRESPerUser", 3, 4, "2")
    h.finish(a)
    assert [s.job_id for s in h.cycle().starts] == [b]


def test_qos_max_wall_and_max_submit_jobs_per_user():
    h = limited()
    h.put(plan(h.state, "modify", "qos", ["gpu"], {}, {"maxwall": "30"}))
    long = h.submit(user="alice", uid=1001, account="physics", qos="gpu", time_limit=45 * 60)
    why = h.cycle().pending[long].why
    assert (why.code, why.asked, why.limit) == ("QOSMaxWallDurationPerJobLimit", 2700, 1800)
    for _ in range(3):
        h.submit(user="alice", uid=1001, account="physics", qos="gpu")
    with pytest.raises(Rejected) as refused:
        h.submit(user="alice", uid=1001, account="physics", qos="gpu")
    assert refused.value.lines == ("QOSMaxSubmitJobPerUserLimit",
                                   "Job violates accounting/QOS policy (job submit limit, user's size and/or time "
                                   "limits)")
    h.submit(user="alice", uid=1001, account="physics", qos="normal")      # another QOS: its own count
    h.put(ev.JobCancelled(job_id=long, by_uid=1001))                          # a job that ends leaves the count
    h.submit(user="alice", uid=1001, account="physics", qos="gpu")
    with pytest.raises(Rejected):
        h.submit(user="alice", uid=1001, account="physics", qos="gpu")
    assert load_snapshot(dump_snapshot(h.state)).active_in == h.state.active_in == {
        "alice": {("gpu", "physics"): 4, ("normal", "physics"): 1}}


def test_qos_limits_hold_only_where_limits_are_enforced():
    h = limited(("associations",))
    jobs = [h.submit(user="alice", uid=1001, account="physics", qos="gpu") for _ in range(3)]
    assert [s.job_id for s in h.cycle().starts] == jobs


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["alice", "bob"]), st.integers(0, 4), st.booleans()), min_size=1,
                max_size=25), st.integers(1, 3), st.integers(1, 6), st.integers(1, 10))
def test_started_jobs_never_exceed_their_qos_or_account_limits(jobs, max_jobs, max_gpus, group_gpus):
    h = Harness(make_cluster(nodes=3, gpus=8).model_copy(update={"accounting_enforce": ("associations", "limits")}))
    h.put(plan(h.state, "add", "account", ["lab"], {}, {"grptres": f"gres/gpu={group_gpus}"}))
    h.put(plan(h.state, "add", "qos", ["q"], {}, {"maxjobsperuser": str(max_jobs),
                                                 "maxtresperuser": f"gres/gpu={max_gpus}"}))
    h.put(plan(h.state, "add", "user", ["alice", "bob"], {}, {"account": "lab", "qos": "normal,q"}))
    for user, gpus, finish in jobs:
        h.submit(user=user, uid=1001 if user == "alice" else 1002, account="lab", qos="q", gpus_per_node=gpus,
                 gpu_given=bool(gpus))
        h.cycle()
        for user_ in ("alice", "bob"):
            mine = [j for j in h.state.jobs.values() if j.state == "RUNNING" and j.spec.user == user_]
            assert len(mine) <= max_jobs
            assert sum(len(a.gpus) for j in mine for a in j.alloc) <= max_gpus
        running = [j for j in h.state.jobs.values() if j.state == "RUNNING"]
        assert sum(len(a.gpus) for j in running for a in j.alloc) <= group_gpus     # the account's GrpTRES
        if finish:
            running = sorted(h.state.running)
            if running:
                h.finish(running[0])


def test_association_and_account_limits_hold_jobs_with_their_numbers():
    h = harness(("associations", "limits"))
    h.put(plan(h.state, "modify", "user", ["alice"], {"account": "physics"}, {"maxjobs": "1", "maxsubmitjobs": "3"}))
    h.put(plan(h.state, "modify", "account", ["theory"], {}, {"grptres": "gres/gpu=4"}))
    a = h.submit(user="alice", uid=1001, account="physics")
    b = h.submit(user="alice", uid=1001, account="physics")
    d = h.cycle()
    assert [s.job_id for s in d.starts] == [a]
    assert (d.pending[b].reason, d.pending[b].why.asked, d.pending[b].why.limit) == ("AssocMaxJobsLimit", 1, 1)
    h.submit(user="alice", uid=1001, account="physics")
    with pytest.raises(Rejected) as refused:
        h.submit(user="alice", uid=1001, account="physics")
    assert refused.value.lines[0] == "AssocMaxSubmitJobLimit"
    g1 = h.submit(user="alice", uid=1001, account="theory", gpus_per_node=3, gpu_given=True)
    g2 = h.submit(user="alice", uid=1001, account="theory", gpus_per_node=2, gpu_given=True)
    d = h.cycle()
    assert g1 in [s.job_id for s in d.starts]
    why = d.pending[g2].why
    assert (why.code, why.asked, why.limit, why.note) == ("AssocGrpGRES", 3, 4, "2")
    assert "account theory's running jobs hold 3 GPUs, this job adds 2; GrpTRES allows 4" in why.numbers()
    h.finish(g1)
    assert g2 in [s.job_id for s in h.cycle().starts]


def test_a_qos_priority_from_sacctmgr_ranks_its_jobs():
    h = Harness(make_cluster(nodes=1, gpus=8).model_copy(
        update={"priority": ev.PriorityWeights(age=0, partition=0, qos=10_000)}))
    h.put(plan(h.state, "add", "qos", ["high"], {}, {"priority": "100"}))
    hog = h.submit(user="alice", gpus_per_node=8, gpu_given=True)
    h.cycle()
    low = h.submit(user="alice", gpus_per_node=8, gpu_given=True)
    high = h.submit(user="bob", gpus_per_node=8, gpu_given=True, qos="high")
    d = h.cycle()
    assert d.pending[high].priority > d.pending[low].priority and d.order.index(high) < d.order.index(low)
    assert hog in h.state.running


def test_grp_tres_mins_counts_what_ended_runs_used_and_running_jobs_reserve():
    h = harness(("associations", "limits", "safe"))
    h.put(plan(h.state, "modify", "account", ["theory"], {}, {"grptresmins": "cpu=100,gres/gpu=30"}))
    a = h.submit(user="alice", uid=1001, account="theory", time_limit=3600)
    b = h.submit(user="alice", uid=1001, account="theory", time_limit=3600)
    d = h.cycle()
    assert [s.job_id for s in d.starts] == [a]
    why = d.pending[b].why
    assert (why.code, why.asked, why.note, why.limit) == ("AssocGrpCPUMinutesLimit", 60, "60", 100)
    assert why.numbers() == ("account theory has used or reserved 60 CPU-minutes, this job would add 60; "
                             "GrpTRESMins allows 100")
    h.advance(600)
    h.finish(a)                       # it used 10 CPU-minutes, not its 60: b fits now
    assert h.state.usage["theory"] == [600, 0, h.now]
    assert [s.job_id for s in h.cycle().starts] == [b]
    g = h.submit(user="alice", uid=1001, account="theory", time_limit=1200, gpus_per_node=2, gpu_given=True)
    why = h.cycle().pending[g].why
    assert (why.code, why.note, why.limit) == ("AssocGrpGRESMinutes", "40", 30)
    h.put(plan(h.state, "modify", "account", ["theory"], {}, {"grptresmins": "cpu=1000,gres/gpu=60"}))
    assert [s.job_id for s in h.cycle().starts] == [g]          # lifted by the administrator
    back = load_snapshot(dump_snapshot(h.state))
    assert back.usage == h.state.usage


def test_without_safe_grp_tres_mins_stops_jobs_only_once_the_minutes_are_used():
    h = harness(("associations", "limits"))
    h.put(plan(h.state, "modify", "account", ["theory"], {}, {"grptresmins": "cpu=100"}))
    big = h.submit(user="alice", uid=1001, account="theory", cpus_per_task=4, time_limit=1920)   # 128 CPU-minutes
    assert [s.job_id for s in h.cycle().starts] == [big]        # Slurm starts it: nothing is used yet
    h.advance(1500)                                             # 100 CPU-minutes used so far
    late = h.submit(user="alice", uid=1001, account="theory", time_limit=60)
    why = h.cycle().pending[late].why
    assert (why.code, why.asked, why.limit) == ("AssocGrpCPUMinutesLimit", 100, 100)
    assert why.numbers().startswith("account theory has used 100 CPU-minutes; GrpTRESMins allows 100")


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4), st.integers(1, 60), st.integers(0, 59)), min_size=1, max_size=20),
       st.integers(30, 400))
def test_an_accounts_used_and_reserved_minutes_never_pass_its_grp_tres_mins(jobs, cap):
    h = harness(("associations", "limits", "safe"))
    h.put(plan(h.state, "modify", "account", ["theory"], {}, {"grptresmins": f"cpu={cap}"}))
    for cpus, minutes, ran in jobs:
        h.submit(user="alice", uid=1001, account="theory", cpus_per_task=cpus, time_limit=minutes * 60)
        h.cycle()
        running = [h.state.jobs[j] for j in h.state.running]
        reserved = sum(a.cpus * (j.time_limit or 0) for j in running for a in j.alloc)
        used = value_at(h.state.usage.get("theory"), h.now, h.state.config.priority.decay_half_life)[0]
        assert (used + reserved) // 60 <= cap
        later = h.now + ran * 60
        for j in sorted(running, key=lambda j: j.start_time + (j.time_limit or 0)):
            end = j.start_time + (j.time_limit or 0)
            if end <= later:          # its agent stops it at its limit
                h.now = max(h.now, end)
                h.finish(j.job_id, state="TIMEOUT")
        h.now = later
        if running and ran % 2 and running[0].state == "RUNNING":
            h.finish(running[0].job_id)       # one that ends early, having used less than it reserved


def test_a_job_that_names_no_qos_runs_under_its_associations_default_qos():
    h = harness()
    h.put(plan(h.state, "modify", "user", ["alice"], {"account": "theory"}, {"defaultqos": "gpu"}))
    spec = ev.JobSpec(user="alice", uid=1001)
    assert submit(h.state, spec, 9, ALICE).spec.qos == "gpu"                       # sbatch without -q
    named = spec.model_copy(update={"qos": "normal", "qos_given": True})         # sbatch -q normal
    assert submit(h.state, named, 9, ALICE).spec.qos == "normal"


class _Forgetful(dict):
    """A verdict cache that keeps nothing: every check is made afresh."""

    def __setitem__(self, key, value) -> None:
        pass


def test_limit_verdicts_kept_between_starts_decide_as_checking_every_job(monkeypatch):
    from rota.bench.core_bench import _accounting, loaded_state
    from rota.core import usage_limits
    from rota.core.schedule import schedule

    state = loaded_state(2000, nodes=40)
    with _accounting(state):
        # tight enough that on 40 nodes most users are at a limit
        state.qos = {"normal": ev.QosRecord(name="normal", max_jobs_per_user=2, max_tres_per_user={"gres/gpu": 4})}
        now = state.now + 600
        kept = schedule(state, now, "conservative")
        held = [p for p in kept.pending.values() if p.reason.startswith(("QOS", "Assoc"))]
        assert len(kept.starts) > 10 and len(held) > 100       # both starts and limits in play
        init = usage_limits.LimitUse.__init__

        def forgetful(self, *a, **kw):
            init(self, *a, **kw)
            self.verdicts = _Forgetful()
        monkeypatch.setattr(usage_limits.LimitUse, "__init__", forgetful)
        fresh = schedule(state, now, "conservative")
    assert (fresh.starts, fresh.reservations, fresh.pending) == (kept.starts, kept.reservations, kept.pending)
