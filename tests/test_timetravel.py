"""Time travel: why, replay, verify and what-if on scenarios whose answers are known."""
import pytest
import subprocess
import sys

from rota.core import events as ev
from rota.core.sim import Simulator, TraceJob
from harness import Harness, make_cluster
from rota.core.timetravel import replay_to, verify, why
from rota.core.whatif import whatif


def blocked_then_started() -> tuple[Harness, dict[str, int]]:
    """One 8-GPU node: `running` holds it, `first` (higher priority) waits, then `x`; `small` backfills."""
    h = Harness(make_cluster(nodes=1, gpus=8))
    ids = {"running": h.submit(name="running", gpus_per_node=8, time_limit=600, user="ann")}
    h.cycle()
    ids["first"] = h.submit(name="first", gpus_per_node=8, time_limit=600, user="bob")
    ids["x"] = h.submit(name="x", gpus_per_node=8, time_limit=600, user="cat")
    ids["small"] = h.submit(name="small", gpus_per_node=0, cpus_per_task=1, time_limit=60, user="dan")
    h.cycle()
    h.advance(600)
    h.finish(ids["running"])
    h.cycle()
    h.advance(600)
    h.finish(ids["first"])
    h.cycle()
    return h, ids


def test_why_priority_then_resources_then_started():
    h, ids = blocked_then_started()
    rep = why(h.log, ids["x"])
    assert [iv.reason for iv in rep.intervals] == ["Priority", "Resources"]
    first, second = rep.intervals
    assert first.ahead == (ids["first"],) and ids["running"] in first.blockers and first.rank == 2
    assert ids["first"] in second.blockers and second.ahead == ()
    assert (first.end - first.start, second.end - second.start) == (600, 600)
    assert rep.start_time == rep.submit_time + 1200 and rep.nodes == ("gpu01",)
    assert rep.blocker_ends[ids["running"]] == rep.submit_time + 600
    assert rep.estimates == [(rep.submit_time, rep.submit_time + 1200, False)]   # reserved, and it held
    assert rep.log_range == (1, len(h.log)) and rep.config_seq == 1


def test_why_names_the_backfilled_job_that_did_not_delay_it():
    h, ids = blocked_then_started()
    rep = why(h.log, ids["x"])
    (bf,) = rep.backfilled_past
    assert bf["job_id"] == ids["small"] and bf["ends_by"] <= bf["reserved_start"]
    assert rep.start_time == bf["reserved_start"]   # and indeed it started at its reserved time
    # rota backfills at every change, Slurm every bf_interval: why says so where it matters
    assert any("bf_interval (30s)" in d and "rota_cadence=slurm" in d for d in rep.slurm_differences)
    assert why(h.log, ids["small"]).slurm_differences and not why(h.log, ids["running"]).slurm_differences


def test_why_names_no_difference_from_slurm_under_slurms_cadence():
    cfg = make_cluster(nodes=1, gpus=8)
    cfg = cfg.model_copy(update={"scheduler": cfg.scheduler.model_copy(update={"cadence": "slurm"})})
    h = Harness(cfg)
    first = h.submit(name="running", gpus_per_node=8, time_limit=600, user="ann")
    h.cycle()
    h.submit(name="wide", gpus_per_node=8, time_limit=600, user="bob")
    small = h.submit(name="small", gpus_per_node=0, cpus_per_task=1, time_limit=60, user="dan")
    h.cycle()
    assert h.state.jobs[first].state == "RUNNING" and h.state.jobs[small].state == "RUNNING"
    assert not why(h.log, small).slurm_differences


