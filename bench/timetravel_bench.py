"""Time travel on a long log: `why` for a job that waited through >= 1,000 cycles, `replay --at`, and
`verify` over the whole log.

    python -m rota.bench.timetravel_bench [--jobs 355000] [--runs 3] [--cache FILE]

The log is made by the simulator, so every decision in it is the scheduler's own: a 64-node x
8-GPU cluster under a steady stream of small jobs (a submit every 2.5 s on average, 1-2 GPUs,
honest time limits, 2 % of them running 45 to 90 minutes) at about 40 % GPU use, and a 60-node job
submitted half way through that must wait for most of the cluster to drain while small jobs backfill around
it. 355,000 jobs make just over 1M events. The policy is EASY backfill: simulating them under
conservative backfill takes about twice as long on 2 cores. Snapshots are taken every 10,000
events, as the controller keeps them; `why` and `replay --at` start from the nearest one, as
`rota why` does on a cluster. ``--cache FILE`` keeps the generated log between runs.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from typing import Any

from rota.core import events as ev
from rota.core.apply import apply
from rota.core.sim import Simulator, TraceJob
from rota.core.state import State, dump_snapshot, load_snapshot
from rota.core.timetravel import replay_to, why
from rota.core.traces import gpu_cluster

from .common import Figure, print_table, write_json

SNAPSHOT_EVERY = 10_000   # the controller's history snapshots (Controller.history_every)


def make_log(jobs: int, seed: int = 5) -> tuple[list[ev.Envelope], int]:
    """A simulated log of ``jobs`` jobs and the id of the big job that waits."""
    big_at = jobs // 2
    rng = random.Random(seed)
    cfg = gpu_cluster(64)
    trace, t = [], 0
    for i in range(jobs):
        t += rng.randint(0, 5)
        if i == big_at:
            spec = ev.JobSpec(user="big", name="big-eval", nodes=60, nodes_given=True, gpus_per_node=8,
                              time_limit=2 * 3600)
            trace.append(TraceJob(t, spec, 1800, trace_id=i + 1))
            continue
        g = rng.choice([1, 1, 1, 2])
        if rng.random() < 0.02:
            limit, run = 5400, rng.randint(2700, 5400)
        else:
            limit, run = rng.choice([600, 1200, 1800]), rng.randint(60, 600)
        spec = ev.JobSpec(user=f"u{rng.randrange(40)}", name=f"j{i}", gpus_per_node=g, cpus_per_task=g * 4,
                          time_limit=limit)
        trace.append(TraceJob(t, spec, run, trace_id=i + 1))
    sim = Simulator(cfg, "easy", record_log=True)
    sim.run(trace)
    return sim.log, big_at + 1   # the simulator numbers jobs in submit order


def cached_log(jobs: int, cache: str | None) -> tuple[list[ev.Envelope], int, float]:
    """The log (made, or read back from ``cache``), the big job's id and the seconds it took to make."""
    import os

    if cache and os.path.exists(cache):
        with open(cache, "rb") as fh:
            first = fh.readline().split()
            if first == [b"rota-bench-log", str(jobs).encode()]:
                big = int(fh.readline())
                made = float(fh.readline())
                return [ev.decode_envelope(line) for line in fh], big, made
    t0 = time.perf_counter()
    log, big = make_log(jobs)
    made = time.perf_counter() - t0
    if cache:
        with open(cache, "wb") as fh:
            fh.write(f"rota-bench-log {jobs}\n{big}\n{made}\n".encode())
            for env in log:
                fh.write(ev.encode_envelope(env) + b"\n")
    return log, big, made


def snapshots(log: list[ev.Envelope]) -> dict[int, bytes]:
    st = State()
    out = {}
    for env in log:
        apply(st, env)
        if env.seq % SNAPSHOT_EVERY == 0:
            out[env.seq] = dump_snapshot(st)
    return out


def nearest(snaps: dict[int, bytes], seq: int) -> State | None:
    best = max((s for s in snaps if s <= seq), default=None)
    return load_snapshot(snaps[best]) if best is not None else None


