"""``rota``: the friendly command line (Slurm-named commands live beside it)."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NoReturn, Optional

import typer

from . import exits
from .audit import app as audit_app

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="rota: an event-sourced batch scheduler for shared GPU machines.")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
             add_help_option=False)
def acctmgr(ctx: typer.Context) -> None:
    """Accounts, users and QOS: sacctmgr's commands (rota acctmgr add qos gpu MaxJobsPerUser=2 ...)."""
    from .sacctmgr import main as sacctmgr_main

    raise typer.Exit(sacctmgr_main(list(ctx.args)))


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
             add_help_option=False)
def report(ctx: typer.Context) -> None:
    """Reports from the accounting projection: `rota report usage [-S START] [-E END] [-P] [--parquet FILE]`
    (CPU and GPU hours per account and user), `rota report time-accuracy [-S START] [-E END] [-P]` (--time asked
    for against used, and the limit each user's history suggests)."""
    from . import time_report, usage_report

    args = list(ctx.args)
    if not args or args[0] not in ("usage", "time-accuracy"):
        sys.stderr.write("rota report: give a report: usage or time-accuracy\n" + usage_report.USAGE + time_report.USAGE)
        raise typer.Exit(1 if args and args[0] not in ("-h", "--help") else 0)
    report_of = usage_report if args[0] == "usage" else time_report
    raise typer.Exit(report_of.run(args[1:], sys.stdout, sys.stderr))


@app.command()
def keygen(
    path: Optional[str] = typer.Argument(None, help="where to write the key (default: the state directory's cluster.key)"),
    force: bool = typer.Option(False, "--force", help="replace an existing key (every host then needs the new one)"),
    size: int = typer.Option(128, "--bytes", help="key length in bytes (32 to 1024)"),
    host: Optional[str] = typer.Option(None, help="write HOST's own key (derived from the cluster key) instead"),
    out: Optional[str] = typer.Option(None, help="with --host: where to write that host's key"),
    nats_auth: Optional[str] = typer.Option(None, help="write nats-server's authorization block (rota's roles) to FILE"),
    config: Optional[str] = typer.Option(None, help="with --nats-auth: the cluster configuration naming the nodes"),
    login: list[str] = typer.Option([], "--login-host", help="with --nats-auth: a host with a signer but no node"),
) -> None:
    """Make the cluster key (like mungekey), a host's key, or the NATS servers' authorization block."""
    from rota.wire import keys

    from rota.wire.paths import cluster_key_path, state_dir as default_state

    key_path = path or cluster_key_path(default_state())
    try:
        if host is None and nats_auth is None:
            os.makedirs(os.path.dirname(os.path.abspath(key_path)), exist_ok=True)
            if os.path.lexists(key_path) and not force:
                fail(f"{key_path} exists; keep it, or replace it with --force (every host then needs the new one)")
            keys.generate(key_path, size, force=force)
            typer.echo(f"rota keygen: wrote a {size}-byte cluster key to {key_path} (mode 0600); copy it only to "
                       "controller hosts, and give other hosts their own key: rota keygen --host NAME --out FILE")
            return
        ring = keys.load_keyring(key_path)
        if ring.cluster_key is None:
            fail(f"{key_path} is a host key: --host and --nats-auth need the cluster key")
        if host is not None:
            target = out or f"{host}.key"
            keys.write_host_key(target, ring.cluster_key, host)
            typer.echo(f"rota keygen: wrote {host}'s key to {target} (mode 0600); install it on {host} and start "
                       f"`rota agent --node {host} --key FILE` (or `rota authd --key FILE`)")
        if nats_auth is not None:
            from rota.wire.natsauth import authorization_block

            hosts = list(login)
            if config:
                from .localconfig import load_config

                cfg = load_config(config, None)
                hosts += [h for h in [n.name for n in cfg.nodes] + list(cfg.controllers) if h not in hosts]
            keys.write_private(nats_auth, authorization_block(ring, hosts).encode(), exclusive=False)
            typer.echo(f"rota keygen: wrote the authorization block for {len(hosts)} host(s) to {nats_auth} "
                       "(mode 0600); include it in each nats-server's configuration")
    except keys.KeyFileError as exc:
        fail(exc.message + (f" (fix: {exc.fix})" if exc.fix else ""))
    except (OSError, ValueError) as exc:
        fail(str(exc))


