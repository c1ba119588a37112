"""The audit of the log with public keys alone: the stored records' hash chain recomputed, the controllers'
signatures of its head and of each snapshot checked, and a digest kept outside the cluster compared
(:mod:`rota.core.chain`). Nothing here needs the cluster's secret key."""
from __future__ import annotations

import json
import base64
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Iterable, Iterator

from rota.core import chain as ch
from rota.wire.audit import AUDIT_SNAPSHOT, CHAIN_HEADER, SIG_HEADER, key_id, signed

from .records import chain_link, stored_chain


@dataclass
class Audit:
    """Walks the log's stored records in order, recomputing the chain; what it finds wrong, by sequence.

    ``keys``: the public keys trusted to sign (hex); empty: any key a signed record names is taken, and what is
    checked is that the records were not changed after they were signed (a digest kept outside the cluster then
    says whose key it was)."""

    keys: frozenset[str] = frozenset()
    seq: int = 0
    chain: bytes = ch.GENESIS
    chained_from: int = 0                   # the first record that carries its hash (older rotas wrote none)
    signed_at: int = 0                      # the last sequence a valid signature covers
    heads: dict[int, bytes] = field(default_factory=dict)   # sequence -> hash, where a snapshot or digest asks
    wanted: set[int] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)
    signers: set[str] = field(default_factory=set)
    last_seal: ch.Digest | None = None      # the last signed head that verified
    unsigned_snapshots: int = 0             # snapshots from before the log was signed (not checked)
    _broken: int = -1                       # the problem that names the first signature that does not match
    _also: int = 0                          # signed heads after it that no longer match either

    def _unsigned(self, seq: int) -> None:
        """A signed head that does not verify: the first is named; every later one follows from it."""
        if self._broken < 0:
            self._broken = len(self.problems)
            self.problems.append(f"the signature on record {seq} does not match: records {self.signed_at + 1}-{seq} "
                                 "were changed after they were signed")
            return
        self._also += 1
        first = self.problems[self._broken].split(" (and ")[0]
        self.problems[self._broken] = f"{first} (and the {self._also} signed heads after it no longer match)"

    def record(self, seq: int, headers: dict | None, body: bytes) -> None:
        headers = headers or {}
        if seq != self.seq + 1:
            self.problems.append(f"records {self.seq + 1}-{seq - 1} are missing: the log was cut")
        self.chain = chain_link(self.chain, seq, headers, body)
        self.seq = seq
        if seq in self.wanted:
            self.heads[seq] = self.chain
        if CHAIN_HEADER not in headers:
            if self.chained_from:
                self.problems.append(f"record {seq} carries no chain hash: it was put there by someone else")
            return
        self.chained_from = self.chained_from or seq
        stored = stored_chain(headers)
        if stored != self.chain:
            self.problems.append(f"record {seq} was changed: what it holds is not what its chain hash covers")
            self.chain = stored or self.chain     # follow on from what is stored
            return
        sig = headers.get(SIG_HEADER)
        if sig is not None:
            key, _, value = sig.partition(":")
            if self.keys and key not in self.keys:
                self.problems.append(f"record {seq} is signed by key {key_id(key)}, which is not one of the trusted keys")
            elif not signed(key, ch.head_message(seq, self.chain), value):
                self._unsigned(seq)
            else:
                self.signed_at = seq
                self.signers.add(key)
                self.last_seal = ch.Digest(seq, self.chain, key, value)


def check_snapshot(name: str, stored: bytes, head_at: dict[int, bytes], keys: Iterable[str] = ()) -> str | None:
    """What is wrong with a stored snapshot, if anything: its signed head must verify, name the log's hash at its
    sequence, and cover exactly the snapshot stored."""
    if not stored.startswith(AUDIT_SNAPSHOT):
        return f"snapshot {name} carries no signed head"
    meta_line, _, rest = stored[len(AUDIT_SNAPSHOT):].partition(b"\n")
    try:
        meta = json.loads(meta_line)
        seq, chain, key, sig = int(meta["seq"]), bytes.fromhex(meta["chain"]), str(meta["key"]), str(meta["sig"])
    except (ValueError, KeyError, TypeError):
        return f"snapshot {name}: its signed head cannot be read"
    trusted = set(keys)
    if trusted and key not in trusted:
        return f"snapshot {name} (sequence {seq}) is signed by key {key_id(key)}, which is not one of the trusted keys"
    if not signed(key, ch.snapshot_message(seq, chain, rest), sig):
        return f"snapshot {name} (the state at sequence {seq}) was changed after it was signed"
    if seq in head_at and head_at[seq] != chain:
        return f"snapshot {name} (sequence {seq}) names a log head the log does not have"
    return None


