"""Connecting to the NATS servers: one way for every part (its role's credentials, TLS, reconnects)."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from .natsauth import connect_options

log = logging.getLogger("rota.nats")
# A server that stops answering (frozen, cut off by a partition: no reset ever arrives) is given up for
# another after this many seconds times this many unanswered pings, rather than nats-py's 2 x 2 minutes.
PING_INTERVAL = 3
MAX_OUTSTANDING_PINGS = 2
CLOSE_WAIT = 1.0     # seconds a reconnect may spend closing the old connection before that socket is cut


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
    nc = await nats.connect(servers, **kwargs)
    if kwargs["max_reconnect_attempts"] != 0:
        task = asyncio.get_running_loop().create_task(_watch(nc, who))
        _WATCHING.add(task)
        task.add_done_callback(_WATCHING.discard)
    return nc


_WATCHING: set[asyncio.Task] = set()


async def _watch(nc: Any, who: str) -> None:
    """Give up a server that no longer answers, whatever the connection was doing. nats-py's own pings go out
    through its write queue: once a frozen server's socket is full and that queue too, its ping loop waits
    there for good and never finds the connection stale (a controller stayed on a SIGSTOPped server for the
    whole freeze). This round trip is bounded from outside: no PONG within the pings' allowance, another server."""
    limit = PING_INTERVAL * MAX_OUTSTANDING_PINGS
    closing: tuple[Any, float] | None = None
    while not nc.is_closed:
        await asyncio.sleep(CLOSE_WAIT if closing else PING_INTERVAL)
        if not nc.is_connected:
            closing = _unstick(nc, who, closing)   # reconnecting (or closed): nats-py is on it, unless stuck
            continue
        closing = None
        # a round trip waited for, not cancelled: nats-py swallows a cancel of a write stuck in its queue
        probe = asyncio.ensure_future(nc.flush(timeout=limit))
        probe.add_done_callback(_quietly)
        done, _ = await asyncio.wait({probe}, timeout=limit)
        if not (done and probe.exception() is None):     # no answer in time (or the connection went meanwhile)
            if nc.is_connected:
                server = nc.connected_url.netloc if nc.connected_url else "?"
                log.warning("%s: the NATS server at %s stopped answering: trying another", who, server)
                if not _cut(nc):
                    await nc.force_reconnect()


def _unstick(nc: Any, who: str, closing: tuple[Any, float] | None) -> tuple[Any, float] | None:
    """nats-py reconnects only once it has closed the old connection gently, and a TLS close waits for the
    server's own (asyncio gives it 30 s): a server that stopped answering holds the reconnect that long. The
    same socket still being closed after ``CLOSE_WAIT`` seconds (a close that goes well takes milliseconds) is
    cut. ``closing``: (that socket's writer, since when) as the last look saw it; returns what this look saw."""
    writer = getattr(getattr(nc, "_transport", None), "_io_writer", None)
    sock = writer.get_extra_info("socket") if writer is not None else None
    if sock is None or sock.fileno() < 0 or not nc.is_reconnecting:
        return None        # no socket being closed (a dead server's was closed at once; nats-py tries the others)
    if closing is None or closing[0] is not writer:
        return (writer, time.monotonic())
    if time.monotonic() - closing[1] < CLOSE_WAIT:
        return closing
    log.warning("%s: the connection to a NATS server that stopped answering does not close: cutting it", who)
    _cut(nc)
    return None


def _quietly(task: asyncio.Future) -> None:
    """Take a finished probe's outcome (asyncio would complain of an exception never retrieved)."""
    if not task.cancelled():
        task.exception()


def _cut(nc: Any) -> bool:
    """Cut the connection's socket at once, as a reset from the server would; nats-py then reconnects to
    another server. Its own reconnect closes the socket gently, which waits for what is buffered to reach the
    frozen server: for good. False where nats-py's transport is not as known (then its reconnect is asked)."""
    cut = False
    transport = getattr(nc, "_transport", None)
    for name in ("_io_writer", "_bare_io_writer"):     # the TLS stream and the TCP one beneath it
        writer = getattr(transport, name, None)
        if writer is not None and hasattr(writer, "transport"):
            writer.transport.abort()
            cut = True
    return cut
