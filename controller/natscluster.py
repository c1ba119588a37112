"""A local 3-server NATS JetStream cluster on loopback ports (for tests and trying R3 out).

    python -m rota.controller.natscluster DIR [--servers 3]

starts the servers with stores under DIR and prints the URL list to give ``rota up --nats``.
"""
from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path

from . import natsserver


def start_cluster(base: str | Path, n: int = 3, name: str = "rota",
                  authorization: str | None = None) -> list[natsserver.NatsServer]:
    """Start ``n`` clustered nats-servers with JetStream (``authorization``: rota's roles, as
    :func:`rota.wire.natsauth.authorization_block` writes them); returns them in order."""
    base = Path(base)
    client_ports = [natsserver.free_port() for _ in range(n)]
    route_ports = [natsserver.free_port() for _ in range(n)]
    servers = []
    try:
        for i in range(n):
            routes: list[int | str] = [p for j, p in enumerate(route_ports) if j != i]
            servers.append(natsserver.start(base / f"n{i + 1}", port=client_ports[i],
                                            cluster=(name, route_ports[i], routes),
                                            server_name=f"{name}-n{i + 1}", authorization=authorization))
    except Exception:
        for s in servers:
            s.stop()
        raise
    return servers


async def wait_for_jetstream(urls: list[str], timeout: float = 30.0, options: dict | None = None) -> None:
    """Wait until the cluster has elected a JetStream meta leader (``options``: nats-py's, e.g. a role's
    credentials and TLS)."""
    import nats

    nc = await nats.connect(urls, **(options or {}))
    try:
        js = nc.jetstream()
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            try:
                await js.account_info()
                return
            except Exception:
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(0.2)
    finally:
        await nc.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--servers", type=int, default=3)
    args = ap.parse_args()
    servers = start_cluster(args.dir, args.servers)
    urls = ",".join(s.url for s in servers)
    asyncio.run(wait_for_jetstream(urls.split(",")))
    print(urls, flush=True)
    print(f"run: rota up --nats {urls}   (Ctrl-C here stops the cluster)", flush=True)
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        for s in servers:
            s.stop()


if __name__ == "__main__":
    main()
