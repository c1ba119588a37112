"""Atomic batches on the log's stream (nats-server 2.12 and later): many records written and synced at
once, landing whole or not at all."""
from __future__ import annotations

import json
import logging
from typing import Any

log = logging.getLogger("rota.eventlog")

ATOMIC_BATCH = 1000   # records in one atomic batch (nats-server's limit on a batch's size)
# The server stages an atomic batch in a store of its own (files made, synced and removed): a cost per
# batch that only pays for itself against fenced publishes one after another from about this many records.
ATOMIC_FROM = 16


class AtomicRefused(Exception):
    """The server refused an atomic batch (nothing of it landed)."""


async def allow_atomic(nc: Any, stream: str) -> bool:
    """Let ``stream`` take atomic batches (nats-server 2.12 and later); False where the server cannot, or
    this connection may not change the stream (records are then appended one by one)."""
    try:
        info = json.loads((await nc.request(f"$JS.API.STREAM.INFO.{stream}", b"", timeout=5)).data)
        config = info.get("config")
        if not isinstance(config, dict):
            return False
        if config.get("allow_atomic"):
            return True
        config["allow_atomic"] = True
        reply = json.loads((await nc.request(f"$JS.API.STREAM.UPDATE.{stream}", json.dumps(config).encode(),
                                             timeout=10)).data)
        return bool((reply.get("config") or {}).get("allow_atomic"))
    except Exception as exc:  # noqa: BLE001 - an older server, a role without the right: one by one
        log.info("the log takes no atomic batches: %s", exc)
        return False