@app.command()
def demo(
    log: Optional[str] = typer.Option(None, help="also write the demo's event log (JSON lines) for rota why/replay/verify"),
) -> None:
    """Run a short simulated scheduling demo through rota's core (no daemons needed)."""
    from rota.core.events import encode_envelope

    from .demo import run_demo

    h = run_demo(typer.echo)
    if log:
        with open(log, "wb") as fh:
            for env in h.log:
                fh.write(encode_envelope(env) + b"\n")
        typer.echo(f"\nthe demo's log: {log} ({len(h.log)} events); try: rota why 8 --log {log}")


@app.command()
def simulate(
    trace: str = typer.Argument(..., help="SWF file (.swf/.swf.gz), Philly GPU trace (.csv/.csv.gz) or a Slurm "
                                "accounting dump (sacct -a -X -P -o JobIDRaw,User,Account,Partition,Submit,Start,"
                                "End,Elapsed,Timelimit,NNodes,NCPUS,ReqMem,ReqTRES,State)"),
    policy: str = typer.Option("conservative", help="fifo | easy | easy_strict | conservative"),
    limit: Optional[int] = typer.Option(None, help="simulate only the first N jobs (after --start)"),
    start: int = typer.Option(0, help="index of the first job to simulate"),
    nodes: Optional[int] = typer.Option(None, help="GPU traces: number of 8-GPU nodes (default 160)"),
    no_kill: bool = typer.Option(False, "--no-kill", help="do not kill jobs at their time limit"),
    log: Optional[str] = typer.Option(None, help="write the simulated event log (JSON lines) here"),
    plot: Optional[str] = typer.Option(None, "--plot", help="draw utilisation and queue length to FILE.png"),
    as_json: bool = typer.Option(False, "--json", help="print the figures as JSON"),
    config: Optional[str] = typer.Option(None, "--config", help="the cluster's slurm.conf (for an accounting dump)"),
) -> None:
    """Replay a workload trace through rota's scheduler on a simulated clock."""
    import json as _json

    from rota.core.schedule import POLICIES

    from . import simulate as sim_mod

    if policy not in POLICIES:
        fail(f"unknown policy {policy!r}: choose one of {', '.join(POLICIES)}")
    try:
        tr = sim_mod.load_trace(trace, nodes=nodes, policy=policy, config=config)
        n = len(tr.jobs[start: start + limit if limit else None])
        progress_cb, finish = _progress(n, as_json)
        result, wall = sim_mod.simulate(tr, policy, start=start, limit=limit, kill_at_limit=not no_kill,
                                        record_log=log is not None, sample_every=300 if plot else 0,
                                        progress=progress_cb)
        finish()
        m = result.metrics()
        m.update({"cycles": float(result.cycles), "wall_s": wall,
                  "jobs_per_s": m.get("jobs", 0) / wall if wall else 0.0, "peak_rss_mib": sim_mod.peak_rss_mib()})
        if log:
            sim_mod.write_log(result, log)
        if plot:
            sim_mod.plot(result, plot, f"{tr.name}, {policy}")
    except sim_mod.SimulateError as exc:
        fail(str(exc))
    if as_json:
        typer.echo(_json.dumps({"trace": tr.name, "policy": policy, **m, "records": tr.notes}, indent=1))
        return
    typer.echo(f"trace {tr.name}: {int(m['jobs'])} jobs, policy {policy}")
    for why, count in sorted(tr.notes.items()):
        typer.echo(f"  trace records: {count} {why}")
    typer.echo(f"  average wait             {m['avg_wait']:12.1f} s")
    typer.echo(f"  average bounded slowdown {m['avg_bsld']:12.2f}   (tau = 10 s)")
    typer.echo(f"  utilisation              {m['util']:12.3f}   " + (f"(GPU {m['gpu_util']:.3f})" if 'gpu_util' in m else ""))
    typer.echo(f"  makespan                 {m['makespan']:12.0f} s")
    typer.echo(f"  backfilled starts        {int(m['backfilled']):12d}")
    typer.echo(f"  simulated                {m['jobs_per_s']:12.0f} jobs/s ({result.cycles} cycles, {wall:.1f} s, "
               f"peak {m['peak_rss_mib']:.0f} MiB)")
    if log:
        typer.echo(f"  event log: {log} ({len(result.log)} events)")
    if plot:
        typer.echo(f"  plot: {plot}")