async def _load_cluster(url: str, log: list[ev.Envelope], snaps: dict[int, bytes], db: str,
                        mac_key: bytes | None = None) -> None:
    """Put ``log`` on a JetStream stream as the controller would have (same subjects, headers with the log
    key's MACs, signed history snapshots), and project it into ``db`` as `rota up` does."""
    import asyncio

    from rota.controller import snapshots as snapshot_store
    from rota.controller.eventlog import STREAM, JetStreamLog, encode_body, subject_for
    from rota.controller.records import record_headers
    from rota.projections.projector import Projector

    lg = await JetStreamLog.connect(url)
    try:
        pending = []
        for env in log:
            body = encode_body(env.event)
            pending.append(lg.js.publish(subject_for(env.event), body, stream=STREAM, timeout=60,   # 4,000 in flight
                                         headers=record_headers(mac_key, env.seq, env.ts, env.actor, env.idem, body)))
            if len(pending) >= 4000:
                await asyncio.gather(*pending)
                pending = []
        await asyncio.gather(*pending)
        store = await snapshot_store.open_store(lg.js)
        for seq, data in sorted(snaps.items()):
            await snapshot_store.put(store, data, seq, history=True, key=mac_key)
        proj = Projector(db, lg)
        await proj.open()
        await proj.catch_up()
        await proj.close()
    finally:
        await lg.close()


def cluster_figures(log: list[ev.Envelope], snaps: dict[int, bytes], big: int, mid: int, runs: int,
                    jobs: int) -> list[Figure]:
    """`rota why` and `rota replay --at` as a user runs them: separate processes against a NATS
    server holding the log, its history snapshots and the projection."""
    import asyncio
    import os
    import tempfile
    from pathlib import Path

    from rota.controller import natsserver

    figures = []
    with tempfile.TemporaryDirectory() as tmp:
        srv = natsserver.start(Path(tmp) / "nats", sync_always=False)   # setup speed only
        try:
            state_dir = Path(tmp) / "state"
            state_dir.mkdir()
            from rota.wire.keys import generate, load_keyring
            from rota.wire.paths import cluster_key_path

            generate(cluster_key_path(str(state_dir)))     # the commands check every record as on a cluster
            mac_key = load_keyring(cluster_key_path(str(state_dir))).purpose_key("log")
            assert mac_key is not None
            t0 = time.perf_counter()
            asyncio.run(_load_cluster(srv.url, log, snaps, str(state_dir / "projections.sqlite"), mac_key))
            loaded = time.perf_counter() - t0
            env = dict(os.environ, ROTA_STATE_DIR=str(state_dir))
            commands = _command_server(state_dir)    # as rota up runs it: the web's why child goes there too
            try:
                figures += _commands_both_ways(env, srv.url, big, mid, runs, f"log loaded into NATS in {loaded:.0f} s; "
                                               f"python -m rota.bench.timetravel_bench --jobs {jobs}")
                figures.append(web_job_page(state_dir, srv.url, big, runs, jobs, len(log)))
            finally:
                commands.kill()
                commands.wait()
        finally:
            srv.stop()
    return figures


