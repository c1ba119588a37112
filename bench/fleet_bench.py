"""A fleet: many simulated nodes against one `rota up`, over the real NATS, with the real signing.

    python -m rota.bench.fleet_bench [--nodes 1000] [--procs 4] [--jobs 10000] [--run-for 1] [--servers 3]

Each simulated node is a lightweight agent in a worker process (``--procs`` of them, the nodes shared out):
its own NATS connection under its node's credentials, the real registration (8 A100s, 64 CPUs), signed
heartbeats every 5 s, and the consumer of its own orders that an agent makes; a launch order is answered by a signed
JobExited (COMPLETED) ``--run-for`` seconds later, without running anything. What is measured:

- the registration storm: every node started at once, the time until the controller has all of them;
- the controller's CPU (rota up's process: controller, projection, signer) at rest with the fleet's heartbeats;
- an array of ``--jobs`` one-GPU jobs: from the submit to every task started, the launch rate, and the
  controller's CPU meanwhile;
- a failure wave: 5 % of the nodes fall silent at once; the time until the controller has marked them all.

``--servers 3``: the same against a NATS cluster of three servers (JetStream R3, rota's roles) with two
controllers, one leading and one standing by, as in production; the CPU figures are then the leader's.

The fleet's own message counts give the NATS message rates. On a 2-core machine the fleet, NATS and
rota up share the two cores, so rota up's CPU is measured, not the machine's.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from rota.cli.client import NoCluster

from .common import Figure, cpu_seconds, print_table

BIN = Path(sys.executable).parent
HEARTBEAT = 5.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------- the simulated nodes (worker processes)

class FakeNode:
    """One node's agent, as little of it as the protocol needs."""

    def __init__(self, name: str, keyring, url: str, run_for: float, counts: dict) -> None:
        self.name, self.keyring, self.url, self.run_for, self.counts = name, keyring, url, run_for, counts
        self.key = keyring.key_of(name)
        self.running: set[int] = set()
        self.tasks: list[asyncio.Task] = []
        self.ends: set[asyncio.Future] = set()      # job ends being reported
        self.nc: Any = None
        self.js: Any = None
        self.reader: Any = None

    def sign(self, subject: str, body: bytes) -> str:
        from rota.core import credentials

        return credentials.issue(self.key, "node", 0, 0, self.name, int(time.time()), os.urandom(16).hex(),
                                 subject, body)

    async def start(self) -> None:
        from rota.core import events as ev
        from rota.wire import natsconn

        from rota.wire.orderqueue import OrderMark, OrderReader

        self.nc = await natsconn.connect(self.url, f"agent {self.name}", keyring=self.keyring, host=self.name)
        self.js = self.nc.jetstream(timeout=30)
        self.reader = OrderReader(self.js, self.name, OrderMark())
        await self.reader.open()
        gpus = tuple(ev.GpuInfo(index=i, uuid=f"GPU-{self.name}-{i}", model="NVIDIA A100-SXM4-80GB", type="a100",
                                memory=81920) for i in range(8))
        await self.report(ev.NodeRegistered(node=self.name, cpus=64, memory=257000, gpus=gpus, agent_version="fleet"))
        self.tasks = [asyncio.create_task(self._heartbeats()), asyncio.create_task(self._orders())]

    async def report(self, event) -> None:
        from rota.core import events as ev
        from rota.wire import subjects as sj

        body = ev.EVENT_ADAPTER.dump_json(event)
        subject = f"{sj.INBOX_PREFIX}.{self.name}"
        headers = {"Nats-Msg-Id": f"{self.name}-{uuid.uuid4().hex}", sj.CRED_HEADER: self.sign(subject, body)}
        while True:
            try:
                await self.js.publish(subject, body, stream=sj.INBOX_STREAM, headers=headers)
                self.counts["reports"] += 1
                return
            except Exception:  # noqa: BLE001 - the server is busy: again
                await asyncio.sleep(0.5)

    async def _heartbeats(self) -> None:
        from rota.core.orders import Heartbeat
        from rota.wire import subjects as sj

        subject = f"{sj.HEARTBEAT_PREFIX}.{self.name}"
        await asyncio.sleep(random.random() * HEARTBEAT)
        while True:
            mark = self.reader.mark
            body = Heartbeat(running=tuple(sorted(self.running)), orders=mark.seq,
                             order_stream=mark.stream or "").model_dump_json().encode()
            await self.nc.publish(subject, body, headers={sj.CRED_HEADER: self.sign(subject, body)})
            self.counts["heartbeats"] += 1
            await asyncio.sleep(HEARTBEAT)

    async def _orders(self) -> None:
        from rota.core import credentials
        from rota.core.orders import Launch
        from rota.wire import orders as wire_orders
        from rota.wire import subjects as sj
        from rota.wire.jsqueue import stored_at

        replay = credentials.ReplayCache()
        async for msgs in self.reader.batches():
            for msg in msgs:
                credentials.verify(lambda host: self.key if host == self.name else None,
                                   (msg.headers or {}).get(sj.CRED_HEADER), msg.subject, msg.data,
                                   stored_at(msg, int(time.time())), kind="ctl", replay=replay)
                order = wire_orders.decode(msg.data)
                self.counts["orders"] += 1
                if isinstance(order, Launch) and order.job_id not in self.running:
                    self.running.add(order.job_id)
                    asyncio.get_running_loop().call_later(self.run_for, self._end, order.job_id)
            await self.reader.done(msgs)

    def _end(self, job_id: int) -> None:
        task = asyncio.ensure_future(self._exited(job_id))
        self.ends.add(task)
        task.add_done_callback(self.ends.discard)

    async def _exited(self, job_id: int) -> None:
        from rota.core import events as ev

        await self.report(ev.JobExited(job_id=job_id, state="COMPLETED", node=self.name, elapsed=int(self.run_for)))
        self.running.discard(job_id)

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.nc.close()


