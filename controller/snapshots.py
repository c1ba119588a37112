"""State snapshots in the JetStream object store: ``latest`` for restarts, ``at-<seq>`` every so often
for time travel (seek = nearest snapshot at or before a moment + replay of the tail)."""
from __future__ import annotations

import logging
from typing import Any

from rota.core.state import State, load_snapshot

log = logging.getLogger("rota.snapshots")
BUCKET = "rota-snapshots"


async def open_store(js: Any) -> Any:
    try:
        return await js.object_store(BUCKET)
    except Exception:  # noqa: BLE001 - not created yet
        return await js.create_object_store(bucket=BUCKET)


def history_name(seq: int) -> str:
    return f"at-{seq:012d}"


async def put(store: Any, data: bytes, seq: int, history: bool) -> None:
    await store.put("latest", data)
    if history:
        await store.put(history_name(seq), data)


async def _load(store: Any, name: str) -> State | None:
    try:
        entry = await store.get(name)
    except Exception:  # noqa: BLE001 - missing
        return None
    if entry is None or not entry.data:
        return None
    try:
        return load_snapshot(entry.data)
    except ValueError as exc:
        log.warning("ignoring unreadable snapshot %s: %s", name, exc)
        return None


async def latest(store: Any) -> State | None:
    return await _load(store, "latest")


async def at_or_before(store: Any, seq: int) -> State | None:
    """The newest snapshot whose sequence is at most ``seq`` (None when there is none)."""
    try:
        names = [o.name for o in await store.list() if o.name.startswith("at-") and not o.deleted]
    except Exception:  # noqa: BLE001 - an empty bucket raises
        names = []
    seqs = sorted(int(n[3:]) for n in names if n[3:].isdecimal() and int(n[3:]) <= seq)
    for s in reversed(seqs):
        state = await _load(store, history_name(s))
        if state is not None:
            return state
    snap = await latest(store)
    return snap if snap is not None and snap.seq <= seq else None


async def at_or_before_time(store: Any, ts: int) -> State | None:
    """The newest snapshot whose log time is at most ``ts``."""
    try:
        names = sorted((o.name for o in await store.list() if o.name.startswith("at-") and not o.deleted),
                       reverse=True)
    except Exception:  # noqa: BLE001
        names = []
    for name in names:
        state = await _load(store, name)
        if state is not None and state.now <= ts:
            return state
    return None
