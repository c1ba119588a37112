"""How the controller's answers are written: JSON with the request id and the log sequence first."""
from __future__ import annotations


class Raw:
    """A reply value that is JSON already (inserted as is by :func:`encode_reply`)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


def encode_reply(result: dict | Raw, rid: str | None = None, seq: int | None = None) -> bytes:
    """A reply as JSON bytes (orjson), splicing pre-encoded values in without re-encoding them; with
    ``rid``, the request id first (``{"rid":"...",...}``: what a signer checks before handing it back),
    then ``seq``, the log sequence the answer saw (what a later read on the caller's host waits for)."""
    import orjson

    if isinstance(result, Raw):
        data = result.data
        if rid is None or not data.startswith(b"{") or data == b"{}":
            return data
        head = b'{"rid":"%s",' % rid.encode() + (b'"seq":%d,' % seq if seq is not None else b"")
        return head + data[1:]
    if rid is None:
        body = result
    elif seq is None:
        body = {"rid": rid, **result}
    else:
        body = {"rid": rid, "seq": seq, **result}
    return orjson.dumps(body, default=lambda v: orjson.Fragment(v.data) if isinstance(v, Raw) else str(v))


def too_large(rid: str, size: int) -> bytes:
    """The answer sent instead of one that no message carries, even compressed."""
    return encode_reply({"ok": False, "code": "too_large", "error": [
        f"the answer is {size:,} bytes compressed, more than the cluster's messages carry: "
        "ask for less (by user, partition, state or job)"]}, rid)
