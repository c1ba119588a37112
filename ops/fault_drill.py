"""A fault drill on loopback: 3 NATS servers, 2 controllers (a leader and a standby), 4 agents, submitters
running `sbatch` while, in turn, the leading controller is killed (-9) and comes back as the standby, the
new leader is stopped (SIGSTOP) until the other takes over and then continued (deposed: the log refuses
it), a NATS server is killed and brought back, an agent is stopped and continued, and the standby is
killed and restarted. Then the log is read back and checked.

    python ops/fault_drill.py [--jobs 400] [--submitters 4] [--dir DIR]

It prints what each fault cost and the counts that must be zero: acknowledged submits lost, duplicate
starts of one run, jobs that never ended; and how many ended other than COMPLETED, the takeover time and
the longest stretch without a start while jobs waited. Exit status 1 when a must-be-zero count is not.
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
from pathlib import Path

BIN = Path(sys.executable).parent
NODES = ("n1", "n2", "n3", "n4")
CONF = ("NodeName=n[1-4] CPUs=4 RealMemory=16000\n"
        "PartitionName=p Nodes=n[1-4] Default=YES MaxTime=10:00\n")


class Drill:
    def __init__(self, base: Path, jobs: int, submitters: int) -> None:
        self.base, self.jobs, self.submitters = base, jobs, submitters
        self.procs: dict[str, subprocess.Popen] = {}
        self.acked: list[tuple[float, int]] = []          # (when, job id) of every acknowledged submit
        self.refused: list[str] = []
        self.lock = threading.Lock()
        self.faults: list[tuple[str, float, float]] = []   # (what, when, how long it cost)
        self.servers: list = []
        self.takeover = 0.0
        self.stopped_takeover = 0.0

    # ---------------------------------------------------------------- the cluster

    def start(self) -> None:
        from rota.controller.natscluster import start_cluster, wait_for_jetstream

        self.servers = start_cluster(self.base / "nats", 3)
        self.urls = ",".join(s.url for s in self.servers)
        asyncio.run(wait_for_jetstream(self.urls.split(",")))
        (self.base / "slurm.conf").write_text(CONF)
        self._controller("ctl-a", standby=False)
        self._wait_file(self.base / "ctl-a" / "cluster.json", "ctl-a")
        (self.base / "ctl-b").mkdir(mode=0o700)
        shutil.copy(self.base / "ctl-a" / "cluster.key", self.base / "ctl-b" / "cluster.key")
        self._controller("ctl-b", standby=True)
        self._wait_file(self.base / "ctl-b" / "cluster.json", "ctl-b")
        for node in NODES:
            self._agent(node)
        for node in NODES:
            self._wait_file(self.base / node / "run" / "rota.sock", node)

    def _controller(self, name: str, standby: bool) -> None:
        env = dict(os.environ, ROTA_STATE_DIR=str(self.base / name))
        cmd = [str(BIN / "rota"), "up", "--config", str(self.base / "slurm.conf"), "--nats", self.urls, "--no-agent",
               "--node-timeout", "20"] + (["--standby"] if standby else [])
        self.procs[name] = subprocess.Popen(cmd, env=env, stdout=open(self.base / f"{name}.log", "a"),
                                            stderr=subprocess.STDOUT)

    def _agent(self, node: str) -> None:
        cmd = [str(BIN / "rota"), "agent", "--node", node, "--nats", self.urls, "--state-dir", str(self.base / node),
               "--key", str(self.base / "ctl-a" / "cluster.key"), "--cpus", "4", "--memory", "16000",
               "--heartbeat", "1", "--kill-wait", "2", "--no-cgroups"]
        self.procs[node] = subprocess.Popen(cmd, stdout=open(self.base / f"{node}.log", "a"),
                                            stderr=subprocess.STDOUT)

    def _wait_file(self, path: Path, who: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not path.exists():
            if time.monotonic() > deadline:
                raise SystemExit(f"{who} did not start: see {self.base / (who + '.log')}")
            time.sleep(0.1)

    def stop(self) -> None:
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
        for s in self.servers:
            s.stop()

    # ---------------------------------------------------------------- the workload

    def submitter(self, k: int, count: int) -> None:
        node = NODES[k % 3]            # n4 is the agent that will be stopped: its signer too
        env = dict(os.environ, ROTA_SOCKET=str(self.base / node / "run" / "rota.sock"))
        for _ in range(count):
            r = subprocess.run([str(BIN / "sbatch"), "--parsable", "-t", "1", "--wrap", "sleep 0.1"], env=env,
                               capture_output=True, text=True, timeout=120, cwd=self.base)   # its output files there
            with self.lock:
                if r.returncode == 0 and r.stdout.strip().isdecimal():
                    self.acked.append((time.monotonic(), int(r.stdout)))
                else:
                    self.refused.append(r.stderr.strip()[-200:])

    def faults_while_submitting(self) -> None:
        per = self.jobs // self.submitters
        threads = [threading.Thread(target=self.submitter, args=(k, per)) for k in range(self.submitters)]
        for t in threads:
            t.start()
        total = per * self.submitters
        self._at(total // 4)
        t0 = time.monotonic()
        self.procs["ctl-a"].send_signal(signal.SIGKILL)           # the leader dies
        self.takeover = self._until_leading("ctl-b") - t0
        self._after("kill -9 of the leading controller", t0)
        self._controller("ctl-a", standby=True)                    # it comes back, as the standby
        self._at(3 * total // 8)
        t0 = time.monotonic()
        self.procs["ctl-b"].send_signal(signal.SIGSTOP)           # the new leader freezes: ctl-a takes over
        self.stopped_takeover = self._until_leading("ctl-a") - t0
        time.sleep(3)
        self.procs["ctl-b"].send_signal(signal.SIGCONT)           # and wakes up deposed: the log refuses it
        self._after("SIGSTOP of the leading controller, then SIGCONT", t0)
        self._at(total // 2)
        t0 = time.monotonic()
        victim = self.servers[1]
        victim.kill()                                              # a NATS server dies, comes back on its store
        time.sleep(3)
        from rota.controller import natsserver

        self.servers[1] = natsserver.restart(victim)
        self._after("kill -9 of a NATS server (back after 3 s)", t0)
        self._at(3 * total // 4)
        t0 = time.monotonic()
        self.procs["n4"].send_signal(signal.SIGSTOP)              # an agent freezes for 8 s
        time.sleep(8)
        self.procs["n4"].send_signal(signal.SIGCONT)
        self._after("SIGSTOP of an agent for 8 s", t0)
        self._at(7 * total // 8)
        t0 = time.monotonic()
        self.procs["ctl-b"].send_signal(signal.SIGKILL)           # the standby (deposed earlier) dies
        self.procs["ctl-b"].wait()
        self._controller("ctl-b", standby=True)                    # and comes back, following the log
        self._after("kill -9 of the standby controller, restarted", t0)
        for t in threads:
            t.join()

    def _at(self, n: int) -> None:
        while True:
            with self.lock:
                if len(self.acked) >= n:
                    return
            time.sleep(0.05)

    def _until_leading(self, name: str) -> float:
        """When ``scontrol ping``'s answer first names controller ``name`` as the primary."""
        from rota.cli.client import NoCluster, request

        os.environ["ROTA_SOCKET"] = str(self.base / "n1" / "run" / "rota.sock")
        while True:
            try:
                listed = request("ping", {}, timeout=20).get("controllers") or []
            except NoCluster:
                listed = []
            if any(c.get("role") == "primary" and c.get("name", "").endswith("/" + name) for c in listed):
                return time.monotonic()
            time.sleep(0.1)

    def _after(self, what: str, t0: float) -> None:
        self.faults.append((what, t0, 0.0))

    def costs(self) -> list[tuple[str, float]]:
        """Each fault's cost: the longest wait for an acknowledged submit from it to the next fault."""
        with self.lock:
            times = sorted(t for t, _ in self.acked)
        out = []
        for i, (what, t0, _) in enumerate(self.faults):
            end = self.faults[i + 1][1] if i + 1 < len(self.faults) else float("inf")
            points = [t0] + [t for t in times if t0 < t <= end]
            out.append((what, max((b - a for a, b in zip(points, points[1:])), default=0.0)))
        return out

    # ---------------------------------------------------------------- the verdict

    def settle(self, timeout: float = 240) -> None:
        """Wait until every acknowledged job has ended."""
        from rota.core.states import TERMINAL_STATES

        wanted = {j for _, j in self.acked}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.fold()[0]
            ended = {j for j in wanted if (j in st.jobs and st.jobs[j].state in TERMINAL_STATES) or j in st.ended}
            if ended == wanted:
                return
            time.sleep(2)

    def fold(self):
        from rota.controller.eventlog import JetStreamLog
        from rota.core.apply import fold
        from rota.wire import keys

        async def read():
            keyring = keys.load_keyring(str(self.base / "ctl-b" / "cluster.key"))
            lg = await JetStreamLog.connect(self.urls.split(","), keyring=keyring)
            try:
                return [e async for e in lg.read(1)]
            finally:
                await lg.close()

        envs = asyncio.run(read())
        return fold(envs), envs

    def report(self) -> int:
        from rota.core.apply import apply
        from rota.core.state import State

        st, envs = self.fold()
        submitted = {e.event.job_id for e in envs if e.event is not None and e.event.type == "job.submitted"}
        acked = {j for _, j in self.acked}
        lost = sorted(acked - submitted)
        starts: dict[tuple[int, int], int] = {}      # (job, run) -> how many times the log started it
        last_start = None
        stall = 0
        walk = State()
        for e in envs:
            ev = e.event
            if ev is not None and ev.type == "jobs.started" and ev.starts:
                for s in ev.starts:
                    job = walk.jobs.get(s.job_id)
                    key = (s.job_id, job.restarts if job is not None else 0)
                    starts[key] = starts.get(key, 0) + 1
                if last_start is not None:
                    stall = max(stall, e.ts - last_start)
                last_start = e.ts
            apply(walk, e)
        duplicates = sum(n - 1 for n in starts.values() if n > 1)
        states: dict[str, int] = {}
        never_ended = 0
        for j in acked:
            job = st.jobs.get(j)
            state = job.state if job is not None else ("COMPLETED" if st.ended.get(j, (0, 1))[0] else "ENDED")
            states[state] = states.get(state, 0) + 1
            if state in ("PENDING", "RUNNING"):
                never_ended += 1
        print(f"\nfault drill: 3 NATS servers, 2 controllers, 4 agents, {self.submitters} submitters, "
              f"{len(acked)} acknowledged submits ({len(self.refused)} refused), log of {len(envs)} events")
        print(f"{'fault':<45} {'longest wait for an acknowledged submit after it':>50}")
        for what, cost in self.costs():
            print(f"{what:<45} {cost:>48.2f} s")
        print(f"takeover (the leader killed -> scontrol ping names the standby primary): {self.takeover:.2f} s; "
              f"the leader stopped (SIGSTOP) -> the other primary: {self.stopped_takeover:.2f} s")
        print(f"acknowledged submits lost: {len(lost)}   duplicate starts of a run: {duplicates}   "
              f"jobs that never ended: {never_ended}")
        print("how the acknowledged jobs ended: " + ", ".join(f"{k} {v}" for k, v in sorted(states.items())))
        print(f"longest stretch between recorded starts: {stall} s")
        for why in sorted(set(self.refused))[:5]:
            print(f"  refused: {why}")
        return 1 if lost or duplicates or never_ended else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=400)
    ap.add_argument("--submitters", type=int, default=4)
    ap.add_argument("--dir", help="where the servers', controllers' and agents' state goes (default: a temp dir)")
    args = ap.parse_args(argv)
    base = Path(args.dir or tempfile.mkdtemp(prefix="rota-drill-"))
    base.mkdir(parents=True, exist_ok=True)
    base.chmod(0o755)
    drill = Drill(base, args.jobs, args.submitters)
    try:
        drill.start()
        drill.faults_while_submitting()
        drill.settle()
        return drill.report()
    finally:
        drill.stop()


if __name__ == "__main__":
    sys.exit(main())
