"""The controller against a real nats-server: submit -> cycle -> start on the log; restart; fencing."""
import asyncio

import pytest

from rota.controller.eventlog import FencedError, JetStreamLog, LogUnavailable, MemoryLog
from rota.controller.service import Controller
from rota.core import events as ev
from rota.core.apply import fold
from harness import make_cluster

CFG = make_cluster(nodes=2, gpus=4)


class Clock:
    def __init__(self, t=1_800_000_000):
        self.t = t

    def __call__(self):
        return self.t


@pytest.fixture
def js(jetstream):
    return jetstream


def spec(**kw):
    """A job as a client describes it: who submits it comes from the caller, never from the body."""
    kw.setdefault("time_limit", 600)
    return ev.JobSpec(**kw).model_dump(mode="json", exclude={"user", "uid", "gid"})


async def test_submit_cycle_start_is_on_the_log_and_restart_gives_the_same_state(js):
    log1 = await js()
    c = Controller(log1, config=CFG, clock=Clock())
    await c.start()
    r = await c.handle("submit", {"rid": "r1", "spec": spec(name="train", gpus_per_node=2)})
    assert r == {"ok": True, "job_id": 1}
    started = await c.cycle()
    assert started is not None and started.starts[0].job_id == 1
    entries = [e async for e in log1.read(1)]
    assert [e.event.type for e in entries] == ["cluster.configured", "controller.started",
                                               "job.submitted", "jobs.started"]
    assert fold(entries) == c.state
    c2 = Controller(await js(), clock=Clock())
    await c2.load()
    assert c2.state == c.state


async def test_a_retried_request_is_applied_once(js):
    c = Controller(await js(), config=CFG, clock=Clock())
    await c.start()
    a = await c.handle("submit", {"rid": "same", "spec": spec()})
    c.frontdoor._results.clear()   # as if the controller had restarted between the two tries
    b = await c.handle("submit", {"rid": "same", "spec": spec()})
    assert a == b == {"ok": True, "job_id": 1}
    assert len(c.state.jobs) == 1


async def test_rejections_carry_slurms_message():
    c = Controller(MemoryLog(), config=CFG, clock=Clock())
    await c.start()
    r = await c.handle("submit", {"spec": spec(gpus_per_node=9)})
    assert r["ok"] is False and r["error"] == ["Requested node configuration is not available"]
    r = await c.handle("drain", {"node": "gpu01", "reason": ""})
    assert r["error"] == ["You must specify a reason when DOWNING or DRAINING a node. Request denied"]
    r = await c.handle("submit", {"spec": {"user": "a", "gpus_per_node": "many"}})
    assert r["code"] == "bad_request"


async def test_waiting_for_a_change_ends_when_the_next_batch_lands_or_at_its_timeout():
    """What a busy step request waits on: the writer's signal that a batch went through the log."""
    c = Controller(MemoryLog(), config=CFG, clock=Clock())
    await c.start()
    t = asyncio.get_running_loop().time()
    assert await c.changed(0.05) is False
    assert asyncio.get_running_loop().time() - t >= 0.05
    waiting = asyncio.create_task(c.changed(5))
    await asyncio.sleep(0)
    assert not waiting.done()
    await c.handle("submit", {"spec": spec()})
    assert await asyncio.wait_for(waiting, 1) is True
    seq = c.state.seq
    both = [asyncio.create_task(c.changed(5)) for _ in range(2)]     # every waiter hears the same batch
    await asyncio.sleep(0)
    await c.handle("hold", {"job_id": 1})
    assert await asyncio.wait_for(asyncio.gather(*both), 1) == [True, True] and c.state.seq == seq + 1


async def test_two_controllers_exactly_one_writes(js):
    a = Controller(await js(), config=CFG, clock=Clock(), name="a")
    await a.start()
    b = Controller(await js(), config=CFG, clock=Clock(), name="b")
    await b.load()
    b.writer.leader = True
    await a.handle("submit", {"spec": spec(name="from-a")})
    with pytest.raises(FencedError):
        await b.append(ev.JobSubmitted(job_id=99, spec=ev.JobSpec(user="b")), "b")
    assert b.leader is False
    r = await b.handle("submit", {"spec": spec(name="from-b")})
    assert r["code"] in ("not_leader",)
    assert [j.spec.name for j in a.state.jobs.values()] == ["from-a"]


