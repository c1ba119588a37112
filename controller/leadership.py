"""Which controller leads: a lease in a NATS key-value bucket, and the standby's loop.

The lease is one key in a bucket whose entries live ``ttl`` seconds: a candidate takes it with a create
(only if no one holds it), the leader keeps it with compare-and-set updates on the revision it holds,
and a leader that dies stops renewing it, so it expires and a standby takes it. The lease only says
who should write; the log itself fences: every append names the sequence it expects to follow, so a
deposed leader that wakes up (SIGSTOP, a partition) can never append, whatever it believes.

Every controller also announces itself (name, host, sequence) in a second bucket, which
``scontrol ping`` reads through the leader.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable

if TYPE_CHECKING:
    from .port import ControllerPort

log = logging.getLogger("rota.controller.leadership")

LEASE_BUCKET = "rota_leader"
STATUS_BUCKET = "rota_controllers"
KEY = "leader"
START_LIMIT = 6           # leases' lives what leading starts may take before leadership is given up and taken afresh
SLOW_START = 2.0      # seconds: what leading starts, or a standby's read of the log, taking longer is logged
LEASE_TTL = 5.0          # seconds a lease lives without renewal: takeover within this plus catching up


async def _bucket(js: Any, name: str, ttl: float, check_copies: bool = False) -> Any:
    """The key-value bucket ``name`` (made with as many copies as the log; ``check_copies``: one made with
    fewer, by an older rota, gets them)."""
    from nats.js.api import KeyValueConfig

    from rota.wire.jsqueue import log_replicas, match_replicas

    try:
        kv = await js.key_value(name)
    except Exception:  # noqa: BLE001 - not there yet: make it (another controller may race us: then open it)
        try:
            return await js.create_key_value(KeyValueConfig(bucket=name, ttl=ttl, history=1,
                                                            replicas=await log_replicas(js)))
        except Exception:  # noqa: BLE001
            return await js.key_value(name)
    if check_copies:
        await match_replicas(js, f"KV_{name}", await log_replicas(js))
    return kv


class Lease:
    """The leader's lease: taken with a create, kept with compare-and-set renewals."""

    def __init__(self, js: Any, name: str, host: str, ttl: float = LEASE_TTL) -> None:
        self.js, self.name, self.host, self.ttl = js, name, host, ttl
        self.kv: Any = None
        self.revision: int | None = None
        self.confirmed = 0.0    # when (monotonic) the last take or renewal known to have landed was sent

    def lapsing(self) -> bool:
        """Whether no take or renewal has been confirmed for half the lease's life: the servers may let it
        expire before one lands, and another controller take it, so this one must stop acting as leader."""
        return time.monotonic() - self.confirmed >= self.ttl / 2

    async def open(self) -> None:
        self.kv = await _bucket(self.js, LEASE_BUCKET, self.ttl, check_copies=True)

    async def _quick(self, call: Awaitable[Any]) -> Any:
        """A lease operation that gives up well within the lease's life (a server that died with the
        bucket's leader holds an answer back for seconds): the next try can still keep the lease."""
        return await asyncio.wait_for(call, timeout=self.ttl / 4)

    def _value(self, seq: int) -> bytes:
        return json.dumps({"name": self.name, "host": self.host, "seq": seq, "at": time.time(),
                           "pid": os.getpid()}).encode()

    async def acquire(self, seq: int) -> bool:
        """Take the lease if no one holds it, or if the holder is this controller's own earlier life (a
        restart after a crash need not wait for its old lease to run out)."""
        from nats.js.errors import KeyWrongLastSequenceError

        sent = time.monotonic()
        try:
            self.revision = await self._quick(self.kv.create(KEY, self._value(seq)))
            self.confirmed = sent
            return True
        except KeyWrongLastSequenceError:
            pass
        try:
            entry = await self._quick(self.kv.get(KEY))
            held = json.loads(entry.value) if entry.value else {}
        except Exception:  # noqa: BLE001 - gone meanwhile: try again next time
            return False
        if held.get("name") != self.name:
            return False
        try:
            self.revision = await self._quick(self.kv.update(KEY, self._value(seq), last=entry.revision))
            self.confirmed = sent
            return True
        except KeyWrongLastSequenceError:
            return False

    async def renew(self, seq: int) -> bool:
        """Keep the lease; False when it was lost (it expired, and maybe another controller took it)."""
        from nats.js.errors import KeyWrongLastSequenceError

        if self.revision is None:
            return False
        sent = time.monotonic()
        try:
            self.revision = await self._quick(self.kv.update(KEY, self._value(seq), last=self.revision))
            self.confirmed = sent
            return True
        except KeyWrongLastSequenceError:
            pass
        try:    # an earlier renewal may have landed although its answer was lost (a server died meanwhile)
            entry = await self._quick(self.kv.get(KEY))
            held = json.loads(entry.value) if entry.value else {}
            if held.get("name") == self.name and held.get("pid") == os.getpid():
                self.revision = await self._quick(self.kv.update(KEY, self._value(seq), last=entry.revision))
                self.confirmed = sent
                return True
        except KeyWrongLastSequenceError:
            pass
        except Exception:  # noqa: BLE001 - expired (not found): it is lost
            pass
        self.revision = None
        return False

    async def release(self) -> None:
        """Give the lease up (a clean stop): a standby need not wait for it to expire."""
        if self.revision is not None:
            try:
                await self.kv.delete(KEY, last=self.revision)
            except Exception:  # noqa: BLE001 - it expires anyway
                pass
            self.revision = None


