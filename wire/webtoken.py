"""Login tokens for ``rota web``: who a browser is, vouched for by the controller.

``rota web login`` asks the controller (through the local signer, so the caller's uid comes from the kernel)
for a token naming that caller; the web server checks it with the same cluster-derived key and trades it
once for a session. A token is ``base64url(payload).base64url(HMAC-SHA256(key, payload))``, the payload
JSON ``{"u": user, "uid": uid, "op": operator, "exp": expiry, "n": nonce}``.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
from dataclasses import dataclass

PURPOSE = "web-login"      # the derived key's purpose (Keyring.purpose_key)
LOGIN_TTL = 600            # seconds a login token may wait to be used
MAX_TOKEN = 1024           # characters: longer is not one of ours


@dataclass(frozen=True, slots=True)
class WebUser:
    user: str
    uid: int
    operator: bool
    expires: int
    nonce: str


class TokenError(ValueError):
    """A token that is not one the controller issued, or no longer valid (the message says which)."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def issue(key: bytes, user: str, uid: int, operator: bool, now: int, ttl: int = LOGIN_TTL) -> str:
    """A token for this caller, valid ``ttl`` seconds from ``now``."""
    payload = json.dumps({"u": user, "uid": uid, "op": operator, "exp": now + ttl, "n": os.urandom(12).hex()},
                         separators=(",", ":"), sort_keys=True).encode()
    return f"{_b64(payload)}.{_b64(hmac.new(key, payload, hashlib.sha256).digest())}"


def check(key: bytes, token: str, now: int) -> WebUser:
    """The caller a token names, if the controller issued it and it has not expired (raises TokenError)."""
    if not token or len(token) > MAX_TOKEN or token.count(".") != 1:
        raise TokenError("not a rota web token: run `rota web login` for a new one")
    body, mac = token.split(".")
    try:
        payload, given = _unb64(body), _unb64(mac)
    except ValueError:
        raise TokenError("not a rota web token: run `rota web login` for a new one") from None
    if not hmac.compare_digest(given, hmac.new(key, payload, hashlib.sha256).digest()):
        raise TokenError("this token was not issued by this cluster: run `rota web login` for a new one")
    try:
        d = json.loads(payload)
        who = WebUser(str(d["u"]), int(d["uid"]), bool(d["op"]), int(d["exp"]), str(d["n"]))
    except (ValueError, KeyError, TypeError):
        raise TokenError("a malformed token: run `rota web login` for a new one") from None
    if who.expires < now:
        raise TokenError("this login token has expired: run `rota web login` for a new one")
    return who
