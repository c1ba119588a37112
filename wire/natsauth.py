"""The broker's side of trust: NATS users and permissions per role, and how each role connects.

Roles:

- ``rota-controller``: the controller (and the projector and admin tools beside it): everything.
- ``host-<name>``: one per node or login host, used by its agent and its local signer. It may make
  API requests, publish its own node's reports (``rota.inbox.<name>``) and heartbeats
  (``rota.hb.<name>``), pull and acknowledge its own assignments (the durable consumer
  ``agent-<name>``, which the controller creates), and receive on its own inbox prefix. Nothing
  else: it cannot serve the API (so it cannot join the controller's queue group), read or write
  the event stream, read another node's assignments, or manage streams.

Passwords are derived from the keys (the controller's from the cluster key, a host's from its
host key), so a host needs only its own key file. The server configuration that lists them is
written with private modes.
"""
from __future__ import annotations

import hmac
import json

from rota.core.credentials import valid_host

from . import subjects as sj

CONTROLLER = "rota-controller"


def host_user(host: str) -> str:
    return f"host-{host}"


def inbox_prefix(host: str) -> str:
    """The reply-subject prefix of a host's connection: it may receive on nothing else."""
    return f"_INBOX_{host}"


def password(keyring, user: str) -> str:
    """The password of ``user``, derived from the key that role holds."""
    if user == CONTROLLER:
        key = keyring.purpose_key("nats:controller")
    else:
        key = keyring.key_of(user.removeprefix("host-"))
    if key is None:
        raise ValueError(f"this key cannot derive the NATS password of {user}")
    return hmac.digest(key, b"rota-nats-password\0" + user.encode(), "sha256").hex()[:48]


def host_permissions(host: str) -> dict:
    """What a host's connection may publish and subscribe to. Of the order stream: its metadata, and its own
    consumer (made only on its own subject: the server checks that the subject's filter is the consumer's),
    read, acknowledged and removed."""
    consumer, orders = sj.agent_consumer(host), sj.ORDER_STREAM
    return {
        "publish": {"allow": [f"{sj.API}.*", f"{sj.INBOX_PREFIX}.{host}", f"{sj.HEARTBEAT_PREFIX}.{host}",
                              f"$JS.API.STREAM.INFO.{orders}",
                              f"$JS.API.CONSUMER.CREATE.{orders}.{consumer}.{sj.ORDER_PREFIX}.{host}",
                              f"$JS.API.CONSUMER.DELETE.{orders}.{consumer}",
                              f"$JS.API.CONSUMER.MSG.NEXT.{orders}.{consumer}",
                              f"$JS.API.CONSUMER.INFO.{orders}.{consumer}",
                              f"$JS.ACK.{orders}.{consumer}.>"]},
        "subscribe": {"allow": [f"{inbox_prefix(host)}.>"]},
    }


def authorization_block(keyring, hosts: list[str]) -> str:
    """The ``authorization {}`` block of nats-server's configuration for these hosts."""
    users: list[dict] = [{"user": CONTROLLER, "password": password(keyring, CONTROLLER)}]
    for host in sorted(set(hosts)):
        if not valid_host(host):
            raise ValueError(f"{host!r} cannot be a NATS user: host names are letters, digits, '_' and '-'")
        users.append({"user": host_user(host), "password": password(keyring, host_user(host)),
                      "permissions": host_permissions(host)})
    return "authorization {\n  users = " + json.dumps(users, indent=2).replace("\n", "\n  ") + "\n}\n"


def connect_options(keyring, host: str | None = None, tls_ca: str | None = None) -> dict:
    """nats-py ``connect`` keyword arguments for the controller (``host`` None) or a host's role."""
    opts: dict = {}
    if keyring is not None:
        user = CONTROLLER if host is None else host_user(host)
        opts.update(user=user, password=password(keyring, user))
        if host is not None:
            opts["inbox_prefix"] = inbox_prefix(host)
    if tls_ca:
        import ssl

        opts["tls"] = ssl.create_default_context(cafile=tls_ca)
    return opts