async def test_snapshot_plus_tail_equals_full_replay(js):
    c = Controller(await js(), config=CFG, clock=Clock(), snapshot_every=3)
    await c.start()
    for i in range(5):
        await c.handle("submit", {"spec": spec(name=f"j{i}", gpus_per_node=1)})
        await c.cycle()
        if i == 2:
            assert await c.maybe_snapshot(force=True)
    await c.handle("drain", {"node": "gpu02", "reason": "fan"})
    c2 = Controller(await js(), clock=Clock())
    await c2.load()
    assert c2.writer.snapshot_seq > 0 and c2.state == c.state


async def test_three_server_cluster_survives_a_server_kill_during_a_burst(tmp_path):
    import asyncio

    from rota.controller.natscluster import start_cluster, wait_for_jetstream

    servers = start_cluster(tmp_path / "cluster", 3)
    urls = [s.url for s in servers]
    try:
        await wait_for_jetstream(urls)
        lg = await JetStreamLog.connect(urls, replicas=3)
        info = await lg.js.stream_info(lg.stream)
        assert info.config.num_replicas == 3
        c = Controller(lg, config=CFG, clock=Clock())
        await c.start()
        acked = {}
        for i in range(300):
            if i == 100:
                servers[2].kill()          # one server dies mid-burst
            rid = f"r{i}"
            for _attempt in range(50):
                r = await c.handle("submit", {"rid": rid, "spec": spec(name=f"j{i}")})
                if r.get("ok"):
                    acked[rid] = r["job_id"]
                    break
                await asyncio.sleep(0.1)
        assert len(acked) == 300
        entries = [e async for e in lg.read(1)]
        ids = {e.idem: e.event.job_id for e in entries if e.event.type == "job.submitted"}
        assert all(ids[f"0:{rid}"] == jid for rid, jid in acked.items())   # idempotency ids are per caller
        assert fold(entries) == c.state
        await lg.close()
    finally:
        for s in servers:
            s.stop()


async def test_concurrent_submits_are_group_committed_in_order(js):
    import asyncio

    lg = await js()
    c = Controller(lg, config=CFG, clock=Clock())
    await c.start()
    base = c.state.seq
    replies = await asyncio.gather(*(c.handle("submit", {"rid": f"g{i}", "spec": spec(hold=True)})
                                     for i in range(300)))
    ids = [r["job_id"] for r in replies]
    assert all(r["ok"] for r in replies) and sorted(ids) == list(range(1, 301))
    entries = [e async for e in lg.read(1)]
    assert [e.event.job_id for e in entries[base:]] == list(range(1, 301))
    assert fold(entries) == c.state


async def test_a_small_group_goes_as_fenced_publishes_and_a_large_one_as_atomic_batches(js):
    """The server stages an atomic batch in a store of its own: a group smaller than ``ATOMIC_FROM`` is
    appended as fenced publishes one after another, a larger one as atomic batches; both land in order."""
    import asyncio

    from rota.controller.logbatch import ATOMIC_FROM

    lg = await js()
    assert lg.atomic
    batches: list[int] = []
    atomic = lg.append_batch

    async def counted(records, expected_last):
        batches.append(len(records))
        return await atomic(records, expected_last)

    lg.append_batch = counted
    c = Controller(lg, config=CFG, clock=Clock())
    await c.start()
    small = await asyncio.gather(*(c.handle("submit", {"rid": f"s{i}", "spec": spec(hold=True)})
                                   for i in range(ATOMIC_FROM - 1)))
    assert batches == []
    large = await asyncio.gather(*(c.handle("submit", {"rid": f"l{i}", "spec": spec(hold=True)})
                                   for i in range(3 * ATOMIC_FROM)))
    assert batches and all(n >= ATOMIC_FROM for n in batches) and sum(batches) <= 3 * ATOMIC_FROM
    assert [r["job_id"] for r in small + large] == list(range(1, 4 * ATOMIC_FROM))
    entries = [e async for e in lg.read(1)]
    assert fold(entries) == c.state


