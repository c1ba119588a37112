"""Orders on their way from the writer to the agents' link (in the order the log decided them)."""
from __future__ import annotations

import asyncio

from rota.core.orders import Order


class Outbox:
    """A FIFO of order batches: the writer puts what each commit implies, the agents' link takes."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[list[tuple[str, Order]]] = asyncio.Queue()

    def put(self, orders: list[tuple[str, Order]]) -> None:
        """Queue (node, order) pairs; never blocks."""
        if orders:
            self._queue.put_nowait(orders)

    async def get(self) -> list[tuple[str, Order]]:
        """The next batch, waiting for one."""
        return await self._queue.get()

    def empty(self) -> bool:
        return self._queue.empty()
