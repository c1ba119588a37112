"""The local signer's socket as a caller sees it: one request, one answer, whatever the caller sends."""
import asyncio
import json
import socket

import pytest

from rota.agents import signer as signer_mod
from rota.agents.signer import Signer
from rota.wire import localsock
from rota.wire.keys import Keyring
from rota.wire.subjects import reply_prefix


@pytest.fixture
async def signer(tmp_path):
    """A signer whose controller (in its process) echoes what it was asked, with the request id's prefix."""
    asked: list[tuple[str, bytes]] = []

    async def local(subject: str, headers: dict, payload: bytes) -> bytes:
        asked.append((subject, payload))
        rid = headers[signer_mod.RID_HEADER]
        return reply_prefix(rid) + b'"ok":true,"n":%d}' % len(payload)

    s = Signer(str(tmp_path / "run" / "rota.sock"), "gpu01", Keyring(cluster_key=b"k" * 64), None)
    s.local = local
    await s.start()
    s.asked = asked      # type: ignore[attr-defined]
    yield s
    await s.stop()


async def _exchange(path: str, data: bytes, close_after: bool = True) -> bytes:
    reader, writer = await asyncio.open_unix_connection(path)
    writer.write(data)
    await writer.drain()
    if close_after:
        writer.write_eof()
    answer = await asyncio.wait_for(reader.read(), 15)
    writer.close()
    return answer


async def test_a_request_in_pieces_is_answered_once_whole(signer):
    payload = json.dumps({"x": "y" * 200_000}).encode()
    data = localsock.request_header("ping", "r1", len(payload)) + payload
    reader, writer = await asyncio.open_unix_connection(signer.path)
    for i in range(0, len(data), 7_001):
        writer.write(data[i:i + 7_001])
        await writer.drain()
        await asyncio.sleep(0)
    answer = await asyncio.wait_for(reader.read(), 15)
    writer.close()
    head, _, body = answer.partition(b"\n")
    assert head == b"OK %d" % len(body)
    assert json.loads(body) == {"rid": "r1", "ok": True, "n": len(payload)}
    assert signer.asked == [("rota.api.ping", payload)]


@pytest.mark.parametrize("data, words", [
    (b"HELLO there\n", b"not a rota request"),
    (b"ROTA1 ping r1 99999999999999\n", b"bad length"),
    (b"ROTA1 ping r1 10\nshort", b"the request ended early"),
    (b"ROTA1 ping r1 10", b"the request ended early"),
    (b"R" * (localsock.MAX_HEADER + 10), b"first line is too long"),
])
async def test_what_is_not_a_whole_request_gets_one_error_line_and_reaches_no_controller(signer, data, words):
    answer = await _exchange(signer.path, data)
    head, _, message = answer.partition(b"\n")
    assert head == b"ERR %d" % len(message)
    assert message.startswith(b"bad request to the local rota signer: ") and words in message, message
    assert signer.asked == []


async def test_a_caller_that_sends_nothing_is_let_go_after_the_read_timeout(signer, monkeypatch):
    monkeypatch.setattr(signer_mod, "READ_TIMEOUT", 0.3)
    answer = await _exchange(signer.path, b"ROTA1 ping r1 10\n", close_after=False)
    assert answer.endswith(b"bad request to the local rota signer: no whole request within 0.3 s")
    assert signer._inflight == {0: 0} and signer.asked == []


async def test_a_caller_that_never_reads_its_answer_does_not_hold_the_signer(signer, monkeypatch):
    """An answer larger than the socket holds, to a caller that never reads it, is given up after
    WRITE_TIMEOUT: its connection is closed and the next caller is answered meanwhile."""
    monkeypatch.setattr(signer_mod, "WRITE_TIMEOUT", 0.5)

    async def big(subject: str, headers: dict, payload: bytes) -> bytes:
        return reply_prefix(headers[signer_mod.RID_HEADER]) + b'"ok":true,"pad":"' + b"x" * (8 << 20) + b'"}'
    signer.local = big
    idle = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    idle.connect(signer.path)
    idle.sendall(localsock.request_header("ping", "r1", 2) + b"{}")
    small = await _exchange(signer.path, localsock.request_header("ping", "r2", 2) + b"{}")
    assert small.startswith(b"OK ")
    for _ in range(100):
        if not signer._serving:
            break
        await asyncio.sleep(0.05)
    assert not signer._serving
    idle.close()
