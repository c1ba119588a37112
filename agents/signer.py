"""The local signer: munged's role, and the only door the commands have into rota.

It listens on a Unix socket any local user may reach. For each request it asks the kernel who is
calling (``SO_PEERCRED``: uid and gid, which the caller cannot choose), signs the request with
this host's key (a credential bound to the verb, the request id and the payload, see
:mod:`rota.core.credentials`) and forwards it to the controller over its own NATS connection,
then relays the answer. The commands never hold a key, never connect to NATS and never say who
they are.
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
import time
from typing import Any, Awaitable, Callable, Sequence

from rota.core import credentials
from rota.wire import localsock
from rota.wire.seen import Mark
from rota.wire.subjects import CRED_HEADER, RID_HEADER, api_subject, reply_prefix, reply_seq

log = logging.getLogger("rota.signer")

SLOW_VERBS = {"timetravel": 900.0, "accounting": 120.0}   # answers that take more than a moment
READ_TIMEOUT = 10.0
WRITE_TIMEOUT = 60.0      # seconds an answer waits for its caller to read it (a command reads it whole at once)
FAILOVER_WAIT = 30.0      # a request with no controller to answer waits this long for a standby to take over
NOT_LEADER = b'"code":"not_leader"'   # in the answer of a controller that is no longer the leader
MAX_INFLIGHT_PER_UID = 64  # a uid's requests beyond are refused at once, with a line that says so
BACKLOG = 4096             # connections the kernel queues for the accept loop (capped by net.core.somaxconn)
ACCEPT_BURST = 64          # connections taken in one turn of the event loop


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket, from the kernel."""
    data = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", data)