async def test_a_change_after_a_quiet_spell_is_scheduled_at_once_and_busy_cycles_keep_their_spacing():
    import asyncio
    import time

    async def running(jid: int, within: float) -> float:
        t = time.monotonic()
        while c.state.jobs[jid].state != "RUNNING":
            assert time.monotonic() - t < within, f"job {jid} did not start within {within} s"
            await asyncio.sleep(0.01)
        return time.monotonic() - t

    c = Controller(MemoryLog(), config=CFG, clock=Clock(), debounce=2.0, cycle_interval=60)
    await c.start()
    cycles = asyncio.create_task(c.run_cycles())
    try:
        await c.handle("submit", {"rid": "a", "spec": spec()})
        assert await running(1, 1.0) < 1.0          # not after the 2 s between cycles: at once
        await c.handle("submit", {"rid": "b", "spec": spec()})
        assert await running(2, 5.0) > 1.0          # right after a cycle that started a job: it waits
    finally:
        cycles.cancel()


class StallingLog(MemoryLog):
    """The in-memory log, whose first append of a cycle's decision waits ``stall`` seconds (a server
    failing over) before it lands."""

    def __init__(self, stall: float) -> None:
        super().__init__()
        self.stall = stall

    async def append(self, event, *, actor, idem, ts, expected_last=None, seal=False):
        import asyncio

        if isinstance(event, ev.JobsStarted) and self.stall:
            stall, self.stall = self.stall, 0.0
            await asyncio.sleep(stall)
        return await super().append(event, actor=actor, idem=idem, ts=ts, expected_last=expected_last)


async def test_a_cycle_kept_waiting_by_the_log_does_not_hold_the_next_one_back():
    import asyncio
    import time

    c = Controller(StallingLog(1.5), config=CFG, clock=Clock(), debounce=0.01, cycle_interval=60)
    await c.start()
    cycles = asyncio.create_task(c.run_cycles())
    try:
        await c.handle("submit", {"rid": "a", "spec": spec()})
        while c.state.jobs[1].state != "RUNNING":
            await asyncio.sleep(0.01)
        await c.handle("submit", {"rid": "b", "spec": spec()})     # behind the start, which waits 1.5 s for the log
        t = time.monotonic()
        while c.state.jobs[2].state != "RUNNING":
            assert time.monotonic() - t < 1.0, "the next cycle waited for twice the log's stall"
            await asyncio.sleep(0.01)
    finally:
        cycles.cancel()


class UnsureLog(MemoryLog):
    """The in-memory log, told to store some appends but report them as unconfirmed (a timeout)."""

    def __init__(self, unsure: set[str]) -> None:
        super().__init__()
        self.unsure = unsure

    async def append(self, event, *, actor, idem, ts, expected_last=None, seal=False):
        ack = await super().append(event, actor=actor, idem=idem, ts=ts, expected_last=expected_last)
        if idem in self.unsure:
            self.unsure.discard(idem)
            raise LogUnavailable("timeout")
        return ack


async def test_an_unconfirmed_append_in_a_batch_is_answered_from_what_the_log_holds():
    import asyncio

    lg = UnsureLog({"u3"})
    c = Controller(lg, config=CFG, clock=Clock())
    await c.start()
    replies = await asyncio.gather(*(c.handle("submit", {"rid": f"u{i}", "spec": spec(hold=True)})
                                     for i in range(8)))
    assert all(r["ok"] for r in replies), replies   # u3 landed although its ack was lost
    assert sorted(r["job_id"] for r in replies) == list(range(1, 9))
    assert fold(lg.entries) == c.state and not c.writer.stale


class RacedLog(MemoryLog):
    """The in-memory log, where another controller's submit (from its older view: a job id past ours) takes
    the place of the first record of the next group of more than one."""

    def __init__(self) -> None:
        super().__init__()
        self.race = True

    async def append(self, event, *, actor, idem, ts, expected_last=None, seal=False):
        if self.race and expected_last is not None and not seal:
            self.race = False
            theirs = ev.JobSubmitted(job_id=event.job_id + 2, spec=ev.JobSpec(user="bob", name="theirs"))
            await super().append(theirs, actor="ctl-b", idem="theirs", ts=ts, expected_last=expected_last)
        return await super().append(event, actor=actor, idem=idem, ts=ts, expected_last=expected_last)


async def test_a_group_never_lands_after_another_controllers_record_that_took_its_place():
    """A group's records each fenced at their own sequence: once the first is fenced by another writer's
    record, no later one may land on top of it (it would change nothing, its job never exist, and its
    submitter be told it was accepted)."""
    import asyncio

    lg = RacedLog()
    c = Controller(lg, config=CFG, clock=Clock())
    await c.start()
    replies = await asyncio.gather(*(c.handle("submit", {"rid": f"r{i}", "spec": spec(hold=True)})
                                     for i in range(4)))
    state = fold(lg.entries)
    assert [e.idem for e in lg.entries if e.event.type == "job.submitted"] == ["theirs"]
    assert not any(r["ok"] for r in replies), replies       # another controller wrote: all refused, none lost
    assert not c.leader and c.state == state


