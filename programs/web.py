"""``rota web``: the web view's process (rota.web), on loopback unless told otherwise, and only behind TLS then."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
from pathlib import Path

class WebSetupError(Exception):
    """A setting the web view cannot run with (the message says which and how to fix it)."""


def web_settings(listen: str, tls_cert: str | None, tls_key: str | None, metrics_token_file: str | None
                 ) -> tuple[ssl.SSLContext | None, str | None]:
    """The TLS context (needed to listen beyond loopback) and the metrics token, checked."""
    from rota.web.app import is_loopback

    if not is_loopback(listen) and not (tls_cert and tls_key):
        raise WebSetupError(f"rota web: --listen {listen} is not loopback: give --tls-cert and --tls-key (sign-in "
                            "cookies and tokens never cross a network in the clear)")
    context = None
    if tls_cert and tls_key:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(tls_cert, tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise WebSetupError(f"rota web: cannot load {tls_cert} / {tls_key}: {exc}") from None
    token = None
    if metrics_token_file:
        try:
            token = Path(metrics_token_file).read_text().strip()
        except OSError as exc:
            raise WebSetupError(f"rota web: cannot read --metrics-token-file {metrics_token_file}: {exc}") from None
        if len(token) < 16:
            raise WebSetupError("rota web: the metrics token must be at least 16 characters")
    return context, token


async def serve(state_dir: str, listen: str, port: int, context: ssl.SSLContext | None, token: str | None,
                echo=print, ready: asyncio.Event | None = None, stop: asyncio.Event | None = None) -> None:
    """Serve until SIGINT/SIGTERM (or ``stop``)."""
    from aiohttp import web

    from rota.web.app import WebApp, is_loopback
    from rota.web.auth import Sessions
    from rota.web.source import Source
    from rota.wire.keys import load_keyring
    from rota.wire.paths import cluster_key_path, web_info_path, write_public
    from rota.wire.webtoken import PURPOSE

    from .entry import child_argv

    key = load_keyring(cluster_key_path(state_dir)).purpose_key(PURPOSE)
    if key is None:
        raise WebSetupError(f"rota web: {cluster_key_path(state_dir)} is a host key: run it where the cluster key is")
    app = WebApp(Source(state_dir, why_argv=child_argv()), Sessions(key), loopback=is_loopback(listen),
                 secure=context is not None, metrics_token=token).build()
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, listen, port, ssl_context=context)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise WebSetupError(f"rota web: cannot listen on {listen}:{port}: {exc.strerror or exc}") from None
    where = url(listen, port, context is not None)
    info = web_info_path(state_dir)
    os.makedirs(os.path.dirname(info), exist_ok=True)
    write_public(info, json.dumps({"url": where, "pid": os.getpid()}))
    echo(f"rota web: {where} (sign in with `rota web login`)")
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
    finally:
        if (announced(state_dir) or {}).get("pid") == os.getpid():
            os.unlink(info)
        await runner.cleanup()


def url(listen: str, port: int, tls: bool) -> str:
    host = "127.0.0.1" if listen in ("127.0.0.1", "0.0.0.0", "localhost") else (f"[{listen}]" if ":" in listen else listen)
    return f"{'https' if tls else 'http'}://{host}:{port}"


def announced(state_dir: str) -> dict | None:
    """What the running web view announced (its address and process), if that process is alive."""
    from rota.wire.paths import web_info_path

    try:
        info = json.loads(Path(web_info_path(state_dir)).read_text())
        os.kill(int(info["pid"]), 0)
    except PermissionError:
        return info                   # alive, another user's (root's) process
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return info if isinstance(info.get("url"), str) else None


def login_url(state_dir: str, token: str) -> str | None:
    """Where ``rota web login`` sends the browser: the web view that announced itself once it listened (None: no
    web view runs; a token is never sent to a port nobody announced, which another local user may hold)."""
    info = announced(state_dir)
    return f"{info['url']}/login?token={token}" if info is not None else None


def main(state_dir: str | None, listen: str, port: int, tls_cert: str | None, tls_key: str | None,
         metrics_token_file: str | None, echo=print) -> int:
    from rota.wire.paths import state_dir as default_dir

    try:
        context, token = web_settings(listen, tls_cert, tls_key, metrics_token_file)
        asyncio.run(serve(state_dir or default_dir(), listen, port, context, token, echo))
    except WebSetupError as exc:
        echo(str(exc))
        return 1
    except KeyboardInterrupt:
        pass
    return 0


def environment_for(state_dir: str) -> dict[str, str]:
    """The web child's environment under ``rota up``: the state directory, nothing else of the caller's."""
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TZ", "HOME", "ROTA_LOGLEVEL")}
    return {**keep, "ROTA_STATE_DIR": state_dir}
