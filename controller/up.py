"""``rota up``: the embedded single-host cluster (nats-server + controller) in the foreground."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
from pathlib import Path

from rota.core import events as ev
from rota.core.slurmconf import ConfigError, auto_config, parse_config

from . import natsserver
from .eventlog import JetStreamLog
from .service import Controller


def default_state_dir() -> Path:
    env = os.environ.get("ROTA_STATE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "rota"


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
        if not count.isdigit():
            raise ValueError(f"--fake-gpus {fake_gpus!r}: use TYPE:N, for example a100:4")
        gpus.append((gtype or "gpu", int(count)))
    host = socket.gethostname().split(".")[0] or "localhost"
    return auto_config(host, os.cpu_count() or 1, max(1, mem_kib // 1024), gpus)


def load_config(path: str | None, fake_gpus: str | None) -> ev.ClusterConfig:
    if path is None:
        return machine_config(fake_gpus)
    text = Path(path).read_text()
    gres = Path(path).with_name("gres.conf")
    return parse_config(text, path, gres.read_text() if gres.exists() else None, str(gres))


async def run(state_dir: Path, config: ev.ClusterConfig, nats_url: str | None, nats_port: int | None,
              echo=print) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    server = None
    if nats_url is None:
        server = natsserver.start(state_dir / "nats", port=nats_port)
        nats_url = server.url
    info = state_dir / "cluster.json"
    urls = nats_url.split(",")
    eventlog = await JetStreamLog.connect(urls, replicas=3 if len(urls) >= 3 else 1)
    controller = Controller(eventlog, config=config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await controller.start()
        await controller.serve(eventlog.nc)
        info.write_text(json.dumps({"nats": nats_url, "pid": os.getpid()}))
        cfg = controller.state.config
        assert cfg is not None
        echo(f"rota up: controller leading at {nats_url} (log at sequence {controller.state.seq}); "
             f"{len(cfg.nodes)} node(s), {sum(n.gpu_count for n in cfg.nodes)} GPU(s), "
             f"partition(s) {', '.join(p.name for p in cfg.partitions)}; state in {state_dir}")
        echo("press Ctrl-C to stop")
        await stop.wait()
    finally:
        try:
            info.unlink()
        except FileNotFoundError:
            pass
        await controller.maybe_snapshot(force=True)
        await controller.stop()
        await eventlog.close()
        if server is not None:
            server.stop()
        echo("rota up: stopped")


def main(state_dir: str | None, config: str | None, nats: str | None, nats_port: int | None,
         fake_gpus: str | None, echo=print) -> int:
    logging.basicConfig(level=logging.WARNING, format="rota: %(message)s")
    try:
        cfg = load_config(config, fake_gpus)
    except ConfigError as exc:
        for d in exc.diagnostics:
            echo(str(d))
        echo(f"rota up: the configuration has errors; check it with: rota config check {config}")
        return 1
    except (OSError, ValueError) as exc:
        echo(f"rota up: {exc}")
        return 1
    try:
        asyncio.run(run(Path(state_dir) if state_dir else default_state_dir(), cfg, nats, nats_port, echo))
    except natsserver.NatsServerError as exc:
        echo(f"rota up: {exc}")
        return 1
    return 0
