"""The local socket between a command and its host's signer (the commands' only way into rota).

One request per connection::

    command -> signer:  ROTA1 <verb> <request id> <length>\\n<payload>
    signer -> command:  OK <length>\\n<reply>      or      ERR <length>\\n<message>

The signer learns who is asking from the kernel (``SO_PEERCRED``), never from the payload. This
module's client side uses only the C socket module: the hot commands import it.
"""
from __future__ import annotations

import _socket

MAGIC = b"ROTA1"
MAX_HEADER = 256
MAX_REQUEST = 12 * 1024 * 1024        # the largest submit (4 MiB script, 1 MiB environment) with room
MAX_REPLY = 256 * 1024 * 1024
VERB_CHARS = frozenset(b"abcdefghijklmnopqrstuvwxyz_")
RID_CHARS = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


class SignerUnavailable(Exception):
    """No local signer answers on the socket (rota is not running on this host)."""


class SignerError(Exception):
    """The signer answered with an error (the controller unreachable, a refused request)."""


def request_header(verb: str, rid: str, length: int) -> bytes:
    return b"%s %s %s %d\n" % (MAGIC, verb.encode(), rid.encode(), length)


def parse_request_header(line: bytes) -> tuple[str, str, int]:
    """(verb, request id, payload length) of a request line; ValueError when it is not one."""
    parts = line.rstrip(b"\n").split(b" ")
    if len(parts) != 4 or parts[0] != MAGIC:
        raise ValueError("not a rota request")
    verb, rid, size = parts[1], parts[2], parts[3]
    if not (0 < len(verb) <= 32 and set(verb) <= VERB_CHARS):
        raise ValueError("bad verb")
    if not (0 < len(rid) <= 64 and set(rid) <= RID_CHARS):
        raise ValueError("bad request id")
    if not (size.isdigit() and len(size) <= 12 and int(size) <= MAX_REQUEST):
        raise ValueError(f"bad length (at most {MAX_REQUEST} bytes)")
    return verb.decode(), rid.decode(), int(size)


def call(path: str, verb: str, rid: str, payload: bytes, timeout: float) -> bytes:
    """Send one request through the signer at ``path`` and return the controller's reply. Whatever goes wrong
    on the socket comes back as one of this module's two exceptions, with a line that says what."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        _connect(sock, path, timeout)
        try:
            sock.sendall(request_header(verb, rid, len(payload)) + payload)
        except (BrokenPipeError, ConnectionResetError):
            pass         # it answered without reading it all (a refusal): the answer is still there to read
        except TimeoutError:
            raise SignerError(f"the local rota signer took no request within {timeout:.0f} s") from None
        except OSError as exc:
            raise SignerError(f"cannot send to the local rota signer at {path}: {exc.strerror or exc}") from None
        try:
            return _read_reply(sock)
        except TimeoutError:
            raise SignerError(f"no answer from the local rota signer within {timeout:.0f} s") from None
        except (BrokenPipeError, ConnectionResetError):
            raise SignerError("the local rota signer closed the connection") from None
        except OSError as exc:
            raise SignerError(f"reading the local rota signer's answer failed: {exc.strerror or exc}") from None
    finally:
        sock.close()


def _connect(sock: _socket.socket, path: str, timeout: float) -> None:
    """Connect, waiting while the signer's queue of connections is full (a Unix socket then refuses with
    EAGAIN at once rather than wait), for at most ``timeout`` seconds."""
    import time

    deadline = time.monotonic() + timeout
    pause = 0.002
    while True:
        try:
            sock.connect(path)
            return
        except (FileNotFoundError, ConnectionRefusedError, PermissionError, NotADirectoryError) as exc:
            raise SignerUnavailable(f"{path}: {exc.strerror or exc}") from None
        except (BlockingIOError, InterruptedError, TimeoutError):
            if time.monotonic() + pause > deadline:
                raise SignerError(f"the local rota signer at {path} is too busy to take a connection (it stayed "
                                  f"so for {timeout:.0f} s); retry") from None
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
        except OSError as exc:
            raise SignerUnavailable(f"{path}: {exc.strerror or exc}") from None


def _read_reply(sock: _socket.socket) -> bytes:
    buf = b""
    while (end := buf.find(b"\n")) < 0:
        if len(buf) > MAX_HEADER:
            raise SignerError("malformed answer from the local rota signer")
        chunk = sock.recv(65536)
        if not chunk:
            raise SignerError("the local rota signer closed the connection")
        buf += chunk
    head, body = buf[:end].split(b" "), buf[end + 1:]
    if len(head) != 2 or head[0] not in (b"OK", b"ERR") or not head[1].isdigit() or int(head[1]) > MAX_REPLY:
        raise SignerError("malformed answer from the local rota signer")
    size = int(head[1])
    parts, have = [body], len(body)
    while have < size:
        chunk = sock.recv(max(65536, size - have))
        if not chunk:
            raise SignerError("the local rota signer closed the connection")
        parts.append(chunk)
        have += len(chunk)
    data = b"".join(parts)[:size]
    if head[0] == b"ERR":
        raise SignerError(data.decode(errors="replace"))
    return data