@app.command()
def validate(
    traces: str = typer.Option(None, help="folder holding lublin_256.swf.gz and lublin_256_new2.swf.gz"),
) -> None:
    """Reproduce the published RLScheduler figures and print rota's beside them."""
    from . import simulate as sim_mod

    folder = traces or os.environ.get("ROTA_TRACES") or _default_traces()
    try:
        rows = sim_mod.validation_rows(folder)
    except sim_mod.SimulateError as exc:
        fail(str(exc))
    typer.echo(f"{'trace':<24} {'mode':<22} {'rota bsld':>10} {'published':>10} {'diff':>7} {'avg wait':>10} {'util':>6}")
    for r in rows:
        pub = f"{r['published_bsld']:.2f}" if r["published_bsld"] is not None else "-"
        diff = f"{r['diff_pct']:+.1f}%" if r["diff_pct"] is not None else "-"
        typer.echo(f"{r['trace']:<24} {r['mode']:<22} {r['rota_bsld']:>10.2f} {pub:>10} {diff:>7} "
                   f"{r['avg_wait']:>10.0f} {r['util']:>6.3f}")


def _default_traces() -> str:
    """The Lublin traces kept with the tests (beside this checkout's cli/ folder)."""
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(here, "..", "tests", "fixtures", "traces")


def _progress(total: int, quiet: bool):
    """A rich progress bar for long runs (callback, finish)."""
    if quiet or total < 2000 or not sys.stderr.isatty():
        return None, lambda: None
    from rich.progress import Progress

    prog = Progress(transient=True)
    task = prog.add_task("simulating", total=total)
    prog.start()
    return (lambda done, _t: prog.update(task, completed=done)), prog.stop


def fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"rota: error: {message}", err=True)
    raise typer.Exit(code)


config_app = typer.Typer(help="Cluster configuration (slurm.conf syntax).", no_args_is_help=True)
app.add_typer(config_app, name="config")


@config_app.command("check")
def config_check(
    file: str = typer.Argument(..., help="slurm.conf-syntax file"),
    gres: Optional[str] = typer.Option(None, "--gres", help="gres.conf to check beside it"),
) -> None:
    """Diagnose a configuration: every problem with file:line, what is wrong and how to fix it."""
    from rota.core.slurmconf import check_config
    from rota.wire.paths import read_slurm_conf, read_text

    try:
        text, origin = read_slurm_conf(file)
        gres_text = read_text(gres) if gres else None
    except OSError as exc:
        fail(f"cannot read {exc.filename}: {exc.strerror}")
    except ValueError as exc:
        fail(str(exc))
    cfg, diags = check_config(text, file, gres_text, gres or "gres.conf", origin)
    for d in diags:
        if d.severity != "ignored":
            typer.echo(str(d), err=True)
    ignored = [d for d in diags if d.severity == "ignored"]
    if ignored:
        typer.echo(f"{file}: {len(ignored)} Slurm setting(s) rota does not use, ignored: "
                   + ", ".join(f"{d.message.split()[0]} (line {d.line}{'' if d.file == file else ' of ' + d.file})"
                              for d in ignored), err=True)
    if cfg is None:
        errors = sum(1 for d in diags if d.severity == "error")
        typer.echo(f"{file}: {errors} error(s); the configuration was not accepted", err=True)
        raise typer.Exit(1)
    gpus = sum(n.gpu_count for n in cfg.nodes)
    typer.echo(f"{file}: OK: {len(cfg.nodes)} nodes, {sum(n.cpus for n in cfg.nodes)} CPUs, {gpus} GPUs, "
               f"{len(cfg.partitions)} partitions ({', '.join(p.name for p in cfg.partitions)}), "
               f"policy {cfg.scheduler.policy}")