class Signer:
    def __init__(self, path: str, host: str, keyring: Any, nc: Any, *, ttl: int = credentials.DEFAULT_TTL,
                 clock: Any = time.time, command_server: Sequence[str] = ()) -> None:
        if not credentials.valid_host(host):
            raise ValueError(f"{host!r} cannot sign credentials: host names are letters, digits, '_' and '-'")
        key = keyring.key_of(host)
        if key is None:
            raise ValueError(f"the key given is not host {host}'s")
        self.path, self.host, self.key, self.nc, self.ttl, self.clock = path, host, key, nc, ttl, clock
        self.server: socket.socket | None = None
        self._inflight: dict[int, int] = {}
        self._serving: set[asyncio.Task] = set()
        self.command_server = list(command_server)   # the program that serves the thin commands, if any
        self.commands: Any = None      # that server, running beside the socket
        self._inode = -1               # the socket file this signer made (another rota may replace it)
        # the controller in this process (``rota up``): (subject, headers, payload) -> its answer, or None
        # while it does not lead
        self.local: Callable[[str, dict, bytes], Awaitable[bytes | None]] | None = None
        self.seen: Mark | None = None  # the newest log sequence an answer here showed (read-your-writes)

    async def start(self) -> None:
        run_dir = os.path.dirname(self.path)
        os.makedirs(run_dir, exist_ok=True)
        os.chmod(run_dir, 0o755)
        self.seen = Mark(self.path)
        if os.path.lexists(self.path):
            os.unlink(self.path)     # a socket left by a rota that died; we own its directory
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(self.path)
        os.chmod(self.path, 0o666)   # every local user may ask; who they are comes from the kernel
        sock.listen(BACKLOG)
        sock.setblocking(False)
        self.server = sock
        asyncio.get_running_loop().add_reader(sock.fileno(), self._accept)
        self._inode = os.stat(self.path).st_ino
        if self.command_server:
            self.commands = _start_command_server(self.command_server, os.path.join(run_dir, "commands.sock"))

    async def stop(self) -> None:
        if self.commands is not None:
            self.commands.terminate()
            self.commands = None
        if self.server is not None:
            asyncio.get_running_loop().remove_reader(self.server.fileno())
            self.server.close()
            self.server = None
        for task in list(self._serving):
            task.cancel()
        try:
            if os.stat(self.path).st_ino == self._inode:
                os.unlink(self.path)
        except OSError:
            pass

    def sign(self, subject: str, rid: str, payload: bytes, uid: int, gid: int) -> str:
        """A credential for this host's caller ``uid``/``gid``, bound to subject, request id and payload."""
        return credentials.issue(self.key, "req", uid, gid, self.host, int(self.clock()), os.urandom(16).hex(),
                                 f"{subject} {rid}", payload, self.ttl)

    def _accept(self) -> None:
        """Take the callers the kernel has queued, a burst at a time (the loop's other work goes on between
        bursts): a caller whose user already has its share in flight is refused here, with one line and no
        more work than that, so a user's flood costs the others little."""
        assert self.server is not None
        for _ in range(ACCEPT_BURST):
            try:
                conn, _ = self.server.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:       # out of descriptors: leave the rest queued a moment
                log.warning("signer: cannot accept a connection: %s", exc)
                return
            try:
                _pid, uid, gid = peer_credentials(conn)
            except OSError:
                conn.close()
                continue
            if self._inflight.get(uid, 0) >= MAX_INFLIGHT_PER_UID:
                try:
                    conn.send(_error(f"uid {uid} has {MAX_INFLIGHT_PER_UID} requests in flight through this host's "
                                     "signer, the most one user may; retry when some have ended"), socket.MSG_DONTWAIT)
                except OSError:
                    pass
                conn.close()
                continue
            self._inflight[uid] = self._inflight.get(uid, 0) + 1
            task = asyncio.ensure_future(self._serve(conn, uid, gid))
            self._serving.add(task)
            task.add_done_callback(self._serving.discard)

    async def _serve(self, conn: socket.socket, uid: int, gid: int) -> None:
        """Read one request from ``conn``, answer it, close it (the socket's own calls: no stream objects)."""
        loop = asyncio.get_running_loop()
        try:
            try:
                conn.setblocking(False)
                verb, rid, payload = await _read_request(loop, conn)
                reply = await self.forward(verb, rid, payload, uid, gid)
            finally:
                self._inflight[uid] -= 1
            if self.seen is not None:
                self.seen.saw(reply_seq(rid, reply))
            answer = b"OK %d\n" % len(reply) + reply
        except TimeoutError:
            answer = _error(f"bad request to the local rota signer: no whole request within {READ_TIMEOUT:g} s")
        except (EOFError, ValueError) as exc:
            answer = _error(f"bad request to the local rota signer: {exc}")
        except localsock.SignerError as exc:
            answer = _error(str(exc))
        except Exception as exc:  # one reply per request, whatever happened
            log.exception("signer: request from uid %s failed", uid)
            answer = _error(f"the local rota signer failed: {type(exc).__name__}")
        try:
            async with asyncio.timeout(WRITE_TIMEOUT):
                await loop.sock_sendall(conn, answer)
        except (OSError, TimeoutError):
            pass      # the caller left, or does not read its answer
        finally:
            conn.close()

    async def forward(self, verb: str, rid: str, payload: bytes, uid: int, gid: int) -> bytes:
        """Sign and send one request; retried (a fresh credential, the same request id) on timeouts."""
        from nats.errors import MaxPayloadError, NoRespondersError, TimeoutError as NatsTimeout

        if verb == "step_create":
            payload = vouch_for_io(payload, uid)
        subject = api_subject(verb)
        timeout = SLOW_VERBS.get(verb, 10.0)
        # a quick first try: a controller that froze (SIGSTOP) may still hold a place among those answering
        timeouts = (timeout, timeout, timeout) if verb in SLOW_VERBS else (3.0, 3.0, 5.0, 10.0, 10.0)
        leaderless_until = time.monotonic() + FAILOVER_WAIT
        if self.local is not None:
            answer = await self._ask_local(subject, rid, payload, uid, gid, timeouts[0])
            if answer is not None:
                return answer
        attempt = 0
        while attempt < len(timeouts):
            headers = self._headers(subject, rid, payload, uid, gid)
            try:
                msg = await self.nc.request(subject, payload, timeout=timeouts[attempt], headers=headers)
            except NoRespondersError:
                if time.monotonic() < leaderless_until:    # between a leader's death and a standby's takeover
                    await asyncio.sleep(0.25)
                    continue
                raise localsock.SignerError("no rota controller answers; is `rota up` running?") from None
            except MaxPayloadError:
                raise localsock.SignerError(f"the request is {len(payload):,} bytes, more than the cluster's messages "
                                            "carry (a script is at most 4 MiB, its environment 1 MiB)") from None
            except (NatsTimeout, asyncio.TimeoutError):
                attempt += 1
                continue
            if not msg.data.startswith(reply_prefix(rid)):
                log.error("signer: dropped a reply that does not answer request %s", rid)
                attempt += 1
                continue
            if NOT_LEADER in msg.data and time.monotonic() < leaderless_until:
                await asyncio.sleep(0.25)   # a deposed controller answered (and wrote nothing): ask the new one
                continue
            return msg.data
        raise localsock.SignerError(f"the rota controller did not answer within {sum(timeouts):.0f} s")

    def _headers(self, subject: str, rid: str, payload: bytes, uid: int, gid: int) -> dict[str, str]:
        """A request's headers: a fresh credential for it, and its request id."""
        return {CRED_HEADER: self.sign(subject, rid, payload, uid, gid), RID_HEADER: rid}

    async def _ask_local(self, subject: str, rid: str, payload: bytes, uid: int, gid: int,
                         timeout: float) -> bytes | None:
        """The answer of the controller in this process, signed and checked as through NATS; None when it
        does not lead or does not answer in time (then NATS carries the request, with the same id)."""
        assert self.local is not None
        asking = asyncio.ensure_future(self.local(subject, self._headers(subject, rid, payload, uid, gid), payload))
        done, _ = await asyncio.wait((asking,), timeout=timeout)
        if not done:
            return None      # it goes on; a retry with the same request id gets its answer once written
        answer = asking.result()
        if answer is None or not answer.startswith(reply_prefix(rid)) or NOT_LEADER in answer:
            return None
        return answer


