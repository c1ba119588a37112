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
    send = _full_client_request if os.environ.get("ROTA_FULL_CLIENT") == "1" else lightnats.request
    for attempt in range(retries):
        try:
            return lightjson.loads(send(target, f"rota.api.{verb}", payload, timeout))
        except lightnats.NoResponders:
            raise NoCluster(f"no rota controller answers at {target}; is `rota up` running?") from None
        except lightnats.RequestTimeout:
            if attempt == retries - 1:
                raise NoCluster(f"rota at {target} did not answer within {timeout:.0f} s") from None
        except (ConnectionError, OSError) as exc:
            raise NoCluster(f"cannot reach rota at {target}: {exc}; is `rota up` running?") from None
    raise AssertionError("unreachable")


def remote_command(command: str, argv: list[str], out, err) -> int:
    """Run ``sacct``/``sinfo`` by the controller, over its projection (for a machine that has none)."""
    try:
        reply = request("accounting", {"command": command, "argv": list(argv), "uid": os.geteuid()})
    except NoCluster as exc:
        err.write(f"{command}: error: {exc}\n")
        return 1
    if not reply.get("ok"):
        err.write(f"{command}: error: {'; '.join(reply.get('error') or ['unknown error'])}\n")
        return 1
    out.write(reply.get("out", ""))
    err.write(reply.get("err", ""))
    return int(reply.get("code", 1))


def _full_client_request(urls: str, subject: str, payload: bytes, timeout: float) -> bytes:
    """The same request through nats-py (``ROTA_FULL_CLIENT=1``): TLS, credentials files, NKEYs."""
    import asyncio

    import nats
    from nats.errors import NoRespondersError, TimeoutError as NatsTimeout

    from . import lightnats

    async def quiet(_exc: Exception) -> None:   # the failure is reported once, below
        return None

    async def go() -> bytes:
        nc = await asyncio.wait_for(
            nats.connect(urls.split(","), connect_timeout=min(timeout, 2.0), max_reconnect_attempts=0,
                         allow_reconnect=False, error_cb=quiet), timeout=min(timeout, 5.0))
        try:
            return (await nc.request(subject, payload, timeout=timeout)).data
        finally:
            await nc.close()

    try:
        return asyncio.run(go())
    except NoRespondersError:
        raise lightnats.NoResponders(subject) from None
    except NatsTimeout:
        raise lightnats.RequestTimeout(subject) from None
    except asyncio.TimeoutError:
        raise ConnectionError("no NATS server answered") from None
    except Exception as exc:  # noqa: BLE001 - nats-py raises its own connection errors
        raise ConnectionError(str(exc) or type(exc).__name__) from None
