"""One contract, two log backends: in memory and NATS JetStream (a real nats-server)."""
import asyncio

import pytest

from rota.controller import natsserver
from rota.controller.eventlog import FencedError, JetStreamLog, MemoryLog, subject_for
from rota.core import events as ev


@pytest.fixture
def nats_server(tmp_path):
    srv = natsserver.start(tmp_path / "nats")
    yield srv
    srv.stop()


@pytest.fixture(params=["memory", "jetstream"])
async def log(request, tmp_path):
    if request.param == "memory":
        yield MemoryLog()
        return
    srv = natsserver.start(tmp_path / "nats")
    lg = await JetStreamLog.connect(srv.url)
    yield lg
    await lg.close()
    srv.stop()


EVENTS = [ev.JobSubmitted(job_id=i, spec=ev.JobSpec(user="alice", name=f"j{i}")) for i in range(1, 6)]


async def test_append_and_read_back(log):
    for i, e in enumerate(EVENTS, start=1):
        a = await log.append(e, actor="alice", idem=f"req-{i}", ts=1000 + i)
        assert (a.seq, a.duplicate) == (i, False)
    got = [env async for env in log.read(1)]
    assert [g.event for g in got] == EVENTS
    assert [(g.seq, g.ts, g.actor, g.idem) for g in got] == [(i, 1000 + i, "alice", f"req-{i}") for i in range(1, 6)]
    tail = [env.seq async for env in log.read(4)]
    assert tail == [4, 5]
    assert await log.last_seq() == 5


async def test_retried_append_is_stored_once(log):
    a = await log.append(EVENTS[0], actor="a", idem="same", ts=1)
    b = await log.append(EVENTS[0], actor="a", idem="same", ts=2)
    assert a.seq == b.seq == 1 and b.duplicate
    assert await log.last_seq() == 1


async def test_fencing_refuses_a_stale_writer(log):
    await log.append(EVENTS[0], actor="c1", idem="x1", ts=1, expected_last=0)
    await log.append(EVENTS[1], actor="c1", idem="x2", ts=1, expected_last=1)
    with pytest.raises(FencedError):
        await log.append(EVENTS[2], actor="c2", idem="x3", ts=1, expected_last=1)
    assert await log.last_seq() == 2


async def test_acknowledged_events_survive_a_server_kill(tmp_path):
    srv = natsserver.start(tmp_path / "nats")
    lg = await JetStreamLog.connect(srv.url)
    for i, e in enumerate(EVENTS, start=1):
        await lg.append(e, actor="a", idem=f"k{i}", ts=i)
    srv.kill()
    await lg.nc.close()
    srv2 = natsserver.start(tmp_path / "nats", port=srv.port)
    lg2 = await JetStreamLog.connect(srv2.url)
    try:
        assert [env.event async for env in lg2.read(1)] == EVENTS
    finally:
        await lg2.close()
        srv2.stop()


def test_the_embedded_server_fsyncs_every_write(nats_server):
    assert "sync_interval: always" in nats_server.config.read_text()
    assert "listen: 127.0.0.1:" in nats_server.config.read_text()


def test_node_events_have_per_node_subjects():
    assert subject_for(ev.NodeDrained(node="gpu01", reason="r")) == "rota.ev.node.gpu01.drained"
    assert subject_for(EVENTS[0]) == "rota.ev.job.submitted"


