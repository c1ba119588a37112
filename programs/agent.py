"""``rota agent`` (a node's agent and its local signer) and ``rota authd`` (a signer alone, for a login
host), each in the foreground until Ctrl-C or SIGTERM."""
from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

from rota.wire.lifetime import run_bounded

# the thin commands' server beside each signer: isolated (-I) and started in /, so nothing of the directory the
# daemon was started in, nor of its PYTHON* variables, is on the path of a process that runs as root
COMMAND_SERVER = (sys.executable, "-I", "-m", "rota.programs.commandserver")


def command_server(log_commands: bool = False) -> tuple[str, ...]:
    """The command server's program beside a signer (its socket's path goes last); with ``log_commands`` it serves
    the log's lookups too (the controller's host)."""
    return (*COMMAND_SERVER, "--log-commands") if log_commands else COMMAND_SERVER


def _keyring(key: str | None, state: Path, host: str, echo) -> Any:
    from rota.wire.keys import KeyFileError, load_keyring
    from rota.wire.paths import cluster_key_path

    path = key or cluster_key_path(str(state))
    try:
        return load_keyring(path, host)
    except KeyFileError as exc:
        echo(f"rota: {exc}")
    except OSError as exc:
        echo(f"rota: cannot read the key {path}: {exc.strerror}")
    return None


def signer_is_running(path: str) -> bool:
    """Whether a signer already answers on ``path`` (another agent of this host, or rota up)."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
            return True
        except OSError:
            return False


async def run_signer(path: str, host: str, keyring: Any, url: str, tls_ca: str | None, echo,
                     log_commands: bool = False) -> Any:
    """Connect as ``host``'s role and serve the local socket; returns the running signer. ``log_commands``: its
    command server serves the log's lookups too (the controller's host)."""
    from rota.wire import natsconn

    from rota.agents.signer import Signer

    nc = await natsconn.connect(url, f"signer {host}", keyring=keyring, host=host, tls_ca=tls_ca)
    signer = Signer(path, host, keyring, nc,
                    command_server=command_server(log_commands) if os.environ.get("ROTA_THIN") != "0" else ())
    await signer.start()
    echo(f"rota: local signer for {host} on {path}")
    return signer


def _setup(prog: str, host: str, nats: str | None, key: str | None, state_dir: str | None,
           echo) -> tuple[str, Path, Any] | None:
    """The NATS URLs, the state directory and this host's keyring; None (said why) when one is missing."""
    from rota.wire.cluster import NoCluster, nats_urls
    from rota.wire.daemonlog import daemon_logging
    from rota.wire.paths import default_state_dir

    daemon_logging(f"{prog} {host}")
    try:
        url = nats_urls(nats)
    except NoCluster as exc:
        echo(f"{prog}: {exc}")
        return None
    state = Path(state_dir) if state_dir else default_state_dir()
    keyring = _keyring(key, state, host, echo)
    return None if keyring is None else (url, state, keyring)


STOP_WAIT = 10.0    # seconds a stopping agent or signer gets to close its connections


async def _stop_within(what: str, echo, signer: Any, agent: Any = None) -> None:
    """Stop the signer and the agent, giving them STOP_WAIT seconds: a NATS connection that keeps
    reconnecting must not keep the process from ending."""
    async def both() -> None:
        if signer is not None:
            await signer.stop()
        if agent is not None:
            await agent.stop()
    try:
        await asyncio.wait_for(both(), STOP_WAIT)
    except asyncio.TimeoutError:
        echo(f"{what}: stopping took more than {STOP_WAIT:.0f} s; leaving anyway")


def _stop_event() -> asyncio.Event:
    """Set on Ctrl-C or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


def main(*, node: str, nats: str | None, state_dir: str | None, key: str | None = None, tls_ca: str | None = None,
         socket_path: str | None = None, echo=print, **options: Any) -> int:
    from rota.wire.paths import socket_in

    from rota.agents.agent import Agent

    setup = _setup("rota agent", node, nats, key, state_dir, echo)
    if setup is None:
        return 1
    url, state, keyring = setup
    try:
        agent = Agent(node, url, state, keyring=keyring, tls_ca=tls_ca, **options)
    except ValueError as exc:
        echo(f"rota agent: {exc}")
        return 1
    for line in agent.describe():
        echo(line)
    path = socket_path or socket_in(str(state))

    async def run() -> None:
        stop = _stop_event()
        await agent.start()
        signer = None
        if signer_is_running(path):
            echo(f"rota agent {node}: a signer already answers on {path}; not starting another")
        else:
            signer = await run_signer(path, node, keyring, url, tls_ca, echo)
        echo(f"rota agent {node}: registered with {url}; running jobs keep running if the agent stops")
        await stop.wait()
        await _stop_within(f"rota agent {node}", echo, signer, agent)

    try:
        run_bounded(run())
    except OSError as exc:
        echo(f"rota agent: cannot reach NATS at {url}: {exc}")
        return 1
    echo(f"rota agent {node}: stopped")
    return 0


def authd(*, host: str | None, nats: str | None, key: str | None, tls_ca: str | None, socket_path: str | None,
          state_dir: str | None, echo=print) -> int:
    """``rota authd``: only the local signer (munged's place), for a login host without an agent."""
    from rota.wire.paths import socket_in

    from rota.agents.agent import hostname

    name = host or hostname()
    setup = _setup("rota authd", name, nats, key, state_dir, echo)
    if setup is None:
        return 1
    url, state, keyring = setup
    path = socket_path or socket_in(str(state))

    async def run() -> None:
        stop = _stop_event()
        signer = await run_signer(path, name, keyring, url, tls_ca, echo)
        await stop.wait()
        await _stop_within(f"rota authd {name}", echo, signer)

    try:
        run_bounded(run())
    except (OSError, ValueError) as exc:
        echo(f"rota authd: {exc}")
        return 1
    return 0
