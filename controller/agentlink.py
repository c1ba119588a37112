"""The controller's side of the agents: drain their inbox into the log, send them orders, watch their
heartbeats (silent: NOT_RESPONDING, then DOWN).

Every report and heartbeat carries its node's credential and is believed only about that node;
every order carries the controller's credential for the node it is meant for. An order that
cannot be delivered is set aside with its reason (a launch that never arrives ends its job), never
retried forever ahead of the others: each node has its own sender.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from functools import partial
from typing import TYPE_CHECKING, Any

from rota.core import commands
from rota.core import credentials as creds
from rota.core import effects
from rota.core import events as ev
from rota.core.orders import Heartbeat, Kill, Launch, Order
from rota.core.state import RUNNING, Node
from rota.wire import orders as wire_orders
from rota.wire import subjects as sj
from rota.wire.subjects import CRED_HEADER
from rota.wire.jsqueue import ensure_streams, order_stream_id, stored_at, work_queue
from rota.wire.keys import Keyring

from .eventlog import FencedError, LogUnavailable
from .outbox import Outbox

if TYPE_CHECKING:
    from .port import ControllerPort

log = logging.getLogger("rota.controller.agents")

SEND_ATTEMPTS = 12        # about a minute of retries (0.1 s doubling to 5 s) before an order is set aside
STREAM_CHECK = 2.0        # seconds each request making sure of the streams waits, at the start of leading
PURGE_EVERY = 64          # orders a node acts on before they are purged from the stream (or PURGE_WAIT)
PURGE_WAIT = 30.0         # seconds after which what a node acted on is purged however little it is


class AgentLink:
    def __init__(self, controller: ControllerPort, nc: Any, *, node_timeout: float = 300.0,
                 keyring: Keyring | None = None) -> None:
        if controller.outbox is None:
            raise ValueError("the controller was built without an outbox: it would give the agents no orders")
        self.c = controller
        self.outbox: Outbox = controller.outbox
        self.nc = nc
        self.js = nc.jetstream(timeout=10)
        self.node_timeout = node_timeout
        self.keyring = keyring if keyring is not None else controller.keyring
        self.replay = creds.ReplayCache()
        self.last_seen: dict[str, float] = controller.agent_seen     # the controller's: /metrics reads it
        self.agent_running: dict[str, set[int]] = {}
        self._senders: dict[str, asyncio.Queue[Order]] = {}
        self._stopped = False
        self._tasks: list[asyncio.Task] = []
        self._subs: list[Any] = []
        self._started = time.monotonic()
        self._purged: dict[str, tuple[int, float]] = {}   # node -> (order sequence purged up to, when)
        self._purging: set[asyncio.Task] = set()
        self._order_stream = ""       # the order stream's id (stream_id): marks of another stream purge nothing
        self.set_aside: list[tuple[str, str, str]] = []    # (node, order, why) of orders never delivered
        self._warned: dict[str, float] = {}

    async def start(self) -> None:
        # each request given up on quickly and tried again: one lost while the servers elect leaders would
        # otherwise hold the start (and the reports that free nodes) for the whole default timeout
        quick = self.nc.jetstream(timeout=STREAM_CHECK)
        await ensure_streams(quick)
        self._order_stream = await order_stream_id(quick)
        self._subs.append(await self.nc.subscribe(f"{sj.HEARTBEAT_PREFIX}.*", cb=self._on_heartbeat))
        self.resend_launches()
        self._tasks = [asyncio.create_task(t) for t in (self._inbox(), self._monitor(), self._orders())]

    async def stop(self) -> None:
        self._stopped = True
        for _ in range(100):      # cancelled again while any is left: Python 3.11's wait_for can swallow a cancel
            left = [t for t in self._tasks if not t.done()]
            if not left:
                break
            for t in left:
                t.cancel()
            await asyncio.wait(left, timeout=0.1)
        for sub in self._subs:
            await sub.unsubscribe()

    # ------------------------------------------------------------ orders

    def send(self, orders: list[tuple[str, Order]]) -> None:
        """Queue each order for its node (sent in order, each node by its own sender). Once stopped (no
        longer leading), none: the next leader sends what its state implies."""
        if self._stopped:
            return
        for node, order in orders:
            queue = self._senders.get(node)
            if queue is None:
                queue = self._senders[node] = asyncio.Queue()
                self._tasks.append(asyncio.create_task(self._sender(node, queue)))
            queue.put_nowait(order)

    async def _orders(self) -> None:
        """Hand what each commit implies to the nodes' senders, in the order the log decided it."""
        while True:
            self.send(await self.outbox.get())

    def resend_launches(self) -> None:
        """Launches for every running job (after a restart or a rebuild): agents ignore repeats."""
        self.send(effects.launches(self.c.state))

    def sign(self, node: str, subject: str, body: bytes) -> str | None:
        key = self.keyring.key_of(node) if self.keyring is not None else None
        if key is None:
            return None
        return creds.issue(key, "ctl", 0, 0, node, int(time.time()), os.urandom(16).hex(), subject, body)

    async def _sender(self, node: str, queue: asyncio.Queue[Order]) -> None:
        """One node's orders, in order (a job's launch always precedes its kill)."""
        from nats.errors import MaxPayloadError

        subject = f"{sj.ORDER_PREFIX}.{node}"
        while True:
            order = await queue.get()
            body = wire_orders.encode(order)
            msg_id = wire_orders.message_id(order, node)
            headers = {"Nats-Msg-Id": msg_id} if msg_id else {}
            cred = self.sign(node, subject, body)
            if cred is not None:
                headers[CRED_HEADER] = cred
            delay, why = 0.1, ""
            for _attempt in range(SEND_ATTEMPTS):
                try:
                    await self.js.publish(subject, body, stream=sj.ORDER_STREAM, headers=headers or None)
                    why = ""
                    break
                except MaxPayloadError:
                    why = f"the order is {len(body):,} bytes, more than NATS carries"
                    break
                except Exception as exc:  # noqa: BLE001 - NATS unavailable: keep trying, in order
                    why = f"{type(exc).__name__}: {exc}"
                    log.warning("order for %s not sent yet: %s", node, why)
                    await asyncio.sleep(delay)
                    delay = min(2 * delay, 5.0)
            if why:
                await self._set_aside(node, order, why)

    async def _set_aside(self, node: str, order: Order, why: str) -> None:
        log.error("an order (%s of job %s) for %s was set aside: %s", order.op, order.job_id, node, why)
        self.set_aside.append((node, f"{order.op} {order.job_id}", why))
        if not isinstance(order, Launch):
            return
        reason = f"the launch could not be delivered to {node}: {why}"
        try:
            await self.c.write(lambda s: commands.undeliverable_launch(s, node, order.job_id, order.restarts, reason),
                               "rota")
        except (commands.Rejected, LogUnavailable, FencedError):
            pass

    # ------------------------------------------------------------ inbox

    def _node_credential(self, node: str, subject: str, headers: Any, body: bytes, now: int) -> str | None:
        """Why a node's message is not believed (None: it carries that node's valid credential)."""
        keyring = self.keyring
        if keyring is None:
            return None   # a controller without a cluster key believes the broker's permissions alone
        try:
            creds.verify(lambda host: keyring.key_of(host) if host == node else None,
                         (headers or {}).get(CRED_HEADER), subject, body, now, kind="node", replay=self.replay)
        except creds.CredentialError as exc:
            return str(exc)
        return None

    async def _inbox(self) -> None:
        async for msgs in work_queue(self.js, sj.INBOX_STREAM, f"{sj.INBOX_PREFIX}.>", "controller", batch=256,
                                     what="the agents' inbox"):
            results = await asyncio.gather(*(self._take(m) for m in msgs), return_exceptions=True)
            for m, r in zip(msgs, results):
                if r is True:
                    await m.ack()
                elif isinstance(r, FencedError):
                    return          # no longer the leader: the next one drains the inbox
                # anything else (log unavailable): not acked, redelivered after ack_wait

    async def _take(self, msg: Any) -> bool:
        """Append one report (idempotent on the inbox message id). True when it may be acked."""
        node = msg.subject.split(".", 2)[2]
        # a report is judged as of when the broker stored it: it may wait out a controller restart
        problem = self._node_credential(node, msg.subject, msg.headers, msg.data, stored_at(msg, int(time.time())))
        if problem is not None and (getattr(msg.metadata, "num_delivered", 1) or 1) > 1 \
                and problem.startswith(creds.REPLAYED):
            problem = None   # redelivered after a lost ack: the idempotency id keeps it from landing twice
        if problem is not None:
            log.error("a report on %s was set aside: %s", msg.subject, problem)
            return True
        try:
            event = ev.EVENT_ADAPTER.validate_json(msg.data)
        except ValueError as exc:
            log.error("dropping a malformed report from %s: %s", node, str(exc).splitlines()[0])
            return True
        idem = "inbox-" + ((msg.headers or {}).get("Nats-Msg-Id") or f"{node}-{msg.metadata.sequence.stream}")[:128]
        try:
            await self.c.write(lambda state: commands.check_report(state, node, event), f"agent:{node}", idem)
        except commands.Rejected as r:
            if r.code == "stale" and not await self._judged_on_the_whole_log():
                return False        # another controller wrote what it depends on: the leader judges it
            if r.code not in ("stale", "noop"):
                log.warning("report from %s refused: %s", node, r.lines[0])
            return True
        except LogUnavailable:
            return False
        if isinstance(event, ev.NodeRegistered):
            self.last_seen[node] = time.monotonic()
        return True

    async def _judged_on_the_whole_log(self) -> bool:
        """Whether the state a report was just judged on holds every record of the log. A controller that
        another has deposed may not know yet: a job it has not seen start is not a stale report's."""
        try:
            return await self.c.log.last_seq() <= self.c.state.seq
        except Exception:  # noqa: BLE001 - the log unreachable: not judged, redelivered later
            return False

    # ------------------------------------------------------------ heartbeats

    async def _on_heartbeat(self, msg: Any) -> None:
        node = msg.subject.split(".", 2)[2]
        problem = self._node_credential(node, msg.subject, msg.headers, msg.data, int(time.time()))
        if problem is not None:
            if time.monotonic() - self._warned.get(node, 0.0) > 30:
                self._warned[node] = time.monotonic()
                log.error("a heartbeat for %s was ignored: %s", node, problem)
            return
        self.last_seen[node] = time.monotonic()
        try:
            beat = Heartbeat.model_validate_json(msg.data)
        except ValueError:
            return   # an older agent's or a broken body: it was heard, that is all
        self.agent_running[node] = set(beat.running)
        if beat.order_stream and beat.order_stream == self._order_stream:
            self._purge_acted(node, beat.orders)

    def _purge_acted(self, node: str, acted: int) -> None:
        """Purge the orders ``node``'s agent says it has acted on (its own subject only: a node that lies
        loses only its own orders), once they are PURGE_EVERY or PURGE_WAIT old."""
        done, when = self._purged.get(node, (0, 0.0))
        now = time.monotonic()
        if acted <= done or (acted - done < PURGE_EVERY and now - when < PURGE_WAIT):
            return
        self._purged[node] = (acted, now)

        async def purge() -> None:
            try:
                await self.js.purge_stream(sj.ORDER_STREAM, subject=f"{sj.ORDER_PREFIX}.{node}", seq=acted + 1)
            except Exception as exc:  # noqa: BLE001 - tried again with a later heartbeat
                self._purged[node] = (done, when)
                log.warning("purging the orders %s acted on: %s", node, str(exc) or type(exc).__name__)
        task = asyncio.create_task(purge())
        self._purging.add(task)
        task.add_done_callback(self._purging.discard)

    async def _monitor(self) -> None:
        """Silent agents: NOT_RESPONDING after half the timeout, DOWN after all of it. Also kills jobs an
        agent still runs that the log says ended, and re-drains a resumed node that still has fewer
        GPUs than configured."""
        interval = min(1.0, self.node_timeout / 10)
        stalled = max(3 * interval, min(5.0, self.node_timeout / 2))
        while True:
            last = time.monotonic()
            await asyncio.sleep(interval)
            woke = time.monotonic()
            if woke - last > stalled:      # this process was stopped (SIGSTOP) or starved, not
                log.warning("the controller did not run for %.0f s: every agent gets a fresh timeout", woke - last)
                self.last_seen.update(dict.fromkeys(self.last_seen, woke))   # none was heard meanwhile (in place:
                # the controller's /metrics reads this dict)
                self._started = woke
            if not self.c.leader:
                continue
            now = time.monotonic()
            try:
                for name, node in list(self.c.state.nodes.items()):
                    if node.registered and not node.down:
                        # heard before this link began (an earlier spell as leader) counts as heard at its start
                        await self._check(name, node, now - max(self.last_seen.get(name, 0.0), self._started))
            except FencedError:
                return

    async def _check(self, name: str, node: Node, silent: float) -> None:
        """One registered node, ``silent`` seconds since its agent was last heard: NOT_RESPONDING, DOWN, or
        drained again for missing GPUs; and the jobs its agent runs that the log says ended are killed."""
        try:
            if silent >= self.node_timeout:
                await self.c.write(partial(commands.silent_node_down, node=name), "rota")
            elif silent >= self.node_timeout / 2 and not node.not_responding:
                await self.c.write(partial(commands.silent_node_not_responding, node=name), "rota")
            elif node.reported_gpus is not None and node.reported_gpus < node.gpu_count and not node.drain:
                reason = f"gres/gpu count reported lower than configured ({node.reported_gpus} < {node.gpu_count})"
                await self.c.write(partial(commands.check_report, node=name,
                                           event=ev.HealthFault(node=name, reason=reason, code="gres")), "rota")
        except (commands.Rejected, LogUnavailable):
            pass
        jobs = self.c.state.jobs
        for jid in self.agent_running.get(name, set()):
            job = jobs.get(jid)
            if job is None or job.state != RUNNING:
                self.send([(name, Kill(job_id=jid, reason="stopped", restarts=job.restarts if job is not None else None))])
        self.agent_running.pop(name, None)