async def test_the_plain_reader_delivers_exactly_what_nats_py_delivers(tmp_path):
    """Replays read deliveries off a plain connection; they must equal nats-py's, in ranges, in order."""
    from rota.controller import eventlog, streamreader

    srv = natsserver.start(tmp_path / "nats")
    lg = await JetStreamLog.connect(srv.url)
    try:
        for i in range(1, 5001):
            await lg.js.publish(subject_for(EVENTS[0]), eventlog.encode_body(EVENTS[i % 5]),
                                headers={"Nats-Msg-Id": f"m{i}", eventlog.TS_HEADER: str(i),
                                         eventlog.ACTOR_HEADER: "alice"})
        for start, end, batch in ((1, 5000, 700), (1234, 4321, 2000), (5000, 5000, 10)):
            plain = [m async for c in _read_with(lg, streamreader.RawPullReader, start, end, batch) for m in c]
            nats_py = [m async for c in _read_with(lg, streamreader.PullReader, start, end, batch) for m in c]
            assert [m[0] for m in plain] == list(range(start, end + 1))
            assert plain == nats_py
        envs = [env async for env in lg.read(4990)]
        assert [(e.seq, e.ts, e.actor, e.idem) for e in envs] == [(s, s, "alice", f"m{s}") for s in range(4990, 5001)]
        assert lg._plain_reads   # the fast path was taken, not the fallback
    finally:
        await lg.close()
        srv.stop()


@pytest.mark.parametrize("plain", [True, False], ids=["plain", "nats-py"])
async def test_a_read_whose_consumer_sits_on_a_frozen_server_goes_on_from_another_within_seconds(tmp_path, plain,
                                                                                                monkeypatch):
    """A read's consumer is one copy on one server. Frozen, that server sends nothing, not even the heartbeats
    the read asks for, and never answers the consumer's removal: the read gives it up within seconds and goes
    on from where it was through a consumer on another server."""
    import signal
    import time

    from rota.controller import eventlog, streamreader
    from rota.controller.natscluster import start_cluster, wait_for_jetstream

    servers = start_cluster(tmp_path / "cluster", 3)
    urls = [s.url for s in servers]
    frozen: list = []
    lg = None
    try:
        await wait_for_jetstream(urls)
        lg = await JetStreamLog.connect(urls, replicas=3, dont_randomize=True)     # on the first server
        for i in range(1, 3001):
            await lg.js.publish(subject_for(EVENTS[0]), eventlog.encode_body(EVENTS[i % 5]),
                                headers={"Nats-Msg-Id": f"m{i}", eventlog.TS_HEADER: str(i)})
        leader = (await lg.js.stream_info(lg.stream)).cluster.leader
        victim = next(s for i, s in enumerate(servers) if f"rota-n{i + 1}" not in ("rota-n1", leader))
        name = f"rota-n{servers.index(victim) + 1}"
        made = streamreader.ephemeral_consumer

        async def on_the_victim_first(lg_: object, from_seq: int) -> str:
            while not frozen:
                consumer = await made(lg, from_seq)
                if (await lg.js.consumer_info(lg.stream, consumer)).cluster.leader == name:
                    victim.process.send_signal(signal.SIGSTOP)
                    frozen.append(victim)
                    return consumer
                await lg.js.delete_consumer(lg.stream, consumer)
            return await made(lg, from_seq)

        monkeypatch.setattr(streamreader, "ephemeral_consumer", on_the_victim_first)
        lg._plain_reads = plain
        began = time.monotonic()

        async def read() -> list[int]:
            return [m[0] async for chunk in lg.read_raw(1, 3000, batch=500) for m in chunk]

        got = await asyncio.wait_for(read(), 30)     # the plain reader used to wait for ever: PINGs kept it hoping
        assert frozen and got == list(range(1, 3001))
        assert time.monotonic() - began < 9.0       # 14 s and more before the reads asked for heartbeats
    finally:
        for s in frozen:
            s.process.send_signal(signal.SIGCONT)
        if lg is not None:
            await lg.close()
        for s in servers:
            s.stop()


async def _read_with(lg, cls, start, end, batch):
    reader = cls(lg, start, end, batch)
    try:
        await reader.open()
        async for chunk in reader.chunks():
            yield chunk
    finally:
        await reader.close()


async def test_read_batches_yields_exactly_the_range_asked(log):
    for i, e in enumerate(EVENTS * 2, start=1):
        await log.append(e, actor="a", idem=f"r{i}", ts=i)

    async def seqs(*args):
        return [env.seq async for chunk in log.read_batches(*args) for env in chunk]

    assert await seqs(1) == list(range(1, 11))
    assert await seqs(3, 7) == [3, 4, 5, 6, 7]
    assert await seqs(8) == [8, 9, 10]
    assert await seqs(10, 10) == [10]
    assert await seqs(11) == []
    assert await seqs(5, 4) == []


