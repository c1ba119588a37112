"""Finding the running cluster and sending it one request (used by every command)."""
from __future__ import annotations

import os

from . import lightjson


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
            data = lightjson.loads(fh.read())
    except (OSError, ValueError):
        raise NoCluster(f"no running rota found (no {info}); start one with `rota up`, "
                        "or point at one with --nats URL or ROTA_NATS_URL") from None
    return data["nats"]


def login_name() -> str:
    """The user running the command (``getpass.getuser``'s order, without its imports)."""
    for var in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        if os.environ.get(var):
            return os.environ[var]
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def request(verb: str, body: dict, url: str | None = None, timeout: float = 10.0, retries: int = 3) -> dict:
    """Send one API request (retried on timeout with the same request id) and return the reply."""
    from . import lightnats

    body = dict(body)
    body.setdefault("rid", os.urandom(16).hex())
    target = cluster_url(url)
    payload = lightjson.dumps(body).encode()
    for attempt in range(retries):
        try:
            return lightjson.loads(lightnats.request(target, f"rota.api.{verb}", payload, timeout))
        except lightnats.NoResponders:
            raise NoCluster(f"no rota controller answers at {target}; is `rota up` running?") from None
        except lightnats.RequestTimeout:
            if attempt == retries - 1:
                raise NoCluster(f"rota at {target} did not answer within {timeout:.0f} s") from None
        except (ConnectionError, OSError) as exc:
            raise NoCluster(f"cannot reach rota at {target}: {exc}; is `rota up` running?") from None
    raise AssertionError("unreachable")
