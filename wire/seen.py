"""Read-your-writes on one host: the newest log sequence any answer given here has shown.

The local signer relays every command's answer, and each answer carries the log sequence the
controller had reached (a write's own event included). The signer keeps the highest in a file beside
its socket; a command that reads the projection (sacct, sinfo, ``scontrol show node``) first waits until
the projection has folded that far, so a change made from this host, by anyone, is never read as not yet
made. Light: every command imports it.
"""
from __future__ import annotations

import os

NAME = "seq"


def path_beside(socket: str) -> str:
    """The file that holds the newest sequence shown by the signer listening at ``socket``."""
    return os.path.join(os.path.dirname(socket), NAME)


def newest(socket: str | None = None) -> int:
    """The newest sequence an answer on this host has shown (0 when none has, or no signer runs)."""
    if socket is None:
        from .paths import socket_path

        socket = socket_path()
    try:
        with open(path_beside(socket), "rb") as fh:
            text = fh.read(24)
    except OSError:
        return 0
    return int(text) if text.strip().isdigit() else 0


class Mark:
    """The signer's side: the highest sequence seen, written (whole, by rename) each time it grows."""

    __slots__ = ("path", "value")

    def __init__(self, socket: str) -> None:
        self.path = path_beside(socket)
        self.value = newest(socket)

    def saw(self, seq: int | None) -> None:
        if seq is None or seq <= self.value:
            return
        self.value = seq
        part = self.path + ".new"
        try:
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
            try:
                os.fchmod(fd, 0o644)     # every local user's reads wait for it (rota up runs under umask 077)
                os.write(fd, b"%d\n" % seq)
            finally:
                os.close(fd)
            os.replace(part, self.path)
        except OSError:
            pass     # a full disk: reads go on without waiting
