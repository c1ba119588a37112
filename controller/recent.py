"""A bounded "recently seen" map: two generations of dicts, O(1) per operation."""
from __future__ import annotations

from typing import Generic, Hashable, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Recent(Generic[K, V]):
    """Remembers at least the last ``size`` keys (at most ``2 * size``); older ones are forgotten."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._new: dict[K, V] = {}
        self._old: dict[K, V] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._new or key in self._old

    def get(self, key: K) -> V | None:
        v = self._new.get(key)
        return v if v is not None else self._old.get(key)

    def __setitem__(self, key: K, value: V) -> None:
        self._new[key] = value
        if len(self._new) >= self.size:
            self._old, self._new = self._new, {}

    def __getitem__(self, key: K) -> V:
        v = self.get(key)
        if v is None:
            raise KeyError(key)
        return v

    def clear(self) -> None:
        self._new, self._old = {}, {}