def test_why_held_by_the_user_then_blocked_by_a_drained_node():
    h = Harness(make_cluster(nodes=1, gpus=8))
    h.submit(name="other", gpus_per_node=1, time_limit=600, user="ann")
    job = h.submit(name="mine", gpus_per_node=1, time_limit=600, user="bob", hold=True)
    h.cycle()                                             # starts `other`; `mine` is held
    h.advance(60)
    h.put(ev.NodeDrained(node="gpu01", reason="fan failure", by="root"))
    h.put(ev.JobReleased(job_id=job), actor="bob")
    late = h.submit(name="late", gpus_per_node=1, time_limit=600, user="cat", nodelist=())
    h.advance(60)
    h.put(ev.NodeResumed(node="gpu01", by="root"))
    h.cycle()                                             # both start now
    assert h.state.jobs[job].state == "RUNNING" and h.state.jobs[late].state == "RUNNING"
    rep = why(h.log, job)
    # released while its only node was drained: no cycle was recorded then, and the wait is still explained
    assert [iv.reason for iv in rep.intervals] == ["JobHeldUser", "ReqNodeNotAvail"]
    held, drained = rep.intervals
    assert (held.cycles, drained.cycles, drained.derived) == (1, 0, 1)
    assert (drained.start, drained.end) == (rep.submit_time + 60, rep.submit_time + 120)
    assert [(a["action"], a.get("node")) for a in rep.actions] == [("node.drained", "gpu01"), ("job.released", None),
                                                                  ("node.resumed", "gpu01")]
    assert rep.actions[0]["reason"] == "fan failure" and rep.start_time == rep.submit_time + 120
    # the drained node as the reason, seen from a moment inside the drain: replay + explain there
    st = replay_to(h.log, at_time=rep.submit_time + 60)
    from rota.core.schedule import schedule
    assert schedule(st, st.now).pending[job].reason == "ReqNodeNotAvail"


def test_why_as_of_an_earlier_moment():
    h, ids = blocked_then_started()
    start_of_second = next(e.seq for e in h.log if isinstance(e.event, ev.JobExited))
    rep = why(h.log, ids["x"], at_seq=start_of_second)
    # as of the moment `running` ended (before the cycle that started `first`): `first` would start
    # then, and `x` would wait for what `first` takes
    assert [iv.reason for iv in rep.intervals] == ["Priority", "Resources"] and rep.start_time is None
    assert ids["first"] in rep.intervals[-1].blockers and rep.intervals[-1].derived == 1


def random_history(n: int = 300):
    import random

    rng = random.Random(7)
    cfg = make_cluster(nodes=6, gpus=8)
    jobs, t = [], 0
    for i in range(n):
        t += rng.randint(0, 120)
        g = rng.choice([1, 1, 2, 4, 8])
        limit = rng.choice([600, 1800, 3600])
        spec = ev.JobSpec(user=f"u{rng.randrange(5)}", name=f"j{i}", gpus_per_node=g, time_limit=limit,
                          nodes=rng.choice([1, 1, 1, 2]))
        jobs.append(TraceJob(t, spec, rng.randint(30, limit), trace_id=i + 1))
    return Simulator(cfg, record_log=True).run(jobs).log


