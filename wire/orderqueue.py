"""A node's orders, read by its agent through a consumer the agent makes for itself.

The order stream (``ROTA_ORDERS``, ``rota.orders.<node>``) keeps every order until the controller purges what
the node's heartbeats say its agent has acted on (:class:`OrderMark`). Each agent reads its own subject through
one consumer, ``agent-<node>``, kept in one copy in memory: a replicated consumer per node is a Raft group per
node, which a thousand nodes make too costly for a small cluster of servers. So the consumer can be lost (its
server dies or restarts, or freezes or is cut off); the agent then makes it again from its mark, wherever the
servers place it, and drops repeats of what it has already acted on. Its reads ask for the servers'
heartbeats, so a consumer whose server stopped answering is told from one with no orders within seconds, not
after the servers' own route pings have given that server up. Its role lets it make, read, acknowledge and
remove that one consumer, on its own subject only (:func:`rota.wire.natsauth.host_permissions`).
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Any, AsyncIterator

from . import subjects as sj
from .jsqueue import ACK_WAIT, MORE_WAIT, stream_id

log = logging.getLogger("rota.wire")
CHECK_IDLE = 10.0       # seconds a reader goes without orders before it checks that its consumer is still there
FAILING = 2.0           # seconds of failed reads after which the consumer is made again
PULL = 2.0              # seconds a read waits for an order
HEARTBEAT = 0.9         # seconds between the servers' heartbeats while it waits (at most half of PULL)
SILENT = 4.0            # seconds of reads with no word from the consumer's server before it is made again
MAKE_WAIT = 1.0         # seconds each step of making the consumer may take at first (doubled on each failure)
MAKE_WAIT_MAX = 10.0
INACTIVE = 60.0         # seconds a consumer no one reads lives on (an agent that died for good)


class OrderMark:
    """Where a node's agent stands in its orders: the stream it reads (by its creation time) and the sequence of
    the last order it acted on; kept in ``path`` (on disk before the orders are acknowledged), when given."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.stream: str | None = None
        self.seq = 0
        if path is not None:
            try:
                kept = json.loads(path.read_text())
                self.stream, self.seq = str(kept["stream"]), int(kept["seq"])
            except (OSError, ValueError, KeyError, TypeError):
                pass     # none yet, or unreadable: orders from now on

    def save(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w") as fh:
            fh.write(json.dumps({"stream": self.stream, "seq": self.seq}))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)


