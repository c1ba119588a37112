"""State snapshots in the JetStream object store: ``latest`` for restarts, ``at-<seq>`` every so often
for time travel (seek = nearest snapshot at or before a moment + replay of the tail)."""
from __future__ import annotations

import logging
from typing import Any

import hmac

from rota.core.state import State, load_snapshot

log = logging.getLogger("rota.snapshots")
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


async def open_store(js: Any) -> Any:
    try:
        return await js.object_store(BUCKET)
    except Exception:  # noqa: BLE001 - not created yet
        return await js.create_object_store(bucket=BUCKET)


def history_name(seq: int) -> str:
    return f"at-{seq:012d}"


async def put(store: Any, data: bytes, seq: int, history: bool, key: bytes | None = None) -> None:
    sealed = seal(data, key)
    await store.put("latest", sealed)
    if history:
        await store.put(history_name(seq), sealed)


async def _load(store: Any, name: str, key: bytes | None = None) -> State | None:
    """The snapshot ``name``; None when there is none. A snapshot that cannot be read or trusted is
    reported (the caller then replays from further back), never silently taken for "none"."""
    from nats.js.errors import NotFoundError, ObjectNotFoundError

    try:
        entry = await store.get(name)
    except (NotFoundError, ObjectNotFoundError):
        return None
    except Exception as exc:  # noqa: BLE001 - a timeout or a broken object: say so
        log.warning("snapshot %s could not be read (%s: %s): replaying the log instead", name,
                    type(exc).__name__, exc)
        return None
    if entry is None or not entry.data:
        return None
    try:
        return load_snapshot(unseal(entry.data, key))
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