def test_verify_passes_on_a_long_history_and_finds_a_tampered_decision():
    log = random_history()
    results = list(verify(log))
    assert len(results) > 100 and all(d is None for _seq, d in results)
    k = next(i for i, e in enumerate(log) if isinstance(e.event, ev.JobsStarted) and i > len(log) // 2)
    e = log[k].event
    s = e.starts[0]
    node = s.alloc[0].node
    other = next(n for n in ("gpu01", "gpu02", "gpu03", "gpu04", "gpu05", "gpu06") if n != node)
    forged = e.model_copy(update={"starts": (s.model_copy(update={"alloc": (s.alloc[0].model_copy(
        update={"node": other}),) + s.alloc[1:]}),) + e.starts[1:]})
    tampered = list(log)
    tampered[k] = log[k].model_copy(update={"event": forged})
    bad = [d for _seq, d in verify(tampered) if d is not None]
    assert bad and bad[0].seq == log[k].seq and bad[0].job_id == s.job_id
    assert other in bad[0].recorded and node in bad[0].recomputed


def test_whatif_with_the_same_settings_reproduces_history_and_another_policy_differs():
    log = random_history(200)
    same = whatif(log, {})
    assert same.replayed == 200 and same.baseline_matches_history == 200
    assert all(j["change"] == 0 for j in same.per_job) and same.baseline == same.changed
    fifo = whatif(log, {"policy": "fifo"})
    assert fifo.changed["avg_wait"] > fifo.baseline["avg_wait"]      # no backfill: longer waits
    assert any(j["change"] > 0 for j in fifo.per_job)


def test_cli_why_verify_replay_whatif_on_a_log_file(tmp_path):
    h, ids = blocked_then_started()
    path = tmp_path / "log.jsonl"
    path.write_bytes(b"".join(ev.encode_envelope(e) + b"\n" for e in h.log))
    rota = [sys.executable, "-m", "rota.cli.main"]

    def run(*args):
        return subprocess.run([*rota, *args, "--log", str(path)], capture_output=True, text=True, check=False)

    r = run("why", str(ids["x"]))
    assert r.returncode == 0, r.stderr
    assert "waiting behind higher-priority jobs [Priority]" in r.stdout and "[Resources]" in r.stdout
    assert f"Job {ids['small']} (dan) started ahead of it by backfill" in r.stdout
    assert "Derived from log sequences 1-" in r.stdout
    r = run("verify")
    assert r.returncode == 0 and r.stdout.startswith("OK: all 4 recorded cycles")
    r = run("replay", "--at", "5")
    assert r.returncode == 0 and "first" in r.stdout and "PD" in r.stdout
    r = run("whatif", "--set", "policy=fifo")
    assert r.returncode == 0 and "avg_wait" in r.stdout
    r = run("why", "999")
    assert r.returncode == 1 and "not in the log" in r.stderr and "Traceback" not in r.stderr
    r = run("whatif", "--set", "nonsense=1")
    assert r.returncode == 1 and "unknown setting" in r.stderr


def test_why_and_verify_shared_out_among_processes_say_exactly_what_one_process_says():
    """`rota why` and `rota verify` evaluate cycles in forked workers and merge: nothing may change,
    a tampered decision included."""
    import os

    from rota.bench.timetravel_bench import make_log
    from rota.cli.timetravel import explain, verify_all

    log, big = make_log(1500)
    one = why(log, big)
    assert sum(iv.cycles for iv in one.intervals) > 50 and one.start_time is not None
    if not hasattr(os, "fork"):
        pytest.skip("no fork on this platform")
    for n in (2, 3):
        assert explain(log, big, None, None, n=n) == one
    import signal

    from rota.cli.timetravel import MomentStreams
    streams = MomentStreams(log, big, None, None, 3)
    dead = streams.children[0][0]
    os.kill(dead, signal.SIGKILL)                 # a worker that dies: its moments are made here instead
    try:
        assert why(log, big, pick=streams.mine, others=streams.take) == one
    finally:
        streams.close()
    with pytest.raises(ChildProcessError):
        os.waitpid(dead, os.WNOHANG)              # reaped
    import threading
    assert not [t for t in threading.enumerate() if t.name == "moments"]   # no reader outlives its streams
    bounds = streams.bounds                       # the story cut into runs, in order, within it
    submit = next(env.seq for env in log if isinstance(env.event, ev.JobSubmitted) and env.event.job_id == big)
    assert len(bounds) == 2 and submit < bounds[0] < bounds[1] <= one.start_seq
    cycles = [i for i, env in enumerate(log) if isinstance(env.event, ev.JobsStarted)]
    victim = cycles[len(cycles) // 2]
    e = log[victim].event
    moved = e.starts[0].model_copy(update={"job_id": e.starts[0].job_id + 100_000})
    tampered = list(log)
    tampered[victim] = log[victim].model_copy(update={"event": e.model_copy(update={"starts": (moved,) + e.starts[1:]})})
    from rota.cli.timetravel import check_all
    from rota.core.liveness import late_starts
    for envs in (log, tampered):
        single = list(verify(envs))
        assert verify_all(envs, n=2) == single and len(single) == len(cycles)
        checked, late = check_all(envs, n=2)      # the cycles and the moments in one walk per worker
        assert checked == single and late == late_starts(envs)
    assert [seq for seq, d in verify_all(tampered, n=3) if d is not None][0] == log[victim].seq


def test_the_demo_log_tells_the_story_the_demo_narrates():
    from rota.cli.demo import T0, run_demo
    from rota.core.liveness import late_starts

    lines: list[str] = []
    h = run_demo(lines.append)
    drains = [(e.ts, type(e.event).__name__) for e in h.log if isinstance(e.event, (ev.NodeDrained, ev.NodeResumed))]
    assert drains == [(T0 + 3600, "NodeDrained"), (T0 + 5 * 3600, "NodeResumed")]
    assert any(line.strip().startswith("t+1:00  gpu04 drained") for line in lines)
    assert any(line.strip().startswith("t+5:00  gpu04 resumed") for line in lines)
    for job in h.state.jobs.values():
        if job.end_time and job.start_time:
            assert job.end_time - job.start_time <= job.time_limit, job.spec.name   # nobody outlives its limit
    assert all(d is None for _s, d in verify(h.log)) and late_starts(h.log) == []
    rep = why(h.log, 8)
    spans = [(iv.reason, iv.start - T0, iv.end - T0) for iv in rep.intervals]
    assert ("ReqNodeNotAvail", 3600, 5 * 3600) in spans
    first = rep.intervals[0]
    assert first.decisive == (1,) and first.expected_start == T0 + 4 * 3600   # job 1 started at T0, limit 4 h
    assert "1 of the 4 usable nodes could hold that now" in first.detail


def eventful_history() -> Harness:
    """A controller-like history (a cycle after every change) with what real clusters log besides submits:
    an array with a throttle, a dependency, cancels of a pending and of a running job, a hold and its
    release, a drain and a resume, a node failure."""
    h = Harness(make_cluster(nodes=2, gpus=4, policy="easy"))

    def then(event, actor="root"):
        h.put(event, actor=actor)
        h.cycle()

    def at(seconds):
        h.advance(seconds)
        for jid in sorted(h.state.running):      # jobs end 100 s after they start, the long one at 900 s
            job = h.state.jobs[jid]
            if job.start_time + (900 if job.spec.name == "long" else 100) <= h.now:
                h.finish(jid, elapsed=h.now - job.start_time)
        h.cycle()

    arr = h.submit(name="arr", gpus_per_node=1, array="0-5%2", time_limit=300)
    first = h.submit(name="first", gpus_per_node=2, time_limit=300)
    h.submit(name="after-first", gpus_per_node=2, time_limit=300, dependency=f"afterok:{first}")
    long = h.submit(name="long", gpus_per_node=4, time_limit=1800)
    doomed = h.submit(name="doomed", gpus_per_node=4, time_limit=300)
    held = h.submit(name="held", gpus_per_node=1, time_limit=300, hold=True)
    h.cycle()
    at(50)
    then(ev.JobCancelled(job_id=doomed, by_uid=0))
    at(60)
    then(ev.NodeDrained(node="gpu02", reason="fan", by="root"))
    at(100)
    then(ev.JobReleased(job_id=held))
    at(100)
    then(ev.NodeResumed(node="gpu02", by="root"))
    then(ev.JobCancelled(job_id=long, by_uid=0))
    for _ in range(10):
        at(100)
    assert not h.state.pending and not h.state.running and arr
    return h


def test_whatif_replays_cancels_drains_holds_arrays_and_dependencies_exactly():
    h = eventful_history()
    res = whatif(h.log, {})
    assert res.inputs["job.cancelled"] == 2 and res.inputs["node.drained"] == 1 and res.inputs["job.released"] == 1
    assert res.replayed == res.baseline_matches_history == 10   # 6 array tasks, first, after-first, long, held
    assert res.baseline == res.changed and all(j["change"] == 0 for j in res.per_job)
    assert {j["job"] for j in res.per_job} >= {"1_0", "1_5", "2", "3", "4", "6"}
    fifo = whatif(h.log, {"policy": "conservative"})
    assert fifo.replayed == 10 and fifo.changed["jobs"] == 10



def test_whatif_keeps_the_logs_order_of_a_cycle_and_an_end_in_the_same_second():
    """A cycle that started a small job just before a big job's blocker ended, in the same second, did
    not see the freed GPUs: the baseline replays that order (the small job starts, the big one waits),
    not the end first."""
    h = Harness(make_cluster(nodes=1, gpus=8, policy="easy"))
    a = h.submit(name="a", gpus_per_node=4, time_limit=600)
    h.cycle()
    b = h.submit(name="b", gpus_per_node=8, time_limit=600)
    h.advance(5)
    c = h.submit(name="c", gpus_per_node=4, time_limit=60)
    h.cycle()                                   # c backfills beside a; b waits for a
    assert h.state.jobs[c].state == "RUNNING"
    h.finish(a, elapsed=5)                      # a ends in that second, after the cycle
    h.advance(1)
    h.cycle()                                   # b waits for c now
    h.advance(10)
    h.finish(c, elapsed=11)
    h.cycle()
    assert h.state.jobs[b].state == "RUNNING"
    res = whatif(h.log, {})
    assert res.replayed == res.baseline_matches_history == 3, res


def test_whatif_with_limits_closer_to_use_lets_a_short_job_backfill_that_waited():
    cfg = make_cluster(nodes=1, gpus=4)
    jobs = [TraceJob(0, ev.JobSpec(user="ann", name="a", gpus_per_node=3, time_limit=3600), 100, 1),
            TraceJob(1, ev.JobSpec(user="bob", name="b", gpus_per_node=4, time_limit=3600), 100, 2),
            TraceJob(2, ev.JobSpec(user="cat", name="c", gpus_per_node=1, time_limit=3600), 50, 3)]
    log = Simulator(cfg, record_log=True).run(jobs).log
    res = whatif(log, {"time_limits": "used*1.2"})
    waits = {j["user"]: (j["wait_before"], j["wait_after"]) for j in res.per_job}
    # as asked, c's hour would run past b's reserved start: it waited for b; with a's and c's limits near their
    # use (2 and 1 minutes), c fits beside a and ends before b's start
    assert waits["cat"][0] > 100 and waits["cat"][1] == 0 and waits["bob"][1] <= waits["bob"][0]
    with pytest.raises(ValueError, match="used\\*F"):
        whatif(log, {"time_limits": "half"})


def test_time_accuracy_per_user_and_the_limit_their_history_suggests():
    from rota.core.timeaccuracy import accuracy, suggest

    rows = [("phys", "ann", 3600, 600)] * 9 + [("phys", "ann", 3600, 3600), ("bio", "bob", 600, 590), ("x", "y", 0, 5)]
    ann, bob = accuracy(rows)
    assert (ann.user, ann.jobs, ann.requested_hours, ann.used_hours) == ("ann", 10, 10.0, 2.5)
    assert (ann.used_share, ann.median_share, ann.under_half) == (0.25, 0.167, 0.9)
    assert ann.suggested == 900        # 90th percentile 600 s x 1.2, in whole 5 minutes
    assert (bob.used_share, bob.under_half, bob.suggested) == (0.983, 0.0, 900)
    assert suggest([]) == 0 and suggest([10]) == 300


def test_why_folding_what_comes_before_the_submit_plainly_tells_the_same_story():
    """`why` folds the events before the job's submit without looking at them one by one (a list only): for every
    seventh job and the big one, as of moments before and after its submit, the report is the one a walk of every
    event gives (an iterator is walked event by event)."""
    from rota.bench.timetravel_bench import make_log

    log, big = make_log(400)
    waited = [e.event.job_id for e in log if isinstance(e.event, ev.JobSubmitted)][::7] + [big]
    submit = {e.event.job_id: e.seq for e in log if isinstance(e.event, ev.JobSubmitted)}
    checked = 0
    for job in waited:
        for at in (None, submit[job] - 5, submit[job], submit[job] + 40):
            fast, walked = why(log, job, at), why(iter(log), job, at)
            assert fast == walked, (job, at)
            checked += bool(fast.intervals)
    assert checked > 20


def test_the_wait_is_cut_into_runs_of_as_many_records_from_the_submit_to_the_start():
    """`rota why` gives each process a run of the job's wait: the cut lies between its submit and its start,
    wherever the submit is among the records, and covers all of them when the submit is not there."""
    from rota.bench.timetravel_bench import make_log
    from rota.cli.timetravel import story_runs

    log, big = make_log(300)
    submit = next(i for i, env in enumerate(log) if isinstance(env.event, ev.JobSubmitted) and env.event.job_id == big)
    start = next(i for i, env in enumerate(log) if isinstance(env.event, ev.JobsStarted)
                 and any(s.job_id == big for s in env.event.starts))
    for envs, first in ((log, submit), (log[submit:], 0)):      # the submit first among them too
        last = start - (submit - first) + 1
        assert story_runs(envs, big, 2) == [envs[first + (last - first) // 2].seq]
        assert story_runs(envs, big, 3) == [envs[first + (last - first) * i // 3].seq for i in (1, 2)]
    after = log[submit + 1:]
    assert story_runs(after, big, 2) == [after[len(after) // 2].seq]