class LateLog(MemoryLog):
    """The in-memory log, whose first cycle decision times out and lands only later, just before the next
    append (a server failing over stores it late)."""

    def __init__(self) -> None:
        super().__init__()
        self.late: tuple | None = None
        self.delayed = False

    async def append(self, event, *, actor, idem, ts, expected_last=None, seal=False):
        if self.late is not None:
            late, self.late = self.late, None
            await super().append(late[0], actor=late[1], idem=late[2], ts=late[3])
        if isinstance(event, ev.JobsStarted) and not self.delayed:
            self.delayed, self.late = True, (event, actor, idem, ts)
            raise LogUnavailable("timeout")
        return await super().append(event, actor=actor, idem=idem, ts=ts, expected_last=expected_last)


async def test_its_own_append_landing_late_is_not_taken_for_another_controller():
    lg = LateLog()
    c = Controller(lg, config=CFG, clock=Clock())
    await c.start()
    await c.handle("submit", {"rid": "a", "spec": spec()})
    with pytest.raises(LogUnavailable):
        await c.cycle()
    await c.handle("submit", {"rid": "b", "spec": spec()})       # fenced by the late decision: read back
    assert c.leader, "it stepped back as if another controller had written"
    assert c.state.jobs[1].state == "RUNNING" and fold(lg.entries) == c.state
    await c.cycle()
    assert c.state.jobs[2].state == "RUNNING"


async def test_a_retry_after_a_restart_is_not_appended_again():
    lg = MemoryLog()
    c = Controller(lg, config=CFG, clock=Clock())
    await c.start()
    first = await c.handle("submit", {"rid": "once", "spec": spec()})
    c2 = Controller(lg, clock=Clock())
    await c2.start()
    again = await c2.handle("submit", {"rid": "once", "spec": spec()})
    assert first == again == {"ok": True, "job_id": 1}
    assert sum(1 for e in lg.entries if e.event.type == "job.submitted") == 1


async def test_time_travel_snapshots_are_kept_and_found_by_sequence(js):
    from rota.controller import snapshots

    lg = await js()
    c = Controller(lg, config=CFG, clock=Clock(), snapshot_every=5, history_every=10)
    await c.start()
    kept = []
    for i in range(120):
        await c.handle("submit", {"rid": f"s{i}", "spec": spec(hold=True)})
        if await c.maybe_snapshot():
            kept.append(c.state.seq)
    # every 5 events while the state holds fewer jobs, then every as many events as the last one held jobs
    assert [b - a for a, b in zip(kept, kept[1:])] == [max(5, n - 2) for n in kept[:-1]]
    store = await snapshots.open_store(lg.js)
    history = sorted(int(o.name[3:]) for o in await store.list() if o.name.startswith("at-"))
    assert len(history) >= 3 and set(history) <= set(kept)       # every 10 events, not every snapshot
    assert len(history) < len(kept)
    target = history[1] + 3
    found = await lg.snapshots.at_or_before(target)
    assert found is not None and found.seq == history[1]           # the newest at or before the target
    entries = [e async for e in lg.read(1)]
    assert found == fold(entries[:found.seq])          # a snapshot is the state at its sequence
    assert await lg.snapshots.at_or_before(1) is None


async def test_a_snapshot_that_cannot_be_read_is_tried_again_then_reported_not_taken_for_none(caplog):
    from rota.controller import snapshots
    from rota.core.state import dump_snapshot
    from harness import Harness, make_cluster

    h = Harness(make_cluster(nodes=1, gpus=0))
    h.submit(hold=True)
    data = dump_snapshot(h.state)

    class Flaky:
        def __init__(self, failures):
            self.failures, self.calls = failures, 0

        async def get(self, name):
            self.calls += 1
            if self.calls <= self.failures:
                raise TimeoutError("nats: timeout")
            return type("Entry", (), {"data": data})()

    once = Flaky(1)
    assert await snapshots.latest(once) == h.state and once.calls == 2      # a passing timeout: tried again
    never = Flaky(99)
    with caplog.at_level("WARNING", logger="rota.snapshots"):
        assert await snapshots.latest(never) is None
    assert never.calls == snapshots.READ_ATTEMPTS
    assert "could not be read (TimeoutError: nats: timeout, 3 tries): replaying the log instead" in caplog.text


