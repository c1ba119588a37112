"""The notifier: follows the log and sends what jobs' ``--mail-type`` asks for (rota.core.notify), at least once.

It keeps its own state, checkpoint and outbox in a SQLite file beside the projection: the notices an event
makes are in the outbox before a checkpoint passes that event (a checkpoint is a pass over every job: it is
taken as often as the projection's; a restart from an older one makes the same notices again, and their keys,
kept in the outbox and once sent, drop them), and a sender
delivers the outbox through the configured transports (a webhook, an SMTP relay, a command), retrying with
backoff, deleting a notice only once every transport took it. A crash between sending and deleting sends it
again; nothing is lost. The log stays the only source of truth: the notifier never writes to it.
"""
from __future__ import annotations

import asyncio
import json
import logging
import smtplib
import subprocess
import time
import urllib.request
from email.message import EmailMessage
from pathlib import Path
from typing import Any, Callable, Protocol

from rota.core.apply import apply
from rota.core.notify import Notice, notices, time_notices
from rota.core.state import State, dump_snapshot, load_snapshot
from rota.wire.cadence import SnapshotCadence

log = logging.getLogger("rota.notify")

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value);
CREATE TABLE IF NOT EXISTS outbox (key TEXT PRIMARY KEY, body TEXT NOT NULL, tries INTEGER NOT NULL DEFAULT 0,
                                   next_try REAL NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS sent (key TEXT PRIMARY KEY, at REAL NOT NULL);
"""
MAX_BACKOFF = 300.0


class Transport(Protocol):
    name: str

    def send(self, notice: dict) -> None:
        """Deliver one notice (its JSON form); raise on failure."""


class Webhook:
    """POST each notice as JSON to a URL the administrator configured (``RotaNotifyWebhook``)."""

    name = "webhook"

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"RotaNotifyWebhook={url}: give an http:// or https:// URL")
        self.url, self.timeout = url, timeout

    def send(self, notice: dict) -> None:
        req = urllib.request.Request(self.url, data=json.dumps(notice).encode(), method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": "rota-notify"})
        with urllib.request.urlopen(req, timeout=self.timeout) as resp:
            if resp.status >= 300:
                raise OSError(f"webhook answered {resp.status}")


class Mail:
    """Mail each notice to its job's --mail-user through an SMTP relay (``RotaNotifySmtp=host[:port]``)."""

    name = "mail"

    def __init__(self, relay: str, sender: str, timeout: float = 10.0) -> None:
        host, _, port = relay.partition(":")
        self.host, self.port, self.sender, self.timeout = host, int(port or 25), sender, timeout

    def send(self, notice: dict) -> None:
        to = notice["to"] if "@" in notice["to"] else f"{notice['to']}@localhost"
        msg = EmailMessage()
        msg["From"], msg["To"], msg["Subject"] = self.sender, to, notice["subject"]
        msg.set_content(json.dumps(notice["fields"], indent=1, sort_keys=True) + "\n")
        with smtplib.SMTP(self.host, self.port, timeout=self.timeout) as smtp:
            smtp.send_message(msg)


class Command:
    """Run the administrator's program for each notice (``RotaNotifyCommand``), the notice as JSON on its standard
    input; never through a shell, so nothing a user typed is run."""

    name = "command"

    def __init__(self, program: str, timeout: float = 30.0) -> None:
        self.program, self.timeout = program, timeout

    def send(self, notice: dict) -> None:
        done = subprocess.run([self.program], input=json.dumps(notice).encode(), capture_output=True,
                              timeout=self.timeout, check=False)
        if done.returncode:
            raise OSError(f"{self.program} exited {done.returncode}: {done.stderr.decode(errors='replace')[:200]}")


def transports(settings: dict[str, str]) -> list[Transport]:
    """The transports rota's own configuration keys name (none: the notifier does not run)."""
    out: list[Transport] = []
    if settings.get("notify_webhook"):
        out.append(Webhook(settings["notify_webhook"]))
    if settings.get("notify_smtp"):
        out.append(Mail(settings["notify_smtp"], settings.get("notify_from") or "rota@localhost"))
    if settings.get("notify_command"):
        out.append(Command(settings["notify_command"]))
    return out


def _body(n: Notice) -> str:
    return json.dumps({"key": n.key, "job_id": n.job_id, "kind": n.kind, "to": n.to, "subject": n.subject,
                       "fields": n.fields}, sort_keys=True)


class Notifier:
    """Follows ``eventlog`` into the outbox of ``db_path`` and sends it through ``sinks``."""

    def __init__(self, db_path: str | Path, eventlog: Any, sinks: list[Transport],
                 clock: Callable[[], float] = time.time, snapshot_every: int = 20_000) -> None:
        self.path, self.log, self.sinks, self.clock = Path(db_path), eventlog, sinks, clock
        self.state = State()
        self.cadence = SnapshotCadence(snapshot_every)
        self.db: Any = None

    async def open(self) -> None:
        import aiosqlite

        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = await aiosqlite.connect(self.path)
        await self.db.executescript(SCHEMA)
        row = await (await self.db.execute("SELECT value FROM meta WHERE key = 'state'")).fetchone()
        if row is not None:
            try:
                self.state = load_snapshot(row[0])
            except ValueError as exc:    # an older rota's checkpoint: fold again (sent notices are not sent twice)
                log.warning("notifier checkpoint not readable (%s): folding the log from its start", exc)
            self.cadence.taken(self.state)

    async def close(self) -> None:
        if self.db is not None:
            if self.cadence.seq != self.state.seq:
                try:
                    await self._queue([], checkpoint=True)   # a restart need not fold again what this one did
                except Exception as exc:  # noqa: BLE001 - the older checkpoint still holds
                    log.warning("notifier checkpoint not written at stop: %s", exc)
            await self.db.close()
            self.db = None

    async def catch_up(self) -> int:
        """Fold what the log holds past the checkpoint, each batch's notices into the outbox with it."""
        n = 0
        async for chunk in self.log.read_tail(self.state.seq + 1):
            made: list[Notice] = []
            for env in chunk:
                if env.seq <= self.state.seq:
                    continue
                apply(self.state, env)
                made.extend(notices(self.state, env))
                n += 1
            await self._queue(made, checkpoint=self.cadence.due(self.state))
        return n

    async def _queue(self, made: list[Notice], checkpoint: bool = False) -> None:
        db = self.db
        for notice in made:
            await db.execute("INSERT OR IGNORE INTO outbox (key, body) SELECT ?, ? WHERE NOT EXISTS "
                             "(SELECT 1 FROM sent WHERE key = ?)", (notice.key, _body(notice), notice.key))
        if checkpoint:
            await db.execute("INSERT OR REPLACE INTO meta VALUES ('state', ?)", (dump_snapshot(self.state),))
            self.cadence.taken(self.state)
        await db.commit()

    async def deliver(self) -> int:
        """Send what is due in the outbox; returns how many went out."""
        now = self.clock()
        rows = await (await self.db.execute("SELECT key, body, tries FROM outbox WHERE next_try <= ? ORDER BY rowid",
                                            (now,))).fetchall()
        sent = 0
        for key, body, tries in rows:
            notice = json.loads(body)
            try:
                for sink in self.sinks:
                    await asyncio.to_thread(sink.send, notice)
            except Exception as exc:  # noqa: BLE001 - a transport down: retried with backoff, never dropped
                wait = min(MAX_BACKOFF, 2.0 ** tries)
                log.warning("notice %s not delivered (%s); retrying in %.0fs", key, exc, wait)
                await self.db.execute("UPDATE outbox SET tries = ?, next_try = ? WHERE key = ?",
                                      (tries + 1, self.clock() + wait, key))
                continue
            await self.db.execute("DELETE FROM outbox WHERE key = ?", (key,))
            await self.db.execute("INSERT OR REPLACE INTO sent VALUES (?, ?)", (key, self.clock()))
            sent += 1
        await self.db.commit()
        return sent

    async def follow(self, stop: asyncio.Event, poll: float = 1.0) -> None:
        """Keep folding, queueing the time-limit notices the clock makes due and delivering, until ``stop``."""
        said = ""
        while not stop.is_set():
            try:
                await self.catch_up()
                await self._queue(time_notices(self.state, int(self.clock())))
                await self.deliver()
                said = ""
            except Exception as exc:  # noqa: BLE001 - the log is briefly unavailable: retry
                if str(exc) != said:
                    log.warning("notifications paused: %s", exc)
                said = str(exc)
            try:
                await asyncio.wait_for(stop.wait(), timeout=poll)
            except asyncio.TimeoutError:
                pass