async def _read_request(loop: asyncio.AbstractEventLoop, conn: socket.socket) -> tuple[str, str, bytes]:
    """(verb, request id, payload) of the request on ``conn``; each of its two parts within ``READ_TIMEOUT``.
    EOFError when the caller left before sending it all, ValueError when it is not a request."""
    async with asyncio.timeout(READ_TIMEOUT):
        data = b""
        while b"\n" not in data:
            if len(data) > localsock.MAX_HEADER:
                raise ValueError("the request's first line is too long")
            chunk = await loop.sock_recv(conn, 65536)
            if not chunk:
                raise EOFError("the request ended early")
            data += chunk
    line, _, rest = data.partition(b"\n")
    verb, rid, size = localsock.parse_request_header(line)
    parts, have = [rest], len(rest)
    async with asyncio.timeout(READ_TIMEOUT):
        while have < size:
            chunk = await loop.sock_recv(conn, min(size - have, 1 << 20))
            if not chunk:
                raise EOFError("the request ended early")
            parts.append(chunk)
            have += len(chunk)
    return verb, rid, (b"".join(parts) if len(parts) > 1 else rest)[:size]


def vouch_for_io(payload: bytes, uid: int) -> bytes:
    """A step's request with its ``io`` (where the step's nodes connect, as root) checked here, on the caller's
    host: a TCP port that ``uid`` itself listens on, named by the address it is bound to. An agent then never
    connects to an address the caller merely names (another host, another user's srun, a service)."""
    import json

    try:
        body = json.loads(payload)
        io = body.get("io") if isinstance(body, dict) else None
    except ValueError:
        return payload            # the controller says what is wrong with it
    if not io or not isinstance(io, str):
        return payload
    host, _, port_text = io.rpartition(":")
    port = int(port_text) if port_text.isdecimal() else -1
    bound = [addr for addr, p, owner in _listeners() if p == port and owner == uid]
    if not bound:
        raise localsock.SignerError(f"the step's I/O address {io} is not a port uid {uid} listens on at this host")
    addr = bound[0]
    if addr == "0.0.0.0":          # every interface: the address given (no name: no lookup here) must be this host's
        if not _ipv4(host) or not _local(host):
            raise localsock.SignerError(f"the step's I/O address {io} is not an IPv4 address of this host")
        addr = host
    body["io"] = f"{addr}:{port}"
    return json.dumps(body, separators=(",", ":")).encode()


def _listeners() -> list[tuple[str, int, int]]:
    """(address, port, owner's uid) of each IPv4 TCP socket listening on this host (``/proc/net/tcp``)."""
    out = []
    try:
        with open("/proc/net/tcp") as fh:
            next(fh, None)
            for line in fh:
                f = line.split()
                if len(f) > 7 and f[3] == "0A":          # LISTEN
                    ip, port = f[1].split(":")
                    out.append((socket.inet_ntoa(bytes.fromhex(ip)[::-1]), int(port, 16), int(f[7])))
    except (OSError, ValueError):
        pass
    return out


def _ipv4(text: str) -> bool:
    try:
        return socket.inet_ntoa(socket.inet_aton(text)) == text
    except OSError:
        return False


def _local(host: str) -> bool:
    """Whether ``host`` is an address of this host (a socket can be bound to it)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((host, 0))
        return True
    except OSError:
        return False
    finally:
        s.close()


def _error(message: str) -> bytes:
    data = message.encode()
    return b"ERR %d\n" % len(data) + data


def _start_command_server(argv: list[str], path: str) -> Any:
    """The thin commands' server (``argv``, a program of its own, named by the composition root) on ``path``,
    beside this signer; it dies with this process. Isolated (``-I``) and in ``/``: nothing of the directory ``rota up``
    was started in, nor of its ``PYTHON*`` variables, is on the path of a process that runs as root."""
    import subprocess
    import sys

    from rota.wire.lifetime import die_with

    return subprocess.Popen([*argv, path], cwd="/",
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, preexec_fn=die_with(os.getpid()) if sys.platform == "linux" else None)
