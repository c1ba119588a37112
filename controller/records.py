"""What the log's records carry (append time, actor and the controller's MAC in headers; the event's
JSON as the body), how they are encoded and decoded, the check a reader holding the log key makes, and
the records this process appended itself (the tail a follower in the same process reads without asking
the server)."""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Callable

from rota.core import chain, credentials
from rota.core import events as ev
from rota.wire.audit import CHAIN_HEADER, SIG_HEADER

log = logging.getLogger("rota.eventlog")

TS_HEADER = "Rota-Ts"
ACTOR_HEADER = "Rota-Actor"
MAC_HEADER = "Rota-Mac"


def record_headers(mac_key: bytes | None, seq: int, ts: int, actor: str, idem: str, body: bytes,
                   chain: bytes | None = None, seal: str | None = None) -> dict[str, str]:
    """The headers an event is stored with: its MAC when the writer holds the log key, its hash in the log's
    chain when the writer knows the one before, and the signature of that head when it seals a group."""
    headers = {TS_HEADER: str(ts), ACTOR_HEADER: actor}
    if idem:
        headers["Nats-Msg-Id"] = idem
    if mac_key is not None:
        headers[MAC_HEADER] = credentials.log_mac(mac_key, seq, ts, actor, idem, body)
    if chain is not None:
        headers[CHAIN_HEADER] = chain.hex()
        if seal is not None:
            headers[SIG_HEADER] = seal
    return headers


def chain_link(prev: bytes, seq: int, headers: dict | None, body: bytes) -> bytes:
    """A stored record's hash in the log's chain (:func:`rota.core.chain.link` over what its headers and body
    hold; a stamp that is not a number hashes as -1)."""
    h = headers or {}
    try:
        ts = int(h.get(TS_HEADER, 0))
    except ValueError:
        ts = -1
    return chain.link(prev, seq, ts, h.get(ACTOR_HEADER, ""), h.get("Nats-Msg-Id", ""), body)


def stored_chain(headers: dict | None) -> bytes | None:
    """The chain hash a stored record carries (None: none, or not one)."""
    text = (headers or {}).get(CHAIN_HEADER)
    try:
        return bytes.fromhex(text) if text is not None and len(text) == 64 else None
    except ValueError:
        return None


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


