"""``rota agent``: one node agent in the foreground until Ctrl-C or SIGTERM."""
from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path
from typing import Any


def main(*, node: str, nats: str | None, state_dir: str | None, echo=print, **options: Any) -> int:
    from rota.cli.client import NoCluster, cluster_url
    from rota.wire.paths import default_state_dir

    from .agent import Agent

    logging.basicConfig(level=logging.WARNING, format=f"rota agent {node}: %(message)s")
    try:
        url = cluster_url(nats)
    except NoCluster as exc:
        echo(f"rota agent: {exc}")
        return 1
    try:
        agent = Agent(node, url, Path(state_dir) if state_dir else default_state_dir(), **options)
    except ValueError as exc:
        echo(f"rota agent: {exc}")
        return 1
    for line in agent.describe():
        echo(line)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await agent.start()
        echo(f"rota agent {node}: registered with {url}; running jobs keep running if the agent stops")
        await stop.wait()
        await agent.stop()

    try:
        asyncio.run(run())
    except OSError as exc:
        echo(f"rota agent: cannot reach NATS at {url}: {exc}")
        return 1
    echo(f"rota agent {node}: stopped")
    return 0
