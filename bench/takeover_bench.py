"""Takeover on a long log: two `rota up` controllers (one leads, one stands by) on a NATS server whose log
holds about 1M events (the time-travel benchmark's simulated 64-node GPU cluster, 355,000 jobs); the
leader is killed (-9), and the time until the standby holds the lease and until it acknowledges a submit
is measured. Then the killed one comes back as the standby, catches up, and the other is killed: the
runs alternate between the two.

    python -m rota.bench.takeover_bench [--jobs 355000] [--runs 3] [--cache FILE]

Both controllers have the log's projection already built (as a cluster that has run for a while has),
so what is measured is the takeover, not a first projection. ``--cache FILE`` keeps the generated log.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import ApiClient, Figure, print_table, write_json
from .timetravel_bench import _load_cluster, cached_log

BIN = Path(sys.executable).parent
CONF = ("ClusterName=sim\nGresTypes=gpu\n"
        "NodeName=node[001-064] CPUs=64 RealMemory=524288 Gres=gpu:v100:8\n"
        "PartitionName=gpu Nodes=node[001-064] Default=YES MaxTime=INFINITE\n")
SPEC = {"name": "after-takeover", "time_limit": 60, "hold": True, "script": "#!/bin/sh\ntrue\n"}


async def _lease_and_status(url: str, options: dict) -> tuple[str | None, dict[str, int]]:
    """Who holds the lease, and each controller's announced log sequence."""
    import nats

    from rota.controller.leadership import STATUS_BUCKET, lease_holder

    nc = await nats.connect(url, **options)
    try:
        js = nc.jetstream(timeout=2)
        holder = await lease_holder(js)
        seqs: dict[str, int] = {}
        try:
            kv = await js.key_value(STATUS_BUCKET)
            for key in await kv.keys():
                entry = json.loads((await kv.get(key)).value or b"{}")
                seqs[entry["name"].rsplit("/", 1)[-1]] = int(entry["seq"])
        except Exception:  # noqa: BLE001 - none yet
            pass
        return (holder.rsplit("/", 1)[-1] if holder else None), seqs
    finally:
        await nc.close()


async def _last_seq(url: str, options: dict) -> int:
    import nats

    from rota.controller.eventlog import STREAM

    nc = await nats.connect(url, **options)
    try:
        return (await nc.jetstream().stream_info(STREAM)).state.last_seq
    finally:
        await nc.close()


class Pair:
    """Two controllers, ctl-a and ctl-b, on one server."""

    def __init__(self, base: Path, url: str) -> None:
        self.base, self.url = base, url
        self.procs: dict[str, subprocess.Popen] = {}
        self.api = ApiClient(str(base / "ctl-a"))

    def start(self, name: str, standby: bool) -> None:
        env = dict(os.environ, ROTA_STATE_DIR=str(self.base / name))
        cmd = [str(BIN / "rota"), "up", "--config", str(self.base / "slurm.conf"), "--nats", self.url, "--no-agent",
               "--node-timeout", "36000"] + (["--standby"] if standby else [])
        self.procs[name] = subprocess.Popen(cmd, env=env, stdout=open(self.base / f"{name}.log", "a"),
                                            stderr=subprocess.STDOUT)

    def wait(self, what, timeout: float, why: str):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = asyncio.run(what())
            if value:
                return value
            for name, p in self.procs.items():
                if p.poll() is not None and p.returncode != -signal.SIGKILL:
                    raise RuntimeError(f"{name} exited: see {self.base / (name + '.log')}")
            time.sleep(0.2)
        raise TimeoutError(why)

    def caught_up(self, name: str, timeout: float = 600) -> None:
        async def check() -> bool:
            last = await _last_seq(self.url, self.api.options)
            return (await _lease_and_status(self.url, self.api.options))[1].get(name, -1) >= last - 5
        self.wait(check, timeout, f"{name} did not catch up with the log")

    def takeover(self, leader: str, standby: str) -> tuple[float, float]:
        """Kill ``leader``; seconds until ``standby`` holds the lease, and until it acknowledged a submit."""
        self.procs[leader].send_signal(signal.SIGKILL)
        self.procs[leader].wait()
        t0 = time.monotonic()

        async def poll() -> tuple[float, float]:
            import nats

            from rota.controller.leadership import lease_holder

            nc = await nats.connect(self.url, **self.api.options)
            try:
                js = nc.jetstream(timeout=2)
                while ((await lease_holder(js)) or "").rsplit("/", 1)[-1] != standby:
                    await asyncio.sleep(0.05)
                leased = time.monotonic() - t0
                while True:
                    try:
                        reply = await self.api.request(nc, "submit", {"spec": SPEC}, timeout=2)
                        if reply.get("ok"):
                            return leased, time.monotonic() - t0
                    except Exception:  # noqa: BLE001 - no one serves yet
                        pass
                    await asyncio.sleep(0.05)
            finally:
                await nc.close()
        return asyncio.run(asyncio.wait_for(poll(), 120))

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in self.procs.values():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