async def test_snapshots_latest_and_history_on_every_backend(log):
    from rota.core.apply import fold
    from rota.core.state import dump_snapshot
    from harness import Harness, make_cluster

    h = Harness(make_cluster(nodes=1, gpus=0))
    for _ in range(6):
        h.advance(10)
        h.submit(hold=True)
    assert await log.snapshots.latest() is None
    at2, at4, at6 = (fold(h.log[:k]) for k in (2, 4, 6))
    await log.snapshots.put(dump_snapshot(at2), at2.seq, history=True)
    await log.snapshots.put(dump_snapshot(at4), at4.seq, history=True)
    await log.snapshots.put(dump_snapshot(at6), at6.seq, history=False)
    assert await log.snapshots.latest() == at6
    assert await log.snapshots.at_or_before(5) == at4          # the newest history snapshot at or before
    assert await log.snapshots.at_or_before(3) == at2
    assert await log.snapshots.at_or_before(1) is None
    assert await log.snapshots.at_or_before_time(at4.now) == at4
    assert await log.snapshots.at_or_before_time(at2.now - 1) is None


async def test_a_controller_restarts_from_the_snapshot_of_either_backend(log):
    from rota.controller.service import Controller
    from rota.core.apply import fold
    from harness import make_cluster

    c = Controller(log, config=make_cluster(nodes=1, gpus=0), clock=lambda: 1000, snapshot_every=1)
    await c.start()
    await c.handle("submit", {"spec": {"time_limit": 60, "hold": True}})
    assert await c.maybe_snapshot()
    await c.handle("submit", {"spec": {"time_limit": 60, "hold": True}})
    again = Controller(log, clock=lambda: 1000)
    await again.load()
    entries = [env async for env in log.read(1)]
    assert again.writer.snapshot_seq == len(entries) - 1 and again.state == fold(entries)


async def test_atomic_batches_land_whole_in_order_signed_or_not_at_all(tmp_path):
    """Many records as atomic batches (one write and sync each): every record at its sequence with its MAC,
    across the batch-size boundary; a batch fenced by another writer leaves nothing of itself; a batch
    with a record the log already holds is refused whole (the writer then appends one by one)."""
    from rota.controller.eventlog import ATOMIC_BATCH, AtomicRefused
    from rota.wire.keys import Keyring

    srv = natsserver.start(tmp_path / "nats")
    keyring = Keyring(cluster_key=b"a" * 64)
    lg = await JetStreamLog.connect(srv.url, keyring=keyring)
    try:
        assert lg.atomic
        n = ATOMIC_BATCH + 7
        records = [(ev.JobSubmitted(job_id=i, spec=ev.JobSpec(user="alice", name=f"j{i}")), "alice", f"r{i}", 10 + i)
                   for i in range(1, n + 1)]
        acks = await lg.append_batch(records, 0)
        assert [a.seq for a in acks] == list(range(1, n + 1))
        reader = await JetStreamLog.connect(srv.url, keyring=keyring)
        got = [env async for env in reader.read(1)]
        assert [(g.seq, g.event.job_id, g.idem, g.ts) for g in got] == [(i, i, f"r{i}", 10 + i) for i in range(1, n + 1)]
        assert reader.set_aside == []                        # every record carries the controller's MAC
        await reader.close()
        with pytest.raises(FencedError):                     # another writer's record came first
            await lg.append_batch([(e, a, f"new-{idem}", ts) for e, a, idem, ts in records[:3]], n - 1)
        with pytest.raises(AtomicRefused):                   # r1 is on the log already
            await lg.append_batch([(EVENTS[0], "a", "fresh", 1), (EVENTS[1], "a", "r1", 1)], n)
        assert await lg.last_seq() == n
    finally:
        await lg.close()
        srv.stop()


