"""The log as a hash chain: each record's hash covers the one before it, so changing, inserting or removing any
record changes every hash after it. The controller signs the chain's head as it appends (a public-key signature:
checking it needs only the public half), and an auditor keeps a digest, a signed head, outside the cluster.

Pure: hashing and the text of what is signed; the keys and signatures themselves are the shell's
(:mod:`rota.wire.audit`).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

GENESIS = bytes(32)          # the hash "before" the first record
DIGEST_PREFIX = "rota-digest1"


def link(prev: bytes, seq: int, ts: int, actor: str, idem: str, body: bytes) -> bytes:
    """The hash of record ``seq``: what it holds (its sequence, append time, actor, idempotency id and body, each
    length-prefixed) on top of the hash before it."""
    a, i = actor.encode(), idem.encode()
    h = hashlib.sha256(prev)
    h.update(b"%d %d %d %d %d\n" % (seq, ts, len(a), len(i), len(body)))
    h.update(a)
    h.update(i)
    h.update(body)
    return h.digest()


def head_message(seq: int, chain: bytes) -> bytes:
    """What the controller signs for the log's head at ``seq``."""
    return b"rota-chain-head %d " % seq + chain.hex().encode()


def snapshot_message(seq: int, chain: bytes, data: bytes) -> bytes:
    """What the controller signs for a snapshot of the state at ``seq``: the log's head there and the snapshot's hash."""
    return b"rota-snapshot %d " % seq + chain.hex().encode() + b" " + hashlib.sha256(data).hexdigest().encode()


@dataclass(frozen=True)
class Digest:
    """A signed head of the log, to keep outside the cluster: the log up to ``seq`` is exactly what it was."""

    seq: int
    chain: bytes
    key: str          # the signer's public key, hex
    sig: str          # its signature of head_message(seq, chain), hex

    def text(self) -> str:
        return f"{DIGEST_PREFIX}:{self.seq}:{self.chain.hex()}:{self.key}:{self.sig}"

    @classmethod
    def parse(cls, text: str) -> "Digest":
        parts = text.strip().split(":")
        try:
            if len(parts) != 5 or parts[0] != DIGEST_PREFIX:
                raise ValueError
            digest = cls(int(parts[1]), bytes.fromhex(parts[2]), parts[3], parts[4])
            bytes.fromhex(digest.key + digest.sig)
        except ValueError:
            raise ValueError(f"not a digest rota audit digest wrote ({DIGEST_PREFIX}:SEQ:CHAIN:KEY:SIGNATURE): "
                             f"{text.strip()[:80]!r}") from None
        if digest.seq < 1 or len(digest.chain) != 32:
            raise ValueError(f"a digest with sequence {digest.seq} and a chain of {len(digest.chain)} bytes is not one")
        return digest