async def test_squeue_start_gives_a_reservation_or_the_plans_estimate(js):
    """Under EASY only the first waiting job holds a reservation; the others get an estimated start from
    the plan (every job placed in priority order where it fits), not N/A."""
    import orjson

    from rota.core.auth import ROOT

    c = Controller(await js(), config=make_cluster(nodes=1, gpus=4, policy="easy"), clock=Clock())
    await c.start()
    for name in ("running", "first", "second"):
        r = await c.handle("submit", {"rid": name, "spec": spec(name=name, gpus_per_node=4, time_limit=600)})
        assert r["ok"]
    assert (await c.cycle()) is not None
    reply = orjson.loads(c.views.squeue_reply({"start": True, "format": "%i %S"}, ROOT))
    starts = dict(line.split() for line in reply["text"].splitlines()[1:])
    t0 = 1_800_000_000
    assert starts == {"2": _iso(t0 + 600), "3": _iso(t0 + 1200)}     # reserved; estimated behind it
    assert c.views.start_estimates() == {2: t0 + 600, 3: t0 + 1200}   # the plan agrees with the reservation


def _iso(t: int) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(t).strftime("%Y-%m-%dT%H:%M:%S")


async def test_verify_finds_a_start_the_controller_skipped(js):
    """A controller with a bug (its cycles skip job 2 for two minutes) writes a log whose every recorded
    cycle is still the scheduler's own decision; the liveness check of `verify` finds the skipped start."""
    from rota.core.liveness import late_starts
    from rota.core.timetravel import verify

    class SkipsJob2(Controller):
        async def cycle(self):
            if 2 in self.state.pending and self.clock.t < 1_800_000_120:
                return None
            return await super().cycle()

    lg = await js()
    c = SkipsJob2(lg, config=make_cluster(nodes=1, gpus=4), clock=Clock())
    await c.start()
    assert (await c.handle("submit", {"rid": "a", "spec": spec(name="a", gpus_per_node=2)}))["ok"]
    assert await c.cycle() is not None                       # job 1 starts
    assert (await c.handle("submit", {"rid": "b", "spec": spec(name="b", gpus_per_node=2)}))["ok"]
    for _ in range(3):                                       # cycles every 30 s: the bug skips job 2
        c.clock.t += 30
        assert await c.cycle() is None
    c.clock.t += 30
    assert (await c.cycle()) is not None                     # the bug's window is over: job 2 starts
    log = [e async for e in lg.read(1)]
    assert all(d is None for _s, d in verify(log))
    (late,) = late_starts(log)
    assert (late.job_id, late.could_start, late.waited_until, late.outcome) == (2, 1_800_000_000, 1_800_000_120,
                                                                                "started")


async def test_scontrol_show_job_gives_a_waiting_jobs_real_priority_and_0_only_when_held(js):
    from rota.core.auth import ROOT

    c = Controller(await js(), config=CFG, clock=Clock())
    await c.start()
    await c.handle("submit", {"rid": "a", "spec": spec(name="a", gpus_per_node=1)})
    await c.cycle()
    await c.handle("submit", {"rid": "b", "spec": spec(name="b", dependency="afterok:1")})
    await c.handle("submit", {"rid": "c", "spec": spec(name="c", hold=True)})
    waiting, held = c.views.job(2, ROOT), c.views.job(3, ROOT)
    assert waiting["reason"] == "Dependency" and waiting["priority"] > 0
    assert held["reason"] == "JobHeldUser" and held["priority"] == 0


async def test_a_request_whose_caller_gave_up_does_not_fail_the_others_in_its_batch():
    import asyncio

    c = Controller(MemoryLog(), config=CFG, clock=Clock())
    await c.start()
    gone = asyncio.create_task(c.append(ev.JobHeld(job_id=1), "a cycle that is cancelled"))
    kept = asyncio.create_task(c.handle("submit", {"rid": "kept", "spec": spec()}))
    await asyncio.sleep(0)
    gone.cancel()                    # (a controller that stops leading cancels its cycle mid-write)
    assert (await kept)["ok"]


