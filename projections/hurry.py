"""A reader asks the projection to fold now, and is told when it has.

The projector folds a stream of writes in batches. A read that must see a change already shown on its host
(read-your-writes) and finds the projection behind asks it to fold at once. The projector listens on a
datagram socket beside its database (``<database>.hurry``) that every local user may write to. A reader sends
the sequence it waits for from a socket of its own that the kernel named (Linux's autobind, in the abstract
namespace); the projector answers that address with an empty datagram once it has folded that far.

Nothing on the line changes what is read. A datagram can only make the projector fold sooner, and never more
often than its hurried pace. An answer only makes the reader look at the projection again. So a forged, lost
or flooded datagram costs at most the batching it skips. Only autobound addresses are answered: a process
running as root sends nothing to a path a user names. Light: the commands import it.
"""
from __future__ import annotations

import heapq
import os
import socket
import stat
import time
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from asyncio import AbstractEventLoop

SUFFIX = ".hurry"
MAX_WAITING = 1024     # readers remembered for an answer; beyond, a reader finds out by looking again
FORGET = 10.0          # seconds a reader is remembered (as long as a read waits)
DRAIN = 256            # datagrams read in one turn of the projector's loop
LOOK_AGAIN = 0.05      # seconds a reader waits for an answer before it reads the projection's sequence again


def path_for(db_path: str) -> str:
    """The hurry line of the projection at ``db_path``."""
    return db_path + SUFFIX


def _autobound(addr: object) -> bool:
    """Whether ``addr`` is a name the kernel gave a socket (a NUL and five hex digits), not one a user chose."""
    return isinstance(addr, bytes) and len(addr) == 6 and addr[0] == 0 and \
        all(c in b"0123456789abcdef" for c in addr[1:])


class HurryLine:
    """The projector's side: ``on_hurry`` is called when a reader asks; :meth:`answer` tells those waiting for a
    sequence folded by now. With ``folded`` (the sequence the database holds), a reader asking for no more than
    that is told at once. Each datagram costs a heap step at most, however many readers wait."""

    def __init__(self, path: str, on_hurry: Callable[[], None], folded: Callable[[], int] | None = None) -> None:
        self.path = path
        self.on_hurry = on_hurry
        self.folded = folded
        self.waiting: dict[bytes, tuple[int, float]] = {}     # reader -> (sequence it waits for, since)
        self._highest: list[tuple[int, bytes]] = []            # (-sequence, reader), stale ones dropped when seen
        self.sock: socket.socket | None = None
        self._inode = 0

    def open(self, loop: AbstractEventLoop) -> bool:
        """Listen (False where the socket cannot be made: readers then only look again from time to time)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            try:
                if stat.S_ISSOCK(os.lstat(self.path).st_mode):
                    os.unlink(self.path)      # left by a projector that died
            except FileNotFoundError:
                pass
            sock.bind(self.path)
            os.chmod(self.path, 0o666)
            sock.setblocking(False)
            self._inode = os.stat(self.path).st_ino
        except OSError:
            sock.close()
            return False
        self.sock = sock
        loop.add_reader(sock.fileno(), self._read)
        return True

    def _read(self) -> None:
        assert self.sock is not None
        asked = False
        for _ in range(DRAIN):
            try:
                data, addr = self.sock.recvfrom(32)
            except OSError:       # nothing more queued
                break
            asked = True
            if not _autobound(addr):
                continue
            self._remember(addr, int(data) if data.isdigit() and len(data) < 20 else 0)
        if asked:
            self.on_hurry()

    def _remember(self, addr: bytes, seq: int) -> None:
        """Keep ``addr`` waiting for ``seq``. When full, the reader waiting for the highest sequence makes way for
        one waiting for less: a real reader waits for one the log holds, which the next batch folds."""
        old = self.waiting.get(addr)
        if old is not None:
            seq = max(seq, old[0])
        if self.folded is not None and seq <= self.folded():
            self.waiting.pop(addr, None)
            self._tell(addr)
            return
        if old is None and len(self.waiting) >= MAX_WAITING:
            top = self._top()
            if top is None or top[0] <= seq:
                return
            heapq.heappop(self._highest)
            del self.waiting[top[1]]
        self.waiting[addr] = (seq, time.monotonic())
        heapq.heappush(self._highest, (-seq, addr))
        if len(self._highest) > 2 * MAX_WAITING:        # mostly stale: rebuilt from those waiting
            self._highest = [(-s, a) for a, (s, _since) in self.waiting.items()]
            heapq.heapify(self._highest)

    def _top(self) -> tuple[int, bytes] | None:
        """(sequence, reader) of the reader waiting for the highest sequence, the heap's stale entries dropped."""
        heap = self._highest
        while heap and self.waiting.get(heap[0][1], (None, 0.0))[0] != -heap[0][0]:
            heapq.heappop(heap)
        return (-heap[0][0], heap[0][1]) if heap else None

    def _tell(self, addr: bytes) -> None:
        assert self.sock is not None
        try:
            self.sock.sendto(b"", socket.MSG_DONTWAIT, addr)
        except OSError:
            pass       # gone, or its queue full: it looks again by itself

    def answer(self, folded: int) -> None:
        """Tell every reader waiting for ``folded`` or less that the projection holds it; forget those that have
        waited longer than a read does."""
        if not self.waiting or self.sock is None:
            return
        old = time.monotonic() - FORGET
        for addr, (seq, since) in list(self.waiting.items()):
            if seq <= folded:
                del self.waiting[addr]
                self._tell(addr)
            elif since < old:
                del self.waiting[addr]

    def close(self, loop: AbstractEventLoop) -> None:
        if self.sock is None:
            return
        loop.remove_reader(self.sock.fileno())
        self.sock.close()
        self.sock = None
        try:
            if os.stat(self.path).st_ino == self._inode:
                os.unlink(self.path)
        except OSError:
            pass


def ask(path: str, seq: int) -> socket.socket | None:
    """A reader's request that the projection at the hurry line ``path`` fold up to ``seq``: the socket its answer
    comes to, or None where there is no one to ask (then the reader only looks again from time to time)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.bind(b"")                   # autobind: a name of the kernel's, for the answer
        sock.sendto(b"%d" % seq, socket.MSG_DONTWAIT, path)
    except OSError:
        sock.close()
        return None
    return sock


def await_answer(sock: socket.socket, timeout: float) -> None:
    """Wait up to ``timeout`` seconds for the projector's answer (or anything: the caller looks again)."""
    sock.settimeout(timeout)
    try:
        sock.recv(16)
    except OSError:
        pass
