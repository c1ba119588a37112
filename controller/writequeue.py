"""The writes waiting for the writer's group commit: how each builds its event, and the fair queue they wait in."""
from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Callable

from rota.core.state import State

Prepare = Callable[[State], Any]
"""Builds an event from the state it will land on, or raises ``Rejected``."""


class OffLoop:
    """A prepare long enough to run in a worker thread (a cycle over a long queue): the writer's lock keeps
    the state still meanwhile, and requests that only read it are answered in the event loop meanwhile."""

    __slots__ = ("prepare",)

    def __init__(self, prepare: Prepare) -> None:
        self.prepare = prepare

    def __call__(self, state: State) -> Any:
        return self.prepare(state)


Item = tuple[Prepare, str, str, asyncio.Future]
"""A queued write: how to build its event, the actor, the idempotency id, and the caller's future."""


class FairQueue:
    """The writes waiting for the group commit, in one lane per actor taken in turn, one write at a time:
    a user's thousands of queued submits hold another's one back by at most one write each, never by all
    of them. Each actor's writes keep their order."""

    def __init__(self) -> None:
        self._lanes: dict[str, deque[Item]] = {}     # the lane to take from next is the first
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def append(self, item: Item) -> None:
        self._lanes.setdefault(item[1], deque()).append(item)
        self._count += 1

    def put_back(self, items: list[Item]) -> None:
        """Writes to try again before any other of their actors' (in the order given)."""
        for item in reversed(items):
            lane = self._lanes.pop(item[1], None) or deque()
            lane.appendleft(item)
            self._lanes = {item[1]: lane, **self._lanes}
            self._count += 1

    def take(self, limit: int) -> list[Item]:
        """At most ``limit`` writes, one from each lane in turn; an off-loop prepare only ever leads a batch."""
        out: list[Item] = []
        lanes = self._lanes
        while lanes and len(out) < limit:
            actor = next(iter(lanes))
            lane = lanes.pop(actor)
            if out and isinstance(lane[0][0], OffLoop):
                self._lanes = {actor: lane, **lanes}
                break
            out.append(lane.popleft())
            if lane:
                lanes[actor] = lane         # to the back of the turn
        self._count -= len(out)
        return out
