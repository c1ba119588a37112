"""What the log's records carry (append time, actor and the controller's MAC in headers), the check a
reader holding the log key makes, and the records this process appended itself (the tail a follower in
the same process reads without asking the server)."""
from __future__ import annotations

from typing import Any

from rota.core import credentials
from rota.core import events as ev

TS_HEADER = "Rota-Ts"
ACTOR_HEADER = "Rota-Actor"
MAC_HEADER = "Rota-Mac"


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


class OwnTail:
    """The last records this process appended, each acknowledged by the log at the sequence its fence
    expected (so each is what the log holds there): up to ``keep`` of them, by sequence."""

    def __init__(self, keep: int = 10_000) -> None:
        self.keep = keep
        self.records: dict[int, ev.Envelope] = {}

    def remember(self, seq: int, ts: int, actor: str, idem: str, event: Any) -> None:
        self.records[seq] = ev.Envelope.trusted(seq, ts, actor, idem, event)
        if len(self.records) > self.keep:
            del self.records[next(iter(self.records))]

    def run_from(self, seq: int) -> list[ev.Envelope]:
        """The records from ``seq`` on, as long as they follow one another (empty when ``seq`` is not here)."""
        out = []
        while seq in self.records:
            out.append(self.records[seq])
            seq += 1
        return out