def _command_server(state_dir) -> Any:
    """The command server ``rota up`` runs beside its signer (it serves the log's lookups), on ``state_dir``'s socket."""
    import subprocess

    from rota.programs.agent import command_server
    from rota.wire.paths import socket_in

    path = os.path.join(os.path.dirname(socket_in(str(state_dir))), "commands.sock")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    proc = subprocess.Popen([*command_server(log_commands=True), path], cwd="/", stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not os.path.exists(path):
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise RuntimeError("the command server did not start")
        time.sleep(0.05)
    return proc


def _commands_both_ways(env: dict, url: str, big: int, mid: int, runs: int, cmd: str) -> list[Figure]:
    """`rota why` and `rota replay --at` as processes, alternating: as they run on the controller's host (handed to
    ``rota up``'s command server, the target's figure) and in their own process (``ROTA_THIN=0``: a host without
    ``rota up``)."""
    import subprocess
    import sys
    from pathlib import Path

    rota = str(Path(sys.executable).parent / "rota")
    here = dict(env, ROTA_THIN="0")
    figures = []
    for label, args in ((f"`rota why {big}`", ["why", str(big)]), (f"`rota replay --at {mid}`", ["replay", "--at", str(mid)])):
        argv = [rota, *args, "--nats", url]
        times: dict[str, list[float]] = {"served": [], "here": []}
        for way in ("served", "here"):
            subprocess.run(argv, env=env if way == "served" else here, capture_output=True)   # untimed: caches warm
        for _ in range(runs):
            for way in ("served", "here"):
                t = time.perf_counter()
                r = subprocess.run(argv, env=env if way == "served" else here, capture_output=True, text=True)
                times[way].append(time.perf_counter() - t)
                if r.returncode != 0:
                    raise RuntimeError(f"{' '.join(argv)}: {r.stderr}")
        served, alone = statistics.median(times["served"]), statistics.median(times["here"])
        figures.append(Figure(f"{label} (a process on the controller's host: rota up's command server runs it)", served,
                              "s", "<= 1 s", served <= 1.0, cmd,
                              "the client's interpreter start included, after one untimed run"))
        figures.append(Figure(f"{label} (a process of its own: ROTA_THIN=0, or no rota up on the host)", alone, "s",
                              "", None, cmd, "interpreter start and imports included, alternating with the above"))
    return figures


def web_job_page(state_dir, nats_url: str, big: int, runs: int, jobs: int, events: int) -> Figure:
    """The web view's page of the job that waited longest, over HTTP from `rota web` against the cluster's log
    (its `why` child reads the log as `rota why` does), signed in as an operator."""
    import http.cookiejar
    import json
    import os
    import signal
    import subprocess
    import sys
    import urllib.request

    from rota.controller import natsserver
    from rota.wire.keys import load_keyring
    from rota.wire.paths import cluster_key_path
    from rota.wire.webtoken import PURPOSE, issue

    (state_dir / "cluster.json").write_text(json.dumps({"nats": nats_url}))
    key = load_keyring(cluster_key_path(str(state_dir))).purpose_key(PURPOSE)
    assert key is not None
    port = natsserver.free_port()
    web = subprocess.Popen([sys.executable, "-m", "rota.programs.main", "web", "--state-dir", str(state_dir), "--port",
                            str(port)], env=dict(os.environ, ROTA_STATE_DIR=str(state_dir)), stdout=subprocess.DEVNULL)
    try:
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        token = issue(key, "root", 0, True, int(time.time()))
        for _ in range(100):
            try:
                opener.open(f"http://127.0.0.1:{port}/login?token={token}", timeout=5).read()
                break
            except OSError:
                time.sleep(0.1)
        page = f"http://127.0.0.1:{port}/job/{big}"
        opener.open(page, timeout=120).read()
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            body = opener.open(page, timeout=120).read()
            times.append(time.perf_counter() - t)
        assert b'id=timeline' in body
    finally:
        web.send_signal(signal.SIGINT)
        web.wait(30)
    value = statistics.median(times)
    return Figure(f"web: the page of job {big} (its wait as a timeline), {events:,}-event log", value, "s", "<= 2 s",
                  value <= 2.0, f"python -m rota.bench.timetravel_bench --jobs {jobs}",
                  "GET over HTTP: the why child reading the log, the projection's record, the HTML")


def run(jobs: int, runs: int, cache: str | None = None, cluster: bool = True, verify: bool = True) -> list[Figure]:
    log, big, made = cached_log(jobs, cache)
    snaps = snapshots(log)
    by_job_id = {}
    for env in log:
        if isinstance(env.event, ev.JobSubmitted):
            by_job_id[env.event.job_id] = env.seq
    submit_seq = by_job_id[big]
    cycles_waited = 0
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        state = nearest(snaps, submit_seq - 1)
        rep = why(log[state.seq if state else 0:], big, None, state)
        times.append(time.perf_counter() - t)
    cycles_waited = sum(iv.cycles for iv in rep.intervals)
    waited_h = ((rep.start_time or 0) - rep.submit_time) / 3600
    figures = [Figure(f"rota why, a job that waited {cycles_waited:,} cycles ({waited_h:.1f} h), {len(log):,}-event log",
                      statistics.median(times), "s", "<= 1 s", statistics.median(times) <= 1.0,
                      f"python -m rota.bench.timetravel_bench --jobs {jobs}",
                      f"log made by the simulator in {made:.0f} s")]
    mid = log[len(log) * 3 // 4].seq
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        state = nearest(snaps, mid)
        st = replay_to(log[state.seq if state else 0:], mid, None, state)
        times.append(time.perf_counter() - t)
    assert st.seq == mid
    figures.append(Figure(f"rota replay --at (sequence {mid:,} of {len(log):,})", statistics.median(times), "s",
                          "<= 1 s", statistics.median(times) <= 1.0, f"python -m rota.bench.timetravel_bench --jobs {jobs}"))
    if cluster:
        figures += cluster_figures(log, snaps, big, mid, runs, jobs)
    if not verify:
        return figures
    from rota.cli.timetravel import check_all, workers
    from rota.core.liveness import DEFAULT_LATENCY

    t = time.perf_counter()
    results, _ = check_all(log, latency=None)
    dt = time.perf_counter() - t
    assert all(d is None for _s, d in results)
    figures.append(Figure(f"rota verify --no-liveness over the whole log ({len(results):,} cycles)", dt, "s", "",
                          None, f"python -m rota.bench.timetravel_bench --jobs {jobs}",
                          f"all decisions reproduced; cycles shared among {workers()} forked workers, as `rota verify` does"))
    t = time.perf_counter()
    results, late = check_all(log)
    dt_live = time.perf_counter() - t
    assert all(d is None for _s, d in results) and not late, late[:3]
    figures.append(Figure("rota verify, with liveness at every change of the state", dt_live, "s",
                          "<= 60 s", dt_live <= 60, f"python -m rota.bench.timetravel_bench --jobs {jobs}",
                          f"no job left waiting more than {DEFAULT_LATENCY} s"))
    return figures


def trace_figures(traces: str, runs: int) -> list[Figure]:
    """`why` for every job of the whole KTH-SP2 trace that waited (the trace replayed into a log under
    EASY, as the site ran it), in one walk (``why_all``): jobs/s, and each timeline checked against the log."""
    import gzip
    import os

    from rota.core.timetravel import why_all
    from rota.core.traces import read_swf, swf_cluster

    path = os.path.join(traces, "KTH-SP2-1996-2.1-cln.swf.gz")
    if not traces or not os.path.exists(path):
        print(f"(no whole KTH-SP2 trace under --traces/ROTA_TRACES {traces!r}: trace-scale why skipped)")
        return []
    with gzip.open(path, "rt") as fh:
        trace = read_swf(fh, source=path)
    log = Simulator(swf_cluster(trace.max_procs), "easy", record_log=True).run(trace.jobs).log
    times, reports = [], {}
    for _ in range(runs):
        t = time.perf_counter()
        reports = why_all(log)
        times.append(time.perf_counter() - t)
    waited = [r for r in reports.values() if r.start_time is not None and r.start_time > r.submit_time]
    gapless = sum(1 for r in waited if r.intervals and r.intervals[0].start == r.submit_time
                  and r.intervals[-1].end == r.start_time
                  and all(a.end == b.start for a, b in zip(r.intervals, r.intervals[1:])))
    dt = statistics.median(times)
    return [Figure(f"rota why for all {len(waited):,} jobs of KTH-SP2 that waited ({len(log):,}-event log, EASY)",
                   len(waited) / dt, "jobs/s", "", None, "python -m rota.bench.timetravel_bench --traces DIR",
                   f"{dt:.1f} s in one walk; {gapless:,} of {len(waited):,} timelines start at the submit, end at "
                   "the start and have no gaps")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=355_000)
    ap.add_argument("--cache", default=None, help="file keeping the generated log between runs")
    ap.add_argument("--no-cluster", action="store_true", help="skip the commands against a NATS-held log")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-verify", action="store_true", help="skip the verify figures")
    ap.add_argument("--json", default=None)
    ap.add_argument("--traces", default=os.environ.get("ROTA_TRACES", ""),
                    help="directory of the whole traces (default $ROTA_TRACES) for the trace-scale figure")
    ap.add_argument("--only-traces", action="store_true", help="only the trace-scale figure")
    args = ap.parse_args()
    figures = [] if args.only_traces else run(args.jobs, args.runs, args.cache, not args.no_cluster,
                                              not args.no_verify)
    figures += trace_figures(args.traces, args.runs)
    print_table(figures, "rota time-travel benchmark (medians)")
    write_json(figures, args.json)


if __name__ == "__main__":
    main()
