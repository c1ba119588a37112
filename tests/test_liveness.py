"""Liveness: `verify` finds a job the scheduler would have started but that was left waiting."""
from rota.core import events as ev
from rota.core.liveness import late_starts, startable
from rota.core.schedule import Decision
from rota.core.sim import Simulator, TraceJob
from rota.core.state import State
from harness import Harness, make_cluster
from rota.core.timetravel import verify

from test_timetravel import random_history
import pytest

pytestmark = pytest.mark.fast    # make test-fast: the core and the front door, no process started


class SkipsAStart(Simulator):
    """A controller with a bug: while job ``victim`` is pending it runs no cycle until ``until``."""

    def __init__(self, *args, victim: int, until: int, **kw) -> None:
        super().__init__(*args, **kw)
        self.victim, self.until = victim, until

    def decide(self, state: State, now: int, policy: str | None = None) -> Decision:
        if self.victim in state.pending and now < self.until:
            return Decision(now=now, policy=self.policy, cycle=state.cycle + 1)
        return super().decide(state, now, policy)


def two_jobs(controller: type[Simulator] = Simulator, **kw) -> list[ev.Envelope]:
    cfg = make_cluster(nodes=1, gpus=4)
    a = ev.JobSpec(user="ann", name="A", gpus_per_node=4, time_limit=100)
    b = ev.JobSpec(user="bob", name="B", gpus_per_node=4, time_limit=100)
    c = ev.JobSpec(user="cat", name="C", gpus_per_node=0, cpus_per_task=1, time_limit=1000)
    jobs = [TraceJob(0, a, 50, trace_id=1), TraceJob(1, b, 50, trace_id=2), TraceJob(300, c, 10, trace_id=3)]
    return controller(cfg, record_log=True, **kw).run(jobs).log


def test_a_correct_history_has_no_late_start():
    assert late_starts(two_jobs()) == []
    log = random_history(300)
    assert late_starts(log) == []
    assert all(d is None for _s, d in verify(log))


def test_a_controller_that_skips_a_start_is_caught_with_when_and_how_long():
    log = two_jobs(SkipsAStart, victim=2, until=200)
    # every recorded cycle is still the scheduler's own: only liveness can see the skipped start
    assert all(d is None for _s, d in verify(log))
    (late,) = late_starts(log)
    assert (late.job_id, late.could_start, late.outcome) == (2, 50, "started")
    assert late.waited_until == 300        # the next event after the bug's window woke a cycle
    assert "job 2 could have started at t=50" in late.text() and "(250 s)" in late.text()
    # within the promised latency it is no finding
    assert late_starts(log, latency=250) == []


def test_a_job_that_stops_being_startable_is_reported_when_it_did():
    h = Harness(make_cluster(nodes=1, gpus=4))
    job = h.submit(name="mine", gpus_per_node=1, time_limit=600, user="bob")   # no cycle runs
    h.advance(120)
    h.put(ev.JobHeld(job_id=job, admin=True), actor="root")
    (late,) = late_starts(h.log)
    assert (late.job_id, late.outcome, late.waited_until - late.could_start) == (job, "gone", 120)


def test_a_begin_time_reached_is_a_moment_to_start():
    h = Harness(make_cluster(nodes=1, gpus=4))
    job = h.submit(name="later", gpus_per_node=1, time_limit=600, user="bob", begin=h.now + 60)
    h.cycle()                                            # BeginTime: nothing starts
    h.advance(500)
    h.put(ev.NodeDrained(node="gpu01", reason="maintenance", by="root"))
    (late,) = late_starts(h.log, latency=30)
    assert late.job_id == job and late.waited_until - late.could_start == 440


def test_shared_out_evaluations_give_the_same_findings():
    log = two_jobs(SkipsAStart, victim=2, until=200)
    parts = [startable(log, pick=lambda k, w=w: k % 2 == w) for w in range(2)]
    known = {**parts[0], **parts[1]}
    assert known == startable(log) and late_starts(log, known=known) == late_starts(log)
    from rota.core.liveness import checked_and_startable
    from rota.core.timetravel import verify
    both = [checked_and_startable(log, pick=lambda k, w=w: k % 2 == w) for w in range(2)]   # one walk does both
    assert {**both[0][1], **both[1][1]} == known
    assert sorted(both[0][0] + both[1][0]) == list(verify(log))


def test_rota_verify_reports_the_skipped_start_and_fails(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "log.jsonl"
    path.write_bytes(b"".join(ev.encode_envelope(e) + b"\n" for e in two_jobs(SkipsAStart, victim=2, until=200)))

    def verify_cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "rota.cli.main", "verify", "--log", str(path), *args],
                              capture_output=True, text=True, check=False)

    r = verify_cli()
    assert r.returncode == 1, r.stdout + r.stderr
    assert "LATE: job 2 could have started at t=50" in r.stdout and "longer than 10 s" in r.stdout
    r = verify_cli("--latency", "300")
    assert r.returncode == 0 and r.stdout.startswith("OK: all") and "no job waited more than 300 s" in r.stdout
    r = verify_cli("--no-liveness")
    assert r.returncode == 0 and "liveness" not in r.stdout