async def test_a_filtered_squeue_makes_only_its_jobs_rows_and_says_what_the_full_listing_filtered_says():
    """``squeue -u/-j/-p/-t`` over a long queue makes rows for the jobs those filters select; its text is
    the full listing's, filtered: every filter, combined, with arrays, ids that ended or never were."""
    import orjson

    from rota.controller.squeue_view import answer, select_jobs
    from rota.core.auth import ROOT, Caller

    cfg = make_cluster(nodes=2, gpus=4, extra_partitions=(ev.PartitionConfig(name="big", nodes=("gpu02",),
                                                                              max_time=3600),))
    c = Controller(MemoryLog(), config=cfg, clock=Clock())
    await c.start()
    alice, bob = Caller(1001, 1001, "alice"), Caller(1002, 1002, "bob")
    for i, (who, part) in enumerate([(alice, "short"), (bob, "big"), (alice, "big"), (bob, "short")] * 3):
        assert (await c.handle("submit", {"spec": spec(gpus_per_node=4, partitions=[part], name=f"j{i}")}, who))["ok"]
    assert (await c.handle("submit", {"spec": spec(gpus_per_node=1, array="0-5%2", name="arr")}, bob))["ok"]
    assert (await c.cycle()) is not None
    assert c.state.running and c.state.pending
    full = c.views.queue_view()
    requests = [{"users": "alice"}, {"users": "1002"}, {"users": "bob", "states": "R"}, {"states": "PD"},
                {"states": "r,pd"}, {"partitions": "big"}, {"partitions": "short", "states": "PENDING"},
                {"jobs": "13"}, {"jobs": "13_4"}, {"jobs": "1,2,99"}, {"jobs": "1", "users": "bob"},
                {"states": "all"}, {"jobs": "x1"}, {"users": "alice", "array": True, "format": "%i %u %P %T %r"}]
    for request in requests:
        chosen = select_jobs(c.state, request)
        reply = orjson.loads(c.views.squeue_reply(dict(request), ROOT))
        expected = answer(full, dict(request), 1_800_000_000)
        expected.pop("now_dependent", None)
        assert reply == expected, request
        if chosen is not None:
            assert len(chosen) < len(full) or request.get("states") == "r,pd"   # no rows made for the others


async def test_a_snapshot_of_a_large_state_moves_what_is_alive_out_of_the_collectors_passes(monkeypatch):
    """From FREEZE_JOBS jobs on, a snapshot collects and freezes: the collector's full passes no longer
    rescan every job (below it, nothing is frozen)."""
    import gc

    from rota.controller import service

    monkeypatch.setattr(service, "FREEZE_JOBS", 3)
    c = Controller(MemoryLog(), config=CFG, clock=Clock(), snapshot_every=1)
    await c.start()
    gc.unfreeze()
    try:
        for i in range(2):
            await c.handle("submit", {"rid": f"f{i}", "spec": spec(hold=True)})
        assert await c.maybe_snapshot() and gc.get_freeze_count() == 0
        for i in range(2, 4):     # the next snapshot comes as many events after as that one held jobs
            await c.handle("submit", {"rid": f"f{i}", "spec": spec(hold=True)})
        assert await c.maybe_snapshot() and gc.get_freeze_count() > 0
        assert not any(o is c.state for o in gc.get_objects())    # the passes no longer see it
    finally:
        gc.unfreeze()


async def test_a_cycle_over_a_long_queue_runs_off_the_loop_reads_answered_writes_behind_it(js, monkeypatch):
    import asyncio
    import threading

    from rota.controller import service

    monkeypatch.setattr(service, "OFF_LOOP_PENDING", 1)
    c = Controller(await js(), config=CFG, clock=Clock())
    await c.start()
    first = (await c.handle("submit", {"rid": "a", "spec": spec(gpus_per_node=4)}))["job_id"]
    entered, release = threading.Event(), threading.Event()
    scheduler = service.schedule

    def held_schedule(state, now, **kw):
        entered.set()
        assert release.wait(10)
        return scheduler(state, now, **kw)

    monkeypatch.setattr(service, "schedule", held_schedule)
    cycle = asyncio.create_task(c.cycle())
    assert await asyncio.to_thread(entered.wait, 10)
    listed = await asyncio.wait_for(c.handle("squeue", {"format": "%i %t", "noheader": True}), 5)
    assert listed["text"].split() == [str(first), "PD"]         # answered while the scheduler runs
    submit = asyncio.create_task(c.handle("submit", {"rid": "b", "spec": spec(gpus_per_node=4)}))
    await asyncio.sleep(0.2)
    assert not submit.done() and not cycle.done()               # a write waits for the cycle's
    release.set()
    started = await cycle
    second = (await submit)["job_id"]
    assert [s.job_id for s in started.starts] == [first]
    assert c.state.jobs[second].submit_seq > c.state.jobs[first].submit_seq and c.state.seq == 5


