"""Connecting to the NATS servers: one way for every part (its role's credentials, TLS, reconnects)."""
from __future__ import annotations

import logging
import time
from typing import Any

from .natsauth import connect_options

log = logging.getLogger("rota.nats")
# A server that stops answering (frozen, cut off by a partition: no reset ever arrives) is given up for
# another after this many seconds times this many unanswered pings, rather than nats-py's 2 x 2 minutes.
PING_INTERVAL = 3
MAX_OUTSTANDING_PINGS = 2


class _QuietTlsEof(logging.Filter):
    """asyncio warns each time a TLS server closes a connection (nats-py's protocol asks to stay half
    open, which TLS cannot); the reconnect callbacks already say what matters."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "eof_received" not in record.getMessage()


logging.getLogger("asyncio").addFilter(_QuietTlsEof())


def connection_callbacks(who: str) -> dict:
    """nats-py callbacks that report a lost or refused connection in one line, at most every 30 s
    (nats-py's own default logs a traceback for every reconnect attempt)."""
    last = [0.0]

    async def error_cb(exc: Exception) -> None:
        now = time.monotonic()
        if now - last[0] >= 30:
            last[0] = now
            log.warning("%s: NATS connection problem: %s (retrying)", who, exc or type(exc).__name__)

    async def reconnected_cb() -> None:
        last[0] = 0.0
        log.warning("%s: reconnected to NATS", who)

    return {"error_cb": error_cb, "reconnected_cb": reconnected_cb}   # a disconnect also comes with close()


async def connect(urls: str | list[str], who: str, *, keyring: Any = None, host: str | None = None,
                  tls_ca: str | None = None, **options: Any) -> Any:
    """A connection that keeps reconnecting, as ``host``'s role (the controller's when None)."""
    import nats

    servers = urls.split(",") if isinstance(urls, str) else urls
    kwargs: dict[str, Any] = {"max_reconnect_attempts": -1, "reconnect_time_wait": 0.2, "name": who,
                              "ping_interval": PING_INTERVAL, "max_outstanding_pings": MAX_OUTSTANDING_PINGS,
                              **connection_callbacks(who), **connect_options(keyring, host, tls_ca)}
    kwargs.update(options)
    return await nats.connect(servers, **kwargs)
