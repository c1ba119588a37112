"""Shared helpers for benchmarks: medians of repeated runs and one printed table."""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable


@dataclass
class Figure:
    name: str
    value: float
    unit: str
    target: str = ""
    met: bool | None = None
    command: str = ""
    note: str = ""


def median_time(fn: Callable[..., object], runs: int = 5,
                setup: Callable[[], object] | None = None) -> tuple[float, list[float]]:
    """Median wall time of ``fn`` over ``runs`` runs (``setup`` untimed before each)."""
    times = []
    for _ in range(runs):
        arg = setup() if setup else None
        t0 = time.perf_counter()
        fn(arg) if setup else fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def stop(proc: Any, timeout: float = 30) -> None:
    """Stop a `rota up` as Ctrl-C does; killed if it has not stopped within ``timeout`` s."""
    import signal
    import subprocess

    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()


def print_table(figures: list[Figure], title: str = "") -> None:
    rows = [("figure", "value", "target", "ok", "reproduce")]
    for f in figures:
        val = f"{f.value:,.3f} {f.unit}" if f.value < 100 else f"{f.value:,.0f} {f.unit}"
        ok = "" if f.met is None else ("yes" if f.met else "NO")
        rows.append((f.name, val, f.target, ok, f.command))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    if title:
        print(title)
    for i, r in enumerate(rows):
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
    for f in figures:
        if f.note:
            print(f"  note: {f.name}: {f.note}")
    sys.stdout.flush()


def write_json(figures: list[Figure], path: str | None) -> None:
    if path:
        with open(path, "w") as fh:
            json.dump([asdict(f) for f in figures], fh, indent=1)


class ApiClient:
    """A benchmark's way to the controller, as a node's signer sends requests: the controller's NATS
    role (read from the cluster key in ``state``), each request signed for ``uid`` on host ``host``."""

    def __init__(self, state: str, host: str = "bench", uid: int = 0, gid: int = 0) -> None:
        from rota.agents.signer import Signer
        from rota.wire.keys import load_keyring
        from rota.wire.natsauth import connect_options
        from rota.wire.paths import cluster_key_path

        keyring = load_keyring(cluster_key_path(state))
        self.options = connect_options(keyring, None)
        self.signer = Signer("/nonexistent", host, keyring, None)
        self.uid, self.gid = uid, gid

    async def connect(self, url: str):
        import nats

        return await nats.connect(url, **self.options)

    def headers(self, verb: str, rid: str, payload: bytes) -> dict[str, str]:
        from rota.agents.signer import CRED_HEADER, RID_HEADER

        subject = f"rota.api.{verb}"
        return {CRED_HEADER: self.signer.sign(subject, rid, payload, self.uid, self.gid), RID_HEADER: rid}

    async def request(self, nc, verb: str, body: dict, timeout: float = 30.0) -> dict:
        import uuid

        rid = uuid.uuid4().hex
        payload = json.dumps(body).encode()
        msg = await nc.request(f"rota.api.{verb}", payload, timeout=timeout, headers=self.headers(verb, rid, payload))
        return json.loads(msg.data)


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
