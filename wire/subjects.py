"""NATS subjects and JetStream streams rota uses (one list, so permissions and code agree)."""
from __future__ import annotations

API = "rota.api"                                      # rota.api.<verb>: requests to the controller
EVENT_STREAM, EVENT_PREFIX = "ROTA_EVENTS", "rota.ev"  # the event log
INBOX_STREAM, INBOX_PREFIX = "ROTA_INBOX", "rota.inbox"       # agents' reports, per node
ORDER_STREAM, ORDER_PREFIX = "ROTA_ORDERS", "rota.orders"     # the controller's orders, per node
HEARTBEAT_PREFIX = "rota.hb"                                   # rota.hb.<node>: plain messages


def agent_consumer(node: str) -> str:
    """The consumer through which ``node``'s agent pulls its orders (it makes it itself, under this name only)."""
    return f"agent-{node}"


CRED_HEADER = "Rota-Cred"      # a request's credential (rota.core.credentials)
RID_HEADER = "Rota-Rid"        # its request id: retries carry the same one


def api_subject(verb: str) -> str:
    return f"{API}.{verb}"


def reply_prefix(rid: str) -> bytes:
    """How the reply to request ``rid`` begins: its request id is the JSON object's first key (what a
    signer checks before handing a reply back, without decoding the rest)."""
    return b'{"rid":"%s",' % rid.encode()


_SEQ = b'"seq":'


def reply_seq(rid: str, data: bytes) -> int | None:
    """The log sequence a reply was answered at (its second key, ``seq``: the state the answer saw, a write
    included), read without decoding the rest; None when the reply has none."""
    head = reply_prefix(rid) + _SEQ
    if not data.startswith(head):
        return None
    start = len(head)
    end = data.find(b",", start, start + 21)
    digits = data[start:end] if end > 0 else b""
    return int(digits) if digits.isdigit() else None


def _head(rid: str, data: bytes) -> bytes:
    """The part of a reply a packed form keeps in the clear: its request id and its sequence."""
    prefix = reply_prefix(rid)
    if data[len(prefix):len(prefix) + len(_SEQ)] == _SEQ:
        end = data.find(b",", len(prefix) + len(_SEQ))
        if end > 0:
            return data[:end + 1]
    return prefix


MAX_BATCH = 10_000           # jobs in one submit_many or job_states request
PACK_OVER = 1 << 20          # replies larger than this travel compressed (NATS carries at most 8 MiB)
_PACKED = b'"packed":1}\n'


def pack_reply(rid: str, data: bytes) -> bytes:
    """A large reply (a queue of 100,000 rows) compressed behind its request id and sequence."""
    if len(data) <= PACK_OVER:
        return data
    import zlib

    return _head(rid, data) + _PACKED + zlib.compress(data, 1)


def unpack_reply(rid: str, data: bytes) -> bytes:
    """The reply's JSON, unpacked when :func:`pack_reply` compressed it."""
    head = _head(rid, data) + _PACKED
    if not data.startswith(head):
        return data
    import zlib

    return zlib.decompress(data[len(head):])
