"""``rota``: the whole command line. The user's commands come from :mod:`rota.cli.main`; the programs that
run a cluster (``rota up``, ``rota agent``, ``rota authd``), the installer of the native commands and the
bulk submit through the Python API are put together here, above everything they start."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer

from .imports import nats_without_websockets, pydantic_without_plugins

nats_without_websockets()
pydantic_without_plugins()

from rota.cli.main import app, fail, main  # noqa: E402 - after the finders above, which shape what it imports


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def submit(
    ctx: typer.Context,
    file: str = typer.Option(..., "--file", "-f", help="one job per line: a command to run, as sbatch --wrap "
                             "runs it ('-': standard input; blank lines and lines starting with # are skipped)"),
) -> None:
    """Submit many jobs in one request: `rota submit --file jobs.txt -t 10 --gres=gpu:1` (the options after the
    file are sbatch's, for every job). Prints the job ids, one per line."""
    from rota.client.api import Client, JobError, NoCluster

    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"rota submit: cannot read {file}: {getattr(exc, 'strerror', None) or exc}")
    jobs = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not jobs:
        fail(f"rota submit: {file} names no job (one command per line)")
    try:
        ids = Client().submit_many(jobs, options=list(ctx.args))
    except (JobError, NoCluster) as exc:
        fail(f"rota submit: {exc}")
    sys.stdout.write("".join(f"{j}\n" for j in ids))


@app.command()
def up(
    state_dir: Optional[str] = typer.Option(None, help="where the log and state live (default "
        "$ROTA_STATE_DIR, else /var/lib/rota for root, ~/.local/share/rota for others)"),
    config: Optional[str] = typer.Option(None, help="slurm.conf-syntax cluster config (default: this machine as one node)"),
    nats: Optional[str] = typer.Option(None, help="use these NATS servers (URL[,URL...]) instead of an embedded one"),
    nats_port: Optional[int] = typer.Option(None, help="port of the embedded nats-server (default: a free one)"),
    fake_gpus: Optional[str] = typer.Option(None, help="TYPE:N fake GPUs for a machine without any"),
    agent_node: Optional[str] = typer.Option(None, help="node the local agent serves (default: this host, else the first)"),
    no_agent: bool = typer.Option(False, "--no-agent", help="run no local agent (agents run elsewhere)"),
    node_timeout: float = typer.Option(300.0, help="seconds of agent silence before a node is DOWN (SlurmdTimeout)"),
    kill_wait: float = typer.Option(30.0, help="seconds between SIGTERM and SIGKILL at a time limit or cancel (KillWait)"),
    max_tasks: Optional[int] = typer.Option(None, min=16, help="the most processes and threads one job may hold on "
        "the local node (default: its share of the node's, by its CPUs)"),
    listen: Optional[str] = typer.Option(None, help="address the embedded nats-server listens on (default "
        "127.0.0.1; RotaNatsListen=)"),
    tls_cert: Optional[str] = typer.Option(None, help="TLS certificate of the embedded nats-server (RotaTLSCertFile=)"),
    tls_key: Optional[str] = typer.Option(None, help="its private key (RotaTLSKeyFile=)"),
    tls_ca: Optional[str] = typer.Option(None, help="the CA that signed it, for rota's own clients (RotaTLSCAFile=)"),
    standby: bool = typer.Option(False, "--standby", help="a second controller (with --nats naming the cluster's "
        "servers and its key in the state directory): follow the log and take over when the leader stops"),
    web_port: Optional[int] = typer.Option(None, min=0, max=65535, help="port of the web view on 127.0.0.1 (0: "
                                           "none; default $ROTA_WEB_PORT, else 8787)"),
) -> None:
    """Run the controller, a local agent (and an embedded nats-server) in the foreground until Ctrl-C."""
    from .up import main as up_main

    tls = {k: v for k, v in (("cert_file", tls_cert), ("key_file", tls_key), ("ca_file", tls_ca)) if v}
    if web_port is None:
        text = os.environ.get("ROTA_WEB_PORT") or "8787"
        if not text.isdecimal() or int(text) > 65535:
            fail(f"rota up: ROTA_WEB_PORT={text!r} is not a port (0 to 65535; 0: no web view)")
        web_port = int(text)
    code = up_main(state_dir, config, nats, nats_port, fake_gpus, typer.echo, agent_node=agent_node,
                   no_agent=no_agent, node_timeout=node_timeout, agent_options={"kill_wait": kill_wait, "max_tasks": max_tasks},
                   tls=tls or None, listen=listen, standby=standby, web_port=web_port)
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)     # stopped: a thread still blocked somewhere (a full disk) must not keep the process


