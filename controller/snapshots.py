"""State snapshots: ``latest`` for restarts, ``at-<seq>`` every so often for time travel (seek =
nearest snapshot at or before a moment + replay of the tail). Every log has a :class:`SnapshotStore`:
the JetStream object store, or memory."""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Protocol

import hmac

from rota.core.state import State, load_snapshot
from rota.wire.audit import strip_snapshot

log = logging.getLogger("rota.snapshots")
READ_ATTEMPTS = 3          # a snapshot read that fails (a timeout) is tried this often before the log is replayed
BUCKET = "rota-snapshots"
SIGNED = b"ROTASNAP1\n"


def _mac(key: bytes, data: bytes) -> bytes:
    return hmac.digest(key, b"rota-snapshot\0" + data, "sha256").hex().encode()


def seal(data: bytes, key: bytes | None) -> bytes:
    """A snapshot as stored: with the controller's MAC in front when it holds the log key."""
    return data if key is None else SIGNED + _mac(key, data) + b"\n" + data


def unseal(stored: bytes, key: bytes | None) -> bytes:
    """The snapshot inside ``stored``; ValueError when a reader holding the key finds it unsigned or altered."""
    if stored.startswith(SIGNED):
        mac, _, data = stored[len(SIGNED):].partition(b"\n")
        if key is not None and not hmac.compare_digest(mac, _mac(key, data)):
            raise ValueError("its MAC does not match (altered, or written with another key)")
        return data
    if key is not None:
        raise ValueError("it is not signed by this cluster's controller")
    return stored


class SnapshotStore(Protocol):
    """Where a log keeps its state snapshots: ``latest`` for restarts, history for time travel."""

    async def put(self, data: bytes, seq: int, history: bool, audit: tuple[Any, bytes] | None = None) -> None:
        """Store ``data`` (the state at ``seq``) as the latest, and in the history when ``history``; ``audit``:
        the controller's signing key and the log's chain hash at ``seq``, to sign it with."""

    async def latest(self) -> State | None:
        """The latest snapshot (None: none, or none that can be read and trusted; the reason is logged)."""

    async def at_or_before(self, seq: int) -> State | None:
        """The newest snapshot whose sequence is at most ``seq``."""

    async def at_or_before_time(self, ts: int) -> State | None:
        """The newest snapshot whose log time is at most ``ts``."""


class MemorySnapshots:
    """Snapshots kept in memory (the in-memory log's)."""

    def __init__(self) -> None:
        self._latest: bytes | None = None
        self._history: dict[int, bytes] = {}

    async def put(self, data: bytes, seq: int, history: bool, audit: tuple[Any, bytes] | None = None) -> None:
        self._latest = data
        if history:
            self._history[seq] = data

    async def latest(self) -> State | None:
        return None if self._latest is None else load_snapshot(self._latest)

    async def at_or_before(self, seq: int) -> State | None:
        older = [s for s in self._history if s <= seq]
        if older:
            return load_snapshot(self._history[max(older)])
        snap = await self.latest()
        return snap if snap is not None and snap.seq <= seq else None

    async def at_or_before_time(self, ts: int) -> State | None:
        for s in sorted(self._history, reverse=True):
            state = load_snapshot(self._history[s])
            if state.now <= ts:
                return state
        return None


class ObjectStoreSnapshots:
    """Snapshots in the JetStream object store (chunked: any size), sealed with the log key when
    this process holds it. ``on_latest(seq)`` is told the sequence of a trusted latest snapshot."""

    def __init__(self, js: Any, key: bytes | None = None, on_latest: Callable[[int], None] | None = None) -> None:
        self.js, self.key, self.on_latest = js, key, on_latest
        self._store: Any = None

    async def _open(self) -> Any:
        if self._store is None:
            self._store = await open_store(self.js)
        return self._store

    async def put(self, data: bytes, seq: int, history: bool, audit: tuple[Any, bytes] | None = None) -> None:
        await put(await self._open(), data, seq, history, self.key, audit)

    async def latest(self) -> State | None:
        snap = await latest(await self._open(), self.key)
        if snap is not None and self.on_latest is not None:
            self.on_latest(snap.seq)
        return snap

    async def at_or_before(self, seq: int) -> State | None:
        return await at_or_before(await self._open(), seq, self.key)

    async def at_or_before_time(self, ts: int) -> State | None:
        return await at_or_before_time(await self._open(), ts, self.key)