def order_config(node: str, start: int) -> Any:
    """``node``'s consumer: its subject only, from stream sequence ``start``, one copy in memory."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    return ConsumerConfig(name=sj.agent_consumer(node), filter_subject=f"{sj.ORDER_PREFIX}.{node}",
                          ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                          opt_start_seq=start, ack_wait=ACK_WAIT, max_ack_pending=1024, num_replicas=1,
                          mem_storage=True, inactive_threshold=INACTIVE)


class OrderReader:
    """``node``'s orders after ``mark``, in batches (:meth:`batches`); the caller acts on each batch's orders
    in turn, then hands the batch to :meth:`done`."""

    def __init__(self, js: Any, node: str, mark: OrderMark, batch: int = 64) -> None:
        self.js, self.node, self.mark, self.batch = js, node, mark, batch
        self.name = sj.agent_consumer(node)
        self.sub: Any = None
        self.opened = 0          # how many times the consumer was made
        self.idle = 0.0          # seconds of reads that found no order though the consumer's server answered
        self.silent = 0.0        # seconds of reads in a row with no word from it

    async def open(self) -> None:
        """Make the consumer from the mark, waiting while the stream is not there (no controller yet) or the
        servers cannot make it."""
        warned = False
        wait = MAKE_WAIT
        while True:
            try:
                await self._make(wait)
                return
            except Exception as exc:  # noqa: BLE001 - no stream yet, a leader being elected, a server away
                wait = min(2 * wait, MAKE_WAIT_MAX)
                if not warned:
                    log.warning("cannot read the orders of %s yet: %s (waiting for the servers and the controller; "
                                "if it lasts, check that the servers' authorization block is this rota's: "
                                "`rota keygen --nats-auth`)", self.node, str(exc) or type(exc).__name__)
                    warned = True
                await asyncio.sleep(0.5)

    async def _make(self, wait: float) -> None:
        """Make the consumer afresh, each step bounded by ``wait`` seconds, the removal of the old one by
        MAKE_WAIT: the servers answer a removal only once the consumer's own server has, which a frozen or
        cut-off one never does, yet the removal takes effect; one not yet in effect fails the making, and the
        caller tries again."""
        from nats.js.errors import NotFoundError

        info = await asyncio.wait_for(self.js.stream_info(sj.ORDER_STREAM), wait)
        stream = stream_id(info)
        if self.mark.stream is None:        # the first read on this node: the orders from now on
            self.mark.stream, self.mark.seq = stream, info.state.last_seq
            self.mark.save()
        elif self.mark.stream != stream:    # a stream made since (a new cluster): all of it is this life's
            self.mark.stream, self.mark.seq = stream, 0
            self.mark.save()
        try:
            await asyncio.wait_for(self.js.delete_consumer(sj.ORDER_STREAM, self.name), MAKE_WAIT)
        except (NotFoundError, asyncio.TimeoutError):
            pass
        await asyncio.wait_for(self.js.add_consumer(sj.ORDER_STREAM, order_config(self.node, self.mark.seq + 1)),
                               wait)
        if self.sub is not None:
            try:
                await self.sub.unsubscribe()      # the old consumer's reply subscription
            except Exception:  # noqa: BLE001 - the connection dropped it already
                pass
        self.sub = await self.js.pull_subscribe_bind(consumer=self.name, stream=sj.ORDER_STREAM)
        self.opened += 1

    async def _there(self) -> bool:
        """Whether the consumer is still there: False only when the servers say it is not (removed, or lost
        with its server). No answer is no verdict: a cluster electing leaders answers nothing for seconds,
        and the consumer it holds may be fine; a consumer whose server is away fails the reads instead."""
        from nats.js.errors import NotFoundError

        try:
            await asyncio.wait_for(self.js.consumer_info(sj.ORDER_STREAM, self.name), timeout=FAILING)
        except NotFoundError:
            return False
        except Exception:  # noqa: BLE001 - no answer yet
            pass
        return True

    async def _fetch(self) -> list[Any]:
        """One order as soon as there is one, then whatever else is already there. Raises FetchTimeoutError
        when none came within PULL seconds though the consumer's server answered, and another TimeoutError when
        nothing at all came from it."""
        # a fetch of one: nats-py's fetch of many may send its second request with less than twice the
        # heartbeat left, which the server refuses
        msgs = await self.sub.fetch(1, timeout=PULL, heartbeat=HEARTBEAT)
        if self.batch > 1:
            try:
                msgs += await self.sub.fetch(self.batch - 1, timeout=MORE_WAIT)
            except asyncio.TimeoutError:
                pass
        return msgs

    async def _waited(self, heard: bool) -> None:
        """A read that brought no order: ``heard`` when the consumer's server answered meanwhile."""
        if heard:
            self.idle, self.silent = self.idle + PULL, 0.0
            if self.idle >= CHECK_IDLE:
                self.idle = 0.0
                if not await self._there():
                    log.warning("the order consumer of %s is gone: made again after sequence %d", self.node,
                                self.mark.seq)
                    await self.open()
            return
        self.silent += PULL       # not a word from it: its server frozen, cut off, or this connection's away
        if self.silent >= SILENT:
            log.warning("the order consumer of %s does not answer (its server frozen or cut off): made again "
                        "after sequence %d", self.node, self.mark.seq)
            self.silent = 0.0
            await self.open()

    async def batches(self) -> AsyncIterator[list[Any]]:
        """Batches of orders after the mark, forever (repeats at or before it are acknowledged and dropped)."""
        from nats.js.errors import FetchTimeoutError

        if self.sub is None:
            await self.open()
        failing = 0.0
        while True:
            try:
                msgs = await self._fetch()
            except FetchTimeoutError:
                await self._waited(heard=True)
                continue
            except asyncio.TimeoutError:
                await self._waited(heard=False)
                continue
            except Exception as exc:  # noqa: BLE001 - reconnecting, or the consumer's server is away
                failing += 0.2
                if failing >= FAILING:
                    log.warning("reading the orders of %s: %s: the consumer made again", self.node, exc)
                    failing = 0.0
                    await self.open()
                await asyncio.sleep(0.2)
                continue
            failing = 0.0
            self.idle = self.silent = 0.0
            fresh = [m for m in msgs if m.metadata.sequence.stream > self.mark.seq]
            for msg in msgs:
                if msg.metadata.sequence.stream <= self.mark.seq:
                    await msg.ack()      # acted on before the consumer was made again
            if fresh:
                yield fresh

    async def done(self, msgs: list[Any]) -> None:
        """``msgs`` were acted on: the mark moves past them (kept on disk first), then they are acknowledged."""
        self.mark.seq = max(self.mark.seq, max(m.metadata.sequence.stream for m in msgs))
        self.mark.save()
        for msg in msgs:
            await msg.ack()