@app.command()
def agent(
    node: str = typer.Option(..., help="the node name this agent serves (as in the cluster configuration)"),
    nats: Optional[str] = typer.Option(None, help="NATS servers URL[,URL...] (default: $ROTA_NATS_URL or a running rota up)"),
    state_dir: Optional[str] = typer.Option(None, help="agent spool and job ledger (default $ROTA_STATE_DIR)"),
    fake_gpus: Optional[str] = typer.Option(None, help="TYPE:N fake GPUs (a fake NVML) for a machine without any"),
    faults_file: Optional[str] = typer.Option(None, help="fake NVML fault-injection JSON file"),
    cpus: Optional[int] = typer.Option(None, help="report this many CPUs instead of the machine's"),
    memory: Optional[int] = typer.Option(None, help="report this much memory (MiB) instead of the machine's"),
    heartbeat: float = typer.Option(5.0, help="seconds between heartbeats"),
    health_interval: float = typer.Option(30.0, help="seconds between health checks (NVML, health program)"),
    health_program: Optional[str] = typer.Option(None, help="admin health check: a non-zero exit drains the node"),
    gpu_max_temp: int = typer.Option(90, help="GPU temperature (C) that is reported (a warning, or a drain with "
                                     "--gpu-drain-on temp)"),
    gpu_drain_on: str = typer.Option("", help="GPU warnings that drain the node instead: any of throttle,pcie,temp"),
    gpu_sample: float = typer.Option(10.0, help="seconds between samples of the running jobs' GPU use (0: off)"),
    gpu_idle_report: float = typer.Option(60.0, help="seconds a job's GPUs stay idle before it is reported idle"),
    kill_wait: float = typer.Option(30.0, help="seconds between SIGTERM and SIGKILL (KillWait)"),
    max_tasks: Optional[int] = typer.Option(None, min=16, help="the most processes and threads one job may hold "
        "(default: its share of the node's, by its CPUs)"),
    no_cgroups: bool = typer.Option(False, "--no-cgroups", help="do not confine jobs in cgroups (poll RSS instead)"),
    key: Optional[str] = typer.Option(None, help="this node's key file, or the cluster key (default: the "
        "state directory's cluster.key)"),
    tls_ca: Optional[str] = typer.Option(None, help="CA certificate of the NATS servers, when they speak TLS"),
    socket: Optional[str] = typer.Option(None, "--socket", help="where the local signer listens (default: the "
        "state directory's run/rota.sock)"),
) -> None:
    """Run a node agent (slurmd) and this host's local signer in the foreground until Ctrl-C."""
    from .agent import main as agent_main

    raise typer.Exit(agent_main(node=node, nats=nats, state_dir=state_dir, key=key, tls_ca=tls_ca,
                                socket_path=socket, fake_gpus=fake_gpus,
                                faults_file=faults_file, cpus=cpus, memory=memory, heartbeat=heartbeat,
                                health_interval=health_interval, health_program=health_program,
                                gpu_max_temp=gpu_max_temp, gpu_drain_on=gpu_drain_on, gpu_sample=gpu_sample,
                                gpu_idle_report=gpu_idle_report,
                                kill_wait=kill_wait, use_cgroups=not no_cgroups, max_tasks=max_tasks,
                                echo=typer.echo))


