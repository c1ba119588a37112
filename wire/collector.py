"""Python's cyclic garbage collector around work that allocates a great deal at once.

Reference counting frees almost everything rota drops; the collector is there for cycles. Its passes
over the oldest generation scan every object alive, so work that allocates many objects which live on
(a replay, a projection catching up) or many that live through one long step (a scheduling cycle over
a long queue, whose young collections would move them to the oldest generation) pauses it meanwhile.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def paused() -> Iterator[None]:
    """No collections inside (reference counting still frees). Process-wide: nested or overlapping uses
    (another thread's) are fine, the collector is back on once the first that turned it off is done."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def keep_out() -> None:
    """Collect, then move what is alive out of the collector's reach for good (a large state mostly lives
    as long as the process; what of it is dropped later is still freed by reference counting), so its full
    passes stop rescanning it."""
    gc.collect()
    gc.freeze()
