"""Two controllers on one log: one leads, the other follows the log and takes over when the leader dies;
a deposed leader that wakes up can never append."""
import asyncio
import json
import time

import pytest

from rota.controller.eventlog import FencedError
from rota.controller.leadership import Candidacy, controllers
from rota.controller.service import Controller
from rota.core import events as ev
from harness import make_cluster

CFG = make_cluster(nodes=2, gpus=4)
TTL = 2.0


def spec(**kw):
    kw.setdefault("time_limit", 600)
    return ev.JobSpec(**kw).model_dump(mode="json", exclude={"user", "uid", "gid"})


async def until(check, timeout: float = 15.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def candidate(connect, name: str) -> tuple[Controller, Candidacy, asyncio.Event, asyncio.Task]:
    lg = await connect()
    c = Controller(lg, config=CFG, debounce=0.01, cycle_interval=0.5, name=name)
    await c.load()
    cand = Candidacy(c, lg.js, name, f"host-{name}", ttl=TTL, on_lead=lambda: c.serve(lg.nc), on_lose=c.stop)
    stop = asyncio.Event()
    return c, cand, stop, asyncio.create_task(cand.run(stop))


async def test_a_standby_takes_over_when_the_leader_dies_and_the_old_leader_cannot_append(jetstream):
    a, cand_a, stop_a, task_a = await candidate(jetstream, "ctl-a")
    await until(lambda: cand_a.leading, what="ctl-a to lead")
    b, cand_b, stop_b, task_b = await candidate(jetstream, "ctl-b")
    first = await a.handle("submit", {"rid": "1", "spec": spec(name="before")})
    assert first["ok"]
    await until(lambda: first["job_id"] in b.state.jobs, what="the standby to follow the log")
    assert not cand_b.leading
    listed = await controllers(b.log)
    assert {(x["name"], x["role"]) for x in listed} == {("ctl-a", "primary"), ("ctl-b", "backup")}

    frozen = asyncio.Event()

    async def frozen_renewal(seq: int) -> bool:
        await frozen.wait()
        return False

    cand_a.lease.renew = frozen_renewal  # the leader freezes (SIGSTOP, a partition): its lease is never renewed
    await a.stop()
    died = time.monotonic()
    await until(lambda: cand_b.leading, timeout=TTL + 10, what="ctl-b to take over")
    takeover = time.monotonic() - died
    print(f"takeover {takeover:.2f} s after the leader froze (lease {TTL} s)")
    assert takeover <= TTL + 3, takeover
    listed = await controllers(b.log)     # the frozen one last said it was the primary: the lease says who is
    assert {(x["name"], x["role"]) for x in listed} == {("ctl-a", "backup"), ("ctl-b", "primary")}, listed
    started = [env async for env in b.log.read(1) if env.event.type == "controller.started"]
    assert started[-1].event.name == "ctl-b" and started[-1].seq > first["job_id"]
    again = await b.handle("submit", {"rid": "2", "spec": spec(name="after")})
    assert again["ok"] and set(b.state.jobs) == {first["job_id"], again["job_id"]}

    assert a.writer.leader               # the old leader still believes it leads: the log refuses it
    with pytest.raises(FencedError):
        await a.append(ev.JobHeld(job_id=first["job_id"]), "ctl-a")
    assert not a.writer.leader
    assert not [env async for env in b.log.read(1) if env.event.type == "job.held"]
    frozen.set()
    stop_a.set()
    stop_b.set()
    await asyncio.gather(task_a, task_b)


async def test_a_leader_whose_start_outlasts_its_lease_keeps_it(jetstream):
    """What leading starts (a thousand nodes' order consumers on a busy server) may take longer than the lease
    lives: the lease is renewed meanwhile, so the leader neither loses it nor hands over to a standby."""
    lg = await jetstream()
    c = Controller(lg, config=CFG, debounce=0.01, cycle_interval=0.5, name="slow")
    await c.load()

    async def slow_start() -> None:
        await asyncio.sleep(3 * TTL)
        await c.serve(lg.nc)

    cand = Candidacy(c, lg.js, "slow", "host-slow", ttl=TTL, on_lead=slow_start, on_lose=c.stop)
    lost: list[bool] = []

    async def on_lose() -> None:
        lost.append(True)
        await c.stop()
    cand.on_lose = on_lose
    stop = asyncio.Event()
    task = asyncio.create_task(cand.run(stop))
    await until(lambda: cand.leading, what="it to lead")
    revision = cand.lease.revision
    await asyncio.sleep(3 * TTL + 1)
    assert cand.leading and not lost and c.writer.leader
    assert cand.lease.revision is not None and cand.lease.revision > (revision or 0)
    answer = await c.handle("submit", {"rid": "1", "spec": spec(name="after-a-slow-start")})
    assert answer["ok"]
    stop.set()
    await task


async def test_a_leader_whose_renewals_fail_stops_leading_before_its_lease_can_expire(jetstream):
    """Renewals that fail with an error (the servers answer no responders, or nothing) rather than a refusal:
    the leader stops acting as one before another controller could take the expired lease."""
    a, cand_a, stop_a, task_a = await candidate(jetstream, "ctl-a")
    await until(lambda: cand_a.leading, what="ctl-a to lead")
    from nats.errors import NoRespondersError

    async def no_responders(*args, **kwargs):
        raise NoRespondersError

    cand_a.lease.kv.update = no_responders
    cand_a.lease.kv.get = no_responders
    failing = time.monotonic()
    await until(lambda: not cand_a.leading, timeout=3 * TTL, what="ctl-a to stop leading")
    assert time.monotonic() - failing < TTL, time.monotonic() - failing
    assert not a.writer.leader
    stop_a.set()
    await task_a


async def test_a_leader_whose_start_fails_gives_the_lease_up_and_takes_it_afresh(jetstream):
    lg = await jetstream()
    c = Controller(lg, config=CFG, debounce=0.01, cycle_interval=0.5, name="flaky")
    await c.load()
    starts: list[float] = []

    async def start() -> None:
        starts.append(time.monotonic())
        if len(starts) == 1:
            raise TimeoutError()         # e.g. the streams could not be read yet
        await c.serve(lg.nc)

    cand = Candidacy(c, lg.js, "flaky", "host-flaky", ttl=TTL, on_lead=start, on_lose=c.stop)
    stop = asyncio.Event()
    task = asyncio.create_task(cand.run(stop))
    await until(lambda: len(starts) == 2, timeout=3 * TTL, what="a second start")
    assert starts[1] - starts[0] < TTL      # the lease was given up, not left to expire
    await until(lambda: cand.leading, what="it to lead again")
    answer = await c.handle("submit", {"rid": "1", "spec": spec(name="after-a-failed-start")})
    assert answer["ok"]
    stop.set()
    await task


async def test_a_leader_whose_first_announcement_fails_still_serves(jetstream):
    """Taking the lease and then failing to announce itself (a server busy electing leaders answers "no
    response from stream") must not leave a leader that never serves."""
    lg = await jetstream()
    c = Controller(lg, config=CFG, debounce=0.01, cycle_interval=0.5, name="busy")
    await c.load()
    cand = Candidacy(c, lg.js, "busy", "host-busy", ttl=TTL, on_lead=lambda: c.serve(lg.nc), on_lose=c.stop)
    announce, failed = cand._announce, []

    async def refused_once() -> None:
        if cand.leading and not failed:
            failed.append(True)
            raise TimeoutError("nats: no response from stream")
        await announce()

    cand._announce = refused_once
    stop = asyncio.Event()
    task = asyncio.create_task(cand.run(stop))
    await until(lambda: cand.leading and failed, what="it to lead")
    answer = await asyncio.wait_for(c.handle("submit", {"rid": "1", "spec": spec(name="served")}), 10)
    assert answer["ok"]
    await until(lambda: c._subs, what="it to serve requests over NATS")
    stop.set()
    await task


async def test_a_leader_that_stops_cleanly_hands_the_lease_over_at_once(jetstream):
    a, cand_a, stop_a, task_a = await candidate(jetstream, "ctl-a")
    await until(lambda: cand_a.leading, what="ctl-a to lead")
    b, cand_b, stop_b, task_b = await candidate(jetstream, "ctl-b")
    await asyncio.sleep(TTL / 2)
    assert not cand_b.leading
    stop_a.set()
    await task_a
    stopped = time.monotonic()
    await until(lambda: cand_b.leading, timeout=3 * TTL, what="ctl-b to take over")
    assert time.monotonic() - stopped < TTL / 2, time.monotonic() - stopped    # not after the lease expired
    stop_b.set()
    await task_b


def test_a_standby_rota_up_takes_over_from_a_killed_one(tmp_path):
    """Two `rota up` on one set of NATS servers (not their own: those die with them): kill -9 the leader,
    the standby leads, commands go on through it, scontrol ping says who leads."""
    import os
    import shutil
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from rota.controller import natsserver

    bin_dir = Path(sys.executable).parent
    conf = tmp_path / "slurm.conf"
    from rota.agents.agent import hostname

    conf.write_text(f"SlurmctldHost={hostname()}\nSlurmctldHost=ctl-elsewhere(10.0.0.9)\n"
                    "NodeName=gpu01 CPUs=8 RealMemory=16000\nPartitionName=p Nodes=gpu01 Default=YES\n")
    srv = natsserver.start(tmp_path / "nats")
    dirs = [tmp_path / "a", tmp_path / "b"]
    procs = []
    try:
        a_env = dict(os.environ, ROTA_STATE_DIR=str(dirs[0]))
        procs.append(subprocess.Popen([str(bin_dir / "rota"), "up", "--config", str(conf), "--nats", srv.url,
                                       "--no-agent"], env=a_env, stdout=open(tmp_path / "a.log", "w"),
                                      stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 30
        while not (dirs[0] / "cluster.json").exists():
            assert time.monotonic() < deadline, (tmp_path / "a.log").read_text()
            time.sleep(0.1)
        dirs[1].mkdir(mode=0o700)
        shutil.copy(dirs[0] / "cluster.key", dirs[1] / "cluster.key")
        b_env = dict(os.environ, ROTA_STATE_DIR=str(dirs[1]))
        procs.append(subprocess.Popen([str(bin_dir / "rota"), "up", "--config", str(conf), "--nats", srv.url,
                                       "--no-agent", "--standby"], env=b_env, stdout=open(tmp_path / "b.log", "w"),
                                      stderr=subprocess.STDOUT))
        while not (dirs[1] / "cluster.json").exists():
            assert time.monotonic() < deadline, (tmp_path / "b.log").read_text()
            time.sleep(0.1)

        def run(env, *cmd):
            return subprocess.run([str(bin_dir / cmd[0]), *cmd[1:]], env=env, capture_output=True, text=True,
                                  timeout=60)

        def projected(state_dir: Path, job: str) -> bool:
            """Whether the projection at ``state_dir`` holds ``job`` within a few seconds (read as it is: no read
            asks that projector to hurry)."""
            import sqlite3

            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    conn = sqlite3.connect(f"file:{state_dir / 'projections.sqlite'}?mode=ro", uri=True)
                    try:
                        if conn.execute("SELECT 1 FROM jobs WHERE job_id = ?", (int(job),)).fetchone():
                            return True
                    finally:
                        conn.close()
                except sqlite3.Error:
                    pass
                time.sleep(0.05)
            return False

        first = run(a_env, "sbatch", "--parsable", "--wrap", "true")
        assert first.returncode == 0, first.stderr
        assert projected(dirs[0], first.stdout) and projected(dirs[1], first.stdout)    # the leader's, the follower's
        ping = run(b_env, "scontrol", "ping").stdout.splitlines()
        assert ping == [f"Slurmctld(primary) at {hostname()} is UP", "Slurmctld(backup) at ctl-elsewhere is DOWN"], ping
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait()
        killed = time.monotonic()
        second = run(b_env, "sbatch", "--parsable", "--wrap", "true")   # waits out the lease, then lands
        assert second.returncode == 0 and int(second.stdout) == int(first.stdout) + 1, second.stderr
        print(f"kill -9 of the leading rota up -> the standby's sbatch answered in {time.monotonic() - killed:.2f} s")
        assert time.monotonic() - killed <= 15
        assert "this controller leads now" in (tmp_path / "b.log").read_text()
        assert projected(dirs[1], second.stdout)          # the new leader's projection, woken by its own appends
        assert run(b_env, "squeue", "-h", "-o", "%i").stdout.split() == [first.stdout.strip(), second.stdout.strip()]
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
        srv.stop()


async def test_on_three_servers_every_stream_bucket_and_store_keeps_three_copies(tmp_path):
    """A lease, an order queue or the snapshots on one server alone would stop the cluster while that
    server is away: all keep as many copies as the log, and one made with fewer (an older rota) is raised."""
    from nats.js.api import KeyValueConfig

    from rota.controller.eventlog import JetStreamLog
    from rota.controller.leadership import LEASE_BUCKET, LEASE_TTL, Lease
    from rota.controller.natscluster import start_cluster, wait_for_jetstream
    from rota.controller.snapshots import BUCKET, open_store
    from rota.wire import subjects as sj
    from rota.wire.jsqueue import ensure_streams

    servers = start_cluster(tmp_path / "cluster", 3)
    urls = [s.url for s in servers]
    try:
        await wait_for_jetstream(urls)
        lg = await JetStreamLog.connect(urls, replicas=3)
        await lg.js.create_key_value(KeyValueConfig(bucket=LEASE_BUCKET, ttl=LEASE_TTL, history=1))   # as an older rota made it
        lease = Lease(lg.js, "ctl-a", "host-a")      # the real lifetime: a server's death takes seconds to ride out
        await lease.open()
        await ensure_streams(lg.js)
        await open_store(lg.js)
        for stream in (f"KV_{LEASE_BUCKET}", sj.INBOX_STREAM, sj.ORDER_STREAM, f"OBJ_{BUCKET}"):
            assert (await lg.js.stream_info(stream)).config.num_replicas == 3, stream
        assert await lease.acquire(1)
        servers[0].kill()          # the bucket stays available: the lease is kept, or taken again at once
        deadline = time.monotonic() + 20
        held = False
        while not held and time.monotonic() < deadline:
            try:
                held = await lease.renew(2) or await lease.acquire(2)
            except Exception:  # noqa: BLE001 - the bucket's leader was on the dead server: a new one is elected
                pass
            await asyncio.sleep(0.2)
        assert held
        await lg.close()
    finally:
        for s in servers:
            s.stop()


async def test_the_report_queue_gives_back_a_lost_delivery_within_ten_seconds(jetstream):
    """A message handed to a reader whose server then died comes back after the queue's redelivery wait:
    ten seconds, also for a consumer an older rota made with thirty."""
    from rota.wire import subjects as sj
    from rota.wire.jsqueue import ACK_WAIT, ensure_streams, queue_config, work_queue

    lg = await jetstream()
    await ensure_streams(lg.js)
    await lg.js.add_consumer(sj.INBOX_STREAM, queue_config("controller", f"{sj.INBOX_PREFIX}.>", 30.0))
    reader = work_queue(lg.js, sj.INBOX_STREAM, f"{sj.INBOX_PREFIX}.>", "controller", batch=1, what="inbox")
    await lg.js.publish(f"{sj.INBOX_PREFIX}.n1", b"{}", stream=sj.INBOX_STREAM)
    first = (await asyncio.wait_for(reader.__anext__(), 10))[0]        # taken, never acknowledged
    began = time.monotonic()
    again = (await asyncio.wait_for(reader.__anext__(), 25))[0]
    assert again.metadata.sequence.stream == first.metadata.sequence.stream
    assert ACK_WAIT - 1 <= time.monotonic() - began <= ACK_WAIT + 8      # not the old 30 s or 60 s
    await again.ack()


async def _orders_of(batches, n: int) -> list:
    """The next ``n`` orders a reader hands out (within 15 s)."""
    got: list = []
    while len(got) < n:
        got += await asyncio.wait_for(batches.__anext__(), 15)
    return got


async def test_a_node_reads_its_orders_from_the_last_it_acted_on_through_a_consumer_it_makes_again(
        jetstream, tmp_path, monkeypatch):
    """An agent's order consumer is one copy in memory: lost (its server died), it is made again from the last
    order the agent acted on, kept on disk; a restarted agent goes on from there; a first read starts from
    now (a previous life's orders are not this one's), and no order of another node is read."""
    from nats.js.errors import NotFoundError

    from rota.wire import orderqueue
    from rota.wire import subjects as sj
    from rota.wire.jsqueue import OLD_ORDER_STREAM, ensure_streams
    from rota.wire.orderqueue import OrderMark, OrderReader, order_config

    monkeypatch.setattr(orderqueue, "CHECK_IDLE", 1.0)
    lg = await jetstream()
    js = lg.js
    await js.add_stream(name=OLD_ORDER_STREAM, subjects=["rota.assign.>"])       # an older rota's
    await ensure_streams(js)
    with pytest.raises(NotFoundError):
        await js.stream_info(OLD_ORDER_STREAM)

    async def order(text: str, node: str = "n1") -> int:
        return (await js.publish(f"{sj.ORDER_PREFIX}.{node}", text.encode(), stream=sj.ORDER_STREAM)).seq

    await order("a previous life's")
    path = tmp_path / "orders.json"
    reader = OrderReader(js, "n1", OrderMark(path))
    await reader.open()
    batches = reader.batches()
    await order("another node's", "n2")
    await order("a")
    b = await order("b")
    got = await _orders_of(batches, 2)
    assert [m.data for m in got] == [b"a", b"b"]
    await reader.done(got)
    assert json.loads(path.read_text())["seq"] == b
    # its server restarted: the consumer is back as first made, without what it delivered since
    await js.delete_consumer(sj.ORDER_STREAM, sj.agent_consumer("n1"))
    await js.add_consumer(sj.ORDER_STREAM, order_config("n1", 1))
    await order("c")
    got = await _orders_of(batches, 1)
    assert [m.data for m in got] == [b"c"] and reader.opened == 1        # a and b again: dropped
    await reader.done(got)
    await js.delete_consumer(sj.ORDER_STREAM, sj.agent_consumer("n1"))         # lost with its server
    await order("d")
    assert [m.data for m in await _orders_of(batches, 1)] == [b"d"] and reader.opened == 2
    again = OrderReader(js, "n1", OrderMark(path))     # restarted before it acted on d
    assert [m.data for m in await _orders_of(again.batches(), 1)] == [b"d"]
    info = await js.consumer_info(sj.ORDER_STREAM, sj.agent_consumer("n1"))
    assert info.config.num_replicas in (None, 0, 1) and info.config.mem_storage


async def test_a_nodes_orders_reach_it_within_seconds_when_the_server_holding_its_consumer_freezes(tmp_path):
    """The consumer is one copy on one server. Frozen, that server answers nothing, and the cluster gives it up
    only after its route pings (about 9 s), then never answers the consumer's removal: the agent hears no
    heartbeat from its reads and makes the consumer again on a server that answers, within seconds."""
    import signal

    from rota.controller.natscluster import start_cluster, wait_for_jetstream
    from rota.wire import natsconn
    from rota.wire import subjects as sj
    from rota.wire.jsqueue import ensure_streams
    from rota.wire.orderqueue import OrderMark, OrderReader

    servers = start_cluster(tmp_path / "cluster", 3)
    urls = [s.url for s in servers]
    conns = []
    frozen = None
    try:
        await wait_for_jetstream(urls)
        agent = await natsconn.connect(urls, "agent", dont_randomize=True)     # on the first server
        conns.append(agent)
        js = agent.jetstream(timeout=10)
        await ensure_streams(js, replicas=3)
        reader = OrderReader(js, "n1", OrderMark())
        for _ in range(20):                  # the consumer on a server other than the agent's
            await reader.open()
            host = (await js.consumer_info(sj.ORDER_STREAM, sj.agent_consumer("n1"))).cluster.leader
            if host != "rota-n1":
                break
        frozen = servers[int(host.rsplit("n", 1)[1]) - 1]
        pub = await natsconn.connect([s.url for s in servers if s is not frozen], "controller", dont_randomize=True)
        conns.append(pub)
        pjs = pub.jetstream(timeout=2)
        batches = reader.batches()
        await pjs.publish(f"{sj.ORDER_PREFIX}.n1", b"before", stream=sj.ORDER_STREAM)
        first = await _orders_of(batches, 1)
        assert [m.data for m in first] == [b"before"]
        await reader.done(first)
        frozen.process.send_signal(signal.SIGSTOP)
        while True:                          # the stream's leader may have been the frozen one
            try:
                await pjs.publish(f"{sj.ORDER_PREFIX}.n1", b"after", stream=sj.ORDER_STREAM)
                break
            except Exception:  # noqa: BLE001 - electing another
                await asyncio.sleep(0.2)
        sent = time.monotonic()
        got = await asyncio.wait_for(batches.__anext__(), 30)
        assert [m.data for m in got] == [b"after"]
        assert time.monotonic() - sent < 8.0          # 15 s and more before the reads asked for heartbeats
    finally:
        if frozen is not None:
            frozen.process.send_signal(signal.SIGCONT)
        for nc in conns:
            await nc.close()
        for s in servers:
            s.stop()


async def test_a_signer_beside_the_leading_controller_is_answered_in_process_and_checked_as_over_nats(
        jetstream, tmp_path):
    """``rota up``'s signer hands its requests to the controller of its own process while that leads: the
    same credential check, the same answer; a controller that does not lead leaves them to NATS."""
    import json

    from rota.agents.signer import Signer
    from rota.wire.keys import Keyring
    from rota.wire.subjects import unpack_reply

    keyring = Keyring(cluster_key=b"k" * 64)
    lg = await jetstream(keyring=keyring)
    c = Controller(lg, config=CFG, debounce=0.01, cycle_interval=0.5, name="ctl", keyring=keyring)
    await c.load()
    await c.lead("ctl", "host-ctl")
    import nats

    own = await nats.connect(jetstream.url)              # the signer's connection, apart from the log's
    signer = Signer(str(tmp_path / "run" / "rota.sock"), "gpu01", keyring, own)
    signer.local = c.local_request
    assert await c.local_request("rota.api.ping", {}, b"{}") is None     # not serving yet: NATS carries it
    await c.serve(lg.nc)
    try:
        body = json.dumps({"spec": spec(name="local")}).encode()
        got = json.loads(unpack_reply("r1", await signer.forward("submit", "r1", body, 0, 0)))
        assert got["ok"] and c.state.jobs[got["job_id"]].spec.name == "local"
        await own.close()                # nothing goes through NATS now: the answer comes in process
        again = json.loads(unpack_reply("r2", await signer.forward("submit", "r2", body, 0, 0)))
        assert again["ok"] and again["job_id"] == got["job_id"] + 1
        # the credential is checked as over NATS: another cluster's signature is refused
        forger = Signer("/nonexistent", "gpu01", Keyring(cluster_key=b"x" * 64), None)
        forger.local = c.local_request
        refused = json.loads(unpack_reply("r3", await forger._ask_local("rota.api.submit", "r3", body, 0, 0, 3.0)))
        assert not refused["ok"] and refused["code"] == "auth", refused
        assert len(c.state.jobs) == 2
    finally:
        await c.stop()
