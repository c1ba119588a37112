"""Who may do what, decided in the core with Slurm's rules; hostile job fields refused at submit."""
import copy

import pytest
from hypothesis import given, settings, strategies as st

from rota.core import commands, events as ev
from rota.core.auth import ADMIN, OPERATOR, USER, Caller, caller, level_of
from rota.core.commands import Rejected
from rota.core.limits import MAX_SCRIPT, MAX_TIME
from harness import Harness, make_cluster

pytestmark = pytest.mark.fast    # make test-fast: the core and the front door, no process started

ALICE = Caller(1001, 1001, "alice")
BOB = Caller(1002, 1002, "bob")
OP = Caller(1003, 1003, "olga", OPERATOR)


def cluster():
    h = Harness(make_cluster(nodes=2, gpus=4))
    jobs = {}
    for who in (ALICE, BOB):
        jobs[(who.user, "pending")] = h.submit(user=who.user, uid=who.uid, gid=who.gid, hold=True)
        jobs[(who.user, "running")] = h.submit(user=who.user, uid=who.uid, gid=who.gid, gpus_per_node=1)
    h.cycle()
    return h, jobs


def denied(fn, *args, **kw):
    with pytest.raises(Rejected) as e:
        fn(*args, **kw)
    assert e.value.code == "permission", e.value.lines
    return e.value.lines[-1]


def test_levels_come_from_the_configuration():
    auth = ev.AuthConfig(slurm_user="slurm", admins=("ada",), operators=("olga",))
    assert [level_of(auth, u, n) for u, n in ((0, "root"), (5, "slurm"), (6, "ada"), (7, "olga"), (8, "bob"))] == \
        [ADMIN, ADMIN, ADMIN, OPERATOR, USER]
    assert caller(None, 1001, 1001, "alice").level == USER and caller(None, 0, 0, "root").level == ADMIN


def test_users_act_on_their_own_jobs_only():
    h, jobs = cluster()
    s = h.state
    mine, theirs = jobs[("alice", "running")], jobs[("bob", "running")]
    assert commands.cancel(s, mine, ALICE).by_uid == 1001
    assert denied(commands.cancel, s, theirs, ALICE) == "Access/permission denied"
    denied(commands.signal, s, theirs, 10, ALICE)
    denied(commands.requeue, s, theirs, False, ALICE)
    denied(commands.hold, s, jobs[("bob", "pending")], ALICE)
    denied(commands.release, s, jobs[("bob", "pending")], ALICE)
    denied(commands.update_job, s, theirs, time_limit=60, caller=ALICE)
    (node, order), = commands.signal(s, mine, 10, ALICE)
    assert order.job_id == mine and order.signal == 10 and node == s.jobs[mine].alloc[0].node
    assert order.batch and not order.steps
    to_steps = commands.signal(s, mine, 10, ALICE, batch=False, steps=True)     # scancel --signal: every node
    assert [n for n, _o in to_steps] == [a.node for a in s.jobs[mine].alloc]
    assert all(o.steps and not o.batch for _n, o in to_steps)
    assert commands.cancel(s, theirs, OP).by_uid == OP.uid     # operators act on anyone's


def test_time_limits_nice_and_priority():
    h, jobs = cluster()
    s = h.state
    mine = jobs[("alice", "running")]
    assert commands.update_job(s, mine, time_limit=60, caller=ALICE).time_limit == 60      # lowering: fine
    denied(commands.update_job, s, mine, time_limit=6000, caller=ALICE)                   # raising: admins only
    denied(commands.update_job, s, mine, time_limit=0, caller=ALICE)                      # unlimited: admins only
    denied(commands.update_job, s, mine, priority=10, caller=ALICE)
    denied(commands.update_job, s, mine, nice=-5, caller=ALICE)
    assert commands.update_job(s, mine, nice=5, caller=ALICE).nice == 5
    assert commands.update_job(s, mine, time_limit=0, priority=9, nice=-5, caller=OP).priority == 9
    with pytest.raises(Rejected, match="Invalid TimeLimit value"):
        commands.update_job(s, mine, time_limit=MAX_TIME + 1, caller=OP)


def test_holds_users_and_administrators():
    h, jobs = cluster()
    pend = jobs[("alice", "pending")]
    h.put(commands.release(h.state, pend, ALICE))
    assert h.state.jobs[pend].hold is None
    h.put(commands.hold(h.state, pend, OP))                   # an operator's hold is an administrator's hold
    assert h.state.jobs[pend].hold == "admin"
    denied(commands.release, h.state, pend, ALICE)             # JobHeldAdmin: the owner cannot lift it
    h.put(commands.release(h.state, pend, OP))
    h.put(commands.hold(h.state, pend, OP, user_hold=True))    # uhold is the user's hold, whoever asks
    assert h.state.jobs[pend].hold == "user"
    h.put(commands.release(h.state, pend, ALICE))
    h.put(commands.hold(h.state, pend, ALICE))
    assert h.state.jobs[pend].hold == "user"


