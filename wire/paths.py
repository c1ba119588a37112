"""Where a running rota keeps its state and its local socket (light: every command imports it).

The state directory holds the cluster key (private), the NATS store (private), the agents' ledgers
(private) and spools, and the projection (private). Its ``run/`` folder holds the local signer's
socket, which every local user may reach: the commands talk only to that socket.
"""
from __future__ import annotations

import os

SYSTEM_STATE_DIR = "/var/lib/rota"


def state_dir() -> str:
    """``$ROTA_STATE_DIR``; else root's ``/var/lib/rota``; else ``$XDG_DATA_HOME/rota`` or ``~/.local/share/rota``."""
    env = os.environ.get("ROTA_STATE_DIR")
    if env:
        return env
    if os.geteuid() == 0:
        return SYSTEM_STATE_DIR
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "rota")


def default_state_dir():  # -> pathlib.Path
    from pathlib import Path

    return Path(state_dir())


def projections_db() -> str:
    """The projection database of the local cluster (``$ROTA_PROJECTIONS`` overrides)."""
    return os.environ.get("ROTA_PROJECTIONS") or os.path.join(state_dir(), "projections.sqlite")


def socket_in(state: str) -> str:
    """The local signer's socket of the rota whose state lives in ``state``."""
    return os.path.join(state, "run", "rota.sock")


def web_info_path(state: str) -> str:
    """Where a running ``rota web`` says, once it listens, at which address and in which process."""
    return os.path.join(state, "run", "web.json")


def write_public(path: str, text: str) -> None:
    """A file every local user may read (an address: no secret in it), replaced whole."""
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def socket_path() -> str:
    """The local signer's socket a command talks to: ``$ROTA_SOCKET``; else the state directory's
    (``$ROTA_STATE_DIR``, or this user's own rota if one runs, else the system's)."""
    env = os.environ.get("ROTA_SOCKET")
    if env:
        return env
    if os.environ.get("ROTA_STATE_DIR"):
        return socket_in(os.environ["ROTA_STATE_DIR"])
    own = socket_in(state_dir())
    if os.path.exists(own):
        return own
    return socket_in(SYSTEM_STATE_DIR)


def cluster_key_path(state: str) -> str:
    return os.path.join(state, "cluster.key")


def read_text(path: str) -> str:
    """A configuration file's text; a file that is not UTF-8 is named with the byte that is not."""
    data = _read_bytes(path)
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ValueError(f"{path}:{line}: the file is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                         f"{exc.start}); save it as UTF-8") from None


MAX_INCLUDE_DEPTH = 16


def read_slurm_conf(path: str) -> tuple[str, list[tuple[str, int]]]:
    """A slurm.conf's text with its ``include FILE`` lines replaced by those files' lines (a relative path
    is read beside the file that names it; nested; a cycle is an error naming the chain), and where each
    line of the result came from: (file, line)."""
    lines: list[str] = []
    origin: list[tuple[str, int]] = []
    _inline(os.path.abspath(path), lines, origin, [])
    return "\n".join(lines) + "\n", origin


def _inline(path: str, lines: list[str], origin: list[tuple[str, int]], chain: list[str]) -> None:
    if path in chain:
        raise ValueError("include cycle: " + " -> ".join([*chain[chain.index(path):], path]))
    if len(chain) >= MAX_INCLUDE_DEPTH:
        raise ValueError(f"includes nested more than {MAX_INCLUDE_DEPTH} deep: " + " -> ".join([*chain, path]))
    for number, line in enumerate(read_text(path).splitlines(), start=1):
        word, _, rest = line.strip().partition(" ")
        if word.lower() == "include" and rest.strip() and "=" not in word:
            target = rest.split("#", 1)[0].strip()
            target = target if os.path.isabs(target) else os.path.join(os.path.dirname(path), target)
            try:
                _inline(os.path.abspath(target), lines, origin, [*chain, path])
            except OSError as exc:
                raise ValueError(f"{path}:{number}: cannot include {target}: {exc.strerror}") from None
            continue
        lines.append(line)
        origin.append((path, number))


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()
