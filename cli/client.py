"""Finding the running cluster and sending it one request (used by every command)."""
from __future__ import annotations

import json
import os


class NoCluster(Exception):
    """No running rota could be found or reached."""


def cluster_url(explicit: str | None = None) -> str:
    """``--nats``, else ``ROTA_NATS_URL``, else the state directory of a running ``rota up``."""
    if explicit:
        return explicit
    env = os.environ.get("ROTA_NATS_URL")
    if env:
        return env
    from .paths import state_dir

    info = os.path.join(state_dir(), "cluster.json")
    try:
        with open(info) as fh:
            data = json.loads(fh.read())
    except (OSError, ValueError):
        raise NoCluster(f"no running rota found (no {info}); start one with `rota up`, "
                        "or point at one with --nats URL or ROTA_NATS_URL") from None
    return data["nats"]


def _loads(data: bytes):
    try:
        import orjson
    except ImportError:   # pragma: no cover - orjson is a dependency; stay correct without it
        return json.loads(data)
    return orjson.loads(data)


def request(verb: str, body: dict, url: str | None = None, timeout: float = 10.0, retries: int = 3) -> dict:
    """Send one API request (retried on timeout with the same request id) and return the reply."""
    from . import lightnats

    body = dict(body)
    body.setdefault("rid", os.urandom(16).hex())
    target = cluster_url(url)
    payload = json.dumps(body).encode()
    for attempt in range(retries):
        try:
            return _loads(lightnats.request(target, f"rota.api.{verb}", payload, timeout))
        except lightnats.NoResponders:
            raise NoCluster(f"no rota controller answers at {target}; is `rota up` running?") from None
        except lightnats.RequestTimeout:
            if attempt == retries - 1:
                raise NoCluster(f"rota at {target} did not answer within {timeout:.0f} s") from None
        except (ConnectionError, OSError) as exc:
            raise NoCluster(f"cannot reach rota at {target}: {exc}; is `rota up` running?") from None
    raise AssertionError("unreachable")
