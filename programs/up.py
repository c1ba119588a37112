"""``rota up``: the embedded single-host cluster (nats-server + controller) in the foreground."""
from __future__ import annotations

import asyncio
import json
import math
import logging
import os
import signal
import sys
import time
from pathlib import Path

from typing import Any

from rota.agents.agent import Agent
from rota.core import events as ev
from rota.core.slurmconf import ConfigError
from rota.projections.projector import Projector
from rota.wire.lifetime import run_bounded, stop_child
from rota.wire.paths import default_state_dir, read_text, write_public

from rota.controller import natsserver
from rota.controller.agentlink import AgentLink
from rota.controller.eventlog import SUBJECT_PREFIX, JetStreamLog
from rota.controller.outbox import Outbox
from rota.controller.service import Controller, GiveWay
from rota.cli.localconfig import load_config

from .entry import child_argv

log = logging.getLogger("rota.up")
SWITCH_INTERVAL = 0.0005   # seconds a thread holds the interpreter before another may take it


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
              listen: str = "127.0.0.1", config_path: str | None = None, standby: bool = False,
              web_port: int = 0) -> None:
    """Run the whole cluster in this process until SIGINT or SIGTERM: NATS (unless ``nats_url`` names
    servers), the controller, the agents' link, the projection, this node's agent and the signer."""
    os.umask(0o077)   # every file rota writes is private unless made public on purpose
    # the projection's folds run in threads beside the event loop that answers requests: a request waits
    # for the interpreter's lock at most this long (Python's default is 5 ms, paid again at every step)
    sys.setswitchinterval(SWITCH_INTERVAL)
    up = _Up(state_dir, config, echo, agent_node, fake_gpus, node_timeout, agent_options, tls)
    up.config_path = config_path
    up.settings = shell_settings(config_path)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await up.start_log(nats_url, nats_port, listen)
        await up.start_controller(stop, standby)
        await up.start_projection(stop)
        await up.start_notifier(stop)
        await up.start_web(web_port)
        await up.start_agent_and_signer()
        up.announce()
        watching = asyncio.create_task(up.watch_server(stop))
        await stop.wait()
        watching.cancel()
    finally:
        stop.set()
        await up.stop()