async def test_a_follower_woken_by_its_writers_append_in_flight_waits_for_its_answer_not_the_server(tmp_path):
    """A follower in the writer's process is woken by the record itself (its subject), before the append's
    acknowledgement: it waits for that answer and reads the record from this process. An append that fails
    leaves it to read the log."""
    srv = natsserver.start(tmp_path / "nats")
    lg = await JetStreamLog.connect(srv.url)
    server_reads: list[int] = []
    read_batches = lg.read_batches

    def counted(from_seq, *args, **kwargs):
        server_reads.append(from_seq)
        return read_batches(from_seq, *args, **kwargs)

    try:
        await lg.append(EVENTS[0], actor="ctl", idem="own-1", ts=101, expected_last=0)
        lg.read_batches = counted
        sending = asyncio.create_task(lg.append(EVENTS[1], actor="ctl", idem="own-2", ts=102, expected_last=1))
        await asyncio.sleep(0)                                  # sent, not yet acknowledged
        assert 2 not in lg.own.records
        assert [[e.seq for e in c] async for c in lg.read_tail(2)] == [[2]] and server_reads == []
        assert (await sending).seq == 2
        fenced = asyncio.create_task(lg.append(EVENTS[2], actor="ctl", idem="late", ts=103, expected_last=1))
        await asyncio.sleep(0)
        assert [[e.seq for e in c] async for c in lg.read_tail(3)] == [] and server_reads == [3]
        with pytest.raises(FencedError):
            await fenced
    finally:
        await lg.close()
        srv.stop()


async def test_a_follower_in_the_writers_process_reads_its_records_without_the_server(tmp_path):
    """``read_tail`` gives the records this process appended (fenced, acknowledged at the sequence it
    expected) without asking the server; what another writer appended after them comes from the log."""
    srv = natsserver.start(tmp_path / "nats")
    lg = await JetStreamLog.connect(srv.url)
    other = await JetStreamLog.connect(srv.url)
    try:
        for i in (1, 2):
            await lg.append(EVENTS[i - 1], actor="ctl", idem=f"own-{i}", ts=100 + i, expected_last=i - 1)
        await other.append(EVENTS[2], actor="ctl-b", idem="theirs", ts=103, expected_last=2)
        await lg.append(EVENTS[3], actor="ctl", idem="unfenced", ts=104)        # not fenced: not remembered
        assert [[e.seq for e in c] async for c in lg.read_tail(3)] == [[3, 4]]   # none of it ours: the server's
        assert [[e.seq for e in c] async for c in other.read_tail(1)] == [[1, 2, 3, 4]]
        await other.close()
        srv.stop()                                                             # no server from here on
        got = [c async for c in lg.read_tail(1)]
        assert [[(e.seq, e.idem, e.ts, e.event) for e in c] for c in got] == \
            [[(1, "own-1", 101, EVENTS[0]), (2, "own-2", 102, EVENTS[1])]]
    finally:
        await lg.nc.close()
        srv.stop()


async def test_a_follower_in_the_writers_process_is_told_of_each_group_it_landed_and_of_nothing_else(tmp_path):
    """``own.on_landed`` (what wakes the leader's projection) is called once for each append that landed where
    its fence expected it, never for one refused or another writer's."""
    srv = natsserver.start(tmp_path / "nats")
    lg = await JetStreamLog.connect(srv.url)
    other = await JetStreamLog.connect(srv.url)
    told: list[list[int]] = []
    lg.own.on_landed = lambda: told.append(sorted(lg.own.records))
    try:
        await lg.append(EVENTS[0], actor="ctl", idem="own-1", ts=101, expected_last=0)
        await other.append(EVENTS[1], actor="ctl-b", idem="theirs", ts=102, expected_last=1)
        with pytest.raises(FencedError):
            await lg.append(EVENTS[2], actor="ctl", idem="late", ts=103, expected_last=1)
        await lg.append(EVENTS[3], actor="ctl", idem="own-3", ts=104, expected_last=2)
        assert told == [[1], [1, 3]]
    finally:
        await other.close()
        await lg.close()
        srv.stop()
