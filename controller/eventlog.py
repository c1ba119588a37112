"""The event log: one contract, two backends (in memory for tests and simulation; NATS JetStream).

``append`` takes an event, an actor, an idempotency id and the sequence the writer last folded
(fencing): the log refuses the write when anything else was appended since. ``read`` replays from
a sequence. A retried append with the same idempotency id is stored once.
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, AsyncIterator

from rota.core import events as ev

STREAM = "ROTA_EVENTS"
SUBJECT_PREFIX = "rota.ev"


class FencedError(Exception):
    """The log moved on since the writer's last folded sequence: the writer is stale."""

    def __init__(self, expected: int, actual: int | None = None) -> None:
        super().__init__(f"append refused: log is past sequence {expected}"
                         + (f" (now at {actual})" if actual is not None else ""))
        self.expected, self.actual = expected, actual


class LogUnavailable(Exception):
    """The log did not confirm an append in time: it may or may not have stored it; retry."""


@dataclass(frozen=True, slots=True)
class Appended:
    seq: int
    duplicate: bool


def subject_for(event: Any) -> str:
    """``rota.ev.<type>``, with node events under their node: ``rota.ev.node.<name>.<what>``."""
    etype: str = event.type
    node = getattr(event, "node", None)
    if node is not None and etype.startswith("node."):
        return f"{SUBJECT_PREFIX}.node.{node}.{etype.split('.', 1)[1]}"
    return f"{SUBJECT_PREFIX}.{etype}"


TS_HEADER = "Rota-Ts"
ACTOR_HEADER = "Rota-Actor"


def encode_body(event: Any) -> bytes:
    """The stored message body is the event's JSON; append time and actor travel in headers."""
    return ev.EVENT_ADAPTER.dump_json(event)


def decode_event_bytes(body: bytes) -> Any:
    """Validate a stored event: the fast path for current versions, upcasting for older ones."""
    try:
        return ev.EVENT_ADAPTER.validate_json(body)
    except ValueError:
        return ev.decode_event(json.loads(body))   # an older version: upcast, then validate


def decode_message(seq: int, headers: dict | None, body: bytes) -> ev.Envelope:
    h = headers or {}
    return ev.Envelope.model_construct(seq=seq, ts=int(h.get(TS_HEADER, 0)), actor=h.get(ACTOR_HEADER, "system"),
                                       idem=h.get("Nats-Msg-Id", ""), event=decode_event_bytes(body))


class MemoryLog:
    """The in-memory backend: same contract as :class:`JetStreamLog`."""

    def __init__(self, duplicate_window: int = 1 << 30) -> None:
        self.entries: list[ev.Envelope] = []
        self._idem: dict[str, int] = {}

    async def last_seq(self) -> int:
        return len(self.entries)

    async def append(self, event: Any, *, actor: str, idem: str, ts: int,
                     expected_last: int | None = None) -> Appended:
        if idem and idem in self._idem:
            return Appended(self._idem[idem], True)
        if expected_last is not None and expected_last != len(self.entries):
            raise FencedError(expected_last, len(self.entries))
        seq = len(self.entries) + 1
        self.entries.append(ev.Envelope(seq=seq, ts=ts, actor=actor, idem=idem, event=event))
        if idem:
            self._idem[idem] = seq
        return Appended(seq, False)

    async def read(self, from_seq: int = 1, to_seq: int | None = None) -> AsyncIterator[ev.Envelope]:
        end = len(self.entries) if to_seq is None else min(to_seq, len(self.entries))
        for env in self.entries[from_seq - 1:end]:
            yield env

    async def close(self) -> None:
        return None