projections_app = typer.Typer(help="The SQLite projection of the log (sacct, sinfo read it).",
                              no_args_is_help=True)
app.add_typer(projections_app, name="projections")

app.add_typer(audit_app, name="audit")


def _open_log(nats: Optional[str]) -> tuple[list[str], dict]:
    """(URLs, connect options) of the log, as its administrator; a clear refusal otherwise."""
    from rota.wire.cluster import NoCluster, NotAdmin, admin_connection

    try:
        return admin_connection(nats)
    except NoCluster as exc:
        fail(str(exc))
    except NotAdmin as exc:
        fail(f"{exc}; this command reads the whole log (every job's environment and script), "
              "so only the cluster's administrator may run it")
    raise AssertionError("unreachable")


@projections_app.command("rebuild")
def projections_rebuild(
    nats: Optional[str] = typer.Option(None, help="NATS servers (default: the running rota up)"),
    db: Optional[str] = typer.Option(None, help="database file (default: the state directory's projections.sqlite)"),
) -> None:
    """Rebuild the projection from the start of the log (into a new file, then swapped in)."""
    import asyncio
    import time as _time

    from rota.controller.eventlog import JetStreamLog
    from rota.projections.projector import Projector

    from rota.wire.paths import projections_db

    urls, options = _open_log(nats)
    target = Path(db) if db else Path(projections_db())
    tmp = target.with_name(target.name + ".rebuild")
    for p in (tmp, Path(str(tmp) + "-wal"), Path(str(tmp) + "-shm")):
        p.unlink(missing_ok=True)

    async def go() -> tuple[int, float, float]:
        lg = await JetStreamLog.connect(urls, **options)
        try:
            proj = Projector(tmp, lg)
            await proj.open()
            t0 = _time.perf_counter()
            n = await proj.catch_up()
            dt = _time.perf_counter() - t0
            assert proj.reasons is not None
            await proj.reasons.catch_up()
            await proj.reasons.settle(int(_time.time()) - 1)
            await proj.save_state()
            await proj.close()
            return n, dt, _time.perf_counter() - t0 - dt
        finally:
            await lg.close()

    n, dt, dt_reasons = asyncio.run(go())
    tmp.replace(target)
    typer.echo(f"rota: projected {n:,} events in {dt:.1f} s ({n / dt if dt else 0:,.0f} events/s) into {target}, "
               f"and the reason history in {dt_reasons:.1f} s more; a running rota up keeps projecting from there "
               "after its restart")


@app.command("export")
def export(
    parquet: str = typer.Option(..., "--parquet", help="directory to write events/jobs/steps/nodes/usage .parquet"),
    nats: Optional[str] = typer.Option(None, help="NATS servers (default: the running rota up)"),
) -> None:
    """Export the event log and the accounting rows as Parquet files for analysis."""
    import asyncio

    from rota.controller.eventlog import JetStreamLog
    from rota.projections.export import export_parquet

    from rota.wire.paths import projections_db

    urls, options = _open_log(nats)

    async def go() -> dict[str, int]:
        lg = await JetStreamLog.connect(urls, **options)
        try:
            return await export_parquet(lg, Path(projections_db()), Path(parquet))
        finally:
            await lg.close()

    for name, rows in asyncio.run(go()).items():
        typer.echo(f"{Path(parquet) / name}: {rows:,} rows")