async def lease_holder(js: Any) -> str | None:
    """The name of the controller holding the lease (None: no one does)."""
    try:
        entry = await (await _bucket(js, LEASE_BUCKET, LEASE_TTL)).get(KEY)
        return json.loads(entry.value).get("name") if entry.value else None
    except Exception:  # noqa: BLE001 - no one holds it
        return None


async def controllers(eventlog: Any) -> list[dict]:
    """Every controller on ``eventlog``'s servers that announced itself lately: name, host, role ("primary":
    the one holding the lease), sequence, and ``up`` (false
    when it has not announced itself for two lease lifetimes: frozen, cut off). Empty for a log that is
    not on NATS."""
    js = getattr(eventlog, "js", None)
    if js is None:
        return []
    kv = await _bucket(js, STATUS_BUCKET, 3 * LEASE_TTL)
    out: list[dict] = []
    try:
        keys = await kv.keys()
    except Exception:  # noqa: BLE001 - none yet
        return out
    holder = await lease_holder(js)
    now = time.time()
    for key in sorted(keys):
        try:
            entry = json.loads((await kv.get(key)).value)
        except Exception:  # noqa: BLE001 - expired meanwhile
            continue
        entry["role"] = "primary" if entry.get("name") == holder else "backup"
        entry["up"] = now - float(entry.get("at") or 0) <= 2 * LEASE_TTL
        out.append(entry)
    return out


async def controllers_of(controller: ControllerPort) -> dict:
    """What ``scontrol ping`` shows: the controllers that announced themselves, and those the
    configuration names (SlurmctldHost lines, in order)."""
    cfg = controller.state.config
    return {"controllers": await controllers(controller.log),
            "configured": list(cfg.controllers) if cfg is not None else []}


