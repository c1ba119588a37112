"""The two streams between the controller and the agents, and reading the controller's work queue.

``ROTA_INBOX`` (``rota.inbox.<node>``): agents' reports, a work queue drained by the controller.
``ROTA_ORDERS`` (``rota.orders.<node>``): the controller's orders, kept until the controller purges what each
node's agent says it has acted on; each agent reads its own through a consumer it makes
(:mod:`rota.wire.orderqueue`).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator

from . import subjects as sj

log = logging.getLogger("rota.wire")
MORE_WAIT = 0.002    # seconds a fetch of "whatever else is there" may take (the server answers at once)
# a message handed to a reader whose server then died comes back after this long
ACK_WAIT = 10.0
ORDER_MAX_AGE = 7 * 86400.0      # seconds an order no agent acted on is kept (acted-on ones are purged at once)
OLD_ORDER_STREAM = "ROTA_ASSIGN"  # an older rota's orders: a work queue whose per-node consumers each cost a Raft group


async def _retrying(what: str, action: Any, attempts: int = 40) -> Any:
    for attempt in range(attempts):
        try:
            return await action()
        except Exception:  # a cluster still forming, a leader being elected
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(0.25)
    raise AssertionError(what)


async def log_replicas(js: Any) -> int:
    """How many copies the event log keeps (1; 3 on a 3-server cluster). rota's other streams, buckets and
    stores keep as many: on a cluster, losing one server must lose none of them (a lease, an order queue
    on one server alone stops the whole cluster while that server is away)."""
    try:
        return max(1, (await js.stream_info(sj.EVENT_STREAM)).config.num_replicas or 1)
    except Exception:  # noqa: BLE001 - no log yet
        return 1


async def match_replicas(js: Any, stream: str, replicas: int) -> None:
    """Raise a stream (a bucket's, a store's) made with fewer copies, by an older rota, to ``replicas``."""
    info = await js.stream_info(stream)
    if (info.config.num_replicas or 1) >= replicas:
        return
    info.config.num_replicas = replicas
    await js.update_stream(info.config)
    for _ in range(100):            # until the new copies have caught up (a few seconds at most)
        cluster = (await js.stream_info(stream)).cluster
        peers = (cluster.replicas or []) if cluster is not None else []
        if len(peers) >= replicas - 1 and all(p.current for p in peers):
            return
        await asyncio.sleep(0.1)


def stream_id(info: Any) -> str:
    """Which stream ``info`` (its StreamInfo) is: when it was made (one made anew counts from 1 again)."""
    return info.created.isoformat() if info.created is not None else ""


async def order_stream_id(js: Any) -> str:
    """The order stream's :func:`stream_id`, asked until answered."""
    return stream_id(await _retrying("stream info", lambda: js.stream_info(sj.ORDER_STREAM)))


async def ensure_streams(js: Any, replicas: int | None = None) -> None:
    """The inbox (work-queue retention: deleted once taken) and order (limits retention: purged once acted
    on) streams, file storage, as many copies as the log (``replicas``: that, unless given). An older rota's
    order stream goes: its orders are the state's, which a leader sends again."""
    from nats.js.api import RetentionPolicy, StorageType, StreamConfig
    from nats.js.errors import NotFoundError

    copies = replicas or await log_replicas(js)
    for name, prefix, retention in ((sj.INBOX_STREAM, sj.INBOX_PREFIX, RetentionPolicy.WORK_QUEUE),
                                    (sj.ORDER_STREAM, sj.ORDER_PREFIX, RetentionPolicy.LIMITS)):
        cfg = StreamConfig(name=name, subjects=[f"{prefix}.>"], storage=StorageType.FILE, retention=retention,
                           num_replicas=copies, duplicate_window=600.0,
                           max_age=ORDER_MAX_AGE if retention == RetentionPolicy.LIMITS else None)

        async def make(name: str = name, cfg: StreamConfig = cfg) -> None:
            try:
                await js.stream_info(name)
            except Exception:  # noqa: BLE001 - not found: create
                await js.add_stream(cfg)
                return
            await match_replicas(js, name, copies)

        await _retrying(f"stream {name}", make)
    try:
        await js.delete_stream(OLD_ORDER_STREAM)
    except NotFoundError:
        pass
    except Exception as exc:  # noqa: BLE001 - tried again when a controller next leads
        log.warning("an older rota's order stream %s is not removed yet: %s", OLD_ORDER_STREAM,
                    str(exc) or type(exc).__name__)


def queue_config(durable: str, subject: str, ack_wait: float) -> Any:
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    return ConsumerConfig(durable_name=durable, name=durable, filter_subject=subject, ack_policy=AckPolicy.EXPLICIT,
                          deliver_policy=DeliverPolicy.ALL, ack_wait=ack_wait, max_ack_pending=1024)


async def _ensure_consumer(js: Any, stream: str, cfg: Any) -> None:
    """Make a durable consumer, or give one made with another redelivery wait this one (an update)."""
    try:
        info = await js.consumer_info(stream, cfg.durable_name)
    except Exception:  # noqa: BLE001 - not found: create
        await js.add_consumer(stream, cfg)
        return
    if info.config.ack_wait != cfg.ack_wait:
        await js.add_consumer(stream, cfg)


async def work_queue(js: Any, stream: str, subject: str, durable: str, *, batch: int, what: str,
                     ack_wait: float = ACK_WAIT, create: bool = True) -> AsyncIterator[list[Any]]:
    """Batches of messages from a durable pull consumer on a work-queue stream, forever; the caller
    acks each message once it has acted on it (unacked ones come back after ``ack_wait``).
    ``create=False``: bind to a consumer someone else made (waiting until it exists)."""
    cfg = queue_config(durable, subject, ack_wait)
    warned = False
    while True:
        try:
            if create:
                await _ensure_consumer(js, stream, cfg)
                sub = await js.pull_subscribe(subject, durable=durable, stream=stream, config=cfg)
            else:
                await js.consumer_info(stream, durable)
                sub = await js.pull_subscribe_bind(durable=durable, stream=stream)
            break
        except Exception as exc:  # noqa: BLE001 - the stream, the consumer or a cluster leader is not there yet
            if not warned:
                log.warning("cannot read %s yet: %s (waiting for the controller)", what, exc or type(exc).__name__)
                warned = True
            await asyncio.sleep(0.5)
    while True:
        try:
            # one message as soon as it is there (a fetch of many waits out its whole timeout once the
            # first has come), then whatever else is already waiting
            msgs = await sub.fetch(1, timeout=1.0)
            if batch > 1:
                try:    # only the server's immediate answer: no time to wait out for more
                    msgs += await sub.fetch(batch - 1, timeout=MORE_WAIT)
                except asyncio.TimeoutError:
                    pass
        except asyncio.TimeoutError:
            continue
        except Exception as exc:  # noqa: BLE001 - reconnecting
            if "timeout" not in str(exc).lower():
                log.warning("reading %s: %s", what, exc)
            await asyncio.sleep(0.2)
            continue
        yield msgs


def stored_at(msg: Any, default: int) -> int:
    """When JetStream took a stored message (seconds since the epoch, the server's clock)."""
    try:
        return int(msg.metadata.timestamp.timestamp())
    except Exception:  # noqa: BLE001 - not a JetStream delivery
        return default
