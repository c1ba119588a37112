"""Who a browser is: a login token the controller issued (``rota web login``) traded once for a session.

The session id is random, kept only in this process and sent back in an HttpOnly, SameSite=Strict cookie;
a token is accepted once (its nonce is remembered until it expires), so a token seen in a shell history
or a proxy's log cannot open a second session.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

from rota.wire.webtoken import TokenError, WebUser, check

COOKIE = "rota_session"
SESSION_TTL = 8 * 3600        # seconds a session lasts from its login
MAX_SESSIONS = 10_000


@dataclass(frozen=True, slots=True)
class Session:
    user: WebUser
    expires: float


class Sessions:
    """The sessions this server opened, by id."""

    def __init__(self, key: bytes, clock=time.time) -> None:
        self.key = key
        self.clock = clock
        self._sessions: dict[str, Session] = {}
        self._used: dict[str, int] = {}        # login tokens' nonces already traded -> their expiry

    def login(self, token: str) -> tuple[str, WebUser]:
        """A new session for a valid, unused token: (session id, who); raises TokenError."""
        now = self.clock()
        who = check(self.key, token, int(now))
        self._forget(now)
        if who.nonce in self._used:
            raise TokenError("this login token was used already: run `rota web login` for a new one")
        self._used[who.nonce] = who.expires
        if len(self._sessions) >= MAX_SESSIONS:
            self._sessions.pop(next(iter(self._sessions)))
        sid = os.urandom(24).hex()
        self._sessions[sid] = Session(who, now + SESSION_TTL)
        return sid, who

    def user(self, sid: str | None) -> WebUser | None:
        """Who a session id belongs to (None: no such live session)."""
        s = self._sessions.get(sid or "")
        if s is None:
            return None
        if s.expires < self.clock():
            del self._sessions[sid or ""]
            return None
        return s.user

    def logout(self, sid: str | None) -> None:
        self._sessions.pop(sid or "", None)

    def _forget(self, now: float) -> None:
        self._used = {n: e for n, e in self._used.items() if e >= now}