@app.command()
def authd(
    host: Optional[str] = typer.Option(None, help="this host's name, as its key names it (default: the host name)"),
    nats: Optional[str] = typer.Option(None, help="NATS servers URL[,URL...] (default: $ROTA_NATS_URL or a running rota up)"),
    key: Optional[str] = typer.Option(None, help="this host's key file (rota keygen --host), or the cluster key"),
    tls_ca: Optional[str] = typer.Option(None, help="CA certificate of the NATS servers, when they speak TLS"),
    socket: Optional[str] = typer.Option(None, "--socket", help="where to listen (default: the state directory's run/rota.sock)"),
    state_dir: Optional[str] = typer.Option(None, help="state directory (default $ROTA_STATE_DIR)"),
) -> None:
    """Run only this host's local signer (munged's place), for a login host without an agent."""
    from .agent import authd as authd_main

    raise typer.Exit(authd_main(host=host, nats=nats, key=key, tls_ca=tls_ca, socket_path=socket,
                                state_dir=state_dir, echo=typer.echo))


web_app = typer.Typer(help="The web view: the queue, nodes, every job's wait, the cluster over time, /metrics.")
app.add_typer(web_app, name="web")


@web_app.callback(invoke_without_command=True)
def web(
    ctx: typer.Context,
    state_dir: Optional[str] = typer.Option(None, help="the cluster's state directory (default $ROTA_STATE_DIR)"),
    listen: str = typer.Option("127.0.0.1", help="address to listen on (beyond loopback only with --tls-cert/--tls-key)"),
    port: int = typer.Option(8787, min=1, max=65535, help="port to listen on"),
    tls_cert: Optional[str] = typer.Option(None, help="TLS certificate (PEM)"),
    tls_key: Optional[str] = typer.Option(None, help="its private key (PEM)"),
    metrics_token_file: Optional[str] = typer.Option(None, help="a file holding the bearer token /metrics asks for "
                                                     "when not on loopback (and for per-user series under PrivateData)"),
) -> None:
    """Serve the web view in the foreground until Ctrl-C (`rota up` starts one on 127.0.0.1:8787)."""
    if ctx.invoked_subcommand is not None:
        return
    from .web import main as web_main

    raise typer.Exit(web_main(state_dir, listen, port, tls_cert, tls_key, metrics_token_file, echo=typer.echo))


@web_app.command("login")
def web_login() -> None:
    """Print a link that signs you in to the web view as yourself (valid 10 minutes, once)."""
    from rota.cli.client import ask
    from rota.wire.paths import state_dir

    from .web import login_url

    reply = ask("rota web login", "web_token", {})
    if reply is None:
        raise typer.Exit(1)
    link = login_url(state_dir(), reply["token"])
    if link is None:
        fail("rota web login: no web view runs for this cluster (`rota up` starts one unless --web-port 0; "
             "or run `rota web`)")
    typer.echo(link)


@app.command("install-commands")
def install_commands(
    bin_dir: Optional[str] = typer.Option(None, "--bin-dir", help="where the commands are (default: beside "
        "this Python, where pip put them)"),
) -> None:
    """Build the native thin client (needs a C compiler) and install it as sbatch, squeue, ... : they then
    start in about a millisecond and hand the command to the local command server."""
    import subprocess

    from rota.agents import launch

    from .native_build import NoCompiler, install, isolate_scripts

    target = Path(bin_dir) if bin_dir else Path(sys.executable).parent
    if not target.is_dir():
        fail(f"rota install-commands: {target} is not a directory (make it, or name another with --bin-dir)")
    try:
        isolate_scripts(target, ("rota",))
        names = install(target)
    except NoCompiler as exc:
        from rota.cli.thin import COMMANDS

        isolate_scripts(target, COMMANDS)
        fail(f"rota install-commands: {exc}; they now run Python isolated (-I)")
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", None) or str(exc)
        fail(f"rota install-commands: could not build the native client: {detail.strip()}")
    typer.echo(f"rota install-commands: {', '.join(names)} in {target} are now the native thin client; "
               f"{launch.EXEC_HELPER} beside them starts the agents' jobs")
    if target.resolve() != Path(sys.executable).parent.resolve():
        typer.echo(f"rota install-commands: agents look for {launch.EXEC_HELPER} beside their Python: start them "
                   f"with ROTA_EXEC={target / launch.EXEC_HELPER}")


__all__ = ["app", "main"]      # main: cli's, which runs the app these commands joined

if __name__ == "__main__":
    main()
