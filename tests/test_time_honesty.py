"""Honest ``--time``: the accuracy priority factor, ``--time=auto`` and sbatch's hint, all from the log."""
import pytest

from rota.core import commands, events as ev
from rota.core.schedule import factors_of
from rota.core.state import dump_snapshot, load_snapshot
from rota.core.timetravel import replay_to
from harness import Harness, make_cluster

pytestmark = pytest.mark.fast


def _run(h: Harness, user: str, name: str, limit: int, used: int, state: ev.JobEndState = "COMPLETED") -> int:
    jid = h.submit(user=user, name=name, time_limit=limit, gpus_per_node=0, cpus_per_task=1)
    h.cycle()
    assert h.state.jobs[jid].state == "RUNNING"
    h.advance(used)
    h.finish(jid, state=state)
    return jid


def _weighted(accuracy: int) -> ev.ClusterConfig:
    cfg = make_cluster(nodes=1, gpus=0, cpus=8)
    return cfg.model_copy(update={"priority": cfg.priority.model_copy(update={"accuracy": accuracy, "age": 0})})


def test_accurate_limits_raise_priority_only_when_the_weight_is_set():
    h = Harness(_weighted(10_000))
    for _ in range(4):
        _run(h, "ann", "train", 3600, 3400)     # 94 % of the hour
        _run(h, "bob", "train", 3600, 360)      # 10 %
    _run(h, "cat", "train", 600, 700, state="TIMEOUT")   # killed at its limit: not padded
    blocker = h.submit(user="dan", name="hold", time_limit=600, gpus_per_node=0, cpus_per_task=8)
    h.cycle()
    assert h.state.jobs[blocker].state == "RUNNING"
    ids = {u: h.submit(user=u, name="next", time_limit=600, gpus_per_node=0, cpus_per_task=8)
           for u in ("bob", "ann", "cat", "eve")}
    f = {u: factors_of(h.state, h.now, [jid])[jid][1] for u, jid in ids.items()}
    assert f["eve"].accuracy == 10_000            # no history yet: the benefit of the doubt
    assert f["cat"].accuracy == 10_000            # a timed-out run used all it asked for
    assert (f["ann"].accuracy, f["bob"].accuracy) == (9444, 1000)
    assert f["ann"].priority - f["bob"].priority == pytest.approx(f["ann"].accuracy - f["bob"].accuracy, abs=1)
    for expected in ("cat", "eve", "ann", "bob"):     # the node frees one job at a time: the most accurate first
        h.advance(600)
        h.finish(next(iter(h.state.running)))
        h.cycle()
        assert h.state.jobs[ids[expected]].state == "RUNNING", expected
    # off (the default): no accuracy in any priority, as Slurm's
    plain = Harness(make_cluster(nodes=1, gpus=0))
    _run(plain, "bob", "train", 3600, 360)
    jid = plain.submit(user="bob", name="x", time_limit=600, gpus_per_node=0, cpus_per_task=1)
    assert factors_of(plain.state, plain.now, [jid])[jid][1].accuracy == 0


def test_the_history_is_folded_by_the_reducer_replayed_and_snapshotted():
    h = Harness(_weighted(1000))
    for used in (100, 200, 300):
        _run(h, "ann", "prep", 3600, used)
    _run(h, "ann", "prep", 3600, 50, state="FAILED")        # a failed run says nothing about its limit
    assert h.state.time_runs["ann"]["prep"] == [100, 200, 300]
    [(key, (share, runs))] = h.state.time_accuracy.items()
    assert key[0] == "ann" and runs == 3 and 0 < share < 100_000
    replayed = replay_to(h.log, h.log[-1].seq)
    assert (replayed.time_runs, replayed.time_accuracy) == (h.state.time_runs, h.state.time_accuracy)
    back = load_snapshot(dump_snapshot(h.state))
    assert (back.time_runs, back.time_accuracy) == (h.state.time_runs, h.state.time_accuracy)


