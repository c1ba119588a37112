"""A fault drill in the production layout: 3 NATS servers (JetStream, R3, TLS, rota's roles), 2
controllers (one leads, one stands by), 4 agents with their own host keys, and submitters running `sbatch`
through the agents' signers, while each piece in turn is killed (-9) and brought back, frozen (SIGSTOP)
and continued, and cut off from the network and reconnected. Then the log is read back and checked.

    python ops/fault_drill.py [--jobs 400] [--submitters 4] [--hold 30] [--short] [--faults nats2:cut,...] [--dir DIR]

As root with `ip` (iproute2), every piece runs in a network namespace of its own on one bridge, so a
partition is `ip link set ... down` on its side of the bridge; otherwise everything runs on loopback and
the partitions are left out (said so in the output). With `openssl`, the servers speak TLS.

The pieces: each NATS server, the leading controller, the standby, an agent (n4; submitters use the other
three agents' signers). ``--hold``: how long a freeze or a partition lasts. ``--short``: one fault of each
kind (for CI) instead of all of them on every piece.

After each fault the drill waits until every NATS stream and consumer has a leader and current copies again
(a server back from a partition can depose them all) before the next, so that each fault meets a whole
cluster. It prints, per fault, the longest wait for an acknowledged submit, the longest stretch without a
recorded start that began then, how long NATS took to be whole again, the takeover times, and the counts
that must be zero: acknowledged submits lost, duplicate starts of one run, jobs that never ended, jobs that
ended other than COMPLETED (their jobs are `sleep 0.1`: anything else was wrongly failed). Exit status 1
when one is not.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

BIN = Path(sys.executable).parent
SERVERS = ("nats1", "nats2", "nats3")
CONTROLLERS = ("ctl-a", "ctl-b")
NODES = ("n1", "n2", "n3", "n4")
STOPPED_AGENT = "n4"            # the agent that faults; submitters use the others' signers
CONF = ("MaxJobCount=1000000\nNodeName=n[1-4] CPUs=4 RealMemory=16000\n"
        "PartitionName=p Nodes=n[1-4] Default=YES MaxTime=10:00\n")
NODE_TIMEOUT = 90               # longer than any hold: a frozen or cut-off agent is not a dead node
PIECES = ("nats1", "nats2", "nats3", "leader", "standby", "agent")
FAULTS = ("kill", "stop", "cut")
SHORT = (("leader", "kill"), ("leader", "stop"), ("nats2", "kill"), ("agent", "stop"), ("nats3", "cut"),
         ("leader", "cut"), ("standby", "kill"))
GAP = 5.0                       # seconds of calm after each fault (once NATS is whole again) before the next
WHOLE_WAIT = 120.0              # seconds a fault's recovery is waited for before the next fault comes anyway
STALL_SHOWN = 10                # a scheduling stall longer than this (seconds) is shown record by record
LOST = "NEVER SUBMITTED"        # an acknowledged job the log never made (counted with the lost submits)


class Network:
    """Where the pieces live: each in a network namespace of its own on one bridge (so one can be cut off),
    or, where namespaces cannot be made, all on loopback."""

    def __init__(self) -> None:
        self.tag = f"{os.getpid() % 100000}"
        self.subnet = f"10.77.{os.getpid() % 250}"
        self.bridge = f"rdb{self.tag}"
        self.index: dict[str, int] = {}
        self.isolated = self._try_bridge()

    def _ip(self, *args: str, ns: str | None = None) -> None:
        cmd = (["ip", "netns", "exec", ns, "ip"] if ns else ["ip"]) + list(args)
        subprocess.run(cmd, check=True, capture_output=True)

    def _try_bridge(self) -> bool:
        if os.geteuid() != 0 or shutil.which("ip") is None:
            self.why_not = "not root, or no `ip` command"
            return False
        try:
            self._ip("link", "add", self.bridge, "type", "bridge")
            self._ip("addr", "add", f"{self.subnet}.254/24", "dev", self.bridge)
            self._ip("link", "set", self.bridge, "up")
            return True
        except subprocess.CalledProcessError as exc:
            self.why_not = f"network namespaces unavailable: {exc.stderr.decode().strip()}"
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
            return False

    def ns(self, piece: str) -> str:
        return f"rota-drill-{self.tag}-{piece}"

    def veth(self, piece: str) -> str:
        return f"rd{self.tag}v{self.index[piece]}"

    def add(self, piece: str) -> str:
        """A place for ``piece``; returns its address."""
        if not self.isolated:
            return "127.0.0.1"
        if piece not in self.index:
            k = self.index[piece] = len(self.index) + 1
            ns, outside, inside = self.ns(piece), self.veth(piece), f"rd{self.tag}p{k}"
            subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True)
            self._ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            self._ip("link", "set", inside, "netns", ns)
            self._ip("link", "set", outside, "master", self.bridge, "up")
            self._ip("link", "set", "lo", "up", ns=ns)
            self._ip("link", "set", inside, "name", "eth0", ns=ns)
            self._ip("addr", "add", f"{self.subnet}.{k}/24", "dev", "eth0", ns=ns)
            self._ip("link", "set", "eth0", "up", ns=ns)
        return f"{self.subnet}.{self.index[piece]}"

    def wrap(self, piece: str, cmd: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns(piece)] + cmd if self.isolated else cmd

    def cut(self, piece: str) -> None:
        self._ip("link", "set", self.veth(piece), "down")

    def heal(self, piece: str) -> None:
        self._ip("link", "set", self.veth(piece), "up")

    def close(self) -> None:
        if self.isolated:
            for piece in self.index:
                subprocess.run(["ip", "netns", "del", self.ns(piece)], capture_output=True)
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)


@dataclass
class Fault:
    """One fault as it happened: what, to which process, when (monotonic and wall clock)."""
    what: str
    t0: float
    wall0: float
    takeover: float | None = None
    whole: float | None = None      # seconds from the piece's return until every NATS stream and consumer had
                                    # its leader and all its copies current again (None: not within WHOLE_WAIT)


class Drill:
    def __init__(self, base: Path, jobs: int, submitters: int, hold: float, short: bool,
                 only: list[tuple[str, str]] | None = None) -> None:
        self.base, self.jobs, self.submitters, self.hold = base, jobs, submitters, hold
        self.plan = only or (list(SHORT) if short else [(p, f) for p in PIECES for f in FAULTS])
        self.procs: dict[str, subprocess.Popen] = {}
        self.acked: list[tuple[float, int]] = []          # (when, job id) of every acknowledged submit
        self.refused: list[str] = []
        self.lock = threading.Lock()
        self.faults: list[Fault] = []
        self.net = Network()
        if not self.net.isolated:
            self.plan = [(p, f) for p, f in self.plan if f != "cut"]
        self.tls_ca: str | None = None

    # ---------------------------------------------------------------- the cluster

    def start(self) -> None:
        from rota.controller import natsserver
        from rota.controller.natscluster import wait_for_jetstream

        (self.base / "slurm.conf").write_text(CONF)
        key = self.base / "cluster.key"
        self._rota("keygen", str(key))
        for node in NODES:
            (self.base / node).mkdir(mode=0o700, exist_ok=True)
            self._rota("keygen", str(key), "--host", node, "--out", str(self.base / node / "host.key"))
        from rota.agents.agent import hostname

        self._rota("keygen", str(key), "--nats-auth", str(self.base / "auth.conf"), "--config",
                   str(self.base / "slurm.conf"), "--login-host", hostname())   # the controllers' signers
        for name in CONTROLLERS:
            (self.base / name).mkdir(mode=0o700, exist_ok=True)
            shutil.copy(key, self.base / name / "cluster.key")
        self.addr = {p: self.net.add(p) for p in SERVERS + CONTROLLERS + NODES}
        tls = self._certificates()
        ports = {s: (4222, 6222) if self.net.isolated else (natsserver.free_port(), natsserver.free_port())
                 for s in SERVERS}
        scheme = "tls" if tls else "nats"
        self.urls = ",".join(f"{scheme}://{self.addr[s]}:{ports[s][0]}" for s in SERVERS)
        self.server_cmd = {}
        for s in SERVERS:
            routes: list[int | str] = [f"{self.addr[o]}:{ports[o][1]}" for o in SERVERS if o != s]
            conf = self.base / s / "nats-server.conf"
            conf.parent.mkdir(mode=0o700, exist_ok=True)
            natsserver.write_config(conf, ports[s][0], self.base / s / "jetstream", cluster=("drill", ports[s][1], routes),
                                    server_name=s, authorization=(self.base / "auth.conf").read_text(), tls=tls,
                                    host=self.addr[s])
            self.server_cmd[s] = [natsserver.find_binary(), "-c", str(conf)]
            self._launch(s, self.server_cmd[s])
        asyncio.run(wait_for_jetstream(self.urls.split(","), options=self._controller_options()))
        self._controller("ctl-a", standby=False)
        self._wait_file(self.base / "ctl-a" / "cluster.json", "ctl-a")
        self._controller("ctl-b", standby=True)
        self._wait_file(self.base / "ctl-b" / "cluster.json", "ctl-b")
        for node in NODES:
            self._agent(node)
        for node in NODES:
            self._wait_file(self.base / node / "run" / "rota.sock", node)

    def _rota(self, *args: str) -> None:
        subprocess.run([str(BIN / "rota"), *args], check=True, capture_output=True)

    def _certificates(self) -> dict[str, str] | None:
        """A private CA and one certificate for all three servers' addresses (when openssl is here)."""
        if shutil.which("openssl") is None:
            return None
        d = self.base / "tls"
        d.mkdir(mode=0o700, exist_ok=True)
        sans = ",".join(sorted({f"IP:{self.addr[s]}" for s in SERVERS} | {"IP:127.0.0.1"}))
        (d / "ext.cnf").write_text(f"subjectAltName={sans}\n")
        for cmd in (["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
                     "-days", "2", "-subj", "/CN=rota drill CA"],
                    ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
                     "-subj", "/CN=nats"],
                    ["x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                     "-out", "server.pem", "-days", "2", "-extfile", "ext.cnf"]):
            subprocess.run(["openssl", *cmd], check=True, capture_output=True, cwd=d)
        self.tls_ca = str(d / "ca.pem")
        return {"cert_file": str(d / "server.pem"), "key_file": str(d / "server.key"), "ca_file": self.tls_ca}

    def _controller_options(self) -> dict:
        from rota.wire.keys import load_keyring
        from rota.wire.natsauth import connect_options

        return connect_options(load_keyring(str(self.base / "cluster.key")), None, self.tls_ca)

    def _launch(self, piece: str, cmd: list[str], env: dict | None = None) -> None:
        self.procs[piece] = subprocess.Popen(self.net.wrap(piece, cmd), env=env, stdin=subprocess.DEVNULL,
                                             stdout=open(self.base / f"{piece}.log", "a"), stderr=subprocess.STDOUT)

    def _controller(self, name: str, standby: bool) -> None:
        env = dict(os.environ, ROTA_STATE_DIR=str(self.base / name))
        cmd = [str(BIN / "rota"), "up", "--config", str(self.base / "slurm.conf"), "--nats", self.urls, "--no-agent",
               "--node-timeout", str(NODE_TIMEOUT)] + (["--tls-ca", self.tls_ca] if self.tls_ca else [])
        self._launch(name, cmd + (["--standby"] if standby else []), env)

    def _agent(self, node: str) -> None:
        cmd = [str(BIN / "rota"), "agent", "--node", node, "--nats", self.urls, "--state-dir", str(self.base / node),
               "--key", str(self.base / node / "host.key"), "--cpus", "4", "--memory", "16000",
               "--heartbeat", "1", "--kill-wait", "2", "--no-cgroups"]
        self._launch(node, cmd + (["--tls-ca", self.tls_ca] if self.tls_ca else []))

    def _wait_file(self, path: Path, who: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not path.exists():
            if time.monotonic() > deadline:
                raise SystemExit(f"{who} did not start: see {self.base / (who + '.log')}")
            time.sleep(0.1)

    def stop(self) -> None:
        for piece in list(self.net.index):
            try:
                self.net.heal(piece)
            except subprocess.CalledProcessError:
                pass
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGCONT)
                    p.send_signal(signal.SIGINT)
                except ProcessLookupError:
                    pass
        for p in self.procs.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        self.net.close()

    # ---------------------------------------------------------------- the workload

    def planned_seconds(self) -> float:
        """How long the faults are expected to take (the submitters spread their jobs over it): a fault, the
        wait for NATS to be whole again (about 10 s after a server's return), the calm after."""
        return sum(self.hold + GAP + 6 + (10 if piece in SERVERS else 2) for piece, _ in self.plan) + 10

    def submitter(self, k: int, count: int, rate: float) -> None:
        node = NODES[k % 3]
        env = dict(os.environ, ROTA_SOCKET=str(self.base / node / "run" / "rota.sock"))
        began = time.monotonic()
        for i in range(count):
            wait = began + i / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            r = subprocess.run([str(BIN / "sbatch"), "--parsable", "-t", "1", "--wrap", "sleep 0.1"], env=env,
                               capture_output=True, text=True, timeout=120, cwd=self.base)   # its output files there
            with self.lock:
                if r.returncode == 0 and r.stdout.strip().isdecimal():
                    self.acked.append((time.monotonic(), int(r.stdout)))
                else:
                    self.refused.append(r.stderr.strip()[-200:])

    def faults_while_submitting(self) -> None:
        per = self.jobs // self.submitters
        rate = per / self.planned_seconds()
        threads = [threading.Thread(target=self.submitter, args=(k, per, rate)) for k in range(self.submitters)]
        for t in threads:
            t.start()
        time.sleep(GAP)
        for piece, kind in self.plan:
            self.fault(piece, kind)
            time.sleep(GAP)
        for t in threads:
            t.join()

    def leader(self, other_than: str | None = None, timeout: float = 60) -> tuple[str, float]:
        """The controller holding the lease (one other than ``other_than``), and the seconds it took to see it:
        read from the lease itself every 0.1 s, so the takeover time is not that of a command's retries."""
        from rota.controller.leadership import lease_holder
        from rota.wire import natsconn

        async def poll() -> tuple[str, float]:
            t0 = time.monotonic()
            nc = await natsconn.connect(self.urls, "drill", **self._controller_options())
            try:
                js = nc.jetstream(timeout=2)
                while time.monotonic() - t0 < timeout:
                    name = ((await lease_holder(js)) or "").rsplit("/", 1)[-1]     # HOST/STATE-DIRECTORY-NAME
                    if name in CONTROLLERS and name != other_than:
                        return name, time.monotonic() - t0
                    await asyncio.sleep(0.1)
            finally:
                await nc.close()
            raise SystemExit(f"no controller took the lease within {timeout:.0f} s")
        return asyncio.run(poll())

    def fault(self, piece: str, kind: str) -> None:
        lead = self.leader()[0]
        other = CONTROLLERS[1 - CONTROLLERS.index(lead)]
        target = {"leader": lead, "standby": other, "agent": STOPPED_AGENT}.get(piece, piece)
        label = {"kill": "kill -9", "stop": f"SIGSTOP {self.hold:g} s", "cut": f"partition {self.hold:g} s"}[kind]
        f = Fault(f"{label} of {piece}" + (f" ({target})" if target != piece else ""), time.monotonic(), time.time())
        self.faults.append(f)
        print(f"{time.strftime('%H:%M:%S')} {f.what}", flush=True)
        proc = self.procs[target]
        ends = time.monotonic() + self.hold
        if kind == "kill":
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            if piece == "leader":
                f.takeover = self.leader(other_than=target)[1]
            time.sleep(3)
            self._restart(target)
        else:
            if kind == "stop":
                proc.send_signal(signal.SIGSTOP)
            else:
                self.net.cut(target)
            if piece == "leader":
                f.takeover = self.leader(other_than=target)[1]
            time.sleep(max(0.0, ends - time.monotonic()))
            if kind == "stop":
                proc.send_signal(signal.SIGCONT)
            else:
                self.net.heal(target)
        f.whole = self.whole()

    def whole(self) -> float | None:
        """Seconds until every stream and consumer on the servers has a leader and all its copies current (a
        server back from a partition can depose every leader, and a fault on a cluster still electing is two
        faults), or None when that takes longer than WHOLE_WAIT."""
        from rota.wire import natsconn

        async def poll() -> float | None:
            t0 = time.monotonic()
            nc = await natsconn.connect(self.urls, "drill", **self._controller_options())
            try:
                js = nc.jetstream(timeout=2)
                while time.monotonic() - t0 < WHOLE_WAIT:
                    try:
                        streams = await js.streams_info()
                        groups = [i.cluster for i in streams]
                        for stream in streams:
                            groups += [c.cluster for c in await js.consumers_info(stream.config.name)]
                        if all(g is not None and g.leader and all(r.current for r in g.replicas or [])
                               for g in groups):
                            return time.monotonic() - t0
                    except Exception:  # noqa: BLE001 - the servers are still electing
                        pass
                    await asyncio.sleep(0.5)
                return None
            finally:
                await nc.close()
        return asyncio.run(poll())

    def _restart(self, piece: str) -> None:
        if piece in SERVERS:
            self._launch(piece, self.server_cmd[piece])
        elif piece in CONTROLLERS:
            self._controller(piece, standby=True)       # a controller comes back as the standby
        else:
            self._agent(piece)

    # ---------------------------------------------------------------- the verdict

    def settle(self) -> None:
        """Wait until every acknowledged job has ended (five minutes, and a tenth of a second a job)."""
        from rota.core.states import TERMINAL_STATES

        timeout = 300 + 0.1 * len(self.acked)
        wanted = {j for _, j in self.acked}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            last = self.fold()[0]
            ended = {j for j in wanted if last.get(j) in TERMINAL_STATES}
            if ended == wanted:
                return
            time.sleep(2)

    def fold(self) -> tuple[dict[int, str], list]:
        """Each job's last state (those the state has purged after MinJobAge included) and the log's records."""
        from rota.controller.eventlog import JetStreamLog
        from rota.core.apply import apply
        from rota.core.changes import Changes
        from rota.core.state import State
        from rota.wire import keys

        async def read():
            keyring = keys.load_keyring(str(self.base / "cluster.key"))
            lg = await JetStreamLog.connect(self.urls.split(","), keyring=keyring, **self._controller_options())
            try:
                return [e async for e in lg.read(1)]
            finally:
                await lg.close()

        envs = asyncio.run(read())
        st, last = State(), {}
        for e in envs:
            changed = Changes()
            apply(st, e, changed)
            for j in changed.jobs:
                if j in st.jobs:
                    last[j] = st.jobs[j].state
        return last, envs

    def costs(self, stalls: list[tuple[int, int]]) -> list[tuple[Fault, float, int]]:
        """Each fault's cost, from it to the next fault: the longest wait for an acknowledged submit, and the
        longest time jobs waited with no start recorded that began then (``stalls``: (when a start came, after
        how long))."""
        with self.lock:
            times = sorted(t for t, _ in self.acked)
        out = []
        for i, f in enumerate(self.faults):
            nxt = self.faults[i + 1] if i + 1 < len(self.faults) else None
            end, wall_end = (nxt.t0, nxt.wall0) if nxt else (float("inf"), float("inf"))
            points = [f.t0] + [t for t in times if f.t0 < t <= end]
            began = [(t - gap, gap) for t, gap in stalls]
            out.append((f, max((b - a for a, b in zip(points, points[1:])), default=0.0),
                        max((gap for t, gap in began if (i == 0 or f.wall0 <= t) and t < wall_end), default=0)))
        return out

    def stall_story(self, stall: tuple[int, int], envs: list) -> str:
        """What the log recorded while jobs waited longest with no start (``stall``: when a start came, after how
        long), with the fault under way at each record: to find which part of the round trip a fault held up."""
        end, gap = stall
        lines = [f"the longest stall, {gap} s until {time.strftime('%H:%M:%S', time.localtime(end))}; the log meanwhile:"]
        for e in envs:
            ev = e.event
            if ev is None or not end - gap <= e.ts <= end:
                continue
            fault = next((f.what for f in reversed(self.faults) if f.wall0 <= e.ts), "before any fault")
            who = getattr(ev, "job_id", None) or getattr(ev, "node", None) or ""
            lines.append(f"  {time.strftime('%H:%M:%S', time.localtime(e.ts))} #{e.seq} {ev.type} {who} "
                         f"by {e.actor} ({fault})")
        if len(lines) == 1:
            lines.append("  nothing: no record was appended")
        return "\n".join(lines[:60])

    def story(self, job_id: int, envs: list) -> str:
        """A job's events on the log, each with the fault under way then (to find what a fault did to it)."""
        parts = []
        for e in envs:
            ev = e.event
            if ev is None:
                continue
            mine = getattr(ev, "job_id", None) == job_id or (
                ev.type == "jobs.started" and any(s.job_id == job_id for s in ev.starts))
            if not mine:
                continue
            fault = next((f.what for f in reversed(self.faults) if f.wall0 <= e.ts), "before any fault")
            detail = ""
            if ev.type == "jobs.started":
                detail = " on " + ",".join(a.node for s in ev.starts if s.job_id == job_id for a in s.alloc)
            elif ev.type == "job.exited":
                detail = f" {ev.state} {ev.exit_code}:{ev.signal} after {ev.elapsed} s"
            parts.append(f"{time.strftime('%H:%M:%S', time.localtime(e.ts))} {ev.type}{detail} ({fault})")
        return f"job {job_id}: " + "; ".join(parts)

    def report(self) -> int:
        from rota.core.apply import apply
        from rota.core.state import State

        last, envs = self.fold()
        acked = {j for _, j in self.acked}
        lost = sorted(acked - last.keys())     # its record missing, or on the log but refused by the reducer
        starts: dict[tuple[int, int], int] = {}      # (job, run) -> how many times the log started it
        stalls: list[tuple[int, int]] = []           # (when a start came, how long jobs had waited for one)
        waiting_since: int | None = None             # since when jobs waited with no start
        walk = State()
        for e in envs:
            ev = e.event
            started = ev is not None and ev.type == "jobs.started" and bool(ev.starts)
            if started:
                for s in ev.starts:
                    job = walk.jobs.get(s.job_id)
                    key = (s.job_id, job.restarts if job is not None else 0)
                    starts[key] = starts.get(key, 0) + 1
                if waiting_since is not None:
                    stalls.append((e.ts, e.ts - waiting_since))
            apply(walk, e)
            if started or not walk.pending:
                waiting_since = e.ts if walk.pending else None
            elif waiting_since is None:
                waiting_since = e.ts
        duplicates = sum(n - 1 for n in starts.values() if n > 1)
        states: dict[str, int] = {}
        never_ended = 0
        odd: list[str] = []                          # what the log says of each job that did not end well
        for j in sorted(acked):
            state = last.get(j, LOST)
            states[state] = states.get(state, 0) + 1
            if state in ("PENDING", "RUNNING"):
                never_ended += 1
            if state != "COMPLETED":
                odd.append(self.story(j, envs))
        wrongly = sum(n for s, n in states.items() if s not in ("COMPLETED", "PENDING", "RUNNING", LOST))
        layout = ("each piece in its own network namespace" if self.net.isolated
                  else f"all on loopback, no partitions ({self.net.why_not})")
        print(f"\nfault drill: 3 NATS servers ({'TLS' if self.tls_ca else 'no TLS: openssl missing'}), 2 controllers, "
              f"4 agents, {self.submitters} submitters; {layout}")
        print(f"{len(acked)} acknowledged submits ({len(self.refused)} refused), log of {len(envs)} events")
        print(f"{'fault':<38} {'takeover':>9} {'longest wait for an ack':>24} {'longest wait for a start':>25} "
              f"{'NATS whole again':>17}")
        for f, cost, gap in self.costs(stalls):
            took = "" if f.takeover is None else f"{f.takeover:.2f} s"
            whole = f"> {WHOLE_WAIT:.0f} s" if f.whole is None else f"{f.whole:.1f} s"
            print(f"{f.what:<38} {took:>9} {cost:>22.2f} s {gap:>23} s {whole:>17}")
        takeovers = [f.takeover for f in self.faults if f.takeover is not None]
        if takeovers:
            print(f"takeover (the leader killed, frozen or cut off -> the other holds the lease): "
                  f"longest {max(takeovers):.2f} s")
        print(f"acknowledged submits lost: {len(lost)}   duplicate starts of a run: {duplicates}   "
              f"jobs that never ended: {never_ended}   jobs wrongly failed: {wrongly}")
        print("how the acknowledged jobs ended: " + ", ".join(f"{k} {v}" for k, v in sorted(states.items())))
        print(f"longest time jobs waited with no start recorded (scheduling stall): "
              f"{max((g for _, g in stalls), default=0)} s")
        if stalls and max(g for _, g in stalls) > STALL_SHOWN:
            print(self.stall_story(max(stalls, key=lambda s: s[1]), envs))
        for story in odd[:10]:
            print(f"  {story}")
        for why in sorted(set(self.refused))[:5]:
            print(f"  refused: {why}")
        ping = subprocess.run([str(BIN / "scontrol"), "ping"], capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, ROTA_SOCKET=str(self.base / "n1" / "run" / "rota.sock")))
        print("scontrol ping: " + " / ".join(ping.stdout.strip().splitlines() or [ping.stderr.strip()]))
        return 1 if lost or duplicates or never_ended or wrongly else 0


