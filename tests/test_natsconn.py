"""Connections to NATS give up a server that stops answering, even when their writes are stuck behind it."""
import asyncio
import logging
import signal
import time

import pytest
from helpers import tls_files

from rota.controller import natsserver
from rota.wire import natsconn


async def test_a_frozen_server_is_given_up_even_with_the_connections_writes_stuck_behind_it(tmp_path):
    """SIGSTOP the server, then publish until the socket and nats-py's write queue are full: its own ping loop
    then waits behind them for good; the connection must still notice within its pings' allowance, and be
    back once the server is."""
    srv = natsserver.start(tmp_path / "nats", sync_always=False)
    gave_up = asyncio.Event()

    async def disconnected() -> None:
        gave_up.set()

    nc = await natsconn.connect(srv.url, "test", disconnected_cb=disconnected, flusher_queue_size=64)
    writers: list[asyncio.Task] = []
    try:
        await nc.flush()
        srv.process.send_signal(signal.SIGSTOP)
        frozen = time.monotonic()
        payload = b"x" * 32_768
        writers = [asyncio.create_task(nc.publish("filler", payload)) for _ in range(4000)]
        await asyncio.sleep(1)
        assert sum(1 for w in writers if not w.done()) > 0      # the writes are stuck behind the frozen server
        allowance = natsconn.PING_INTERVAL * (natsconn.MAX_OUTSTANDING_PINGS + 2) + 1
        await asyncio.wait_for(gave_up.wait(), timeout=allowance + 5)
        assert time.monotonic() - frozen <= allowance
    finally:
        srv.process.send_signal(signal.SIGCONT)
    try:
        for _ in range(100):
            if nc.is_connected:
                break
            await asyncio.sleep(0.2)
        await nc.flush(timeout=5)           # back on the server once it answers again
    finally:
        for w in writers:
            w.cancel()
        await asyncio.gather(*writers, return_exceptions=True)
        await nc.close()
        srv.stop()


def test_a_rota_process_reads_the_log_without_importing_aiohttp_and_can_still_import_it(tmp_path):
    """The `rota` program keeps nats-py from importing aiohttp (its WebSocket transport, unused), yet a
    connection works and aiohttp stays importable for `rota web`."""
    import subprocess
    import sys

    srv = natsserver.start(tmp_path / "nats", sync_always=False)
    try:
        code = ("import asyncio, sys\n"
                "import rota.programs.main\n"
                "from rota.wire import natsconn\n"
                "async def go():\n"
                "    nc = await natsconn.connect(sys.argv[1], 'test')\n"
                "    await nc.flush()\n"
                "    await nc.close()\n"
                "asyncio.run(go())\n"
                "print('aiohttp' in sys.modules)\n"
                "from aiohttp import web\n"
                "print(web.Application.__name__)\n")
        out = subprocess.run([sys.executable, "-c", code, srv.url], capture_output=True, text=True, timeout=60)
    finally:
        srv.stop()
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "Application"]


def test_a_rota_process_builds_its_models_without_looking_for_pydantic_plugins():
    """The `rota` program makes pydantic find no plugins, without reading every installed package's metadata
    (importlib.metadata): its models still validate, and an installed package's `pydantic` entry point never
    runs in it."""
    import subprocess
    import sys

    code = ("import sys\n"
            "import rota.programs.main\n"
            "from rota.core.events import Envelope\n"
            "from pydantic.plugin._loader import get_plugins\n"
            "print('importlib.metadata' in sys.modules, list(get_plugins()))\n"
            "try:\n"
            "    Envelope.model_validate({'seq': 'x'})\n"
            "except Exception as exc:\n"
            "    print(type(exc).__name__)\n")
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "[]", "ValidationError"]


async def test_a_frozen_tls_server_is_given_up_though_closing_its_connection_gently_never_ends(tmp_path):
    """Over TLS, nats-py reconnects only once it has closed the old connection gently, and a TLS close waits for
    the server's own close (asyncio gives it 30 s): a frozen server keeps the connection from moving on. It must
    still give the server up within a few pings' allowance."""
    made = tls_files(tmp_path)
    if made is None:
        pytest.skip("openssl is not installed")
    ca, cert, key = made
    srv = natsserver.start(tmp_path / "nats", sync_always=False, tls={"cert_file": cert, "key_file": key})
    gave_up = asyncio.Event()

    async def disconnected() -> None:
        gave_up.set()

    # nats-py's own pings find the server stale first (its reconnect then closes the connection gently)
    nc = await natsconn.connect(srv.url, "test", disconnected_cb=disconnected, tls_ca=ca, ping_interval=1,
                                max_outstanding_pings=1)
    try:
        await nc.flush()
        srv.process.send_signal(signal.SIGSTOP)
        frozen = time.monotonic()
        allowance = natsconn.PING_INTERVAL * (2 * natsconn.MAX_OUTSTANDING_PINGS + 2) + 2
        await asyncio.wait_for(gave_up.wait(), timeout=40)
        took = time.monotonic() - frozen
        assert took <= allowance, took
    finally:
        srv.process.send_signal(signal.SIGCONT)
        await nc.close()
        srv.stop()


async def test_a_reconnect_after_the_server_died_is_left_to_nats_py(tmp_path, caplog):
    """A killed server's connection is closed at once: while nats-py tries the servers again, the socket it closed
    is not cut again and again, nor said not to close."""
    srv = natsserver.start(tmp_path / "nats", sync_always=False)
    nc = await natsconn.connect(srv.url, "test")
    try:
        await nc.flush()
        with caplog.at_level(logging.WARNING, logger="rota.nats"):
            srv.process.kill()
            srv.process.wait()
            for _ in range(80):
                if nc.is_reconnecting:
                    break
                await asyncio.sleep(0.1)
            assert nc.is_reconnecting
            await asyncio.sleep(natsconn.PING_INTERVAL + 3 * natsconn.CLOSE_WAIT)
        assert not [r for r in caplog.records if "does not close" in r.getMessage()], caplog.text
    finally:
        await nc.close()
        srv.stop()