class _Up:
    """The parts of a running ``rota up``, started and stopped in order."""

    def __init__(self, state_dir: Path, config: ev.ClusterConfig, echo: Any, agent_node: str | None,
                 fake_gpus: str | None, node_timeout: float, agent_options: dict | None,
                 tls: dict[str, str] | None) -> None:
        from rota.agents.agent import hostname

        self.state_dir, self.config, self.echo = state_dir, config, echo
        self.agent_node, self.fake_gpus, self.node_timeout = agent_node, fake_gpus, node_timeout
        self.agent_options, self.tls = agent_options, tls
        self.tls_ca = (tls or {}).get("ca_file")
        self.keyring = prepare_state_dir(state_dir)
        self.signer_host = agent_node or hostname()
        self.info = state_dir / "cluster.json"
        self.server: Any = None
        self.nats_url = ""
        self.eventlog: Any = None
        self.controller: Controller | None = None
        self.link: AgentLink | None = None
        self.projector: Projector | None = None
        self.wake: asyncio.Event | None = None       # the projector's: a record has landed
        self.woken_by: Any = None                   # the subscription to every record, while this one follows
        self._waking = asyncio.Lock()
        self.projecting: asyncio.Task | None = None
        self.agent: Agent | None = None
        self.signer: Any = None
        self.config_path: str | None = None
        self.settings: dict = {}             # rota's own keys of the configuration file (notifications)
        self.notifier: Any = None
        self.notifying: asyncio.Task | None = None
        self.web: Any = None                 # the web view's process (rota web)
        self.web_url: str | None = None
        self.candidacy: Any = None
        self.candidating: asyncio.Task | None = None
        self.announced = False
        self.stopping = False

    async def start_log(self, nats_url: str | None, nats_port: int | None, listen: str) -> None:
        """Our own NATS server (unless told to use others) and the event log on it."""
        from rota.wire import natsauth

        if nats_url is None:
            hosts = [n.name for n in self.config.nodes] + [self.signer_host]
            self.server = natsserver.start(self.state_dir / "nats", port=nats_port, tls=self.tls, host=listen,
                                           authorization=natsauth.authorization_block(self.keyring, hosts))
            nats_url = self.server.url
        else:
            self.echo(f"rota up: the NATS servers at {nats_url} are not rota's own: make sure they enforce rota's "
                      "roles (`rota keygen --nats-auth FILE --config slurm.conf` writes their authorization block)")
        self.nats_url = nats_url
        urls = nats_url.split(",")
        self.eventlog = await JetStreamLog.connect(urls, replicas=3 if len(urls) >= 3 else 1, keyring=self.keyring,
                                                   **natsauth.connect_options(self.keyring, None, self.tls_ca))
        from rota.wire.audit import AuditKey

        # this controller's signing key for the log's hash chain (its public half goes on the log when it leads)
        self.eventlog.audit = AuditKey.load_or_create(str(self.state_dir / "audit.key"))

    async def start_controller(self, stop: asyncio.Event, standby: bool) -> None:
        """The controller, a candidate for leadership (rota.controller.leadership): while it leads it serves
        the API, runs cycles and talks to the agents; otherwise it follows the log. Unless ``standby``,
        wait (a lease's lifetime at most) to lead."""
        from rota.controller.leadership import LEASE_TTL, Candidacy
        from rota.controller.views import timetravel_environment

        from rota.cli.reports import runner

        self.controller = Controller(self.eventlog, config=self.config, keyring=self.keyring, outbox=Outbox(),
                                     reports=runner(str(self.state_dir / "projections.sqlite")),
                                     timetravel_env=timetravel_environment(str(self.state_dir)),
                                     timetravel_argv=child_argv())
        self.controller.reload_config = lambda: load_config(self.config_path, self.fake_gpus)
        if self.server is not None:      # our own server: its store is on this host's disk
            self.controller.store_dir = str(self.state_dir / "nats")
        await self.controller.load()
        name = f"{self.signer_host}:{self.state_dir.resolve()}"
        self.candidacy = Candidacy(self.controller, self.eventlog.js, name, self.signer_host,
                                   on_lead=self._lead, on_lose=self._follow)
        self.candidating = asyncio.create_task(self.candidacy.run(stop))
        if not standby:
            deadline = time.monotonic() + LEASE_TTL + 10
            while not self.candidacy.leading and time.monotonic() < deadline and not self.candidating.done():
                await asyncio.sleep(0.05)

    async def _lead(self) -> None:
        assert self.controller is not None
        await self.controller.serve(self.eventlog.nc)
        self.link = AgentLink(self.controller, self.eventlog.nc, node_timeout=self.node_timeout,
                              keyring=self.keyring)
        await self.link.start()
        await self._woken_by_others(False)
        if self.announced:
            self.echo(f"rota up: this controller leads now (from log sequence {self.controller.state.seq})")

    async def _follow(self) -> None:
        assert self.controller is not None
        await self._woken_by_others(True)
        await self.controller.stop()
        if self.link is not None:
            await self.link.stop()
            self.link = None
        if not self.stopping:
            self.echo("rota up: this controller no longer leads: following the log, standing by")

    def answering(self) -> bool:
        """Whether the controller here is answering a request (background work gives way), until rota up stops."""
        return not self.stopping and self.controller is not None and self.controller.frontdoor.answering > 0

    async def start_projection(self, stop: asyncio.Event) -> None:
        """The SQLite projection (sacct, sinfo), woken by every new event; scheduling goes on without it."""
        projector = Projector(self.state_dir / "projections.sqlite", self.eventlog,
                              give_way=GiveWay(self.answering, math.inf))
        try:
            await projector.open()
        except Exception as exc:  # noqa: BLE001 - scheduling goes on; sacct/sinfo say they have no data
            self.echo(f"rota up: projections disabled: cannot open {projector.path}: {exc}")
            return
        self.projector = projector
        self.wake = wake = asyncio.Event()
        self.eventlog.own.on_landed = wake.set      # this process's appends wake it without the records' trip back
        await self._woken_by_others(self.candidacy is None or not self.candidacy.leading)
        self.projecting = asyncio.create_task(projector.follow(stop, wake))

    async def _woken_by_others(self, others: bool) -> None:
        """Wake the projector on every record of the log (``others``: they are another controller's, this one
        follows) or only on this process's own appends (it leads: no one else appends); either way, once now."""
        if self.wake is None:
            return
        async with self._waking:
            if others and self.woken_by is None:
                self.woken_by = await self.eventlog.nc.subscribe(f"{SUBJECT_PREFIX}.>", cb=_waker(self.wake))
            elif not others and self.woken_by is not None:
                sub, self.woken_by = self.woken_by, None
                await sub.unsubscribe()
        self.wake.set()

    async def start_notifier(self, stop: asyncio.Event) -> None:
        """The notifier (--mail-type), where rota's configuration names a webhook, an SMTP relay or a command."""
        from rota.projections.notifier import Notifier, transports

        try:
            sinks = transports(self.settings)
        except ValueError as exc:
            self.echo(f"rota up: notifications disabled: {exc}")
            return
        if not sinks:
            return
        notifier = Notifier(self.state_dir / "notify.sqlite", self.eventlog, sinks)
        await notifier.open()
        self.notifier = notifier
        self.notifying = asyncio.create_task(notifier.follow(stop))

    async def start_agent_and_signer(self) -> None:
        """This host's agent (when it is a node) and the local signer every command goes through."""
        from .agent import run_signer
        from rota.wire.paths import socket_in

        if self.agent_node is not None:
            node_cfg = next(n for n in self.config.nodes if n.name == self.agent_node)
            opts = dict(self.agent_options or {})
            if self.fake_gpus:   # a fake node (demo, tests): it has what the configuration says
                opts.setdefault("cpus", node_cfg.cpus)
                opts.setdefault("memory", node_cfg.memory)
            self.agent = Agent(self.agent_node, self.nats_url, self.state_dir, keyring=self.keyring,
                               tls_ca=self.tls_ca, fake_gpus=self.fake_gpus, **opts)
            for line in self.agent.describe():
                self.echo(line)
            await self.agent.start()
        sock = socket_in(str(self.state_dir))
        self.signer = await run_signer(sock, self.signer_host, self.keyring, self.nats_url, self.tls_ca,
                                       lambda _l: None, log_commands=True)
        if self.controller is not None:    # requests of this host skip the trip through NATS while it leads
            self.signer.local = self.controller.local_request
        write_public(str(self.info), json.dumps({"nats": self.nats_url, "pid": os.getpid(), "tls_ca": self.tls_ca,
                                             "socket": sock, "web": self.web_url}))

    async def start_web(self, port: int) -> None:
        """The web view (``rota web``) as a child process on 127.0.0.1:``port`` (0: none); rota up runs on
        without it if it cannot start (it says why)."""
        if not port:
            return
        from .web import announced, environment_for

        state = str(self.state_dir.resolve())
        self.web = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-m", "rota.programs.main", "web", "--state-dir", state, "--port", str(port),
            env=environment_for(state), stdin=asyncio.subprocess.DEVNULL)
        # announced only once it listens: a port another user took first is never named to `rota web login`
        for _ in range(300):
            info = announced(state)
            if info is not None and info.get("pid") == self.web.pid:
                self.web_url = info["url"]
                return
            if self.web.returncode is not None:
                break
            await asyncio.sleep(0.05)
        self.echo("rota up: the web view did not start (its reason is above); rota runs on without it")

    async def watch_server(self, stop: asyncio.Event) -> None:
        """Restart the embedded nats-server, on the same port and store, whenever it dies (kill -9, a crash):
        the controller, the agent and the signer reconnect by themselves, and what the store holds is kept."""
        while not stop.is_set() and self.server is not None:
            try:
                await asyncio.wait_for(stop.wait(), timeout=0.5)
                return
            except asyncio.TimeoutError:
                pass
            died = self.server.process.poll()
            if died is None:
                continue
            self.echo(f"rota up: the embedded nats-server exited ({died}); restarting it on the same store")
            try:
                self.server = await asyncio.to_thread(natsserver.restart, self.server)
                self.echo("rota up: nats-server restarted; clients reconnect")
            except natsserver.NatsServerError as exc:
                self.echo(f"rota up: nats-server did not restart ({exc}); trying again")
                await asyncio.sleep(2)

    def announce(self) -> None:
        from rota.wire.paths import socket_in

        assert self.controller is not None
        state = self.controller.state
        cfg = state.config
        self.announced = True
        if cfg is None or not self.candidacy.leading:
            self.echo(f"rota up: controller standing by at {self.nats_url} (log at sequence {state.seq}): another "
                      "controller leads; this one takes over if it stops renewing its lease")
            self.echo("press Ctrl-C to stop")
            return
        self.echo(f"rota up: controller leading at {self.nats_url} (log at sequence {state.seq}); "
                  f"{len(cfg.nodes)} node(s), {sum(n.gpu_count for n in cfg.nodes)} GPU(s), "
                  f"partition(s) {', '.join(p.name for p in cfg.partitions)}; state in {self.state_dir}")
        self.echo(f"rota up: commands reach it through {socket_in(str(self.state_dir))} (any local user; who "
                  "they are comes from the kernel)")
        self.echo("press Ctrl-C to stop")

    async def stop(self) -> None:
        """Stop whatever started, in reverse order, each step bounded: Ctrl-C always stops rota up."""
        try:
            self.info.unlink()
        except FileNotFoundError:
            pass
        self.stopping = True
        steps = self._stop_steps()
        for what, step in steps:
            log.info("stopping: %s", what)
            try:
                await asyncio.wait_for(step(), timeout=5)
            except Exception as exc:  # noqa: BLE001 - keep stopping the rest
                log.warning("stopping %s: %s", what, exc or type(exc).__name__)
        if self.server is not None:
            self.server.stop()
        if self.agent is not None and self.agent.runs:
            self.echo(f"rota up: {len(self.agent.runs)} job(s) still running on {self.agent.node} "
                      f"({', '.join(map(str, sorted(self.agent.runs)[:10]))}); the next `rota up` adopts them")
        self.echo("rota up: stopped")

    def _stop_steps(self) -> list[tuple[str, Any]]:
        """What stops, in order, for what started: each a name and a coroutine function."""
        steps: list[tuple[str, Any]] = []
        if self.controller is not None and self.controller.leader:
            steps.append(("snapshot", lambda: self.controller.maybe_snapshot(force=True)))
        if self.candidating is not None:      # stops leading (the API, cycles, the agent link), gives the lease up
            steps.append(("leadership", lambda: asyncio.gather(self.candidating, return_exceptions=True)))
        if self.web is not None:
            steps.append(("web view", lambda: stop_child(self.web)))
        if self.signer is not None:
            steps.append(("signer", self.signer.stop))
        if self.agent is not None:
            steps.append(("agent", self.agent.stop))
        if self.projector is not None:
            steps.append(("projections", lambda: _stop_projector(self.projector, self.projecting)))
        if self.notifier is not None:
            steps.append(("notifier", lambda: _stop_projector(self.notifier, self.notifying)))
        if self.controller is not None:
            steps.append(("controller", self.controller.stop))
        if self.link is not None:
            steps.append(("agent link", lambda: self.link.stop() if self.link is not None else asyncio.sleep(0)))
        if self.eventlog is not None:
            steps.append(("event log", self.eventlog.close))
        return steps


