"""The reason history the projection keeps equals what `why` derives from the log, job for job."""
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rota.core import events as ev
from rota.core.reason_history import spans_of
from rota.core.state import PENDING, RUNNING
from harness import Harness, make_cluster
from rota.core.timetravel import why
import pytest

pytestmark = pytest.mark.fast    # make test-fast: the core and the front door, no process started

OPS = st.lists(st.tuples(st.sampled_from(["submit", "submit", "submit", "cycle", "cycle", "advance", "finish",
                                          "cancel", "hold", "release", "drain", "resume", "big"]),
                         st.integers(0, 1_000_000)), min_size=5, max_size=40)


def history(ops: list[tuple[str, int]]) -> Harness:
    """A random history: submits of various sizes (some held, some to begin later), cycles that are
    or are not recorded, ends, cancels, holds, drains and resumes, on two 4-GPU nodes."""
    h = Harness(make_cluster(nodes=2, gpus=4, policy="easy"))
    for op, r in ops:
        st_ = h.state
        pending = sorted(j for j in st_.pending)
        running = sorted(st_.running)
        if op in ("submit", "big"):
            gpus = 4 if op == "big" else 1 + r % 4
            h.submit(user=f"u{r % 3}", gpus_per_node=gpus, nodes=2 if op == "big" and r % 2 else 1,
                     time_limit=60 * (1 + r % 10), hold=r % 7 == 0, begin=h.now + 30 if r % 11 == 0 else None)
        elif op == "cycle":
            h.cycle()
        elif op == "advance":
            h.advance(1 + r % 120)
        elif op == "finish" and running:
            h.finish(running[r % len(running)])
        elif op == "cancel" and pending:
            h.put(ev.JobCancelled(job_id=pending[r % len(pending)]), actor="root")
        elif op in ("hold", "release") and pending:
            jid = pending[r % len(pending)]
            held = st_.jobs[jid].hold is not None
            if op == "hold" and not held:
                h.put(ev.JobHeld(job_id=jid, admin=False), actor="root")
            elif op == "release" and held:
                h.put(ev.JobReleased(job_id=jid), actor="root")
        elif op == "drain":
            node = f"gpu0{1 + r % 2}"
            if not st_.nodes[node].drain:
                h.put(ev.NodeDrained(node=node, reason="test", by="root"), actor="root")
        elif op == "resume":
            node = f"gpu0{1 + r % 2}"
            if st_.nodes[node].drain:
                h.put(ev.NodeResumed(node=node, by="root"), actor="root")
    return h


def why_by_code(log: list[ev.Envelope], job_id: int) -> list[tuple[str, int, int]]:
    merged: list[list] = []
    for iv in why(log, job_id).intervals:
        if merged and merged[-1][0] == iv.reason:
            merged[-1][2] = iv.end
        else:
            merged.append([iv.reason, iv.start, iv.end])
    return [tuple(m) for m in merged]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS)
def test_history_equals_why_for_every_job(ops):
    h = history(ops)
    for jid in sorted(h.state.jobs):
        spans = [(s.code, s.start, s.end) for s in spans_of(h.log, jid)]
        assert spans == why_by_code(h.log, jid), (jid, h.state.jobs[jid].state)


def test_a_job_that_waited_on_resources_then_priority_then_ran():
    h = Harness(make_cluster(nodes=1, gpus=4, policy="easy"))
    a = h.submit(user="ann", gpus_per_node=4, time_limit=100)
    h.cycle()
    b = h.submit(user="bob", gpus_per_node=4, time_limit=100)       # waits for A: no cycle recorded
    h.advance(100)
    h.finish(a)
    h.cycle()
    spans = list(spans_of(h.log, b))
    assert [(s.code, s.start, s.end) for s in spans] == [("Resources", h.now - 100, h.now)]
    assert h.state.jobs[b].state == RUNNING and h.state.jobs[a].state != PENDING


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS)
@example([("submit", 1), ("submit", 2), ("cycle", 0), ("big", 1), ("submit", 1), ("advance", 0), ("finish", 0),
          ("cycle", 0), ("finish", 0)])
