"""One NATS request/reply over a plain socket: the light path for the hot commands.

Importing nats-py (asyncio, its JetStream API) costs about ten times a bare Python start, and
``sbatch``/``squeue`` are called thousands of times by tools. This speaks just enough of the NATS
text protocol (INFO, CONNECT, SUB, PUB, MSG/HMSG, PING/PONG) for one request on loopback or a LAN.
TLS and authenticated servers need the full client (``ROTA_FULL_CLIENT=1``).
"""
from __future__ import annotations

import os

# ``_socket`` is the C module under ``socket``: importing ``socket`` pulls in selectors, enum and
# more (about 4 ms); one request needs none of it.
import _socket


class NoResponders(Exception):
    """Nobody subscribes to the subject (no controller running)."""


class RequestTimeout(Exception):
    """No reply within the timeout."""


def _address(url: str) -> tuple[str, int]:
    """``nats://host:port`` (or ``host:port``, ``user:pass@host``) -> (host, port)."""
    rest = url.split("://", 1)[-1].rsplit("@", 1)[-1].rstrip("/")
    host, _, port = rest.rpartition(":") if "]" not in rest.rsplit(":", 1)[-1] else (rest, "", "")
    if not host:
        host, port = rest, ""
    return host.strip("[]") or "127.0.0.1", int(port) if port.isdigit() else 4222


def _connect(url: str, timeout: float) -> _socket.socket:
    host, port = _address(url)
    for family in (_socket.AF_INET, _socket.AF_INET6):   # an address needs no resolver (nor its idna codec)
        try:
            _socket.inet_pton(family, host)
        except OSError:
            continue
        sock = _socket.socket(family, _socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect((host, port))
        except OSError:
            sock.close()
            raise
        return sock
    last: Exception | None = None
    for family, kind, proto, _name, addr in _socket.getaddrinfo(host, port, 0, _socket.SOCK_STREAM):
        sock = _socket.socket(family, kind, proto)
        sock.settimeout(timeout)
        try:
            sock.connect(addr)
            return sock
        except OSError as exc:
            sock.close()
            last = exc
    raise last or OSError(f"no address for {host}")


def request(urls: str, subject: str, payload: bytes, timeout: float = 10.0) -> bytes:
    """Send ``payload`` to ``subject`` and return the first reply's body."""
    last: Exception | None = None
    for url in urls.split(","):
        try:
            sock = _connect(url.strip(), min(timeout, 2.0))
        except OSError as exc:
            last = exc
            continue
        try:
            return _exchange(sock, subject, payload, timeout)
        finally:
            sock.close()
    raise ConnectionError(f"cannot connect to {urls}: {last}")


class _Reader:
    """Lines and counted bodies from a socket (what ``socket.makefile`` gives, without its imports)."""

    def __init__(self, sock: _socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _fill(self) -> None:
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("the NATS server closed the connection")
        self.buf += chunk

    def readline(self) -> bytes:
        while (end := self.buf.find(b"\n")) < 0:
            self._fill()
        line, self.buf = self.buf[:end + 1], self.buf[end + 1:]
        return line

    def read(self, size: int) -> bytes:
        if len(self.buf) < size:
            parts, have = [self.buf], len(self.buf)
            while have < size:
                chunk = self.sock.recv(max(1 << 20, size - have))
                if not chunk:
                    raise ConnectionError("the NATS server closed the connection")
                parts.append(chunk)
                have += len(chunk)
            self.buf = b"".join(parts)
        data, self.buf = self.buf[:size], self.buf[size:]
        return data


def _exchange(sock: _socket.socket, subject: str, payload: bytes, timeout: float) -> bytes:
    sock.settimeout(timeout)
    reader = _Reader(sock)
    info = reader.readline()
    if not info.startswith(b"INFO"):
        raise ConnectionError(f"not a NATS server: {info[:40]!r}")
    if b'"tls_required":true' in info.replace(b" ", b""):
        raise ConnectionError("the server requires TLS: set ROTA_FULL_CLIENT=1")
    inbox = f"_INBOX.{os.urandom(8).hex()}"
    sock.sendall(b'CONNECT {"verbose":false,"pedantic":false,"headers":true,"no_responders":true,'
                 b'"lang":"python","version":"rota-light","protocol":1}\r\n'
                 + f"SUB {inbox} 1\r\nUNSUB 1 1\r\nPUB {subject} {inbox} {len(payload)}\r\n".encode()
                 + payload + b"\r\nPING\r\n")
    try:
        while True:
            line = reader.readline()
            if line.startswith(b"MSG "):
                size = int(line.split()[-1])
                return reader.read(size + 2)[:size]
            if line.startswith(b"HMSG "):
                fields = line.split()
                hdr_len, total = int(fields[-2]), int(fields[-1])
                data = reader.read(total + 2)[:total]
                status = data[:hdr_len].split(b"\r\n", 1)[0]
                if status.startswith(b"NATS/1.0 503"):
                    raise NoResponders(subject)
                return data[hdr_len:]
            if line.startswith(b"PING"):
                sock.sendall(b"PONG\r\n")
            elif line.startswith(b"-ERR"):
                raise ConnectionError(line.decode(errors="replace").strip())
    except TimeoutError:
        raise RequestTimeout(subject) from None
