"""Where the web view's figures come from: the controller (asked through this host's signer, as root, so the
view itself applies each user's rights) and the projection (read-only SQLite); time travel as the CLI runs it."""
from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Callable, Sequence, TypeVar

from rota.cli.client import NoCluster, request
from rota.controller.views import timetravel_environment
from rota.projections import queries
from rota.wire.lifetime import stop_child

T = TypeVar("T")
CONFIG_TTL = 5.0          # seconds the cluster's configuration is reused between pages
WHY_TIMEOUT = 120.0       # seconds a job page waits for its time travel


class SourceError(Exception):
    """The controller or the projection could not answer (the message says what to do)."""


class Source:
    def __init__(self, state_dir: str, why_argv: Sequence[str], socket: str | None = None) -> None:
        self.state_dir = state_dir
        self.socket = socket
        self.why_argv = list(why_argv)    # how ``rota`` starts as a child (the composition root names the program)
        self.db_path = f"{state_dir}/projections.sqlite"
        self._config: tuple[float, dict] | None = None

    async def ask(self, verb: str, body: dict | None = None) -> dict:
        """The controller's answer (raises SourceError with its last error line)."""
        try:
            reply = await asyncio.to_thread(request, verb, body or {}, 15.0, self.socket)
        except NoCluster as exc:
            raise SourceError(str(exc)) from None
        if not reply.get("ok"):
            raise SourceError((reply.get("error") or ["the controller refused"])[-1])
        return reply

    async def config(self) -> dict:
        """The cluster's configuration as the log has it (reused for a few seconds)."""
        cached = self._config
        if cached is not None and time.monotonic() - cached[0] < CONFIG_TTL:
            return cached[1]
        cfg = (await self.ask("config")).get("config") or {}
        self._config = (time.monotonic(), cfg)
        return cfg

    async def db(self, read: Callable[..., T], *args: Any) -> T:
        """``read(connection, *args)`` on the projection, in a thread."""
        def run() -> T:
            try:
                conn = queries.connect(self.db_path)
            except queries.Error as exc:
                raise SourceError(f"cannot read the projection {self.db_path}: {exc}") from None
            try:
                return read(conn, *args)
            finally:
                conn.close()
        return await asyncio.to_thread(run)

    async def why(self, job_id: int) -> dict:
        """``rota why N --json`` for a job, as the CLI computes it (a child process reading the log)."""
        proc = await asyncio.create_subprocess_exec(
            *self.why_argv, "why", str(int(job_id)), "--json",
            env=timetravel_environment(self.state_dir), cwd="/", stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout=WHY_TIMEOUT)
        except asyncio.TimeoutError:
            await stop_child(proc)
            raise SourceError(f"rota why {job_id} took longer than {WHY_TIMEOUT:.0f} s") from None
        if proc.returncode != 0:
            raise SourceError(err.decode(errors="replace").strip().splitlines()[-1] if err.strip()
                              else f"rota why {job_id} failed")
        try:
            return json.loads(out)
        except ValueError:
            raise SourceError(f"rota why {job_id} did not answer JSON") from None