class Candidacy:
    """A controller that leads when it holds the lease and stands by (tailing the log) when it does not.

    ``on_lead`` runs once it leads (it serves requests, runs cycles, talks to the agents); ``on_lose``
    once it no longer does (it stops all of that and goes back to tailing)."""

    def __init__(self, controller: ControllerPort, js: Any, name: str, host: str, *, ttl: float = LEASE_TTL,
                 on_lead: Callable[[], Awaitable[None]] | None = None,
                 on_lose: Callable[[], Awaitable[None]] | None = None) -> None:
        self.c, self.js, self.name, self.host, self.ttl = controller, js, name, host, ttl
        self.lease = Lease(js, name, host, ttl)
        self.on_lead, self.on_lose = on_lead, on_lose
        self.leading = False
        self._status: Any = None
        self._starting: asyncio.Task | None = None      # on_lead, run beside the renewals
        self._starting_since = 0.0

    async def run(self, stop: asyncio.Event) -> None:
        await self.lease.open()
        self._status = await _bucket(self.js, STATUS_BUCKET, 3 * self.ttl, check_copies=True)
        try:
            while not stop.is_set():
                try:
                    await self._step()
                except Exception as exc:  # noqa: BLE001 - the servers are away: keep trying
                    log.warning("leadership: %s", str(exc) or type(exc).__name__)
                    if self.leading and (self.lease.revision is None or not self.c.leader or self.lease.lapsing()):
                        await self._lose(f"its lease could not be renewed for {time.monotonic() - self.lease.confirmed:.1f} s")
                try:
                    await asyncio.wait_for(stop.wait(), timeout=self.ttl / 5)
                except asyncio.TimeoutError:
                    pass
        finally:
            if self.leading:
                try:
                    await self._lose("stopping", release=True)
                except Exception as exc:  # noqa: BLE001 - the connection is gone: the lease expires by itself
                    log.warning("stopping: %s", exc or type(exc).__name__)

    async def _step(self) -> None:
        if self.leading:
            stuck = self._start_stuck()
            if not self.c.leader:
                await self._lose("the log refused its append (another controller wrote)")
            elif stuck:
                await self._lose(stuck, release=True)    # taken again at once, by this one or the other: a fresh start
            elif not await self.lease.renew(self.c.state.seq):
                await self._lose("its lease ran out")
        else:
            began = time.monotonic()
            await self.c.writer.catch_up()             # stand by: keep the state as the log has it
            took = time.monotonic() - began
            if took > SLOW_START:                      # the lease is not tried for meanwhile: say why
                log.warning("standing by: reading the log up to sequence %d took %.1f s", self.c.state.seq, took)
            if await self.lease.acquire(self.c.state.seq):
                await self.c.writer.catch_up()         # whatever the last leader appended before it died
                self.leading = True
                await self.c.lead(name=self.name, host=self.host)
                log.warning("leading from log sequence %d", self.c.state.seq)
                if self.on_lead is not None:     # before the announcement, which a busy server may refuse
                    self._starting = asyncio.create_task(self._start_leading(self.on_lead))
                    self._starting_since = time.monotonic()
        await self._announce()

    @staticmethod
    async def _start_leading(on_lead: Callable[[], Awaitable[None]]) -> str:
        """What leading starts (serving, the agents' link), beside the lease's renewals (a busy server can
        hold it up longer than the lease lives); why it failed, or "" once started."""
        try:
            await on_lead()
        except Exception as exc:  # noqa: BLE001 - the servers are away: leadership is given up and taken afresh
            return f"what leading starts failed: {str(exc) or type(exc).__name__}"
        return ""

    def _start_stuck(self) -> str:
        """Why what leading starts will not serve (it failed, or has not finished within START_LIMIT leases),
        or "" (started, or still starting)."""
        starting = self._starting
        if starting is None:
            return ""
        if starting.done():
            self._starting = None
            why = starting.result()
            took = time.monotonic() - self._starting_since
            if not why and took > SLOW_START:
                log.warning("serving as leader after %.1f s", took)
            return why
        if time.monotonic() - self._starting_since > START_LIMIT * self.ttl:
            return f"what leading starts did not finish in {START_LIMIT * self.ttl:.0f} s"
        return ""

    async def _lose(self, why: str, release: bool = False) -> None:
        """Stop leading; ``release``: and give the lease up once stopped (a standby need not wait for it to expire)."""
        log.warning("no longer leading: %s", why)
        self.leading = False
        self.c.writer.leader = False
        revision, self.lease.revision = self.lease.revision, None
        starting, self._starting = self._starting, None
        if starting is not None and not starting.done():
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
        if self.on_lose is not None:
            await self.on_lose()
        if release and revision is not None:
            self.lease.revision = revision
            await self.lease.release()

    async def _announce(self) -> None:
        body = json.dumps({"name": self.name, "host": self.host, "seq": self.c.state.seq,   # who leads: the lease
                           "at": time.time()}).encode()
        await self._status.put(hashlib.sha256(self.name.encode()).hexdigest()[:20], body)   # a valid key for any name