def _faults(text: str) -> list[tuple[str, str]]:
    """``--faults``: PIECE:FAULT pairs, comma-separated."""
    out = []
    for item in text.split(","):
        piece, _, kind = item.strip().partition(":")
        if piece not in PIECES or kind not in FAULTS:
            raise argparse.ArgumentTypeError(f"{item.strip()!r} is not PIECE:FAULT with PIECE one of {', '.join(PIECES)} "
                                             f"and FAULT one of {', '.join(FAULTS)}")
        out.append((piece, kind))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=400)
    ap.add_argument("--submitters", type=int, default=4)
    ap.add_argument("--hold", type=float, default=30.0, help="seconds a freeze or a partition lasts (default 30)")
    ap.add_argument("--short", action="store_true", help="one fault of each kind instead of every fault on every piece")
    ap.add_argument("--faults", type=_faults, default=None, metavar="PIECE:FAULT,...",
                    help=f"only these faults, in this order (pieces: {', '.join(PIECES)}; faults: {', '.join(FAULTS)}); "
                         "e.g. nats2:cut,leader:stop")
    ap.add_argument("--dir", help="where the servers', controllers' and agents' state goes (default: a temp dir)")
    args = ap.parse_args(argv)
    base = Path(args.dir or tempfile.mkdtemp(prefix="rota-drill-"))
    base.mkdir(parents=True, exist_ok=True)
    base.chmod(0o755)
    drill = Drill(base, args.jobs, args.submitters, args.hold, args.short, args.faults)
    try:
        drill.start()
        drill.faults_while_submitting()
        drill.settle()
        return drill.report()
    finally:
        drill.stop()


if __name__ == "__main__":
    sys.exit(main())