def _taken_before(stored: bytes, chained_from: int) -> bool:
    """Whether an unsigned snapshot is of a state before the log's first chained record (an older rota's)."""
    from rota.core.state import load_snapshot

    from .snapshots import unseal

    if not chained_from:
        return True
    try:
        return load_snapshot(unseal(stored, None)).seq < chained_from
    except ValueError:
        return False


def check_digest(digest: ch.Digest, audit: Audit, keys: Iterable[str] = ()) -> str | None:
    """What is wrong with the log against a digest kept outside the cluster, if anything."""
    trusted = set(keys)
    if trusted and digest.key not in trusted:
        return f"the digest is signed by key {key_id(digest.key)}, which is not one of the trusted keys"
    if not signed(digest.key, ch.head_message(digest.seq, digest.chain), digest.sig):
        return "the digest's signature does not match it: it was altered"
    if digest.seq > audit.seq:
        return f"the log ends at {audit.seq}, before the digest's sequence {digest.seq}: records were removed"
    if audit.heads.get(digest.seq) != digest.chain:
        return f"the log up to sequence {digest.seq} is not the one the digest was taken of: a record at or before it " \
               "was changed, added or removed"
    return None


def snapshot_seq(stored: bytes) -> int | None:
    """The sequence a stored snapshot's signed head names (None: it has none)."""
    if not stored.startswith(AUDIT_SNAPSHOT):
        return None
    try:
        return int(json.loads(stored[len(AUDIT_SNAPSHOT):].partition(b"\n")[0])["seq"])
    except (ValueError, KeyError, TypeError):
        return None


def run(records: Iterable[tuple[int, dict | None, bytes]], snapshots: dict[str, bytes], keys: Iterable[str] = (),
        digest: ch.Digest | None = None) -> Audit:
    """The audit of a log's stored records and snapshots: its ``problems`` (empty: none found)."""
    audit = Audit(keys=frozenset(keys))
    audit.wanted = {s for s in map(snapshot_seq, snapshots.values()) if s is not None}
    if digest is not None:
        audit.wanted.add(digest.seq)
    for seq, headers, body in records:
        audit.record(seq, headers, body)
    if audit.seq == 0:
        audit.problems.append("the log is empty")
    for name in sorted(snapshots):
        if not snapshots[name].startswith(AUDIT_SNAPSHOT) and _taken_before(snapshots[name], audit.chained_from):
            audit.unsigned_snapshots += 1       # from before this log was signed: nothing to check it against
            continue
        why = check_snapshot(name, snapshots[name], audit.heads, keys)
        if why is not None:
            audit.problems.append(why)
    if digest is not None:
        why = check_digest(digest, audit, keys)
        if why is not None:
            audit.problems.append(why)
    return audit


async def stored_records(lg: Any) -> AsyncIterator[tuple[int, dict | None, bytes]]:
    """The log's records as stored (sequence, headers, body), from the first."""
    async for chunk in lg.read_raw(1):
        for record in chunk:
            yield record


async def stored_snapshots(lg: Any) -> dict[str, bytes]:
    """Every snapshot the log's snapshot store holds, as stored, by name."""
    from .snapshots import open_store

    store = await open_store(lg.js)
    try:
        names = [o.name for o in await store.list() if not o.deleted]
    except Exception:  # noqa: BLE001 - an empty bucket raises
        names = []
    out = {}
    for name in names:
        entry = await store.get(name)
        out[name] = entry.data or b""
    return out


def export_lines(records: Iterable[tuple[int, dict | None, bytes]], snapshots: dict[str, bytes]) -> Iterator[str]:
    """The log and its snapshots as stored, as JSON lines an auditor checks without the cluster."""
    for seq, headers, body in records:
        yield json.dumps({"seq": seq, "headers": dict(headers or {}), "body": base64.b64encode(body).decode()})
    for name, data in sorted(snapshots.items()):
        yield json.dumps({"snapshot": name, "data": base64.b64encode(data).decode()})


def read_export(lines: Iterable[bytes], path: str) -> tuple[list[tuple[int, dict | None, bytes]], dict[str, bytes]]:
    """An export's records and snapshots; ValueError naming the line that is not one of them."""
    records: list[tuple[int, dict | None, bytes]] = []
    snapshots: dict[str, bytes] = {}
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            if "snapshot" in item:
                snapshots[str(item["snapshot"])] = base64.b64decode(item["data"], validate=True)
            else:
                headers = item["headers"]
                if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
                    raise ValueError("headers are not text")
                records.append((int(item["seq"]), headers, base64.b64decode(item["body"], validate=True)))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{n}: not a record or snapshot rota audit export wrote ({exc})") from None
    return records, snapshots
