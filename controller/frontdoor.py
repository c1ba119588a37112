"""The controller's front door: authenticate, resolve rights once, validate, dispatch, answer once.

Every API request arrives on ``rota.api.<verb>`` with a credential issued by the caller's local
signer. Here, in this order and nowhere else:

1. the credential is checked (key, binding to subject, request id and payload, lifetime, replay);
2. the caller's name comes from its uid (``pwd``) and its rights from the configuration;
3. the body is validated by the verb's request model (:mod:`rota.controller.requests`);
4. the verb's handler runs; the core commands check the caller's rights against what it touches,
   and a refusal is appended to the log as ``request.denied``;
5. exactly one reply goes back, carrying the request id it answers (its first key, ``rid``, so the
   signer can check it without decoding the rest).
"""
from __future__ import annotations

import logging
import pwd
from typing import TYPE_CHECKING

from pydantic import ValidationError

from rota.core import commands
from rota.core import credentials as creds
from rota.core.auth import Caller, caller as make_caller
from rota.wire.keys import Keyring
from rota.wire.subjects import CRED_HEADER, RID_HEADER, pack_reply

from . import requests as rq
from .eventlog import FencedError, LogUnavailable
from .port import ControllerPort
from .ratelimit import SubmitRate
from .recent import Recent
from .verbs import VERBS
from .replies import Raw, encode_reply, too_large

if TYPE_CHECKING:
    from nats.aio.msg import Msg

log = logging.getLogger("rota.controller.api")