def _through_controller(command: str, log: Optional[str], nats: Optional[str], needs: str | None = None) -> None:
    """A user who cannot read the log (it holds everyone's environments and scripts), or the file
    ``needs`` names, gets the same answer from the controller, which runs the command where it can."""
    from rota.wire.cluster import may_read_log

    if log is not None or nats is not None or (os.access(needs, os.R_OK) if needs else may_read_log()):
        _QUICK_EXIT[0] = True    # the command runs here, on a heap of the log's records: see main
        return
    from .client import remote_command

    argv = sys.argv[sys.argv.index(command) + 1:] if command in sys.argv else []
    raise typer.Exit(remote_command(command, argv, sys.stdout, sys.stderr, verb="timetravel", timeout=1800,
                                    prog=f"rota {command}"))


def _history(log: Optional[str], nats: Optional[str]):
    from rota.wire.cluster import NoCluster, NotAdmin

    from .timetravel import load_envelopes

    try:
        envs = load_envelopes(log, nats)
    except (OSError, ValueError, NoCluster, NotAdmin) as exc:
        fail(str(exc))
    if not envs:
        fail("the log is empty")
    return envs


@app.command()
def why(
    job: int = typer.Argument(..., help="job id"),
    at: Optional[str] = typer.Option(None, help="explain as of this moment: a log sequence, epoch seconds or ISO time"),
    log: Optional[str] = typer.Option(None, help="a JSON-lines event log (rota simulate --log) instead of the cluster's"),
    nats: Optional[str] = typer.Option(None, help="NATS servers of the cluster (default: the running rota up)"),
    as_json: bool = typer.Option(False, "--json", help="the whole explanation as JSON"),
) -> None:
    """Why did job N wait? Its wait as intervals, each with the reason and the evidence."""
    _through_controller("why", log, nats)
    from rota.core.events import JobsStarted, JobSubmitted

    from .timetravel import explain, job_seqs, load_seek, parse_at, why_json, why_text

    try:
        at_seq, at_time = parse_at(at)
    except ValueError as exc:
        fail(str(exc))
    start_state = None
    seqs = job_seqs(job) if log is None else None
    if seqs is not None:   # the cluster's log: from a snapshot before the submit to where its story ends
        submitted, last, ended = seqs
        upto = at_seq if at_seq is not None else (last if ended else None)
        try:
            start_state, envs = load_seek(nats, target_seq=submitted - 1, to_seq=upto)
        except Exception as exc:  # noqa: BLE001 - unreachable cluster: one clear line
            fail(f"cannot read the log: {exc}")
    else:
        envs = _history(log, nats)
    if at_time is not None:
        at_seq = max((e.seq for e in envs if e.ts <= at_time), default=0)
    rep = explain(envs, job, at_seq, start_state)
    if not rep.found:
        fail(f"job {job} is not in the log (sequences {envs[0].seq if envs else 0}-{envs[-1].seq if envs else 0})")
    if as_json:
        typer.echo(why_json(rep))
        return
    users = {jid: j.spec.user for jid, j in (start_state.jobs.items() if start_state else ())}
    users.update({e.event.job_id: e.event.spec.user for e in envs if isinstance(e.event, JobSubmitted)})
    for e in envs:   # array tasks started under their own ids
        if isinstance(e.event, JobsStarted):
            for s in e.event.starts:
                if s.array_job_id is not None:
                    users[s.job_id] = users.get(s.array_job_id, "?")
    sys.stdout.write("".join(line + "\n" for line in why_text(rep, users)))   # one write: a long story