def run(jobs: int, runs: int, cache: str | None) -> list[Figure]:
    from rota.controller import natsserver

    import gc

    log, _big, made = cached_log(jobs, cache)
    events = len(log)
    gc.freeze()          # a million envelopes: a full collection would stall the loader past the servers' pings
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        (base / "slurm.conf").write_text(CONF)
        for name in ("ctl-a", "ctl-b"):
            (base / name).mkdir(mode=0o700)
        subprocess.run([str(BIN / "rota"), "keygen", str(base / "ctl-a" / "cluster.key")], check=True,
                       capture_output=True)
        shutil.copy(base / "ctl-a" / "cluster.key", base / "ctl-b" / "cluster.key")
        srv = natsserver.start(base / "nats", sync_always=False)          # loading speed only
        t = time.perf_counter()
        asyncio.run(_load_cluster(srv.url, log, {}, str(base / "ctl-a" / "projections.sqlite")))
        loaded = time.perf_counter() - t
        del log
        shutil.copy(base / "ctl-a" / "projections.sqlite", base / "ctl-b" / "projections.sqlite")
        srv.stop()
        srv = natsserver.start(base / "nats", port=srv.port)               # as rota runs it: every write synced
        pair = Pair(base, srv.url)
        try:
            t = time.perf_counter()
            pair.start("ctl-a", standby=False)
            pair.wait(lambda: _holder_is(srv.url, pair.api.options, "ctl-a"), 600, "ctl-a did not lead")
            pair.caught_up("ctl-a")
            first = time.perf_counter() - t
            pair.start("ctl-b", standby=True)
            t = time.perf_counter()
            pair.caught_up("ctl-b")
            standby_ready = time.perf_counter() - t
            leases, answers = [], []
            leader, standby = "ctl-a", "ctl-b"
            for _ in range(runs):
                leased, answered = pair.takeover(leader, standby)
                leases.append(leased)
                answers.append(answered)
                print(f"  {leader} killed: {standby} held the lease after {leased:.2f} s and acknowledged a submit "
                      f"after {answered:.2f} s", flush=True)
                pair.start(leader, standby=True)
                pair.caught_up(leader)
                leader, standby = standby, leader
        finally:
            pair.stop()
            srv.stop()
    cmd = f"python -m rota.bench.takeover_bench --jobs {jobs}"
    note = (f"{events:,}-event log (made by the simulator in {made:.0f} s, loaded in {loaded:.0f} s); a controller "
            f"starting on it led after {first:.0f} s, a standby caught up in {standby_ready:.0f} s")
    return [Figure(f"takeover, {events:,}-event log: the leader killed -> the standby holds the lease",
                   statistics.median(leases), "s", "", None, cmd, note),
            Figure(f"takeover, {events:,}-event log: the leader killed -> the standby acknowledges a submit",
                   statistics.median(answers), "s", "<= 10 s", statistics.median(answers) <= 10, cmd,
                   f"lease 5 s; runs: {', '.join(f'{a:.2f}' for a in answers)} s")]


async def _holder_is(url: str, options: dict, name: str) -> bool:
    return (await _lease_and_status(url, options))[0] == name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=355_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cache", default=None, help="keep the generated log in this file between runs")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    figures = run(args.jobs, args.runs, args.cache)
    print_table(figures, "controller takeover")
    write_json(figures, args.json)


if __name__ == "__main__":
    main()
