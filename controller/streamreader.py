"""Reading a JetStream stream fast: an ephemeral pull consumer with two batched requests in flight,
its messages taken off a plain connection of its own and parsed in bulk where the server allows."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from typing import Any, AsyncIterator

from .logerrors import LogUnavailable

log = logging.getLogger("rota.eventlog")

HEARTBEAT = 1.0      # seconds between the server's heartbeats while a request waits
SILENCE = 3.5        # seconds with not a word from the consumer's server before a read gives it up
REMOVE_WAIT = 1.0    # seconds a consumer's removal is waited for (it goes by itself when idle anyway)
MAKE_WAIT, MAKE_WAIT_MAX = 2.0, 4.0   # seconds a try at making a consumer may take at first, and at most
KEEP = ("100", "404", "408", "409")   # statuses that are no failure: a heartbeat, a request dry or expired


async def ephemeral_consumer(lg: Any, from_seq: int) -> str:
    """An ephemeral consumer of ``lg``'s stream from ``from_seq``, one copy in memory, no acknowledgements. A try
    placed on a frozen or cut-off server is never answered: another lands elsewhere."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    cfg = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=from_seq,
                         ack_policy=AckPolicy.NONE, inactive_threshold=30.0, mem_storage=True)
    wait = MAKE_WAIT
    for attempt in range(40):   # consumer creation times out while a stream leader is elected
        try:
            return (await asyncio.wait_for(lg.js.add_consumer(lg.stream, cfg), wait)).name
        except Exception as exc:  # noqa: BLE001
            if attempt == 39:
                raise LogUnavailable(f"cannot read the log: {type(exc).__name__}: {exc}") from None
            if attempt == 2:
                log.warning("a consumer to read the log cannot be made yet (%s: %s): still trying",
                            type(exc).__name__, exc)
            wait = min(2 * wait, MAKE_WAIT_MAX)
            await asyncio.sleep(0.25)
    raise AssertionError("unreachable")


class PullReader:
    """One ephemeral pull consumer reading [start, end], two batched requests in flight."""

    def __init__(self, log: Any, start: int, end: int, batch: int) -> None:
        self.log, self.start, self.end, self.batch = log, start, end, batch
        self.consumer: str | None = None
        self.sub: Any = None
        self.got: list[tuple[int, dict | None, bytes]] = []
        self.ready = asyncio.Event()
        self.failure: list[str] = []
        self.requested = start - 1
        self.heard = False          # whether anything came since the last look

    async def open(self) -> None:
        self.consumer = await ephemeral_consumer(self.log, self.start)
        self.inbox = self.log.nc.new_inbox()
        self.sub = await self.log.nc.subscribe(self.inbox, cb=self._on_msg, pending_msgs_limit=self.batch * 8,
                                               pending_bytes_limit=256 * 1024 * 1024)
        self.next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{self.log.stream}.{self.consumer}"

    async def _on_msg(self, msg: Any) -> None:
        self.heard = True
        reply = msg.reply
        if not reply:   # a status message
            status = (msg.headers or {}).get("Status", "")
            if status == "100":
                return
            if status not in KEEP:
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
            await self._send(json.dumps({"batch": n, "expires": 30_000_000_000,
                                         "idle_heartbeat": int(HEARTBEAT * 1e9)}).encode())
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
            await self._wait(delivered)
            self.ready.clear()
            if self.failure:
                raise LogUnavailable(self.failure[0])
            chunk, self.got[:] = list(self.got), []
            if not chunk:
                continue
            delivered = chunk[-1][0]
            yield await self._hand_over(chunk)

    async def _wait(self, delivered: int) -> None:
        """Until a batch is in, a request ends or fails; LogUnavailable after SILENCE seconds without a word
        from the consumer's server (frozen, or cut off: its heartbeats stop)."""
        while True:
            self.heard = False
            try:
                await asyncio.wait_for(self.ready.wait(), timeout=SILENCE)
                return
            except asyncio.TimeoutError:
                if not self.heard:
                    raise LogUnavailable(f"its server went silent at sequence {delivered}") from None

    async def close(self) -> None:
        if self.sub is not None:
            try:
                await self.sub.unsubscribe()
            except Exception:  # noqa: BLE001 - the connection may be reconnecting
                pass
        if self.consumer is not None:
            try:
                await asyncio.wait_for(self.log.js.delete_consumer(self.log.stream, self.consumer), REMOVE_WAIT)
            except Exception:  # noqa: BLE001 - it expires on its own (inactive_threshold); a frozen server never answers
                pass


class RawUnsupported(Exception):
    """The plain reader cannot speak to this server (TLS, credentials it does not have)."""


class RawPullReader(PullReader):
    """:class:`PullReader` with the messages read off a connection of its own and parsed in bulk.

    nats-py spends about 19 us per delivered message (a ``Msg`` object, header parsing, a queue and
    a callback); cutting whole frames out of a buffer takes about 5. The consumer is still made
    with nats-py; only the deliveries travel on the plain connection. A server that wants TLS or
    credentials the URL does not carry makes :meth:`open` fail, and the caller falls back.
    """

    async def open(self) -> None:
        url = self.log.nc.connected_url
        if url is None or url.scheme not in ("nats", ""):
            raise RawUnsupported(f"scheme {getattr(url, 'scheme', None)!r}")
        self.consumer = await ephemeral_consumer(self.log, self.start)
        self.reader, self.writer = await asyncio.wait_for(
            asyncio.open_connection(url.hostname, url.port or 4222, limit=1 << 24), timeout=5)
        info = await asyncio.wait_for(self.reader.readline(), timeout=5)
        meta = json.loads(info[5:]) if info.startswith(b"INFO ") else {}
        user = url.username or self.log.nc.options.get("user")
        password = url.password or self.log.nc.options.get("password")
        if meta.get("tls_required") or (meta.get("auth_required") and not (user and password)):
            raise RawUnsupported("the server wants TLS or credentials")
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
                raise RawUnsupported(line.decode(errors="replace").strip() or "connection closed")
        self.next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{self.log.stream}.{self.consumer}"
        self.buf = b""

    async def _send(self, body: bytes) -> None:
        self.writer.write(b"PUB %s %s %d\r\n%s\r\n" % (self.next_subject.encode(), self.inbox.encode(),
                                                        len(body), body))

    def _parse(self) -> int:  # noqa: C901 - the replay's frame loop, one piece: a call per frame costs the replay
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
                    if reply is None:   # a status: a heartbeat, a request dry or expired, or a failure
                        self.heard = True
                        status = lines[0][9:12].decode()
                        if status not in KEEP:
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
        last_word = time.monotonic()         # the consumer's last delivery or status (the server's PINGs aside)
        while delivered < self.end:
            try:
                data = await asyncio.wait_for(self.reader.read(1 << 20), timeout=SILENCE)
            except asyncio.TimeoutError:
                data = None
            if data == b"":
                raise LogUnavailable(f"the connection closed at sequence {delivered}")
            self.buf += data or b""
            before = len(self.got)
            pings = self._parse()
            if pings:
                self.writer.write(b"PONG\r\n" * pings)
            if self.failure:
                raise LogUnavailable(self.failure[0])
            if self.heard or len(self.got) > before:
                self.heard, last_word = False, time.monotonic()
            elif time.monotonic() - last_word > SILENCE:     # not even a heartbeat
                raise LogUnavailable(f"its server went silent at sequence {delivered}")
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