async def test_an_off_loop_prepare_leads_its_batch_so_readers_meanwhile_see_only_what_landed(js):
    import asyncio
    import time

    from rota.controller.writer import OffLoop

    c = Controller(await js(), config=CFG, clock=Clock())
    await c.start()
    seen: list[bool] = []

    def after_a(state):
        for _ in range(200):          # what was queued before it lands (and is answered) before it runs
            if a.done():
                break
            time.sleep(0.01)
        seen.append(a.done())
        return ev.JobSubmitted(job_id=state.next_job_id, spec=ev.JobSpec(user="bob", time_limit=60))

    a = asyncio.create_task(c.handle("submit", {"rid": "a", "spec": spec()}))
    b = asyncio.create_task(c.writer.write(OffLoop(after_a), "bob"))
    await asyncio.gather(a, b)
    assert seen == [True] and a.result()["job_id"] == 1 and c.state.jobs[2].spec.user == "bob"


def test_a_cycle_off_the_loop_gives_way_to_reads_for_a_bounded_time():
    import time

    from rota.controller.service import GiveWay

    reading = [0]
    give_way = GiveWay(lambda: reading[0] > 0, 0.05)
    t = time.perf_counter()
    give_way()
    assert time.perf_counter() - t < 0.01              # nothing to give way to
    reading[0] = 1
    t = time.perf_counter()
    give_way()
    assert 0.05 <= time.perf_counter() - t < 0.5       # waits while a read is answered, up to its budget
    t = time.perf_counter()
    give_way()
    assert time.perf_counter() - t < 0.01              # spent: the cycle goes on


async def test_a_report_refused_on_a_state_the_log_has_moved_past_is_left_for_the_leader():
    """A deposed controller that has not seen a job start must not drop the job's end as stale: the report
    stays in the inbox (not acked) for the controller that leads; one judged on the whole log is acked."""
    from types import SimpleNamespace

    from rota.controller.agentlink import AgentLink
    from rota.controller.outbox import Outbox
    from rota.wire import subjects as sj

    class NoNats:
        def jetstream(self, timeout=None):
            return None

    lg = MemoryLog()
    old = Controller(lg, config=CFG, clock=Clock(), outbox=Outbox())
    await old.start()
    new = Controller(lg, clock=Clock(), outbox=Outbox())
    await new.start()                               # the old one is now behind the log
    await new.handle("submit", {"rid": "j", "spec": spec()})
    started = await new.cycle()
    node = started.starts[0].alloc[0].node

    def report(job_id: int) -> SimpleNamespace:
        body = ev.EVENT_ADAPTER.dump_json(ev.JobExited(job_id=job_id, state="COMPLETED", node=node))
        return SimpleNamespace(subject=f"{sj.INBOX_PREFIX}.{node}", headers={"Nats-Msg-Id": f"r{job_id}"}, data=body,
                               metadata=SimpleNamespace(num_delivered=1, sequence=SimpleNamespace(stream=job_id)))

    assert await AgentLink(old, NoNats())._take(report(1)) is False      # not acked: left for the leader
    assert old.state.jobs.get(1) is None
    assert await AgentLink(new, NoNats())._take(report(1)) is True
    assert new.state.jobs[1].state == "COMPLETED"
    assert await AgentLink(new, NoNats())._take(report(99)) is True      # truly stale: acked, dropped


async def test_a_large_state_is_snapshotted_by_a_forked_child_and_loads_back_equal(js, monkeypatch):
    from rota.controller import service
    from rota.core.state import dump_snapshot

    monkeypatch.setattr(service, "DUMP_ASIDE_FROM", 3)
    lg = await js()
    c = Controller(lg, config=CFG, clock=Clock())
    await c.start()
    for i in range(5):
        assert (await c.handle("submit", {"rid": f"s{i}", "spec": spec(hold=True)}))["ok"]
    forks = []
    real = service.dump_aside
    monkeypatch.setattr(service, "dump_aside", lambda *a: forks.append(1) or real(*a))
    assert await c.maybe_snapshot(force=True)
    assert forks == [1]
    loaded = await lg.snapshots.latest()
    assert loaded is not None and dump_snapshot(loaded) == dump_snapshot(c.state)