async def _worker(names: list[str], url: str, key_path: str, run_for: float, status: str) -> None:
    """Run ``names`` until SIGTERM; SIGUSR1 silences the first 5 % of the whole fleet held here (a failure
    wave); the counts of messages sent and received are written to ``status`` every second."""
    import logging

    from rota.wire.keys import load_keyring

    logging.basicConfig(level=logging.ERROR)      # the nodes wait quietly for their consumers to be made
    keyring = load_keyring(key_path)
    counts = {"heartbeats": 0, "reports": 0, "orders": 0}
    nodes = [FakeNode(n, keyring, url, run_for, counts) for n in names]
    await asyncio.gather(*(n.start() for n in nodes))
    stop, fail = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, fail.set)
    failed: list[str] = []
    while not stop.is_set():
        if fail.is_set() and not failed:
            wave = nodes[:max(1, len(nodes) // 20)]
            failed = [n.name for n in wave]
            await asyncio.gather(*(n.stop() for n in wave))
        remade = sum(max(0, n.reader.opened - 1) for n in nodes if n.reader is not None)
        Path(status).write_text(json.dumps({**counts, "remade": remade, "failed": failed, "t": time.time()}))
        try:
            await asyncio.wait_for(stop.wait(), timeout=1.0)
        except asyncio.TimeoutError:
            pass
    ends = [t for n in nodes for t in n.ends]
    for t in ends:
        t.cancel()
    await asyncio.gather(*ends, return_exceptions=True)


# ---------------------------------------------------------------- the benchmark (main process)

def _machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far (/proc/stat)."""
    v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = v[3] + v[4]
    return (sum(v) - idle) / CLK_TCK, sum(v) / CLK_TCK


def _cpu_share(pid: int, seconds: float) -> float:
    """rota up's CPU over ``seconds``, as a share of one core."""
    c0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(pid) - c0) / (time.monotonic() - t0)


def _ask(verb: str, body: dict | None = None) -> dict:
    from rota.cli.client import request

    return request(verb, body or {}, timeout=120.0)


def _wait(check, timeout: float, what: str, every: float = 0.5) -> float:
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 > timeout:
            raise SystemExit(f"fleet_bench: {what} did not happen within {timeout:.0f} s")
        time.sleep(every)
    return time.monotonic() - t0


def _counts(status: list[Path]) -> dict:
    total = {"heartbeats": 0, "reports": 0, "orders": 0, "remade": 0, "failed": []}
    for p in status:
        try:
            d = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        for k in ("heartbeats", "reports", "orders", "remade"):
            total[k] += d[k]
        total["failed"] += d["failed"]
    return total


def _config(nodes: int) -> str:
    return (f"GresTypes=gpu\nMaxJobCount=1000000\nMaxArraySize=100001\n"
            f"SchedulerParameters=rota_max_submit_per_user=1000000\n"
            f"NodeName=f[0001-{nodes:04d}] CPUs=64 RealMemory=257000 Gres=gpu:a100:8\n"
            f"PartitionName=gpu Nodes=f[0001-{nodes:04d}] Default=YES MaxTime=1-0\n")


def _node_states() -> dict[str, str]:
    return {n["name"]: n["state"] for n in _ask("nodes")["nodes"]}


class Fleet:
    """Where the benchmark runs: one ``rota up`` on its embedded NATS server, or (``servers`` 3) a NATS
    cluster with a leading controller and a standby, as :mod:`ops/fault_drill` lays it out (without TLS)."""

    def __init__(self, base: Path, nodes: int, timeout: float, servers: int = 1) -> None:
        self.base, self.nodes, self.timeout, self.servers = base, nodes, timeout, servers
        self.procs: dict[str, subprocess.Popen] = {}
        (base / "slurm.conf").write_text(_config(nodes))
        self.url = ""
        self.key = ""

    @property
    def leader(self) -> subprocess.Popen:
        return self.procs["ctl-a"]

    def start(self) -> None:
        if self.servers == 1:
            state = self.base / "state"
            os.environ.update(ROTA_STATE_DIR=str(state), ROTA_WEB_PORT="0")
            self._up("ctl-a", state)
            self.url, self.key = json.loads((state / "cluster.json").read_text())["nats"], str(state / "cluster.key")
            return
        self._cluster()

    def _rota(self, *args: str) -> None:
        subprocess.run([str(BIN / "rota"), *args], check=True, capture_output=True)

    def _cluster(self) -> None:
        from rota.agents.agent import hostname
        from rota.controller.natscluster import start_cluster, wait_for_jetstream
        from rota.wire.keys import load_keyring
        from rota.wire.natsauth import connect_options

        key = self.base / "cluster.key"
        self._rota("keygen", str(key))
        self._rota("keygen", str(key), "--nats-auth", str(self.base / "auth.conf"), "--config",
                   str(self.base / "slurm.conf"), "--login-host", hostname())
        servers = start_cluster(self.base / "nats", self.servers, "fleet", (self.base / "auth.conf").read_text())
        self.procs.update((f"nats{i + 1}", s.process) for i, s in enumerate(servers))
        self.url, self.key = ",".join(s.url for s in servers), str(key)
        asyncio.run(wait_for_jetstream(self.url.split(","), options=connect_options(load_keyring(str(key)))))
        for name in ("ctl-a", "ctl-b"):
            (self.base / name).mkdir(mode=0o700)
            shutil.copy(key, self.base / name / "cluster.key")
            self._up(name, self.base / name, "--nats", self.url, *(["--standby"] if name == "ctl-b" else []))
        os.environ.update(ROTA_STATE_DIR=str(self.base / "ctl-a"), ROTA_WEB_PORT="0")

    def _launch(self, name: str, cmd: list[str], env: dict | None = None) -> None:
        self.procs[name] = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL,
                                            stdout=open(self.base / f"{name}.log", "w"), stderr=subprocess.STDOUT)

    def _up(self, name: str, state: Path, *extra: str) -> None:
        env = dict(os.environ, ROTA_STATE_DIR=str(state), ROTA_WEB_PORT="0")
        self._launch(name, [str(BIN / "rota"), "up", "--config", str(self.base / "slurm.conf"), "--no-agent",
                            "--node-timeout", str(self.timeout), *extra], env)
        _wait(lambda: (state / "cluster.json").exists(), 60, f"rota up ({name}; see {self.base / name}.log)")

    def stop(self) -> None:
        order = [p for n, p in self.procs.items() if n.startswith("ctl")] + \
                [p for n, p in self.procs.items() if not n.startswith("ctl")]
        for p in order:
            p.send_signal(signal.SIGINT)
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()

    def others_cpu(self) -> float:
        """CPU seconds so far of every process but the leader (the standby, the NATS servers)."""
        return sum(cpu_seconds(p.pid) for n, p in self.procs.items() if n != "ctl-a" and p.poll() is None)


