"""Orders on the wire: how the controller's typed orders (:mod:`rota.core.orders`) travel to an agent."""
from __future__ import annotations

from pydantic import TypeAdapter, ValidationError

from rota.core.orders import REPEATABLE, Order

_ADAPTER: TypeAdapter[Order] = TypeAdapter(Order)


class BadOrder(ValueError):
    """Bytes that are not an order this agent understands."""


def encode(order: Order) -> bytes:
    """The order as compact JSON."""
    return order.model_dump_json().encode()


def decode(data: bytes) -> Order:
    """The order in ``data``; raises :class:`BadOrder` saying what is wrong with it."""
    try:
        return _ADAPTER.validate_json(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "the message"
        raise BadOrder(f"not an order: {where}: {first.get('msg', 'invalid')}") from None


def message_id(order: Order, node: str = "") -> str | None:
    """JetStream's de-duplication id: a retried launch or kill lands once (None: send every time). The
    stream de-duplicates across all nodes' subjects, so an order sent to several nodes names the node."""
    if isinstance(order, REPEATABLE):
        return None
    step = getattr(order, "step_id", None)
    return f"{order.op}-{order.job_id}-{'any' if order.restarts is None else order.restarts}" + \
        (f"-{step}" if step is not None else "") + (f"-{node}" if node else "")
