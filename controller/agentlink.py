"""The controller's side of the agents: drain their inbox into the log, send them assignments,
watch their heartbeats (silent: NOT_RESPONDING, then DOWN)."""
from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from rota.agents.agent import (
    ASSIGN_PREFIX, ASSIGN_STREAM, HEARTBEAT_PREFIX, INBOX_PREFIX, INBOX_STREAM, ensure_streams, work_queue,
)
from rota.core import commands
from rota.core import events as ev
from rota.core.state import RUNNING, State

from . import assign
from .eventlog import FencedError, LogUnavailable

log = logging.getLogger("rota.controller.agents")

# What an agent may report, and only about its own node.
AGENT_REPORTS = (ev.NodeRegistered, ev.JobExited, ev.HealthFault)


def check_report(state: State, node: str, event: Any) -> Any:
    """Validate an agent's report against the state; returns the event to append or raises Rejected."""
    if not isinstance(event, AGENT_REPORTS):
        raise commands.Rejected(f"agents may not report {event.type!r}", code="forbidden")
    if getattr(event, "node", node) not in ("", node):
        raise commands.Rejected(f"agent {node} reported for node {event.node!r}", code="forbidden")
    n = state.nodes.get(node)
    if n is None:
        raise commands.Rejected(f"unknown node {node!r}: not in the cluster configuration", code="node")
    if isinstance(event, ev.JobExited):
        job = state.jobs.get(event.job_id)
        if job is None or job.state != RUNNING or not job.alloc or job.alloc[0].node != node:
            raise commands.Rejected(f"job {event.job_id} is not running on {node}", code="stale")
        return event.model_copy(update={"node": node})
    if isinstance(event, ev.HealthFault) and n.drain:
        raise commands.Rejected(f"{node} is already drained", code="noop")
    return event


class AgentLink:
    def __init__(self, controller: Any, nc: Any, *, node_timeout: float = 300.0) -> None:
        self.c = controller
        self.nc = nc
        self.js = nc.jetstream(timeout=10)
        self.node_timeout = node_timeout
        self.last_seen: dict[str, float] = {}
        self.agent_running: dict[str, set[int]] = {}
        self._outbox: asyncio.Queue[tuple[str, dict]] = asyncio.Queue()
        self._tasks: list[asyncio.Task] = []
        self._subs: list[Any] = []
        self._started = time.monotonic()

    async def start(self) -> None:
        await ensure_streams(self.js)
        self.c.on_assign = self.send
        self.c.on_reload = self.resend_launches
        self._subs.append(await self.nc.subscribe(f"{HEARTBEAT_PREFIX}.*", cb=self._on_heartbeat))
        self._tasks = [asyncio.create_task(t) for t in (self._publisher(), self._inbox(), self._monitor())]
        self.resend_launches()

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for sub in self._subs:
            await sub.unsubscribe()

    # ------------------------------------------------------------ assignments

    def send(self, messages: list[tuple[str, dict]]) -> None:
        for item in messages:
            self._outbox.put_nowait(item)

    def resend_launches(self) -> None:
        """Launches for every running job (after a restart or a rebuild): agents ignore repeats."""
        st = self.c.state
        for jid in list(st.running):
            msg = assign.launch_message(st, jid)
            if msg is not None:
                self._outbox.put_nowait((msg["nodes"][0], msg))

    async def _publisher(self) -> None:
        """One sender, so a job's launch always precedes its kill."""
        while True:
            node, msg = await self._outbox.get()
            msg_id = f"{msg['op']}-{msg['job_id']}-{msg.get('restarts', 0)}"
            delay = 0.1
            while True:
                try:
                    once = msg["op"] not in ("update", "signal")   # these may be repeated on purpose
                    await self.js.publish(f"{ASSIGN_PREFIX}.{node}", json.dumps(msg).encode(), stream=ASSIGN_STREAM,
                                          headers={"Nats-Msg-Id": msg_id} if once else None)
                    break
                except Exception as exc:  # noqa: BLE001 - NATS unavailable: keep trying, in order
                    log.warning("assignment for %s not sent yet: %s", node, exc)
                    await asyncio.sleep(delay)
                    delay = min(2 * delay, 5.0)

    # ------------------------------------------------------------ inbox

    async def _inbox(self) -> None:
        async for msgs in work_queue(self.js, INBOX_STREAM, f"{INBOX_PREFIX}.>", "controller", batch=256,
                                     ack_wait=30, what="the agents' inbox"):
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
        try:
            event = ev.EVENT_ADAPTER.validate_json(msg.data)
        except ValueError as exc:
            log.error("dropping a malformed report from %s: %s", node, str(exc).splitlines()[0])
            return True
        idem = "inbox-" + ((msg.headers or {}).get("Nats-Msg-Id") or f"{node}-{msg.metadata.sequence.stream}")
        try:
            await self.c.write(lambda state: check_report(state, node, event), f"agent:{node}", idem)
        except commands.Rejected as r:
            if r.code not in ("stale", "noop"):
                log.warning("report from %s refused: %s", node, r.lines[0])
            return True
        except LogUnavailable:
            return False
        if isinstance(event, ev.NodeRegistered):
            self.last_seen[node] = time.monotonic()
        return True

    # ------------------------------------------------------------ heartbeats

    async def _on_heartbeat(self, msg: Any) -> None:
        node = msg.subject.split(".", 2)[2]
        self.last_seen[node] = time.monotonic()
        try:
            self.agent_running[node] = set(json.loads(msg.data).get("running", []))
        except (ValueError, AttributeError):
            pass

    async def _monitor(self) -> None:
        """Silent agents: NOT_RESPONDING after half the timeout, DOWN after all of it. Also kills jobs an
        agent still runs that the log says ended, and re-drains a resumed node that still has fewer
        GPUs than configured."""
        while True:
            await asyncio.sleep(min(1.0, self.node_timeout / 10))
            if not self.c.leader:
                continue
            now = time.monotonic()
            st = self.c.state
            for name, node in list(st.nodes.items()):
                if not node.registered or node.down:
                    continue
                silent = now - self.last_seen.get(name, self._started)
                try:
                    if silent >= self.node_timeout:
                        await self.c.write(lambda s, n=name: _down(s, n), "rota")
                    elif silent >= self.node_timeout / 2 and not node.not_responding:
                        await self.c.write(lambda s, n=name: _not_responding(s, n), "rota")
                    elif node.reported_gpus is not None and node.reported_gpus < node.gpu_count and not node.drain:
                        reason = (f"gres/gpu count reported lower than configured "
                                  f"({node.reported_gpus} < {node.gpu_count})")
                        await self.c.write(lambda s, n=name, r=reason: check_report(
                            s, n, ev.HealthFault(node=n, reason=r, code="gres")), "rota")
                except (commands.Rejected, LogUnavailable):
                    pass
                except FencedError:
                    return
                for jid in self.agent_running.get(name, set()):
                    job = st.jobs.get(jid)
                    if job is None or job.state != RUNNING:
                        self._outbox.put_nowait((name, {"op": "kill", "job_id": jid, "reason": "stopped",
                                                        "restarts": job.restarts if job else 0}))
                self.agent_running.pop(name, None)


def _down(state: State, node: str) -> Any:
    n = state.nodes.get(node)
    if n is None or n.down:
        raise commands.Rejected("noop", code="noop")
    return ev.NodeDown(node=node, reason="Not responding", by="rota")


def _not_responding(state: State, node: str) -> Any:
    n = state.nodes.get(node)
    if n is None or n.not_responding or n.down:
        raise commands.Rejected("noop", code="noop")
    return ev.NodeNotResponding(node=node)
