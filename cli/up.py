"""``rota up``: the embedded single-host cluster (nats-server + controller) in the foreground."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from pathlib import Path

from typing import Any

from rota.agents.agent import Agent
from rota.core import events as ev
from rota.core.slurmconf import ConfigError, auto_config, parse_config
from rota.projections.projector import Projector
from rota.wire.paths import default_state_dir

from rota.controller import natsserver
from rota.controller.agentlink import AgentLink
from rota.controller.eventlog import SUBJECT_PREFIX, JetStreamLog
from rota.controller.outbox import Outbox
from rota.controller.service import Controller

log = logging.getLogger("rota.up")


def machine_config(fake_gpus: str | None) -> ev.ClusterConfig:
    """A one-node cluster describing this machine (CPUs, memory; GPUs from --fake-gpus TYPE:N)."""
    mem_kib = 0
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    except OSError:
        mem_kib = 4 * 1024 * 1024
    gpus: list[tuple[str, int]] = []
    if fake_gpus:
        gtype, _, count = fake_gpus.rpartition(":")
        if not count.isdecimal():
            raise ValueError(f"--fake-gpus {fake_gpus!r}: use TYPE:N, for example a100:4")
        gpus.append((gtype or "gpu", int(count)))
    from rota.agents.agent import hostname

    return auto_config(hostname(), os.cpu_count() or 1, max(1, mem_kib // 1024), gpus)


def load_config(path: str | None, fake_gpus: str | None) -> ev.ClusterConfig:
    """The cluster configuration ``rota up`` applies; its nodes take work once their agent registers."""
    if path is None:
        cfg = machine_config(fake_gpus)
    else:
        text = read_text(path)
        gres = Path(path).with_name("gres.conf")
        cfg = parse_config(text, path, read_text(str(gres)) if gres.exists() else None, str(gres))
    return cfg.model_copy(update={"agents": True})


def pick_agent_node(config: ev.ClusterConfig, wanted: str | None) -> str | None:
    """The node the local agent serves: ``wanted``, else this host's name if configured, else the first."""
    names = [n.name for n in config.nodes]
    if wanted:
        if wanted not in names:
            raise ValueError(f"--agent-node {wanted}: no such node in the configuration ({', '.join(names[:5])}...)")
        return wanted
    from rota.agents.agent import hostname

    host = hostname()
    return host if host in names else (names[0] if names else None)


def prepare_state_dir(state_dir: Path) -> Any:
    """The state directory and its cluster key: made on first start (the key private, like munge's);
    refused with the exact fix when the key is not private to this user."""
    from rota.wire.keys import generate, load_keyring
    from rota.wire.paths import cluster_key_path

    state_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(state_dir, 0o755)   # others reach run/ (the signer's socket); what is inside stays private
    key = cluster_key_path(str(state_dir))
    if not os.path.lexists(key):
        generate(key)
    return load_keyring(key)


async def run(state_dir: Path, config: ev.ClusterConfig, nats_url: str | None, nats_port: int | None,
              echo=print, *, agent_node: str | None = None, fake_gpus: str | None = None,
              node_timeout: float = 300.0, agent_options: dict | None = None, tls: dict[str, str] | None = None,
              listen: str = "127.0.0.1") -> None:
    from rota.agents.agent import hostname
    from rota.agents.main import run_signer
    from rota.wire import natsauth
    from rota.wire.paths import socket_in

    from rota.controller.views import timetravel_environment

    os.umask(0o077)   # every file rota writes is private unless made public on purpose
    keyring = prepare_state_dir(state_dir)
    signer_host = agent_node or hostname()
    tls_ca = (tls or {}).get("ca_file")
    server = None
    if nats_url is None:
        hosts = [n.name for n in config.nodes] + [signer_host]
        server = natsserver.start(state_dir / "nats", port=nats_port, tls=tls, host=listen,
                                  authorization=natsauth.authorization_block(keyring, hosts))
        nats_url = server.url
    else:
        echo(f"rota up: the NATS servers at {nats_url} are not rota's own: make sure they enforce rota's roles "
             "(`rota keygen --nats-auth FILE --config slurm.conf` writes their authorization block)")
    info = state_dir / "cluster.json"
    urls = nats_url.split(",")
    eventlog = await JetStreamLog.connect(urls, replicas=3 if len(urls) >= 3 else 1, keyring=keyring,
                                          **natsauth.connect_options(keyring, None, tls_ca))
    from .reports import runner

    controller = Controller(eventlog, config=config, keyring=keyring, outbox=Outbox(),
                            reports=runner(str(state_dir / "projections.sqlite")),
                            timetravel_env=timetravel_environment(str(state_dir)))
    agent: Agent | None = None
    link: AgentLink | None = None
    projector: Projector | None = None
    projecting: asyncio.Task | None = None
    signer = None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await controller.start()
        await controller.serve(eventlog.nc)
        link = AgentLink(controller, eventlog.nc, node_timeout=node_timeout, keyring=keyring)
        await link.start()
        projector = Projector(state_dir / "projections.sqlite", eventlog)
        try:
            await projector.open()
        except Exception as exc:  # noqa: BLE001 - scheduling goes on; sacct/sinfo say they have no data
            echo(f"rota up: projections disabled: cannot open {projector.path}: {exc}")
            projector = None
        if projector is not None:
            wake = asyncio.Event()
            await eventlog.nc.subscribe(f"{SUBJECT_PREFIX}.>", cb=_waker(wake))
            projecting = asyncio.create_task(projector.follow(stop, wake))
        if agent_node is not None:
            node_cfg = next(n for n in config.nodes if n.name == agent_node)
            opts = dict(agent_options or {})
            if fake_gpus:   # a fake node (demo, tests): it has what the configuration says
                opts.setdefault("cpus", node_cfg.cpus)
                opts.setdefault("memory", node_cfg.memory)
            agent = Agent(agent_node, nats_url, state_dir, keyring=keyring, tls_ca=tls_ca, fake_gpus=fake_gpus,
                          **opts)
            for line in agent.describe():
                echo(line)
            await agent.start()
        signer = await run_signer(socket_in(str(state_dir)), signer_host, keyring, nats_url, tls_ca, lambda _l: None)
        _write_public(info, json.dumps({"nats": nats_url, "pid": os.getpid(), "tls_ca": tls_ca,
                                        "socket": socket_in(str(state_dir))}))
        cfg = controller.state.config
        assert cfg is not None
        echo(f"rota up: controller leading at {nats_url} (log at sequence {controller.state.seq}); "
             f"{len(cfg.nodes)} node(s), {sum(n.gpu_count for n in cfg.nodes)} GPU(s), "
             f"partition(s) {', '.join(p.name for p in cfg.partitions)}; state in {state_dir}")
        echo(f"rota up: commands reach it through {socket_in(str(state_dir))} (any local user; who they are "
             "comes from the kernel)")
        echo("press Ctrl-C to stop")
        await stop.wait()
    finally:
        try:
            info.unlink()
        except FileNotFoundError:
            pass
        stop.set()
        steps = []
        if signer is not None:
            steps.append(("signer", signer.stop()))
        if agent is not None:
            steps.append(("agent", agent.stop()))
        if link is not None:
            steps.append(("agent link", link.stop()))
        if projector is not None:
            steps.append(("projections", _stop_projector(projector, projecting)))
        steps.append(("snapshot", controller.maybe_snapshot(force=True)))
        steps.append(("controller", controller.stop()))
        steps.append(("event log", eventlog.close()))
        for what, step in steps:   # each bounded: Ctrl-C always stops rota up
            log.info("stopping: %s", what)
            try:
                await asyncio.wait_for(step, timeout=5)
            except Exception as exc:  # noqa: BLE001 - keep stopping the rest
                log.warning("stopping %s: %s", what, exc or type(exc).__name__)
        if server is not None:
            server.stop()
        if agent is not None and agent.runs:
            echo(f"rota up: {len(agent.runs)} job(s) still running on {agent.node} "
                 f"({', '.join(map(str, sorted(agent.runs)[:10]))}); the next `rota up` adopts them")
        echo("rota up: stopped")