class OwnTail:
    """The last records this process appended, each acknowledged by the log at the sequence its fence
    expected (so each is what the log holds there): up to ``keep`` of them, by sequence."""

    def __init__(self, keep: int = 10_000) -> None:
        self.keep = keep
        self.records: dict[int, ev.Envelope] = {}
        self._coming: dict[int, asyncio.Future[None]] = {}   # sequence -> answered when the append sent there is
        self.on_landed: Callable[[], None] | None = None     # told of every group landed (wakes a follower here)

    def coming(self, first: int, count: int = 1) -> Callable[[], None]:
        """Note a fenced append on its way to sequences ``first`` on; call what this returns once it is answered
        (landed, refused or of unknown outcome)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        seqs = range(first, first + count)
        for seq in seqs:
            self._coming[seq] = fut

        def answered() -> None:
            for seq in seqs:
                if self._coming.get(seq) is fut:
                    del self._coming[seq]
            if not fut.done():
                fut.set_result(None)
        return answered

    async def run_once_answered(self, seq: int) -> list[ev.Envelope]:
        """:meth:`run_from`, after waiting for the answer to an append of this process on its way to ``seq``:
        a follower woken by the record itself reads it here, not from the server."""
        fut = self._coming.get(seq)
        if fut is not None and seq not in self.records:
            await asyncio.wait((fut,))
        return self.run_from(seq)

    def remember(self, first: int, records: list[tuple[Any, str, str, int]]) -> None:
        """``records`` (event, actor, idem, ts) landed from ``first`` on."""
        for seq, (event, actor, idem, ts) in enumerate(records, first):
            self.records[seq] = ev.Envelope.trusted(seq, ts, actor, idem, event)
        while len(self.records) > self.keep:
            del self.records[next(iter(self.records))]
        if self.on_landed is not None:
            self.on_landed()

    def run_from(self, seq: int) -> list[ev.Envelope]:
        """The records from ``seq`` on, as long as they follow one another (empty when ``seq`` is not here)."""
        out = []
        while seq in self.records:
            out.append(self.records[seq])
            seq += 1
        return out


def encode_body(event: Any) -> bytes:
    """The stored message body: the event's type and version, then only the fields whose values differ
    from their defaults (decoding puts the defaults back: a field's default never changes within one
    version, see :mod:`rota.core.events`). Append time and actor travel in headers."""
    rest = ev.EVENT_ADAPTER.dump_json(event, exclude_defaults=True, exclude=_TYPE_AND_VERSION)
    head = b'{"type":"%b","v":%d' % (event.type.encode(), event.v)
    return head + b"}" if rest == b"{}" else head + b"," + rest[1:]


_TYPE_AND_VERSION = {"type", "v"}


def decode_event_bytes(body: bytes) -> Any:
    """Validate a stored event: the fast path for current versions, upcasting for older ones."""
    try:
        return ev.EVENT_ADAPTER.validate_json(body)
    except ValueError:
        return ev.decode_event(json.loads(body))   # an older version: upcast, then validate


def decode_bodies(bodies: list[bytes]) -> list[Any] | None:
    """Many stored events validated in one call (the replay's hot path); None when any of them is not
    a current event (the caller then decodes each on its own, upcasting or setting aside)."""
    try:
        return ev.EVENT_LIST_ADAPTER.validate_json(b"[" + b",".join(bodies) + b"]")
    except ValueError:
        return None


def _first_problem(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors(include_url=False)[0]
        where = ".".join(str(p) for p in first.get("loc", ())[1:]) or "the record"
        return f"{where}: {first.get('msg', 'invalid')}"
    return (str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)


def _head(seq: int, headers: dict | None, body: bytes, check: RecordCheck | None) -> tuple[int, str, str, str | None]:
    """A stored record's append time, actor and idempotency id from its headers, and why it is not the
    controller's (None: it is, or no key is set)."""
    h = headers or {}
    raw_ts = h.get(TS_HEADER, "0")
    ts = int(raw_ts) if raw_ts.isdecimal() and len(raw_ts) < 16 else 0
    actor, idem = h.get(ACTOR_HEADER, "system"), h.get("Nats-Msg-Id", "")
    why = check.problem(seq, ts, actor, idem, body, h.get(MAC_HEADER)) if check is not None else None
    return ts, actor, idem, why


def _event_or_why(body: bytes) -> tuple[Any, str | None]:
    try:
        return decode_event_bytes(body), None
    except Exception as exc:  # noqa: BLE001 - any malformed record: set aside, never stop a replay
        return None, f"not an event this rota knows ({_first_problem(exc)})"


def _set_aside(seq: int, why: str, set_aside: list | None) -> None:
    log.error("log record %d set aside: %s", seq, why)
    if set_aside is not None:
        set_aside.append((seq, why))


def decode_messages(chunk: list[tuple[int, dict | None, bytes]], check: RecordCheck | None = None,
                    set_aside: list | None = None) -> list[ev.Envelope]:
    """Stored records as envelopes, the events of all those whose headers pass validated in one call (each
    on its own only when that fails). A record that is malformed, unknown or not the controller's becomes
    an envelope without an event (``event`` None): it keeps its place and changes nothing."""
    heads = [_head(seq, headers, body, check) for seq, headers, body in chunk]
    passed = [body for (_seq, _h, body), head in zip(chunk, heads) if head[3] is None]
    together = decode_bodies(passed)
    decoded = iter([(e, None) for e in together] if together is not None else [_event_or_why(b) for b in passed])
    out = []
    for (seq, _h, _body), (ts, actor, idem, why) in zip(chunk, heads):
        event = None
        if why is None:
            event, why = next(decoded)
        if why is not None:
            _set_aside(seq, why, set_aside)
        out.append(ev.Envelope.trusted(seq, ts, actor, idem, event))
    return out