@app.command()
def replay(
    at: str = typer.Option(..., help="the moment: a log sequence, epoch seconds or ISO time"),
    log: Optional[str] = typer.Option(None, help="a JSON-lines event log instead of the cluster's"),
    nats: Optional[str] = typer.Option(None, help="NATS servers of the cluster (default: the running rota up)"),
) -> None:
    """The queue and the nodes as they were at a moment of the log."""
    _through_controller("replay", log, nats)
    from .timetravel import load_seek, parse_at, replay_views

    try:
        at_seq, at_time = parse_at(at)
    except ValueError as exc:
        fail(str(exc))
    state = None
    if log is None:
        try:
            state, envs = load_seek(nats, at_seq, at_time, to_seq=at_seq)
        except Exception as exc:  # noqa: BLE001 - unreachable cluster: one clear line
            fail(f"cannot read the log: {exc}")
    else:
        envs = _history(log, nats)
    for line in replay_views(envs, at_seq, at_time, state):
        typer.echo(line)


@app.command()
def history(
    job: int = typer.Argument(..., help="job id"),
    log: Optional[str] = typer.Option(None, help="a JSON-lines event log instead of the cluster's projection"),
    nats: Optional[str] = typer.Option(None, help="NATS servers of the cluster (default: the running rota up)"),
    as_json: bool = typer.Option(False, "--json", help="the intervals as JSON"),
) -> None:
    """Job N's pending reasons over time, as kept by the projection (what `rota why` derives, interval
    for interval, without its evidence)."""
    from rota.wire.paths import projections_db

    _through_controller("history", log, nats, needs=projections_db())
    from .timetravel import history_rows, history_text

    if log is not None or nats is not None:
        from rota.core.reason_history import spans_of

        envs = _history(log, nats)
        rows = [(s.code, s.start, s.end, s.seq) for s in spans_of(envs, job)]
        now = envs[-1].ts
    else:
        try:
            rows, now = history_rows(job)
        except (OSError, ValueError) as exc:
            fail(str(exc))
    if as_json:
        import json as _json

        typer.echo(_json.dumps({"job_id": job, "intervals": [
            {"reason": code, "start": start, "end": end, "seq": seq} for code, start, end, seq in rows]}, indent=2))
        return
    for line in history_text(job, rows, now):
        typer.echo(line)


@app.command()
def verify(
    from_seq: int = typer.Option(1, "--from", help="first log sequence to check"),
    to_seq: Optional[int] = typer.Option(None, "--to", help="last log sequence to check"),
    latency: Optional[int] = typer.Option(None, min=0, help="seconds the controller may take to start a job once "
                                          "it can start (liveness; default: the controller's promise, with margin)"),
    no_liveness: bool = typer.Option(False, "--no-liveness", help="only re-run the recorded cycles"),
    log: Optional[str] = typer.Option(None, help="a JSON-lines event log instead of the cluster's"),
    nats: Optional[str] = typer.Option(None, help="NATS servers of the cluster (default: the running rota up)"),
) -> None:
    """Re-run the scheduler at every recorded cycle and check it makes exactly the recorded decisions; and
    at every change of the state between them, that no job the scheduler would start was left waiting."""
    _through_controller("verify", log, nats)
    import time as _time

    from rota.core.liveness import DEFAULT_LATENCY

    from .timetravel import check_all

    latency = DEFAULT_LATENCY if latency is None else latency
    envs = _history(log, nats)
    t0 = _time.perf_counter()
    results, late = check_all(envs, from_seq, to_seq, latency=None if no_liveness else latency)
    cycles, bad = len(results), [div for _seq, div in results if div is not None]
    dt = _time.perf_counter() - t0
    for d in bad:
        typer.echo(f"DIVERGES at sequence {d.seq} (cycle {d.cycle}), job {d.job_id}: recorded {d.recorded}; "
                   f"the scheduler now says {d.recomputed}")
    for x in late:
        typer.echo(f"LATE: {x.text()}")
    last = to_seq or envs[-1].seq
    live = "" if no_liveness else (f"; {len(late)} jobs left waiting longer than {latency} s after they could start"
                                   if late else f"; no job waited more than {latency} s once the scheduler would "
                                   "start it (liveness checked at every change of the state)")
    if bad or late:
        typer.echo(f"{len(bad)} of {cycles} recorded cycles diverge{live} (sequences {from_seq}-{last}, {dt:.1f} s)")
        raise typer.Exit(1)
    typer.echo(f"OK: all {cycles} recorded cycles in sequences {from_seq}-{last} are exactly what the scheduler "
               f"decides from the state before them{live} ({dt:.1f} s)")


