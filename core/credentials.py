"""Credentials like munge's, and MACs over the log (pure: time, nonces and keys come from the caller).

A credential says: the process with this uid/gid on this host asked for exactly this message,
at this time. It is an HMAC-SHA256 over (kind, uid, gid, host, issued-at, ttl, nonce) and the
SHA-256 digest of the subject and payload it travels with, keyed with the issuing host's key.

HMAC rather than Ed25519: the standard library has it (no native dependency on any node), it costs
about a microsecond, and munge's model is a shared symmetric key anyway. Every host's key is
derived from the cluster key (``host_key``), so a node holds only its own key: a node that is
broken into can vouch for callers on itself, never for another host. The controller, which holds
the cluster key, derives every host's key to verify.

Refusals use munge's words: ``Expired credential``, ``Rewound credential``, ``Replayed credential``,
``Invalid credential``, ``Invalid credential format``.
"""
from __future__ import annotations

import hashlib
import hmac
from collections import deque
from dataclasses import dataclass
from typing import Callable

VERSION = "rota1"
DEFAULT_TTL = 300
MAX_TTL = 3600
KINDS = ("req", "node", "ctl")   # a user's request; an agent's report or heartbeat; the controller's order

EXPIRED = "Expired credential"
REWOUND = "Rewound credential"
REPLAYED = "Replayed credential"
INVALID = "Invalid credential"
BAD_FORMAT = "Invalid credential format"

_HOST_OK = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
_HEX = frozenset("0123456789abcdef")


class CredentialError(Exception):
    """A credential that does not prove what it claims; ``words`` are munge's."""

    def __init__(self, words: str, detail: str = "") -> None:
        super().__init__(words + (f" ({detail})" if detail else ""))
        self.words = words
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Credential:
    kind: str
    uid: int
    gid: int
    host: str
    issued: int
    ttl: int
    nonce: str
    mac: str

    def head(self) -> str:
        return f"{VERSION}:{self.kind}:{self.uid}:{self.gid}:{self.host}:{self.issued}:{self.ttl}:{self.nonce}"

    def __str__(self) -> str:
        return f"{self.head()}:{self.mac}"


def valid_host(name: str) -> bool:
    """Host (and node) names usable in credentials and NATS subjects: letters, digits, ``_``, ``-``."""
    return 0 < len(name) <= 64 and _HOST_OK.issuperset(name)


def host_key(cluster_key: bytes, host: str) -> bytes:
    """The key a host signs with, derived from the cluster key."""
    return hmac.digest(cluster_key, b"rota-host-key\0" + host.encode(), "sha256")


def derived_key(cluster_key: bytes, purpose: str) -> bytes:
    """A key for one purpose (the log's MACs, NATS passwords), derived from the cluster key."""
    return hmac.digest(cluster_key, b"rota-key\0" + purpose.encode(), "sha256")


def digest(subject: str, payload: bytes) -> bytes:
    """What a credential is bound to: the subject (so a cancel cannot pass for a submit) and the body."""
    return hashlib.sha256(subject.encode() + b"\0" + payload).digest()


def _mac(key: bytes, head: str, body_digest: bytes) -> str:
    return hmac.digest(key, head.encode() + b"\n" + body_digest, "sha256").hex()


def issue(key: bytes, kind: str, uid: int, gid: int, host: str, issued: int, nonce: str,
          subject: str, payload: bytes, ttl: int = DEFAULT_TTL) -> str:
    """A credential for ``payload`` on ``subject`` (``key``: the issuing host's key)."""
    cred = Credential(kind, uid, gid, host, issued, ttl, nonce, "")
    return f"{cred.head()}:{_mac(key, cred.head(), digest(subject, payload))}"