async def test_the_submit_rate_limit_counts_each_job_and_refills(js):
    from rota.core.auth import Caller

    clock = Clock()
    cfg = CFG.model_copy(update={"rate_limit": ev.RateLimit(enabled=True, bucket_size=5, refill_rate=1, refill_period=2)})
    c = Controller(MemoryLog(), config=cfg, clock=clock)
    await c.start()
    alice = Caller(1000, 1000, "alice")
    ok = [await c.handle("submit", {"rid": f"a{i}", "spec": spec(hold=True)}, caller=alice) for i in range(6)]
    assert [r["ok"] for r in ok] == [True] * 5 + [False]
    assert ok[-1]["error"][-1] == "Slurm temporarily unable to accept job, sleeping and retrying"
    assert "may submit 5 jobs at once and 1 more every 2 s" in ok[-1]["error"][0]
    clock.t += 4                                              # two more have come back
    r = await c.handle("submit_many", {"rid": "m1", "specs": [spec(hold=True)] * 3}, caller=alice)
    assert not r["ok"] and r["code"] == "busy"                # three are more than two: the whole request waits
    r = await c.handle("submit_many", {"rid": "m2", "specs": [spec(hold=True)] * 2}, caller=alice)
    assert r["ok"] and None not in r["job_ids"]
    for i in range(8):                                        # root is not limited
        assert (await c.handle("submit", {"rid": f"r{i}", "spec": spec(hold=True)}))["ok"]


async def test_a_retried_submit_whose_record_made_no_job_is_not_answered_with_another_jobs_id(js):
    """The record a retry finds on the log was refused by the reducer (a job id already taken, as when it
    landed after another controller's records): the retry is told its job is not known, never handed the
    id of the job that took its place."""
    lg = await js()
    c = Controller(lg, config=CFG, clock=Clock())
    await c.start()
    first = await c.handle("submit", {"rid": "a", "spec": spec(hold=True)})
    assert first == {"ok": True, "job_id": 1}
    void = ev.JobSubmitted(job_id=1, spec=ev.JobSpec(user="root", name="late", time_limit=600, hold=True))
    ack = await lg.append(void, actor="root", idem="0:late", ts=c.state.now, expected_last=c.state.seq)
    assert ack.seq in lg.own.records               # this process appended it: the writer knows its job id
    await c.writer.catch_up()
    assert c.state.seq == ack.seq and c.state.jobs[1].submit_seq != ack.seq
    again = await c.handle("submit", {"rid": "late", "spec": spec(hold=True, name="late")})
    assert not again["ok"] and "no longer known" in again["error"][-1], again


class UnfencedLog(MemoryLog):
    """An in-memory log whose fence failed once: another controller's submit of the same job id lands just
    before the next record, which is stored after it anyway."""

    def __init__(self) -> None:
        super().__init__()
        self.race = False

    async def append(self, event, *, actor, idem, ts, expected_last=None, seal=False):
        if self.race and isinstance(event, ev.JobSubmitted):
            self.race = False
            theirs = ev.JobSubmitted(job_id=event.job_id, spec=ev.JobSpec(user="bob", name="theirs"))
            await super().append(theirs, actor="ctl-b", idem="theirs", ts=ts)
            return await super().append(event, actor=actor, idem=idem, ts=ts)
        return await super().append(event, actor=actor, idem=idem, ts=ts, expected_last=expected_last)


async def test_a_submit_on_the_log_that_made_no_job_is_not_acknowledged():
    lg = UnfencedLog()
    c = Controller(lg, config=CFG, clock=Clock())
    await c.start()
    assert (await c.handle("submit", {"rid": "a", "spec": spec(hold=True)}))["ok"]
    lg.race = True
    r = await c.handle("submit", {"rid": "b", "spec": spec(hold=True)})
    assert [e.idem for e in lg.entries[-2:]] == ["theirs", "0:b"]     # on the log, after the other's job 2
    assert not r["ok"] and "made no job" in r["error"][-1], r
    assert fold(lg.entries).jobs[2].spec.name == "theirs"
