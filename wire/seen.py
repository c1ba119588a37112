"""Read-your-writes on one host: the newest log sequence any answer given here has shown.

The local signer relays every command's answer, and each answer carries the log sequence the
controller had reached (a write's own event included). The signer keeps the highest beside its socket
(the target of a symbolic link); a command that reads the projection (sacct, sinfo, ``scontrol show
node``) first waits until the projection has folded that far, so a change made from this host, by
anyone, is never read as not yet made. Light: every command imports it.
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
        text = os.readlink(path_beside(socket))
    except OSError:
        return 0
    return int(text) if text.isascii() and text.isdigit() and len(text) < 20 else 0


class Mark:
    """The signer's side: the highest sequence seen, as the target of a symbolic link replaced (by rename) each
    time it grows. A link, not a file: nothing to write or sync, where a file renamed over another has its data
    flushed first (ext4), which every write's answer would wait for."""

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
            try:
                os.symlink(str(seq), part)
            except FileExistsError:   # left by a rota that died between the two steps
                os.unlink(part)
                os.symlink(str(seq), part)
            os.replace(part, self.path)
        except OSError:
            pass     # a full disk: reads go on without waiting