@app.command()
def whatif(
    set_: list[str] = typer.Option(..., "--set", help="KEY=VALUE, e.g. policy=easy, bf_window=3600, priority.age=1000"),
    log: Optional[str] = typer.Option(None, help="a JSON-lines event log instead of the cluster's"),
    nats: Optional[str] = typer.Option(None, help="NATS servers of the cluster (default: the running rota up)"),
    as_json: bool = typer.Option(False, "--json", help="figures and per-job changes as JSON"),
    top: int = typer.Option(10, help="how many winners and losers to list"),
) -> None:
    """Replay the recorded submits and real run times under other settings and compare."""
    _through_controller("whatif", log, nats)
    import json as _json
    from dataclasses import asdict

    from rota.core.whatif import whatif as compare

    settings = {}
    for item in set_:
        key, eq, value = item.partition("=")
        if not eq:
            fail(f"--set {item!r}: use KEY=VALUE")
        settings[key.strip()] = value.strip()
    try:
        res = compare(_history(log, nats), settings)
    except ValueError as exc:
        fail(str(exc))
    if as_json:
        typer.echo(_json.dumps(asdict(res), indent=2))
        return
    from .timetravel import whatif_text

    for line in whatif_text(res, set_, top):
        typer.echo(line)


@app.command()
def idle(as_json: bool = typer.Option(False, "--json", help="the idle jobs as JSON")) -> None:
    """The running jobs whose GPUs sit idle: since when, for how long, the GPU-hours that wasted, and the policy."""
    import json as _json

    from .client import ask
    from rota.core.timefmt import format_utc

    reply = ask("rota idle", "idle", {})
    if reply is None:
        raise typer.Exit(1)
    if as_json:
        typer.echo(_json.dumps({"jobs": reply["jobs"], "policy": reply["policy"]}, indent=2))
        return
    p = reply["policy"] or {}
    then = f", then {p['action']} after {p['grace']}s more" if p.get("action", "warn") != "warn" else ""
    typer.echo(f"policy: after {p['after']}s idle: warn{then}" if p.get("after") else "policy: off (RotaIdleGpu)")
    typer.echo(f"{'JOBID':>8} {'USER':<10} {'PARTITION':<10} {'NODE':<10} {'GPUS':>4} {'IDLE_SINCE':<24} "
               f"{'IDLE_FOR':>9} {'GPU_HOURS':>9}")
    for j in reply["jobs"]:
        typer.echo(f"{j['job_id']:>8} {j['user']:<10} {j['partition']:<10} {j['node']:<10} {j['gpus']:>4} "
                   f"{format_utc(j['since']):<24} {j['idle_for']:>8}s {j['gpu_hours']:>9.2f}")


@app.command()
def version() -> None:
    """Print rota's version."""
    from rota.core import __version__

    typer.echo(f"rota {__version__}")


# Set by a command that ends holding a big heap and leaves nothing to clean up (the time-travel commands):
# the process then ends as soon as its output is out, without freeing every object one by one.
_QUICK_EXIT = [False]


def main(prog_name: str | None = None) -> None:
    try:
        app(prog_name=prog_name)
    except KeyboardInterrupt:
        sys.exit(130)
    except SystemExit as done:
        if not _QUICK_EXIT[0]:
            raise
        code = done.code
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except OSError:      # a reader that went away (a pipe to head)
                code = code or 1
        if exits.before_exit is not None:     # run by a command server's worker: its caller hears the status
            exits.before_exit(code or 0)
        os._exit(code or 0)


def main_exit() -> None:
    """``rota`` as a command server's worker runs it (rota.programs.commandserver), named as its caller names it."""
    main("rota")


if __name__ == "__main__":
    main()
