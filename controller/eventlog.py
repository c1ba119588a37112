"""The event log: one contract, two backends (in memory for tests and simulation; NATS JetStream).

``append`` takes an event, an actor, an idempotency id and the sequence the writer last folded
(fencing): the log refuses the write when anything else was appended since. ``read`` replays from
a sequence. A retried append with the same idempotency id is stored once.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
from dataclasses import dataclass
from typing import Any, AsyncIterator, Protocol

from rota.core import credentials
from rota.core import events as ev
from rota.wire import natsconn
from rota.wire import subjects as sj

from .snapshots import MemorySnapshots, ObjectStoreSnapshots, SnapshotStore

log = logging.getLogger("rota.eventlog")
STREAM = sj.EVENT_STREAM
SUBJECT_PREFIX = sj.EVENT_PREFIX


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
MAC_HEADER = "Rota-Mac"


def encode_body(event: Any) -> bytes:
    """The stored message body is the event's JSON; append time and actor travel in headers."""
    return ev.EVENT_ADAPTER.dump_json(event)


def decode_event_bytes(body: bytes) -> Any:
    """Validate a stored event: the fast path for current versions, upcasting for older ones."""
    try:
        return ev.EVENT_ADAPTER.validate_json(body)
    except ValueError:
        return ev.decode_event(json.loads(body))   # an older version: upcast, then validate


def record_headers(mac_key: bytes | None, seq: int, ts: int, actor: str, idem: str, body: bytes) -> dict[str, str]:
    """The headers an event is stored with (its MAC when the writer holds the log key)."""
    headers = {TS_HEADER: str(ts), ACTOR_HEADER: actor}
    if idem:
        headers["Nats-Msg-Id"] = idem
    if mac_key is not None:
        headers[MAC_HEADER] = credentials.log_mac(mac_key, seq, ts, actor, idem, body)
    return headers


class RecordCheck:
    """What a reader holding the log key accepts: records the controller signed. Unsigned records
    before the first signed one (a log begun by an older rota) are accepted; after it, never."""

    def __init__(self, mac_key: bytes) -> None:
        self.mac_key = mac_key
        self.first_signed: int | None = None   # the lowest sequence known to carry the controller's MAC

    def signed_at(self, seq: int) -> None:
        if self.first_signed is None or seq < self.first_signed:
            self.first_signed = seq

    def problem(self, seq: int, ts: int, actor: str, idem: str, body: bytes, mac: str | None) -> str | None:
        if mac is None:
            if self.first_signed is not None and seq > self.first_signed:
                return "it carries no MAC: it was not written by this cluster's controller"
            return None
        if not credentials.check_log_mac(self.mac_key, mac, seq, ts, actor, idem, body):
            return "its MAC does not match: it was forged, altered or moved"
        self.signed_at(seq)
        return None


