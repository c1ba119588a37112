"""Values many jobs repeat, kept once per process: a job's environment, its script, the names of the fields
it set, the spec itself, its per-node request, the numbers behind its reason. A queue of jobs submitted from
one shell repeats them all; each of the states a process folds (the controller's, the projection's, ...)
would otherwise hold its own copies.

Sharing changes no result: what holds these values is frozen, and nothing changes them in place. Pools are
filled from more than one thread (a projection folds in a worker): a race costs a second copy, nothing more.
"""
from __future__ import annotations

import sys
import weakref
from typing import Any

_MAX_FIELD_SETS = 4096          # distinct sets of named fields (a handful in practice)


class SharedEnv(dict[str, str]):
    """An environment held by every spec that has exactly these variables (a dict: it serializes as one)."""

    __slots__ = ("__weakref__",)


_ENVS: "weakref.WeakValueDictionary[tuple[tuple[str, str], ...], SharedEnv]" = weakref.WeakValueDictionary()
_FIELD_SETS: dict[frozenset[str], set[str]] = {}
_SPECS: dict[int, "weakref.KeyedRef"] = {}   # by the hash of its field names and values: a reference to the spec
_NAMES: dict[tuple[str, ...], tuple[tuple[str, ...], int]] = {}   # a spec's field names: their one copy, where env is
_STRINGS = ("script", "submit_line", "workdir", "name", "user", "account", "output", "error", "submit_host")


def shared_env(env: dict[str, str]) -> dict[str, str]:
    """The process's one copy of ``env``."""
    if type(env) is SharedEnv:
        return env
    key = tuple(env.items())
    got = _ENVS.get(key)
    if got is None:
        got = SharedEnv(env)
        _ENVS[key] = got
    return got


_STRS: dict[str, str] = {}
_STRS_ROOM = [4096]             # the pool's size at which it next drops what only it holds


def shared_str(value: str) -> str:
    """The process's one copy of ``value`` while anything holds it. Not ``sys.intern``: since Python 3.12
    interned strings are immortal, so every script and command line a job brought would stay in memory
    after its job left."""
    got = _STRS.get(value)
    if got is None:
        if len(_STRS) >= _STRS_ROOM[0]:
            _sweep_strs()
        got = _STRS[value] = value
    return got


def _counts(pool: dict[str, str]) -> list[tuple[str, int]]:
    """Each pooled string with its reference count (the same code counts the probe and the pool)."""
    return [(k, sys.getrefcount(k)) for k in list(pool)]   # a copy made in one call: other threads may add


def _held_by_pool_only() -> int:
    """The count :func:`_counts` gives a string that only its pool holds."""
    probe: dict[str, str] = {}
    s = "".join(("pool", "probe"))
    probe[s] = s
    del s
    return _counts(probe)[0][1]


_ONLY_POOL = _held_by_pool_only()


def _sweep_strs() -> None:
    """Drop the strings nothing but the pool holds; the pool may then grow to twice what is left."""
    for k, n in _counts(_STRS):
        if n <= _ONLY_POOL:
            _STRS.pop(k, None)
    _STRS_ROOM[0] = max(4096, 2 * len(_STRS))


_MAX_VALUES = 1 << 16
_VALUES: dict[type, dict[Any, Any]] = {}


def shared_value(value: Any) -> Any:
    """The process's one copy of an immutable, hashable ``value`` (a job's per-node request, the numbers behind
    a reason): a queue holds few distinct ones. Kept by type, at most a bounded number of each."""
    table = _VALUES.get(type(value))
    if table is None:
        table = _VALUES[type(value)] = {}
    got = table.get(value)
    if got is None:
        if len(table) >= _MAX_VALUES:
            table.clear()
        got = table[value] = value
    return got


def shared_spec(spec: Any) -> Any:
    """The process's one spec equal to ``spec`` (``spec`` itself the first time): the states a process
    folds from one log, and the jobs of a queue submitted alike, then hold one spec between them."""
    d = spec.__dict__
    names = tuple(d)
    known = _NAMES.get(names)
    if known is None:
        if len(_NAMES) >= _MAX_FIELD_SETS:
            _NAMES.clear()
        known = _NAMES[names] = (names, names.index("env"))
    values = [*d.values()]
    at = known[1]
    values[at] = id(values[at])     # the environment is shared already: the same one is the same object
    try:
        key = hash((known[0], *values))
    except TypeError:               # a value that cannot be hashed (not one a validated spec holds)
        return spec
    ref = _SPECS.get(key)
    got = ref() if ref is not None else None
    if got is None:
        _SPECS[key] = weakref.KeyedRef(spec, _forget, key)
        return spec
    # the key is a hash, not the values (a deep queue of distinct jobs would hold each twice): equal only if equal
    return got if got.__dict__ == d else spec


def _forget(ref: "weakref.KeyedRef", specs: dict = _SPECS) -> None:
    """A spec no job holds any more leaves the pool (unless an equal one took its place)."""
    if specs.get(ref.key) is ref:
        specs.pop(ref.key, None)


KEEP = object()      # a field always kept in a spec's __dict__ (its default is made anew: a dict)


def share_spec(spec: Any, fields: tuple[tuple[str, Any], ...]) -> None:
    """Point a freshly made job spec's repeated values at the process's one copy of each, and leave out of
    its ``__dict__`` the fields that hold their defaults (``fields``: (name, default or KEEP) in order; the
    class holds the defaults): a queue's jobs set a dozen of fifty fields, and the dict is most of a spec's size."""
    full = spec.__dict__
    named = frozenset(spec.__pydantic_fields_set__)
    plan, strings = _plan(fields, named) if len(full) == len(fields) else (fields, _STRINGS)
    d = {}
    for key, default in plan:
        value = full.get(key, default)
        if value is KEEP:
            continue
        if default is KEEP or not (value is default or (type(value) is type(default) and value == default)):
            d[key] = value
    object.__setattr__(spec, "__dict__", d)     # a dict made for what it holds: a dict never shrinks
    d["env"] = shared_env(d["env"])     # an empty one too: jobs submitted without one are otherwise alike
    for key in strings:
        value = d.get(key)
        if value and type(value) is str:
            d[key] = shared_str(value)
    pooled = _FIELD_SETS.get(named)
    if pooled is None:
        if len(_FIELD_SETS) >= _MAX_FIELD_SETS:
            return
        # a plain set, as pydantic expects: a copy of the model copies it before adding to it
        pooled = _FIELD_SETS[named] = set(named)
    object.__setattr__(spec, "__pydantic_fields_set__", pooled)


_PLANS: dict[tuple[int, frozenset[str]], tuple[tuple[tuple[str, Any], ...], tuple[str, ...]]] = {}


def _plan(fields: tuple[tuple[str, Any], ...], named: frozenset[str]) -> tuple[tuple[tuple[str, Any], ...], tuple[str, ...]]:
    """For a spec as validation makes it (every field in its ``__dict__``, each one not named in the input at its
    default): the fields that may hold something else (those named, and those always kept), in order, and which
    of them are pooled strings."""
    key = (id(fields), named)
    got = _PLANS.get(key)
    if got is None:
        if len(_PLANS) >= _MAX_FIELD_SETS:
            _PLANS.clear()
        plan = tuple((k, default) for k, default in fields if k in named or default is KEEP)
        got = _PLANS[key] = (plan, tuple(k for k in _STRINGS if k in named))
    return got