def _write_public(path: Path, text: str) -> None:
    """A file every local user may read (the cluster's address: no secret in it)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o644)
    tmp.replace(path)


async def _stop_projector(projector: Projector, projecting: asyncio.Task | None) -> None:
    if projecting is not None:
        await asyncio.gather(projecting, return_exceptions=True)
    await projector.save_state()
    await projector.close()


def _waker(event: asyncio.Event):
    async def on_event(_msg) -> None:
        event.set()
    return on_event


def main(state_dir: str | None, config: str | None, nats: str | None, nats_port: int | None,
         fake_gpus: str | None, echo=print, *, agent_node: str | None = None, no_agent: bool = False,
         node_timeout: float = 300.0, agent_options: dict | None = None, tls: dict[str, str] | None = None,
         listen: str | None = None) -> int:
    from rota.wire.keys import KeyFileError

    logging.basicConfig(level=os.environ.get("ROTA_LOGLEVEL", "WARNING").upper(), format="rota: %(message)s")
    try:
        cfg = load_config(config, fake_gpus)
        node = None if no_agent else pick_agent_node(cfg, agent_node)
        settings = shell_settings(config)
        tls = {**settings.get("tls", {}), **(tls or {})} or None
        if tls is not None and not (tls.get("cert_file") and tls.get("key_file")):
            raise ValueError("TLS needs a certificate and its key (--tls-cert and --tls-key, or RotaTLSCertFile "
                             "and RotaTLSKeyFile in the configuration)")
        listen = listen or settings.get("listen") or "127.0.0.1"
    except ConfigError as exc:
        for d in exc.diagnostics:
            echo(str(d))
        echo(f"rota up: the configuration has errors; check it with: rota config check {config}")
        return 1
    except (OSError, ValueError) as exc:
        echo(f"rota up: {exc}")
        return 1
    try:
        asyncio.run(run(Path(state_dir) if state_dir else default_state_dir(), cfg, nats, nats_port, echo,
                        agent_node=node, fake_gpus=fake_gpus, node_timeout=node_timeout,
                        agent_options=agent_options, tls=tls, listen=listen))
    except natsserver.NatsServerError as exc:
        echo(f"rota up: {exc}")
        return 1
    except KeyFileError as exc:
        echo(f"rota up: {exc.message}")
        if exc.fix:
            echo(f"rota up: fix it with: {exc.fix}")
        return 1
    return 0


def shell_settings(config: str | None) -> dict:
    """What rota's own configuration keys say about how it runs here (TLS, the NATS listen address)."""
    from rota.core.slurmconf import shell_settings as read

    if config is None:
        return {}
    return read(read_text(config))


def read_text(path: str) -> str:
    """A configuration file's text; a file that is not UTF-8 is named with the byte that is not."""
    data = Path(path).read_bytes()
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ValueError(f"{path}:{line}: the file is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                         f"{exc.start}); save it as UTF-8") from None