def run(nodes: int = 1000, procs: int = 4, jobs: int = 10_000, run_for: float = 1.0, timeout: float = 30.0,
        servers: int = 1) -> list[Figure]:
    fleet = Fleet(Path(tempfile.mkdtemp(prefix="rota-fleet-")), nodes, timeout, servers)
    workers: list[subprocess.Popen] = []
    status = [fleet.base / f"fleet-{i}.json" for i in range(procs)]
    how = f"python -m rota.bench.fleet_bench --nodes {nodes} --procs {procs} --jobs {jobs}" + \
        (f" --servers {servers}" if servers > 1 else "")
    where = "" if servers == 1 else f" ({servers} NATS servers, a standby)"
    figures: list[Figure] = []
    try:
        fleet.start()
        pid = fleet.leader.pid
        names = [f"f{i:04d}" for i in range(1, nodes + 1)]
        t0 = time.monotonic()
        for i in range(procs):
            workers.append(subprocess.Popen([sys.executable, "-m", "rota.bench.fleet_bench", "--worker",
                                             ",".join(names[i::procs]), "--nats", fleet.url, "--key", fleet.key,
                                             "--run-for", str(run_for), "--status", str(status[i])]))
        _wait(lambda: sum(1 for s in _node_states().values() if s == "IDLE") == nodes, 600, "every registration", 1.0)
        storm = time.monotonic() - t0
        figures.append(Figure(f"fleet{where}: {nodes:,} nodes registered, all started at once", storm, "s", "", None,
                              how, f"{procs} worker processes, each node its own NATS connection"))
        time.sleep(2 * HEARTBEAT)
        c0, m0, o0 = time.monotonic(), _counts(status), fleet.others_cpu()
        rest = _cpu_share(pid, 20.0)
        m1, spent = _counts(status), time.monotonic() - c0
        beat_rate = (m1["heartbeats"] - m0["heartbeats"]) / spent
        others = "" if servers == 1 else \
            f"; the standby and the NATS servers together {(fleet.others_cpu() - o0) / spent:.0%} of a core"
        figures.append(Figure(f"fleet{where}: the leader's CPU at rest, {nodes:,} nodes at {HEARTBEAT:g} s heartbeats",
                              rest * 100, "% of a core", "<= 10 %", rest <= 0.10, how,
                              f"{beat_rate:.0f} signed heartbeats/s reaching the controller{others}"))
        figures += _array(jobs, pid, status, how, [w.pid for w in workers], where)
        wave = sum(max(1, len(names[i::procs]) // 20) for i in range(procs))
        figures += _failure_wave(workers, status, wave, timeout, how, where)
    except NoCluster as exc:
        raise SystemExit(f"fleet_bench: {exc}: the controllers' and servers' logs are in {fleet.base}") from None
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            try:
                w.wait(30)
            except subprocess.TimeoutExpired:
                w.kill()
        fleet.stop()
    return figures


def _array(jobs: int, pid: int, status: list[Path], how: str, fleet: list[int], where: str = ""
           ) -> list[Figure]:
    """An array of one-GPU tasks over the fleet: submit to every task started, and the CPU meanwhile (rota up's,
    the fleet's processes', the machine's)."""
    before = _ask("metrics")
    ended0 = before["seq"]
    m0, c0 = _counts(status), cpu_seconds(pid)
    f0, (b0, a0) = sum(cpu_seconds(w) for w in fleet), _machine_busy()
    t0 = time.monotonic()
    r = subprocess.run([str(BIN / "sbatch"), "--parsable", f"--array=1-{jobs}", "--gres=gpu:1", "-t", "10", "-o",
                        "/dev/null", "--wrap", "true"], capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"fleet_bench: sbatch failed: {r.stderr}")
    array = int(r.stdout.strip().split(";")[0])

    def all_started() -> bool:
        m = _ask("metrics")
        return m["pending"] == 0
    _wait(all_started, 900, "every task started", 0.2)
    took = time.monotonic() - t0
    cpu = (cpu_seconds(pid) - c0) / took
    m1 = _counts(status)
    orders = m1["orders"] - m0["orders"]
    _wait(lambda: _counts(status)["orders"] - m0["orders"] >= jobs, 900, "every launch order delivered", 0.2)
    delivered = time.monotonic() - t0
    fleet_cpu = (sum(cpu_seconds(w) for w in fleet) - f0) / delivered
    b1, a1 = _machine_busy()
    machine = (b1 - b0) / max(1e-9, a1 - a0)
    _wait(lambda: _ask("metrics")["running"] == 0, 900, "every task ended", 0.5)
    done = time.monotonic() - t0
    m2 = _counts(status)
    events = _ask("metrics")["seq"] - ended0
    return [Figure(f"fleet{where}: array of {jobs:,} one-GPU tasks, submit to every task started", took, "s", "", None, how,
                   f"array job {array}; {orders:,} launch orders delivered meanwhile"),
            Figure(f"fleet{where}: launch rate (tasks started per second, as the log decided them)", jobs / took, "tasks/s",
                   ">= 500", jobs / took >= 500, how),
            Figure(f"fleet{where}: launch orders received by the nodes per second (submit to the last delivered)",
                   jobs / delivered, "orders/s", ">= 500", jobs / delivered >= 500, how,
                   f"the last order reached its node {delivered:.1f} s after the submit"),
            Figure(f"fleet{where}: the leader's CPU while the array starts", cpu * 100, "% of a core", "", None, how),
            Figure(f"fleet{where}: the simulated nodes' own CPU meanwhile (all worker processes)", fleet_cpu * 100,
                   "% of a core", "", None, how, f"the machine was {machine:.0%} busy (all its cores) while orders "
                   "were delivered: beyond ~90 % the figures above are this machine's, not rota's"),
            Figure(f"fleet{where}: messages through NATS during the array (orders + reports + heartbeats, per second)",
                   ((m2["orders"] - m0["orders"]) + (m2["reports"] - m0["reports"])
                    + (m2["heartbeats"] - m0["heartbeats"])) / done, "msgs/s", "", None, how,
                   f"{events:,} events appended in {done:.0f} s, submit to the last end"),
            Figure(f"fleet{where}: order consumers made again while the array ran (taken for silent or lost)",
                   m2["remade"] - m0["remade"], "consumers", "0", m2["remade"] == m0["remade"], how,
                   "reads with no heartbeat from its consumer's server for 4 s make it again")]


def _failure_wave(workers: list[subprocess.Popen], status: list[Path], expected: int, timeout: float,
                  how: str, where: str = "") -> list[Figure]:
    """A twentieth of the fleet (of each worker's nodes) falls silent at once: the time until the controller has
    them all DOWN."""
    for w in workers:
        w.send_signal(signal.SIGUSR1)
    t0 = time.monotonic()
    _wait(lambda: len(_counts(status)["failed"]) >= expected, 30, "the failure wave")
    failed = _counts(status)["failed"]

    def marked() -> bool:
        states = _node_states()
        return all(states.get(n) == "DOWN" for n in failed)
    _wait(marked, 10 * timeout, "the silent nodes DOWN", 0.5)
    took = time.monotonic() - t0
    return [Figure(f"fleet{where}: {len(failed)} nodes fall silent at once, until all are DOWN", took, "s",
                   f"<= {timeout + 2 * HEARTBEAT:g} s", took <= timeout + 2 * HEARTBEAT, how,
                   f"node timeout {timeout:g} s")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--run-for", type=float, default=1.0)
    ap.add_argument("--node-timeout", type=float, default=30.0)
    ap.add_argument("--servers", type=int, choices=(1, 3), default=1,
                    help="3: a NATS cluster of 3 servers, with a leading controller and a standby")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--nats", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--key", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--status", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        asyncio.run(_worker(args.worker.split(","), args.nats, args.key, args.run_for, args.status))
        return
    figures = run(args.nodes, args.procs, args.jobs, args.run_for, args.node_timeout, args.servers)
    print_table(figures, "rota fleet benchmark (one run)")


if __name__ == "__main__":
    main()