class FrontDoor:
    def __init__(self, controller: ControllerPort, keyring: Keyring | None = None) -> None:
        self.c = controller
        self.keyring = keyring
        self.replay = creds.ReplayCache()
        self._results: Recent[tuple[int, str], dict] = Recent(100_000)   # (uid, request id) -> the answer a retry gets
        self._names: dict[int, str | None] = {}
        self.refused = 0
        self.rate = SubmitRate()
        self.answering = 0        # requests being answered in the event loop now (the reason lane gives way to them)
        self.reading = 0          # those that only read (a cycle off the loop gives way to them)

    # ------------------------------------------------------------ identity

    def user_name(self, uid: int) -> str | None:
        """The name ``uid`` has on this host (what the log and the views call the caller)."""
        if uid not in self._names:
            if len(self._names) > 65536:
                self._names.clear()
            try:
                self._names[uid] = pwd.getpwuid(uid).pw_name
            except KeyError:
                self._names[uid] = None
        return self._names[uid]

    def authenticate(self, subject: str, rid: str, credential: str | None, payload: bytes) -> Caller:
        """The caller a request's credential proves, with its rights; raises CredentialError."""
        if self.keyring is None:
            raise creds.CredentialError(creds.INVALID, "this controller has no cluster key")
        cfg = self.c.state.config
        ttl = cfg.auth.cred_ttl if cfg is not None else creds.DEFAULT_TTL
        cred = creds.verify(self.keyring.key_of, credential, f"{subject} {rid}", payload, int(self.c.clock()),
                            kind="req", replay=self.replay, max_ttl=ttl)
        name = self.user_name(cred.uid)
        if name is None:
            raise commands.Rejected("Invalid user id", code="permission")
        return make_caller(cfg.auth if cfg is not None else None, cred.uid, cred.gid, name, cred.host)

    # ------------------------------------------------------------ NATS

    async def on_message(self, msg: Msg) -> None:
        """Answer one ``rota.api.<verb>`` message: one reply, always, carrying its request id."""
        if not msg.reply:
            return      # a publish, not a request: nobody to answer
        rid, data = await self.answer(msg.subject, msg.headers or {}, msg.data or b"")
        from nats.errors import MaxPayloadError
        try:
            try:
                await self.c.nc_reply(msg.reply, data)
            except MaxPayloadError:    # even compressed: say so rather than leave the caller waiting
                await self.c.nc_reply(msg.reply, too_large(rid, len(data)))
        except Exception as exc:  # noqa: BLE001 - the caller is gone or the connection closed
            log.warning("could not answer request %s: %s", rid[:64], exc)

    async def answer(self, subject: str, headers: dict, payload: bytes) -> tuple[str, bytes]:
        """The request id and the reply to one signed request (from NATS, or from this process's signer)."""
        rid = headers.get(RID_HEADER, "")
        verb_name = subject.rsplit(".", 1)[-1]
        try:
            if not rid or len(rid) > 64 or not _RID_CHARS.issuperset(rid):
                rid = ""
                raise commands.Rejected("bad request: no request id (letters, digits, '_' and '-')",
                                        code="bad_request")
            caller = self.authenticate(subject, rid, headers.get(CRED_HEADER), payload)
            result = await self.dispatch(verb_name, payload or b"{}", caller, rid)
        except creds.CredentialError as exc:
            self.refused += 1
            log.warning("refused %s (request %s): %s%s", subject, rid[:64], exc.words,
                        f"; {exc.detail}" if exc.detail else "")
            result = {"ok": False, "error": [f"Protocol authentication error: {exc.words}"
                                              + (f" ({exc.detail})" if exc.words == creds.REWOUND else "")],
                      "code": "auth"}
        except commands.Rejected as r:
            result = {"ok": False, "error": list(r.lines), "code": r.code}
        except Exception as exc:  # one reply per request, whatever happened
            log.exception("request %s on %s failed", rid[:64], subject)
            result = {"ok": False, "error": [f"internal error: {type(exc).__name__}"], "code": "internal"}
        return rid, pack_reply(rid, encode_reply(result, rid, self.c.state.seq if rid else None))

    # ------------------------------------------------------------ dispatch

    async def dispatch(self, verb_name: str, body: bytes, caller: Caller, rid: str = "") -> dict | Raw:
        """Validate ``body`` for ``verb_name`` and run its handler as ``caller``; errors become answers."""
        spec = VERBS.get(verb_name)
        if spec is None:
            return {"ok": False, "error": [f"unknown request {verb_name[:40]!r}"], "code": "unknown"}
        key = (caller.uid, rid)
        if rid and spec.writes and key in self._results:
            return self._results[key]
        request = None
        self.answering += (here := not spec.elsewhere)
        self.reading += (reads := here and not spec.writes)
        try:
            request = spec.model.model_validate_json(body)
            self.c.check_space(spec.writes)
            if verb_name in SUBMITS and self.c.state.config is not None:
                self.rate.take(self.c.state.config.rate_limit, caller, len(getattr(request, "specs", ())) or 1,
                               float(self.c.clock()))
            result = await spec.handler(self.c, caller, request, rid)
        except ValidationError as exc:
            result = {"ok": False, "error": [f"bad request: {rq.first_problem(exc)}"], "code": "bad_request"}
        except ValueError as exc:   # orjson and friends on a body that is not JSON
            result = {"ok": False, "error": [f"bad request: {str(exc).splitlines()[0] if str(exc) else 'invalid'}"],
                      "code": "bad_request"}
        except commands.Rejected as r:
            result = {"ok": False, "error": list(r.lines), "code": r.code}
            if r.code == "permission":
                await self._record_denial(verb_name, caller, request, r)
        except FencedError:
            result = {"ok": False, "error": ["controller is not the leader"], "code": "not_leader"}
        except LogUnavailable as exc:
            result = {"ok": False, "error": [f"event log unavailable ({exc}); retry"], "code": "unavailable"}
        finally:
            self.answering -= here
            self.reading -= reads
        if rid and spec.writes and isinstance(result, dict) and result.get("ok"):
            self._results[key] = result
        return result

    async def _record_denial(self, verb_name: str, caller: Caller, request: rq.Request | None,
                             r: commands.Rejected) -> None:
        job_id, node = getattr(request, "job_id", None), getattr(request, "node", None)
        target = f"job {job_id}" if job_id is not None else f"node {node}" if node is not None else ""
        try:
            await self.c.append(commands.denied(caller, verb_name, target, r.lines[-1]), caller.actor())
        except Exception as exc:  # noqa: BLE001 - the refusal stands even if the log cannot take the record
            log.warning("refused %s by %s (%s) not recorded: %s", verb_name, caller.actor(), target, exc)


SUBMITS = frozenset({"submit", "submit_many"})
_RID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
