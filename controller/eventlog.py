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

from rota.core import chain as chain_mod
from rota.core import events as ev
from rota.wire import natsconn
from rota.wire import subjects as sj

from .logbatch import ATOMIC_BATCH, AtomicRefused, allow_atomic
from .records import (  # noqa: F401 - the record's headers and codec are part of the log's interface
    ACTOR_HEADER, TS_HEADER, OwnTail, RecordCheck, chain_link, decode_messages, encode_body, record_headers,
    stored_chain,
)
from .logerrors import FencedError, LogUnavailable
from .snapshots import MemorySnapshots, ObjectStoreSnapshots, SnapshotStore
from .streamreader import PullReader, RawPullReader, RawUnsupported

__all__ = ["FencedError", "LogUnavailable", "EventLog", "MemoryLog", "JetStreamLog", "Appended"]

log = logging.getLogger("rota.eventlog")
STREAM = sj.EVENT_STREAM
SUBJECT_PREFIX = sj.EVENT_PREFIX
# seconds an append (and the stream's API) waits for the log's answer: within a lease's life, so an append whose outcome is
# unknown is read back while this controller still holds the lease, and the writer is not held for longer
APPEND_TIMEOUT = 4.0


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


class EventLog(Protocol):
    """What the controller needs of a log: fenced, idempotent appends; reads in batches; snapshots."""

    snapshots: SnapshotStore
    mac_key: bytes | None

    async def last_seq(self) -> int:
        """The sequence of the last record."""

    async def append(self, event: Any, *, actor: str, idem: str, ts: int,
                     expected_last: int | None = None, seal: bool = False) -> Appended:
        """Append ``event`` (a duplicate ``idem`` returns the first one's sequence; a log whose last
        sequence is not ``expected_last`` raises :class:`FencedError`). ``seal``: the last of a group (a log
        that signs its chain signs its head here)."""

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
                     expected_last: int | None = None, seal: bool = False) -> Appended:
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

    async def read_tail(self, from_seq: int) -> AsyncIterator[list[ev.Envelope]]:
        async for chunk in self.read_batches(from_seq):
            yield chunk

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
        self._plain_reads = True   # deliveries on a connection of our own (see RawPullReader)
        self.atomic = False        # the stream takes atomic batches (one commit, one sync, for many records)
        self.own = OwnTail()       # what this process appended (a follower here reads it without the server)
        self.mac_key = mac_key
        self.check = RecordCheck(mac_key) if mac_key is not None else None
        # a trusted snapshot signed by the controller: the log is signed from its sequence on
        self.snapshots: SnapshotStore = ObjectStoreSnapshots(js, mac_key, self.check.signed_at if self.check else None)
        self.set_aside: list[tuple[int, str]] = []   # (sequence, why) of records read and not applied
        # the log's hash chain (rota.core.chain) as this process knows it: (sequence, hash) of the last record it
        # appended; None when unknown (after a failed append): found again before the next group
        self.chain: tuple[int, bytes] | None = None
        self.audit: Any = None     # the controller's signing key (rota.wire.audit.AuditKey): it seals each group

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
        js = nc.jetstream(timeout=APPEND_TIMEOUT)
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
        opened = cls(nc, js, stream, keyring.purpose_key("log") if keyring is not None else None)
        opened.atomic = await allow_atomic(nc, stream)
        return opened

    async def last_seq(self, attempts: int = 20) -> int:
        """The stream's last sequence (retried while a cluster elects a new stream leader)."""
        for attempt in range(attempts):
            try:
                info = await self.js.stream_info(self.stream)
                return info.state.last_seq
            except Exception as exc:  # noqa: BLE001 - timeouts while servers come and go
                if attempt == attempts - 1:
                    raise LogUnavailable(f"stream info: {type(exc).__name__}: {exc}") from None
                if attempt == 3:
                    log.warning("the log's stream does not say where it ends (%s: %s): still asking",
                                type(exc).__name__, exc)
                await asyncio.sleep(0.25)
        raise AssertionError("unreachable")

    async def ready_chain(self, base: int) -> None:
        """Know the chain's hash at ``base`` (the record the next append is fenced on): from what this process
        appended last, else from that record's own chain header, else (a log begun by an older rota) by hashing
        the records from the first."""
        if self.chain is not None and self.chain[0] == base:
            return
        self.chain = None
        if base == 0:
            self.chain = (0, chain_mod.GENESIS)
            return
        try:
            head = stored_chain((await self.js.get_msg(self.stream, base)).headers)
            if head is None:
                head = chain_mod.GENESIS
                async for chunk in self.read_raw(1, base):
                    for seq, headers, body in chunk:
                        head = chain_link(head, seq, headers, body)
            self.chain = (base, head)
        except Exception as exc:  # noqa: BLE001 - unreadable now: the next appends go without a chain hash
            log.warning("the log's hash chain at %d could not be found: %s", base, exc)

    def _link(self, seq: int, ts: int, actor: str, idem: str, body: bytes, seal: bool) -> tuple[bytes | None, str | None]:
        """The chain hash of record ``seq`` (and its seal), advancing what this process knows; (None, None) when the
        hash before it is not known."""
        if self.chain is None or self.chain[0] != seq - 1:
            return None, None
        head = chain_mod.link(self.chain[1], seq, ts, actor, idem, body)
        self.chain = (seq, head)
        return head, self.audit.seal_head(seq, head) if seal and self.audit is not None else None

    async def chain_at(self, seq: int) -> bytes | None:
        """The chain's hash at ``seq`` (for a snapshot's signed head); None when it cannot be read now."""
        if self.chain is not None and self.chain[0] == seq:
            return self.chain[1]
        try:
            return stored_chain((await self.js.get_msg(self.stream, seq)).headers)
        except Exception:  # noqa: BLE001 - not there, or not reachable now
            return None

    async def append(self, event: Any, *, actor: str, idem: str, ts: int,
                     expected_last: int | None = None, seal: bool = False) -> Appended:
        from nats.js.errors import APIError

        body = encode_body(event)
        key = self.mac_key if expected_last is not None else None   # the position is known only when fenced
        head, sealed = self._link(expected_last + 1, ts, actor, idem or "", body, seal) if expected_last is not None \
            else (None, None)
        headers = record_headers(key, (expected_last or 0) + 1, ts, actor, idem, body, head, sealed)
        if expected_last is not None:
            headers["Nats-Expected-Last-Sequence"] = str(expected_last)
        answered = self.own.coming(expected_last + 1) if expected_last is not None else (lambda: None)
        try:
            ack = await self.js.publish(subject_for(event), body, stream=self.stream, headers=headers)
            if expected_last is not None and not ack.duplicate and ack.seq == expected_last + 1:
                self._landed(ack.seq, [(event, actor, idem, ts)])
        except APIError as exc:
            self.chain = None
            if getattr(exc, "err_code", None) == 10071:   # wrong last sequence
                raise FencedError(expected_last or 0) from None
            raise LogUnavailable(str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - timeouts, no responders, reconnects: the outcome is unknown
            self.chain = None
            raise LogUnavailable(f"{type(exc).__name__}: {exc}") from None
        finally:
            answered()
        if ack.duplicate:
            self.chain = None
        return Appended(ack.seq, bool(ack.duplicate))

    async def append_batch(self, records: list[tuple[Any, str, str, int]], expected_last: int) -> list[Appended]:
        """Append ``records`` (event, actor, idem, ts) at ``expected_last + 1`` on, as atomic batches of at most
        ``ATOMIC_BATCH``: each lands whole or not at all, fenced by its first record's expected last sequence, and
        costs the server one write and sync instead of one per record. Raises FencedError (another writer
        appended), LogUnavailable (the outcome is unknown), or AtomicRefused (nothing landed: append one by one)."""
        out: list[Appended] = []
        for start in range(0, len(records), ATOMIC_BATCH):
            chunk = records[start:start + ATOMIC_BATCH]
            answered = self.own.coming(expected_last + start + 1, len(chunk))   # however it ends
            try:
                out += await self._append_atomic(chunk, expected_last + start)
            finally:
                answered()
        return out

    async def _append_atomic(self, chunk: list[tuple[Any, str, str, int]], base: int) -> list[Appended]:
        """One atomic batch of :meth:`append_batch`, fenced at ``base``."""
        batch_id = os.urandom(12).hex()
        last = len(chunk)
        try:
            for i, (event, actor, idem, ts) in enumerate(chunk, 1):
                body = encode_body(event)
                head, sealed = self._link(base + i, ts, actor, idem or "", body, i == last)
                headers = record_headers(self.mac_key, base + i, ts, actor, idem, body, head, sealed)
                headers.update({"Nats-Batch-Id": batch_id, "Nats-Batch-Sequence": str(i)})
                if i == 1:
                    headers["Nats-Expected-Last-Sequence"] = str(base)
                if i < last:
                    await self.nc.publish(subject_for(event), body, headers=headers)
                    continue
                headers["Nats-Batch-Commit"] = "1"
                msg = await self.nc.request(subject_for(event), body, timeout=APPEND_TIMEOUT, headers=headers)
        except Exception as exc:  # noqa: BLE001 - timeouts, reconnects: the outcome is unknown
            self.chain = None
            raise LogUnavailable(f"{type(exc).__name__}: {exc}") from None
        try:
            ack = json.loads(msg.data)
        except ValueError:
            raise LogUnavailable("the log's answer to a batch is not JSON") from None
        error = ack.get("error") if isinstance(ack, dict) else None
        if error is not None or ack.get("count") != last:
            self.chain = None
        if error is not None:
            if error.get("err_code") == 10071:   # wrong last sequence
                raise FencedError(base)
            raise AtomicRefused(str(error.get("description", error)))
        if ack.get("count") != last or not isinstance(ack.get("seq"), int):
            raise LogUnavailable(f"the log's answer to a batch of {last} is {msg.data[:200]!r}")
        first = ack["seq"] - last + 1
        if first == base + 1:
            self._landed(first, chunk)
        return [Appended(first + i, False) for i in range(last)]

    def _landed(self, first: int, records: list[tuple[Any, str, str, int]]) -> None:
        """``records`` (event, actor, idem, ts) were acknowledged from ``first`` on, where their fence
        expected them: a follower in this process may read them from here, and the log is signed from there."""
        self.own.remember(first, records)
        if self.check is not None:
            self.check.signed_at(first)

    async def read_tail(self, from_seq: int) -> AsyncIterator[list[ev.Envelope]]:
        """For a reader that follows the log in this process (the projection): the records this process
        appended itself when they continue from ``from_seq`` (no trip to the server), else the log's
        records to its end. A record someone else appended after those comes with the next call."""
        mine = await self.own.run_once_answered(from_seq)
        if mine:
            yield mine
            return
        async for chunk in self.read_batches(from_seq):
            yield chunk

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
            yield decode_messages(chunk, check, aside)

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
            reader = (RawPullReader if self._plain_reads else PullReader)(self, delivered + 1, end, batch)
            try:
                try:
                    await reader.open()
                except (RawUnsupported, OSError, asyncio.TimeoutError) as exc:
                    log.info("reading the log through nats-py (%s)", exc)
                    self._plain_reads = False
                    await reader.close()
                    reader = PullReader(self, delivered + 1, end, batch)
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

    async def close(self) -> None:
        """Close the connection (every append was acknowledged already: nothing to drain)."""
        try:
            await asyncio.wait_for(self.nc.flush(), timeout=2)
        except Exception:  # noqa: BLE001 - closing anyway
            pass
        try:
            await self.nc.close()
        except OSError:     # the server dropped the connection first: it is closed either way
            pass