class JetStreamLog:
    """The event stream on NATS JetStream: file storage, never discards, duplicate window."""

    def __init__(self, nc: Any, js: Any, stream: str = STREAM) -> None:
        self.nc, self.js, self.stream = nc, js, stream

    @classmethod
    async def connect(cls, servers: str | list[str], *, replicas: int = 1, stream: str = STREAM,
                      duplicate_window: float = 600.0, connect_timeout: float = 5.0) -> "JetStreamLog":
        """Connect and make sure the stream exists with rota's settings."""
        import nats
        from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
        from nats.js.errors import BadRequestError, NotFoundError

        nc = await nats.connect(servers, connect_timeout=connect_timeout, max_reconnect_attempts=-1,
                                reconnect_time_wait=0.2)
        js = nc.jetstream(timeout=10)
        config = StreamConfig(name=stream, subjects=[f"{SUBJECT_PREFIX}.>"], storage=StorageType.FILE,
                              retention=RetentionPolicy.LIMITS, discard=DiscardPolicy.OLD,
                              max_msgs=-1, max_bytes=-1, max_age=0, num_replicas=replicas,
                              duplicate_window=duplicate_window)
        for attempt in range(60):
            try:
                await js.stream_info(stream)
                break
            except NotFoundError:
                try:
                    await js.add_stream(config)
                    break
                except BadRequestError as exc:   # a forming cluster: "no suitable peers for placement"
                    if exc.err_code != 10005 or attempt == 59:
                        raise
            except Exception:                     # no meta leader elected yet
                if attempt == 59:
                    raise
            await asyncio.sleep(0.25)
        return cls(nc, js, stream)

    async def last_seq(self, attempts: int = 20) -> int:
        """The stream's last sequence (retried while a cluster elects a new stream leader)."""
        for attempt in range(attempts):
            try:
                info = await self.js.stream_info(self.stream)
                return info.state.last_seq
            except Exception as exc:   # timeouts while servers come and go
                if attempt == attempts - 1:
                    raise LogUnavailable(f"stream info: {type(exc).__name__}: {exc}") from None
                await asyncio.sleep(0.25)
        raise AssertionError("unreachable")

    async def append(self, event: Any, *, actor: str, idem: str, ts: int,
                     expected_last: int | None = None) -> Appended:
        from nats.js.errors import APIError

        headers = {TS_HEADER: str(ts), ACTOR_HEADER: actor}
        if idem:
            headers["Nats-Msg-Id"] = idem
        if expected_last is not None:
            headers["Nats-Expected-Last-Sequence"] = str(expected_last)
        try:
            ack = await self.js.publish(subject_for(event), encode_body(event),
                                        stream=self.stream, headers=headers)
        except APIError as exc:
            if getattr(exc, "err_code", None) == 10071:   # wrong last sequence
                raise FencedError(expected_last or 0) from None
            raise LogUnavailable(str(exc)) from None
        except Exception as exc:   # timeouts, no responders, reconnects: the outcome is unknown
            raise LogUnavailable(f"{type(exc).__name__}: {exc}") from None
        return Appended(ack.seq, bool(ack.duplicate))

    async def read(self, from_seq: int = 1, to_seq: int | None = None, batch: int = 1000) -> AsyncIterator[ev.Envelope]:
        """Replay [from_seq, to_seq] (to the current end when None) with an ordered consumer.

        Messages are buffered by the subscription callback and decoded in batches here.
        """
        from nats.js.api import DeliverPolicy

        end = to_seq if to_seq is not None else await self.last_seq()
        if end < from_seq:
            return
        buf: list[Any] = []
        ready = asyncio.Event()
        expected = end - from_seq + 1     # the stream has no gaps: rota never deletes events
        received = 0

        async def on_msg(msg: Any) -> None:
            nonlocal received
            buf.append(msg)
            received += 1
            if len(buf) >= batch or received >= expected:
                ready.set()

        for attempt in range(40):   # consumer creation times out while a stream leader is elected
            try:
                sub = await self.js.subscribe(f"{SUBJECT_PREFIX}.>", stream=self.stream, cb=on_msg,
                                              ordered_consumer=True, deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                                              config=_start_config(from_seq), pending_msgs_limit=batch * 100)
                break
            except Exception as exc:
                if attempt == 39:
                    raise LogUnavailable(f"cannot read the log: {type(exc).__name__}: {exc}") from None
                await asyncio.sleep(0.25)
        try:
            while True:
                try:
                    await asyncio.wait_for(ready.wait(), timeout=0.05)
                except asyncio.TimeoutError:
                    if not buf:
                        continue
                ready.clear()
                chunk, buf[:] = list(buf), []
                for msg in chunk:
                    seq = msg.metadata.sequence.stream
                    if seq < from_seq:
                        continue
                    yield decode_message(seq, msg.headers, msg.data)
                    if seq >= end:
                        return
        finally:
            await sub.unsubscribe()

    async def close(self) -> None:
        await self.nc.drain()


def _start_config(seq: int):
    from nats.js.api import ConsumerConfig, DeliverPolicy

    return ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=seq)
