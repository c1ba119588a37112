"""Finding a running cluster's NATS servers, and connecting to them as its administrator.

``rota up`` writes ``cluster.json`` (the NATS URLs, and the CA that signs the servers' certificates
when they speak TLS) into its state directory. Tools that read the log directly (``rota why``,
``export``, ``projections rebuild``) connect with the controller's role, which needs the cluster
key: only the cluster's administrator can read it. Everyone else asks the controller.
"""
from __future__ import annotations

import json
import os

from .paths import cluster_key_path, state_dir


class NoCluster(Exception):
    """No running rota could be found or reached."""


class NotAdmin(Exception):
    """Reading the log directly needs the cluster key, which this user cannot read."""


def cluster_info(state: str | None = None) -> dict:
    """What ``rota up`` recorded about the running cluster (``{"nats": urls, "tls_ca": path|None}``)."""
    path = os.path.join(state or state_dir(), "cluster.json")
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        raise NoCluster(f"no running rota found (no {path}); start one with `rota up`, "
                        "or point at one with --nats URL or ROTA_NATS_URL") from None
    if not isinstance(data, dict) or not isinstance(data.get("nats"), str):
        raise NoCluster(f"{path} is not a rota cluster description")
    return data


def nats_urls(explicit: str | None = None) -> str:
    """``--nats``, else ``ROTA_NATS_URL``, else the state directory of a running ``rota up``."""
    return explicit or os.environ.get("ROTA_NATS_URL") or cluster_info()["nats"]


def admin_connection(explicit: str | None = None) -> tuple[list[str], dict]:
    """(URLs, :meth:`JetStreamLog.connect` options) to reach the log with the controller's role."""
    from .keys import KeyFileError, load_keyring
    from .natsauth import connect_options

    state = state_dir()
    urls = nats_urls(explicit)
    key_path = cluster_key_path(state)
    keyring = None
    if os.path.exists(key_path) or not explicit:
        if os.path.exists(key_path) and not os.access(key_path, os.R_OK):
            raise NotAdmin(f"reading the log needs the cluster key {key_path}, which only the cluster's "
                           "administrator can read")
        try:
            keyring = load_keyring(key_path)
        except PermissionError:
            raise NotAdmin(f"reading the log needs the cluster key {key_path}, which only the cluster's "
                           "administrator can read") from None
        except KeyFileError as exc:
            raise NotAdmin(str(exc)) from None
    tls_ca = os.environ.get("ROTA_TLS_CA")
    if tls_ca is None and not explicit:
        try:
            tls_ca = cluster_info(state).get("tls_ca")
        except NoCluster:
            tls_ca = None
    options = connect_options(keyring, None, tls_ca)
    if keyring is not None:
        options["keyring"] = keyring   # JetStreamLog checks every record's MAC with it
    return urls.split(","), options


def may_read_log() -> bool:
    """Whether this process can read the log directly (it can read the cluster key, or it was told to)."""
    if os.environ.get("ROTA_DIRECT_LOG") == "1" or os.environ.get("ROTA_NATS_URL"):
        return True
    return os.access(cluster_key_path(state_dir()), os.R_OK)
