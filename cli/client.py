"""Sending one request to the cluster (used by every command): through this host's local signer.

The signer (``rota up``, ``rota agent`` or ``rota authd`` runs it) learns who is asking from the
kernel and signs the request; this side sends only what the command asked for.
"""
from __future__ import annotations

import os

from rota.wire import localsock
from rota.wire.paths import socket_path
from rota.wire.subjects import unpack_reply

from . import lightjson


class NoCluster(Exception):
    """No running rota could be found or reached."""


class AllocationError(Exception):
    """An allocation (``srun``, ``salloc``) that could not be had (the message is the error line)."""


def request(verb: str, body: dict, timeout: float = 45.0, path: str | None = None) -> dict:
    """Send one API request (through the signer at ``path``, else this host's) and return the controller's
    reply (a retry carries the same request id)."""
    rid = os.urandom(16).hex()
    path = path or socket_path()
    payload = lightjson.dumps(body).encode()
    try:
        data = localsock.call(path, verb, rid, payload, timeout)
    except localsock.SignerUnavailable:
        raise NoCluster(f"no rota runs on this host (no local signer at {path}); start one with `rota up` "
                        "(or `rota agent` / `rota authd` on a node), or set ROTA_SOCKET") from None
    except localsock.SignerError as exc:
        raise NoCluster(str(exc)) from None
    try:
        reply = lightjson.loads(unpack_reply(rid, data))
    except ValueError:
        raise NoCluster("the controller's answer is not JSON") from None
    if not isinstance(reply, dict):
        raise NoCluster("the controller's answer is not a JSON object")
    return reply


def ask(prog: str, verb: str, body: dict) -> dict | None:
    """The controller's answer to a query; None after saying on stderr why there is none."""
    import sys

    try:
        reply = request(verb, body)
    except NoCluster as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return None
    if not reply.get("ok"):
        print(f"{prog}: error: {(reply.get('error') or ['unknown error'])[-1]}", file=sys.stderr)
        return None
    return reply


def remote_command(command: str, argv: list[str], out, err, verb: str = "accounting",
                   timeout: float = 150.0, prog: str | None = None) -> int:
    """Run ``sacct``/``sinfo`` (or time travel) by the controller, for a caller who cannot read the
    projection (or the log) here: its output, as the caller."""
    prog = prog or command
    try:
        reply = request(verb, {"command": command, "argv": list(argv)}, timeout=timeout)
    except NoCluster as exc:
        err.write(f"{prog}: error: {exc}\n")
        return 1
    if not reply.get("ok"):
        err.write(f"{prog}: error: {'; '.join(reply.get('error') or ['unknown error'])}\n")
        return 1
    out.write(reply.get("out", ""))
    err.write(reply.get("err", ""))
    return int(reply.get("code", 1))