def parse(text: str | bytes | None) -> Credential:
    """Split a credential; anything malformed is ``Invalid credential format``."""
    if isinstance(text, bytes):
        text = text.decode("ascii", "replace")
    if not text:
        raise CredentialError(BAD_FORMAT, "no credential")
    if len(text) > 512:
        raise CredentialError(BAD_FORMAT, "too long")
    parts = text.split(":")
    if len(parts) != 9 or parts[0] != VERSION:
        raise CredentialError(BAD_FORMAT, f"expected {VERSION}:kind:uid:gid:host:issued:ttl:nonce:mac")
    _v, kind, uid, gid, host, issued, ttl, nonce, mac = parts
    if kind not in KINDS or not valid_host(host) or not (8 <= len(nonce) <= 64) or len(mac) != 64:
        raise CredentialError(BAD_FORMAT)
    for n in (uid, gid, issued, ttl):
        if not n.isdecimal() or len(n) > 12:
            raise CredentialError(BAD_FORMAT)
    if not _HEX.issuperset(nonce) or not _HEX.issuperset(mac):
        raise CredentialError(BAD_FORMAT)
    return Credential(kind, int(uid), int(gid), host, int(issued), int(ttl), nonce, mac)


def check_mac(cred: Credential, key: bytes, subject: str, payload: bytes) -> None:
    """Raise ``Invalid credential`` unless ``key`` signed exactly this credential and message."""
    if not hmac.compare_digest(_mac(key, cred.head(), digest(subject, payload)), cred.mac):
        raise CredentialError(INVALID)


def check_time(cred: Credential, now: int, max_ttl: int = MAX_TTL) -> None:
    """munge's window: decoded no earlier than issued - ttl (else rewound), no later than issued + ttl."""
    ttl = min(cred.ttl, max_ttl)
    if now < cred.issued - ttl:
        raise CredentialError(REWOUND, "check for out of sync clocks")
    if now > cred.issued + ttl:
        raise CredentialError(EXPIRED)


class ReplayCache:
    """Nonces seen while their credentials live: a second decode is ``Replayed credential``."""

    def __init__(self) -> None:
        self._expiry: dict[str, int] = {}
        self._order: deque[tuple[int, str]] = deque()

    def __len__(self) -> int:
        return len(self._expiry)

    def insert(self, cred: Credential, now: int) -> None:
        """Remember ``cred`` until it expires; raise ``Replayed credential`` if it was seen."""
        self._prune(now)
        key = f"{cred.host}:{cred.nonce}"
        if key in self._expiry:
            raise CredentialError(REPLAYED)
        until = cred.issued + min(cred.ttl, MAX_TTL)
        self._expiry[key] = until
        self._order.append((until, key))

    def forget(self, cred: Credential) -> None:
        """Unmark a credential whose message was not acted on (munge's ``replay_remove``)."""
        self._expiry.pop(f"{cred.host}:{cred.nonce}", None)

    def _prune(self, now: int) -> None:
        order, expiry = self._order, self._expiry
        while order and order[0][0] < now:
            until, key = order.popleft()
            if expiry.get(key) == until:
                del expiry[key]


def verify(key_of: Callable[[str], bytes | None], text: str | bytes | None, subject: str, payload: bytes,
           now: int, *, kind: str, replay: ReplayCache | None = None, max_ttl: int = MAX_TTL) -> Credential:
    """Parse and check a credential of ``kind`` completely; returns it or raises :class:`CredentialError`.

    ``key_of(host)`` gives the key the credential's host signs with (None: a host this verifier
    does not know, which makes the credential invalid).
    """
    cred = parse(text)
    if cred.kind != kind:
        raise CredentialError(INVALID, f"a {cred.kind} credential where a {kind} one is needed")
    key = key_of(cred.host)
    if key is None:
        raise CredentialError(INVALID, f"unknown host {cred.host}")
    check_mac(cred, key, subject, payload)
    check_time(cred, now, max_ttl)
    if replay is not None:
        replay.insert(cred, now)
    return cred


def log_mac(key: bytes, seq: int, ts: int, actor: str, idem: str, body: bytes) -> str:
    """The MAC the controller stores with each event it appends (position, stamp and body)."""
    head = f"{seq}:{ts}:{len(actor)}:{actor}:{len(idem)}:{idem}:".encode()
    return hmac.digest(key, head + body, "sha256")[:16].hex()


def check_log_mac(key: bytes, mac: str | None, seq: int, ts: int, actor: str, idem: str, body: bytes) -> bool:
    return mac is not None and hmac.compare_digest(log_mac(key, seq, ts, actor, idem, body), mac)