def test_each_user_keeps_the_history_of_the_names_run_last_only():
    """A name made unique per job must not grow the history with every job: each user keeps the NAMES_KEPT
    names it ran last (a name run again counts as new), in the live state, a replay and a snapshot."""
    from rota.core.timeaccuracy import NAMES_KEPT

    h = Harness(_weighted(1000))
    _run(h, "bob", "keep", 3600, 100)
    for i in range(NAMES_KEPT):
        _run(h, "ann", f"run-{i}", 3600, 100)
        if i == NAMES_KEPT // 2:
            _run(h, "ann", "run-0", 3600, 200)        # run again: the last run now
    _run(h, "ann", "last", 3600, 100)
    names = h.state.time_runs["ann"]
    assert len(names) == NAMES_KEPT and "last" in names and names["run-0"] == [100, 200]
    assert "run-1" not in names and "run-2" in names     # the one run longest ago went, the one run again stayed
    assert h.state.time_runs["bob"] == {"keep": [100]}  # another user's history is not touched
    assert replay_to(h.log, h.log[-1].seq).time_runs == h.state.time_runs
    assert list(load_snapshot(dump_snapshot(h.state)).time_runs["ann"]) == list(names)


def test_time_auto_takes_the_users_own_history_of_the_job_and_hints_when_far_over():
    cfg = make_cluster(nodes=1, gpus=0)
    cfg = cfg.model_copy(update={"partitions": (cfg.partitions[0].model_copy(update={"max_time": 7200}),)})
    h = Harness(cfg)
    for used in (400, 500, 600, 550):
        _run(h, "ann", "prep", 7200, used)
    _run(h, "bob", "prep", 7200, 5000)
    auto = h.submit(user="ann", name="prep", time_limit=None, time_auto=True, gpus_per_node=0, cpus_per_task=1)
    assert h.state.jobs[auto].spec.time_limit == 900       # 600 s x 1.2 in whole 5 minutes: ann's, not bob's
    assert h.state.jobs[auto].spec.time_auto
    fresh = h.submit(user="cat", name="prep", time_limit=None, time_auto=True, gpus_per_node=0, cpus_per_task=1)
    assert h.state.jobs[fresh].spec.time_limit is None        # no history: the partition's default
    tall = h.submit(user="bob", name="prep", time_limit=None, time_auto=True, gpus_per_node=0, cpus_per_task=1)
    assert h.state.jobs[tall].spec.time_limit == 6000
    hint = commands.time_hint(h.state, ev.JobSpec(user="ann", name="prep", time_limit=7200))
    assert "last 4 runs of 'prep' suggest --time=00:15:00 (asked 02:00:00)" in hint
    assert commands.time_hint(h.state, ev.JobSpec(user="ann", name="prep", time_limit=1200)) == ""
    assert commands.time_hint(h.state, ev.JobSpec(user="bob", name="prep", time_limit=7200)) == ""   # one run only


def test_the_weight_is_a_configuration_key_and_sprio_shows_its_column_only_when_set():
    from rota.cli.sprio import default_format, render
    from rota.core.slurmconf import parse_config

    base = "NodeName=n1 CPUs=4 RealMemory=1000\nPartitionName=p Nodes=n1 Default=YES\n"
    assert parse_config(base + "RotaPriorityWeightAccuracy=5000\n").priority.accuracy == 5000
    assert parse_config(base).priority.accuracy == 0
    weights = ev.PriorityWeights(accuracy=5000).model_dump()
    reply = {"weights": weights, "rows": [{"job_id": 7, "partition": "p", "user": "ann",
                                           "factors": [6000, 0, 0, 0, 1000, 0, 0, 5000]}]}
    assert render(reply, {}) == ["          JOBID PARTITION   PRIORITY       SITE        AGE  PARTITION   ACCURACY",
                                 "              7 p               6000          0          0       1000       5000"]
    assert "%.10E" not in default_format({}, ev.PriorityWeights().model_dump())