async def _stop_projector(projector: Any, projecting: asyncio.Task | None) -> None:
    """A follower of the log (the projection, the notifier): its task ends (its stop is set), then it closes."""
    if projecting is not None:
        await asyncio.gather(projecting, return_exceptions=True)
    if hasattr(projector, "save_state"):
        await projector.save_state()
    await projector.close()


def _waker(event: asyncio.Event):
    async def on_event(_msg) -> None:
        event.set()
    return on_event


def main(state_dir: str | None, config: str | None, nats: str | None, nats_port: int | None,
         fake_gpus: str | None, echo=print, *, agent_node: str | None = None, no_agent: bool = False,
         node_timeout: float = 300.0, agent_options: dict | None = None, tls: dict[str, str] | None = None,
         listen: str | None = None, standby: bool = False, web_port: int = 0) -> int:
    from rota.wire.daemonlog import daemon_logging
    from rota.wire.keys import KeyFileError

    daemon_logging("rota", os.environ.get("ROTA_LOGLEVEL", "WARNING").upper())
    try:
        cfg = load_config(config, fake_gpus)
        node = None if no_agent else pick_agent_node(cfg, agent_node)
        settings = shell_settings(config)
        tls = {**settings.get("tls", {}), **(tls or {})} or None
        if tls is not None and nats is None and not (tls.get("cert_file") and tls.get("key_file")):
            raise ValueError("TLS needs a certificate and its key (--tls-cert and --tls-key, or RotaTLSCertFile "
                             "and RotaTLSKeyFile in the configuration)")   # with --nats: only the servers' CA
        listen = listen or settings.get("listen") or "127.0.0.1"
        from rota.agents.agent import hostname

        standby = standby or hostname() in cfg.controllers[1:]    # a backup SlurmctldHost stands by
    except ConfigError as exc:
        for d in exc.diagnostics:
            echo(str(d))
        echo(f"rota up: the configuration has errors; check it with: rota config check {config}")
        return 1
    except (OSError, ValueError) as exc:
        echo(f"rota up: {exc}")
        return 1
    try:
        run_bounded(run(Path(state_dir) if state_dir else default_state_dir(), cfg, nats, nats_port, echo,
                         agent_node=node, fake_gpus=fake_gpus, node_timeout=node_timeout,
                         agent_options=agent_options, tls=tls, listen=listen, config_path=config,
                         standby=standby, web_port=web_port))
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