def _first_problem(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors(include_url=False)[0]
        where = ".".join(str(p) for p in first.get("loc", ())[1:]) or "the record"
        return f"{where}: {first.get('msg', 'invalid')}"
    return (str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)


def decode_message(seq: int, headers: dict | None, body: bytes, check: RecordCheck | None = None,
                   set_aside: list | None = None) -> ev.Envelope:
    """One stored record as an envelope; a record that is malformed, unknown or not the controller's
    becomes an envelope without an event (``event`` None): it keeps its place and changes nothing."""
    h = headers or {}
    raw_ts = h.get(TS_HEADER, "0")
    ts = int(raw_ts) if raw_ts.isdecimal() and len(raw_ts) < 16 else 0
    actor, idem = h.get(ACTOR_HEADER, "system"), h.get("Nats-Msg-Id", "")
    why = check.problem(seq, ts, actor, idem, body, h.get(MAC_HEADER)) if check is not None else None
    event = None
    if why is None:
        try:
            event = decode_event_bytes(body)
        except Exception as exc:  # noqa: BLE001 - any malformed record: set aside, never stop a replay
            why = f"not an event this rota knows ({_first_problem(exc)})"
    if why is not None:
        log.error("log record %d set aside: %s", seq, why)
        if set_aside is not None:
            set_aside.append((seq, why))
    return ev.Envelope.trusted(seq, ts, actor, idem, event)


class EventLog(Protocol):
    """What the controller needs of a log: fenced, idempotent appends; reads in batches; snapshots."""

    snapshots: SnapshotStore
    mac_key: bytes | None

    async def last_seq(self) -> int:
        """The sequence of the last record."""

    async def append(self, event: Any, *, actor: str, idem: str, ts: int,
                     expected_last: int | None = None) -> Appended:
        """Append ``event`` (a duplicate ``idem`` returns the first one's sequence; a log whose last
        sequence is not ``expected_last`` raises :class:`FencedError`)."""

    def read_batches(self, from_seq: int = 1, to_seq: int | None = None) -> AsyncIterator[list[ev.Envelope]]:
        """The records from ``from_seq`` to ``to_seq`` (inclusive; None: the end), in order, in batches."""

    async def close(self) -> None:
        """Let go of the log's connections."""


class MemoryLog:
    """The in-memory backend: same contract as :class:`JetStreamLog`."""

    def __init__(self, duplicate_window: int = 1 << 30) -> None:
        self.entries: list[ev.Envelope] = []
        self._idem: dict[str, int] = {}
        self.snapshots: SnapshotStore = MemorySnapshots()
        self.mac_key: bytes | None = None

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
        async for chunk in self.read_batches(from_seq, to_seq):
            for env in chunk:
                yield env

    async def read_batches(self, from_seq: int = 1, to_seq: int | None = None,
                           batch: int = 2000) -> AsyncIterator[list[ev.Envelope]]:
        end = len(self.entries) if to_seq is None else min(to_seq, len(self.entries))
        for i in range(from_seq - 1, end, batch):
            yield self.entries[i:min(i + batch, end)]

    async def close(self) -> None:
        return None


class JetStreamLog:
    """The event stream on NATS JetStream: file storage, never discards, duplicate window."""

    def __init__(self, nc: Any, js: Any, stream: str = STREAM, mac_key: bytes | None = None) -> None:
        self.nc, self.js, self.stream = nc, js, stream
        self._plain_reads = True   # deliveries on a connection of our own (see _RawPullReader)
        self.mac_key = mac_key
        self.check = RecordCheck(mac_key) if mac_key is not None else None
        # a trusted snapshot signed by the controller: the log is signed from its sequence on
        self.snapshots: SnapshotStore = ObjectStoreSnapshots(js, mac_key, self.check.signed_at if self.check else None)
        self.set_aside: list[tuple[int, str]] = []   # (sequence, why) of records read and not applied

    @classmethod
    async def connect(cls, servers: str | list[str], *, replicas: int = 1, stream: str = STREAM,
                      duplicate_window: float = 600.0, connect_timeout: float = 5.0, keyring: Any = None,
                      **options: Any) -> "JetStreamLog":
        """Connect (``options``: nats-py's, e.g. the role's user and password) and make sure the stream
        exists with rota's settings. With a ``keyring`` holding the cluster key, every append carries a
        MAC and every record read is checked: one that is not the controller's is set aside."""
        from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
        from nats.js.errors import BadRequestError, NotFoundError

        nc = await natsconn.connect(servers, "rota", connect_timeout=connect_timeout, drain_timeout=5, **options)
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
        return cls(nc, js, stream, keyring.purpose_key("log") if keyring is not None else None)

    async def last_seq(self, attempts: int = 20) -> int:
        """The stream's last sequence (retried while a cluster elects a new stream leader)."""
        for attempt in range(attempts):
            try:
                info = await self.js.stream_info(self.stream)
                return info.state.last_seq
            except Exception as exc:  # noqa: BLE001 - timeouts while servers come and go
                if attempt == attempts - 1:
                    raise LogUnavailable(f"stream info: {type(exc).__name__}: {exc}") from None
                await asyncio.sleep(0.25)
        raise AssertionError("unreachable")

    async def append(self, event: Any, *, actor: str, idem: str, ts: int,
                     expected_last: int | None = None) -> Appended:
        from nats.js.errors import APIError

        body = encode_body(event)
        key = self.mac_key if expected_last is not None else None   # the position is known only when fenced
        headers = record_headers(key, (expected_last or 0) + 1, ts, actor, idem, body)
        if expected_last is not None:
            headers["Nats-Expected-Last-Sequence"] = str(expected_last)
        try:
            ack = await self.js.publish(subject_for(event), body, stream=self.stream, headers=headers)
            if key is not None and self.check is not None and not ack.duplicate and ack.seq == (expected_last or 0) + 1:
                self.check.signed_at(ack.seq)
        except APIError as exc:
            if getattr(exc, "err_code", None) == 10071:   # wrong last sequence
                raise FencedError(expected_last or 0) from None
            raise LogUnavailable(str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - timeouts, no responders, reconnects: the outcome is unknown
            raise LogUnavailable(f"{type(exc).__name__}: {exc}") from None
        return Appended(ack.seq, bool(ack.duplicate))

    async def read(self, from_seq: int = 1, to_seq: int | None = None,
                   batch: int = 2000) -> AsyncIterator[ev.Envelope]:
        """Replay [from_seq, to_seq] (to the current end when None) in order."""
        async for chunk in self.read_batches(from_seq, to_seq, batch):
            for env in chunk:
                yield env

    async def read_batches(self, from_seq: int = 1, to_seq: int | None = None,
                           batch: int = 2000) -> AsyncIterator[list[ev.Envelope]]:
        """Replay in decoded batches (no per-event generator step: the rebuild hot path)."""
        check, aside = self.check, self.set_aside
        async for chunk in self.read_raw(from_seq, to_seq, batch):
            yield [decode_message(seq, headers, body, check, aside) for seq, headers, body in chunk]

    async def read_raw(self, from_seq: int = 1, to_seq: int | None = None,
                       batch: int = 2000) -> AsyncIterator[list[tuple[int, dict | None, bytes]]]:
        """The stored messages [from_seq, to_seq] as (seq, headers, body) lists, in order.

        An ephemeral pull consumer (no acks) fed by batched ``$JS.API.CONSUMER.MSG.NEXT`` requests on a
        plain subscription, two requests in flight: the fastest way nats-py reads a stream.
        """
        end = to_seq if to_seq is not None else await self.last_seq()
        if end < from_seq:
            return
        delivered = from_seq - 1
        for attempt in range(20):
            reader = (_RawPullReader if self._plain_reads else _PullReader)(self, delivered + 1, end, batch)
            try:
                try:
                    await reader.open()
                except (_RawUnsupported, OSError, asyncio.TimeoutError) as exc:
                    log.info("reading the log through nats-py (%s)", exc)
                    self._plain_reads = False
                    await reader.close()
                    reader = _PullReader(self, delivered + 1, end, batch)
                    await reader.open()
                async for chunk in reader.chunks():
                    chunk = [m for m in chunk if m[0] > delivered]   # never twice, never out of order
                    if chunk:
                        delivered = chunk[-1][0]
                        yield chunk
                return
            except LogUnavailable as exc:
                # a consumer lost with its server, a leader being elected: resume from what we have
                if attempt == 19:
                    raise
                log.warning("reading the log: %s; resuming after sequence %d", exc, delivered)
                await asyncio.sleep(0.25)
            finally:
                await reader.close()

    async def _ephemeral_consumer(self, from_seq: int) -> str:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        cfg = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=from_seq,
                             ack_policy=AckPolicy.NONE, inactive_threshold=30.0, mem_storage=True)
        for attempt in range(40):   # consumer creation times out while a stream leader is elected
            try:
                return (await self.js.add_consumer(self.stream, cfg)).name
            except Exception as exc:  # noqa: BLE001
                if attempt == 39:
                    raise LogUnavailable(f"cannot read the log: {type(exc).__name__}: {exc}") from None
                await asyncio.sleep(0.25)
        raise AssertionError("unreachable")

    async def close(self) -> None:
        """Close the connection (every append was acknowledged already: nothing to drain)."""
        try:
            await asyncio.wait_for(self.nc.flush(), timeout=2)
        except Exception:  # noqa: BLE001 - closing anyway
            pass
        await self.nc.close()


class _PullReader:
    """One ephemeral pull consumer reading [start, end], two batched requests in flight."""

    def __init__(self, log: "JetStreamLog", start: int, end: int, batch: int) -> None:
        self.log, self.start, self.end, self.batch = log, start, end, batch
        self.consumer: str | None = None
        self.sub: Any = None
        self.got: list[tuple[int, dict | None, bytes]] = []
        self.ready = asyncio.Event()
        self.failure: list[str] = []
        self.requested = start - 1

    async def open(self) -> None:
        self.consumer = await self.log._ephemeral_consumer(self.start)
        self.inbox = self.log.nc.new_inbox()
        self.sub = await self.log.nc.subscribe(self.inbox, cb=self._on_msg, pending_msgs_limit=self.batch * 8,
                                               pending_bytes_limit=256 * 1024 * 1024)
        self.next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{self.log.stream}.{self.consumer}"

    async def _on_msg(self, msg: Any) -> None:
        reply = msg.reply
        if not reply:   # a status message: 404/408 when a request ran dry or expired
            status = (msg.headers or {}).get("Status", "")
            if status not in ("404", "408", "409"):
                self.failure.append(f"pull request failed: status {status!r}")
            self.ready.set()
            return
        seq = _stream_seq(reply)
        self.got.append((seq, msg.headers, msg.data))
        if len(self.got) >= self.batch or seq >= self.end:
            self.ready.set()

    async def _ask(self) -> None:
        n = min(self.batch, self.end - self.requested)
        if n > 0:
            await self._send(json.dumps({"batch": n, "expires": 30_000_000_000}).encode())
            self.requested += n

    async def _send(self, body: bytes) -> None:
        """Publish one MSG.NEXT request, its deliveries addressed to our inbox."""
        await self.log.nc.publish(self.next_subject, body, reply=self.inbox)

    async def _hand_over(self, chunk: list[tuple[int, dict | None, bytes]]) -> list[tuple[int, dict | None, bytes]]:
        """Keep two batches requested ahead of ``chunk``; trim what lies past the end."""
        delivered = chunk[-1][0]
        while self.requested < self.end and self.requested - delivered < 2 * self.batch:
            await self._ask()
        return [m for m in chunk if m[0] <= self.end] if delivered > self.end else chunk

    async def chunks(self) -> AsyncIterator[list[tuple[int, dict | None, bytes]]]:
        delivered = self.start - 1
        await self._ask()
        await self._ask()
        while delivered < self.end:
            try:
                await asyncio.wait_for(self.ready.wait(), timeout=10)
            except asyncio.TimeoutError:
                raise LogUnavailable(f"reading the log stalled at sequence {delivered}") from None
            self.ready.clear()
            if self.failure:
                raise LogUnavailable(self.failure[0])
            chunk, self.got[:] = list(self.got), []
            if not chunk:
                continue
            delivered = chunk[-1][0]
            yield await self._hand_over(chunk)

    async def close(self) -> None:
        if self.sub is not None:
            try:
                await self.sub.unsubscribe()
            except Exception:  # noqa: BLE001 - the connection may be reconnecting
                pass
        if self.consumer is not None:
            try:
                await self.log.js.delete_consumer(self.log.stream, self.consumer)
            except Exception:  # noqa: BLE001 - it expires on its own (inactive_threshold)
                pass


class _RawUnsupported(Exception):
    """The plain reader cannot speak to this server (TLS, credentials it does not have)."""


class _RawPullReader(_PullReader):
    """:class:`_PullReader` with the messages read off a connection of its own and parsed in bulk.

    nats-py spends about 19 us per delivered message (a ``Msg`` object, header parsing, a queue and
    a callback); cutting whole frames out of a buffer takes about 5. The consumer is still made
    with nats-py; only the deliveries travel on the plain connection. A server that wants TLS or
    credentials the URL does not carry makes :meth:`open` fail, and the caller falls back.
    """

    async def open(self) -> None:
        url = self.log.nc.connected_url
        if url is None or url.scheme not in ("nats", ""):
            raise _RawUnsupported(f"scheme {getattr(url, 'scheme', None)!r}")
        self.consumer = await self.log._ephemeral_consumer(self.start)
        self.reader, self.writer = await asyncio.wait_for(
            asyncio.open_connection(url.hostname, url.port or 4222, limit=1 << 24), timeout=5)
        info = await asyncio.wait_for(self.reader.readline(), timeout=5)
        meta = json.loads(info[5:]) if info.startswith(b"INFO ") else {}
        user = url.username or self.log.nc.options.get("user")
        password = url.password or self.log.nc.options.get("password")
        if meta.get("tls_required") or (meta.get("auth_required") and not (user and password)):
            raise _RawUnsupported("the server wants TLS or credentials")
        connect = {"verbose": False, "pedantic": False, "headers": True, "no_responders": True,
                   "lang": "python", "version": "rota-replay", "protocol": 1}
        if user and password and isinstance(user, str) and isinstance(password, str):
            connect.update(user=user, **{"pass": password})
        self.inbox = f"_INBOX.{os.urandom(12).hex()}"
        self.writer.write(f"CONNECT {json.dumps(connect)}\r\nSUB {self.inbox} 1\r\nPING\r\n".encode())
        while True:
            line = await asyncio.wait_for(self.reader.readline(), timeout=5)
            if line.startswith(b"PONG"):
                break
            if not line or line.startswith(b"-ERR"):
                raise _RawUnsupported(line.decode(errors="replace").strip() or "connection closed")
        self.next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{self.log.stream}.{self.consumer}"
        self.buf = b""

    async def _send(self, body: bytes) -> None:
        self.writer.write(b"PUB %s %s %d\r\n%s\r\n" % (self.next_subject.encode(), self.inbox.encode(),
                                                        len(body), body))

    def _parse(self) -> int:
        """Cut the complete frames out of the buffer into ``got``; returns PINGs to answer."""
        buf, got, pings = self.buf, self.got, 0
        n, pos, find = len(buf), 0, buf.find
        while pos < n:
            eol = find(b"\r\n", pos)
            if eol < 0:
                break
            head = buf[pos:pos + 5]
            if head == b"HMSG " or head[:4] == b"MSG ":
                has_headers = head == b"HMSG "
                parts = buf[pos + (5 if has_headers else 4):eol].split(b" ")
                total = int(parts[-1])
                hlen = int(parts[-2]) if has_headers else 0
                start = eol + 2
                if start + total + 2 > n:
                    break
                reply = parts[2] if len(parts) == (5 if has_headers else 4) else None
                headers = None
                if hlen:
                    lines = buf[start:start + hlen].split(b"\r\n")
                    if reply is None:   # a status: 404/408/409 when a request ran dry or expired
                        status = lines[0][9:12].decode()
                        if status not in ("404", "408", "409"):
                            self.failure.append(f"pull request failed: status {status!r}")
                        pos = start + total + 2
                        continue
                    headers = {}
                    for line in lines[1:]:
                        if line:
                            k, _, v = line.partition(b": ")
                            headers[k.decode()] = v.decode()
                if reply is not None:
                    got.append((_stream_seq(reply.decode()), headers, buf[start + hlen:start + total]))
                pos = start + total + 2
            else:
                if head[:4] == b"PING":
                    pings += 1
                elif head[:4] == b"-ERR":
                    self.failure.append(buf[pos:eol].decode(errors="replace"))
                pos = eol + 2
        self.buf = buf[pos:]
        return pings

    async def chunks(self) -> AsyncIterator[list[tuple[int, dict | None, bytes]]]:
        delivered = self.start - 1
        await self._ask()
        await self._ask()
        while delivered < self.end:
            try:
                data = await asyncio.wait_for(self.reader.read(1 << 20), timeout=10)
            except asyncio.TimeoutError:
                raise LogUnavailable(f"reading the log stalled at sequence {delivered}") from None
            if not data:
                raise LogUnavailable(f"the connection closed at sequence {delivered}")
            self.buf += data
            pings = self._parse()
            if pings:
                self.writer.write(b"PONG\r\n" * pings)
            if self.failure:
                raise LogUnavailable(self.failure[0])
            got = self.got
            if not got or (len(got) < self.batch and got[-1][0] < self.end):
                continue
            chunk, self.got = got, []
            delivered = chunk[-1][0]
            yield await self._hand_over(chunk)

    async def close(self) -> None:
        writer = getattr(self, "writer", None)
        if writer is not None:
            writer.close()
        await super().close()


def _stream_seq(reply: str) -> int:
    """The stream sequence in a JetStream delivery's reply subject (v1 and v2 ack formats)."""
    tokens = reply.split(".")
    return int(tokens[5] if len(tokens) == 9 else tokens[7])