def test_every_interval_says_what_the_scheduler_decides_at_its_moment(ops):
    """Each interval of `why` is the scheduler's own verdict at the moment it begins (reason, blockers,
    what it waits for, expected start), re-derived here from the state replayed to that moment; and
    the expected starts listed as they moved are those of the intervals."""
    from rota.core.schedule import plan, schedule
    from rota.core.timetravel import replay_to

    h = history(ops)
    for jid in sorted(h.state.jobs):
        rep = why(h.log, jid)
        for iv in rep.intervals:
            if iv.at_cycle:      # a recorded cycle: the state just before it, under its policy
                env = next(e for e in h.log if e.seq == iv.first_seq)
                st, policy = replay_to(h.log, at_seq=iv.first_seq - 1), env.event.policy
            else:
                st, policy = replay_to(h.log, at_seq=iv.first_seq), None
            p = schedule(st, iv.start, policy, explain=True).pending_of(jid)
            expected = p.start
            if expected is None and p.reason in ("Resources", "Priority"):
                expected = plan(st, iv.start).get(jid)         # no reservation: the plan's estimate
                expected = expected if expected is not None and expected > iv.start else None
            assert iv.estimated == (p.start is None and expected is not None)
            assert (p.reason, p.blockers, p.ahead) == (iv.reason, iv.blockers, iv.ahead)
            assert set(p.decisive) <= set(p.blockers) | set(p.ahead)
            assert expected is None or expected > iv.start
            # in force at its start: the estimate listed then, or (several intervals in one second) the
            # last one listed before that second or at it
            before = [s for t, s, _e in rep.estimates if t < iv.start]
            upto = [s for t, s, _e in rep.estimates if t <= iv.start]
            assert (iv.start, expected, iv.estimated) in rep.estimates or (before and before[-1] == expected) \
                or (upto and upto[-1] == expected)
        starts = [(s, e) for _t, s, e in rep.estimates]
        assert all(a != b for a, b in zip(starts, starts[1:]))       # listed as it moved, not repeated


def test_the_history_gives_way_in_its_scheduler_runs_and_records_the_same():
    from rota.core.reason_history import ReasonHistory
    from rota.core.state import State

    h = Harness(make_cluster(nodes=1, gpus=0))
    for _ in range(1100):
        h.submit(cpus_per_task=64)
    h.advance(30)
    h.submit(cpus_per_task=64)           # a moment after submits: the scheduler runs over every pending job
    h.cycle()
    runs = []
    spans = []
    for give_way in (lambda: runs.append(1), None):
        hist = ReasonHistory(give_way)
        hist.fold(State(), h.log)
        spans.append(sorted((s.job_id, s.code, s.start, s.end) for s in hist.take()))
    assert runs and spans[0] == spans[1] and len(spans[0]) >= 1100


def test_the_nodes_kept_for_a_pending_job_are_planned_until_it_starts():
    import sqlite3

    from rota.cli.sinfo import state_long, state_short
    from rota.core.reason_history import ReasonHistory
    from rota.core.state import State

    h = Harness(make_cluster(nodes=2, gpus=4))
    a = h.submit(user="ann", gpus_per_node=4, time_limit=100)          # gpu01's GPUs, one of its CPUs
    h.cycle()
    h.submit(user="bob", gpus_per_node=4, nodes=2, time_limit=100)     # both nodes, once `a` ends
    history, st_ = ReasonHistory(), State()
    history.fold(st_, h.log)
    history.settle(st_, None)
    assert history.planned == ("gpu02",)         # gpu01 is kept too, but `a` runs there: not planned (as Slurm)
    h.advance(100)
    h.finish(a)
    h.cycle()
    again, st_ = ReasonHistory(), State()
    again.fold(st_, h.log)
    again.settle(st_, None)
    assert again.planned == ()

    conn = sqlite3.connect(":memory:")
    conn.row_factory = sqlite3.Row

    def row(base: str, planned: int, not_responding: int = 0) -> sqlite3.Row:
        return conn.execute("SELECT ? AS base, 0 AS drain, ? AS not_responding, ? AS planned",
                            (base, not_responding, planned)).fetchone()
    assert [state_short(row("IDLE", 1)), state_short(row("IDLE", 0))] == ["plnd", "idle"]
    assert [state_long(row("IDLE", 1)), state_long(row("MIXED", 1))] == ["planned", "mixed"]
    assert state_long(row("IDLE", 1, not_responding=1)) == "idle*"        # as Slurm: not responding comes first