def test_nodes_are_for_operators():
    h, _ = cluster()
    for fn, args in ((commands.drain, ("gpu01", "fan")), (commands.down, ("gpu01", "dead"))):
        assert denied(fn, h.state, *args, ALICE) == "Invalid user id"   # what slurmctld says
    assert commands.drain(h.state, "gpu01", "fan", OP).by == "olga"
    h.put(commands.drain(h.state, "gpu01", "fan", OP))
    denied(commands.resume, h.state, "gpu01", ALICE)


def test_a_denial_is_an_event_that_changes_nothing():
    h, _ = cluster()
    before = copy.deepcopy(h.state)
    h.put(commands.denied(ALICE, "cancel", "job 3", "Access/permission denied"))
    after = h.state
    assert after.jobs == before.jobs and after.nodes == before.nodes
    assert h.log[-1].event.type == "request.denied"


def test_submit_as_someone_else_or_with_negative_nice():
    h, _ = cluster()
    spec = ev.JobSpec(user="bob", uid=1002, gid=1002, time_limit=60)
    denied(commands.submit, h.state, spec, 99, ALICE)
    denied(commands.submit, h.state, spec.model_copy(update={"user": "alice", "uid": 1001, "nice": -1}), 99, ALICE)
    assert commands.submit(h.state, spec.model_copy(update={"nice": -1}), 99, Caller(0, 0, "root", ADMIN))


@pytest.mark.parametrize("field,value,words", [
    ("mem_per_node", -87_948, "Invalid --mem value -87948"),
    ("cpus_per_task", 0, "Invalid --cpus-per-task value 0"),
    ("cpus_per_task", -3, "Invalid --cpus-per-task value -3"),
    ("nodes", -1, "Invalid --nodes value -1"),
    ("gpus_per_node", -2, "Invalid --gres value -2"),
    ("time_limit", -60, "Invalid --time value -60"),
    ("time_limit", 9_999_999_999_999_999_999, "Invalid --time value"),
    ("nice", -1_000_000_000_000, "Invalid --nice value"),
    ("name", "x\x1b[2J\x00", "Invalid --job-name value"),
    ("name", "\ud800", "Invalid --job-name value"),
    ("output", "/tmp/a\nb", "Invalid --output path"),
    ("script", "#!/bin/sh\n" + "x" * MAX_SCRIPT, "Batch script is too large"),
    ("env", {"A=B": "1"}, "Invalid environment"),
])
def test_hostile_fields_are_refused_with_a_clear_line(field, value, words):
    h, _ = cluster()
    spec = ev.JobSpec(user="root", time_limit=60).model_copy(update={field: value})
    with pytest.raises(Rejected) as e:
        commands.submit(h.state, spec, 99)
    assert e.value.code == "invalid" and any(words in line for line in e.value.lines), e.value.lines


VERBS = st.sampled_from(["cancel", "signal", "hold", "uhold", "release", "requeue", "requeuehold", "limit", "nice",
                         "priority", "drain", "down", "resume"])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(VERBS, st.integers(1, 6), st.integers(0, 100_000), st.sampled_from(["gpu01", "gpu02"])),
                max_size=25))
def test_no_sequence_of_requests_by_one_user_changes_another_users_job(requests):
    """Whatever alice asks, in whatever order, bob's jobs stay exactly as they were (the property)."""
    h, _ = cluster()
    bobs = {jid for jid, job in h.state.jobs.items() if job.spec.uid == BOB.uid}
    before = {jid: copy.deepcopy(h.state.jobs[jid]) for jid in bobs}
    act = {
        "cancel": lambda s, j, n, node: commands.cancel(s, j, ALICE),
        "signal": lambda s, j, n, node: commands.signal(s, j, 15, ALICE) and None,
        "hold": lambda s, j, n, node: commands.hold(s, j, ALICE),
        "uhold": lambda s, j, n, node: commands.hold(s, j, ALICE, user_hold=True),
        "release": lambda s, j, n, node: commands.release(s, j, ALICE),
        "requeue": lambda s, j, n, node: commands.requeue(s, j, False, ALICE),
        "requeuehold": lambda s, j, n, node: commands.requeue(s, j, True, ALICE),
        "limit": lambda s, j, n, node: commands.update_job(s, j, time_limit=n, caller=ALICE),
        "nice": lambda s, j, n, node: commands.update_job(s, j, nice=n - 50_000, caller=ALICE),
        "priority": lambda s, j, n, node: commands.update_job(s, j, priority=n, caller=ALICE),
        "drain": lambda s, j, n, node: commands.drain(s, node, "x", ALICE),
        "down": lambda s, j, n, node: commands.down(s, node, "x", ALICE),
        "resume": lambda s, j, n, node: commands.resume(s, node, ALICE),
    }
    for verb, jid, n, node in requests:
        try:
            event = act[verb](h.state, jid, n, node)
        except Rejected as r:
            if jid in bobs and verb not in ("drain", "down", "resume"):
                assert r.code in ("permission", "no_job"), (verb, r.lines)
            continue
        if event is not None:
            h.put(event)
        h.cycle()
    for jid in bobs:
        assert h.state.jobs[jid] == before[jid], jid
