"""The controller's signing key for the log's hash chain (Ed25519: verifying needs only the public half), and
how signatures travel with records and snapshots (:mod:`rota.core.chain`; the audit itself is
:mod:`rota.controller.audit`)."""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from rota.core import chain as ch

CHAIN_HEADER = "Rota-Chain"       # the record's hash, hex
SIG_HEADER = "Rota-Sig"           # on the last record a controller appended in one go: its signature of the head
AUDIT_SNAPSHOT = b"ROTAAUDIT1\n"  # a snapshot's signed head, before the snapshot as stored


def key_id(public_hex: str) -> str:
    return hashlib.sha256(bytes.fromhex(public_hex)).hexdigest()[:16]


class AuditKey:
    """A controller's private signing key (a file of its own, mode 0600, made on first use)."""

    def __init__(self, private: Any) -> None:
        from cryptography.hazmat.primitives import serialization

        self._key = private
        raw = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.public = raw.hex()

    @classmethod
    def load_or_create(cls, path: str) -> "AuditKey":
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        try:
            with open(path, "rb") as fh:
                st = os.fstat(fh.fileno())
                if st.st_uid != os.geteuid() or st.st_mode & 0o077:
                    raise ValueError(f"{path} must belong to this user and be private to it (chmod 600 {path})")
                raw = fh.read()
            if len(raw) != 32:
                raise ValueError(f"{path} is not an audit key (32 bytes): make a new one by removing it")
            return cls(Ed25519PrivateKey.from_private_bytes(raw))
        except FileNotFoundError:
            pass
        from cryptography.hazmat.primitives import serialization

        key = Ed25519PrivateKey.generate()
        raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                serialization.NoEncryption())
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
        return cls(key)

    def sign(self, message: bytes) -> str:
        return self._key.sign(message).hex()

    def seal_head(self, seq: int, chain: bytes) -> str:
        """The ``Rota-Sig`` header of the record at ``seq`` whose hash is ``chain``."""
        return f"{self.public}:{self.sign(ch.head_message(seq, chain))}"

    def seal_snapshot(self, seq: int, chain: bytes, stored: bytes) -> bytes:
        """A snapshot as stored, with its signed head in front."""
        meta = {"seq": seq, "chain": chain.hex(), "key": self.public,
                "sig": self.sign(ch.snapshot_message(seq, chain, stored))}
        return AUDIT_SNAPSHOT + json.dumps(meta, separators=(",", ":")).encode() + b"\n" + stored


def signed(public_hex: str, message: bytes, sig_hex: str) -> bool:
    """Whether ``sig_hex`` is ``public_hex``'s signature of ``message``."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_hex)).verify(bytes.fromhex(sig_hex), message)
        return True
    except (InvalidSignature, ValueError):
        return False


def strip_snapshot(stored: bytes) -> bytes:
    """A stored snapshot without its signed head (what the rest of rota reads)."""
    if stored.startswith(AUDIT_SNAPSHOT):
        return stored[len(AUDIT_SNAPSHOT):].partition(b"\n")[2]
    return stored