async def open_store(js: Any) -> Any:
    """The snapshot store, with as many copies as the log."""
    from nats.js.api import ObjectStoreConfig

    from rota.wire.jsqueue import log_replicas, match_replicas

    copies = await log_replicas(js)
    try:
        store = await js.object_store(BUCKET)
    except Exception:  # noqa: BLE001 - not created yet
        return await js.create_object_store(BUCKET, ObjectStoreConfig(bucket=BUCKET, replicas=copies))
    if copies > 1:
        await match_replicas(js, f"OBJ_{BUCKET}", copies)
    return store


def history_name(seq: int) -> str:
    return f"at-{seq:012d}"


async def put(store: Any, data: bytes, seq: int, history: bool, key: bytes | None = None,
              audit: tuple[Any, bytes] | None = None) -> None:
    sealed = seal(data, key)
    if audit is not None:
        signer, head = audit
        sealed = signer.seal_snapshot(seq, head, sealed)
    await store.put("latest", sealed)
    if history:
        await store.put(history_name(seq), sealed)


async def _load(store: Any, name: str, key: bytes | None = None) -> State | None:
    """The snapshot ``name``; None when there is none. A snapshot that cannot be read or trusted is
    reported (the caller then replays from further back), never silently taken for "none"."""
    from nats.js.errors import NotFoundError, ObjectNotFoundError

    entry = None
    for attempt in range(1, READ_ATTEMPTS + 1):
        try:
            entry = await store.get(name)
            break
        except (NotFoundError, ObjectNotFoundError):
            return None
        except Exception as exc:  # noqa: BLE001 - a timeout or a broken object: say so
            if attempt == READ_ATTEMPTS:
                log.warning("snapshot %s could not be read (%s: %s, %d tries): replaying the log instead", name,
                            type(exc).__name__, exc, attempt)
                return None
            log.info("snapshot %s not read yet (%s: %s); trying again", name, type(exc).__name__, exc)
            await asyncio.sleep(0.2 * attempt)
    if entry is None or not entry.data:
        return None
    try:
        return load_snapshot(unseal(strip_snapshot(entry.data), key))
    except ValueError as exc:
        log.warning("snapshot %s set aside: %s; replaying the log instead", name, exc)
        return None


async def latest(store: Any, key: bytes | None = None) -> State | None:
    return await _load(store, "latest", key)


async def at_or_before(store: Any, seq: int, key: bytes | None = None) -> State | None:
    """The newest snapshot whose sequence is at most ``seq`` (None when there is none)."""
    try:
        names = [o.name for o in await store.list() if o.name.startswith("at-") and not o.deleted]
    except Exception:  # noqa: BLE001 - an empty bucket raises
        names = []
    seqs = sorted(int(n[3:]) for n in names if n[3:].isdecimal() and int(n[3:]) <= seq)
    for s in reversed(seqs):
        state = await _load(store, history_name(s), key)
        if state is not None:
            return state
    snap = await latest(store, key)
    return snap if snap is not None and snap.seq <= seq else None


async def at_or_before_time(store: Any, ts: int, key: bytes | None = None) -> State | None:
    """The newest snapshot whose log time is at most ``ts``."""
    try:
        names = sorted((o.name for o in await store.list() if o.name.startswith("at-") and not o.deleted),
                       reverse=True)
    except Exception:  # noqa: BLE001
        names = []
    for name in names:
        state = await _load(store, name, key)
        if state is not None and state.now <= ts:
            return state
    return None
