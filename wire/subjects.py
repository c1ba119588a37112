"""NATS subjects and JetStream streams rota uses (one list, so permissions and code agree)."""
from __future__ import annotations

API = "rota.api"                                      # rota.api.<verb>: requests to the controller
EVENT_STREAM, EVENT_PREFIX = "ROTA_EVENTS", "rota.ev"  # the event log
INBOX_STREAM, INBOX_PREFIX = "ROTA_INBOX", "rota.inbox"       # agents' reports, per node
ASSIGN_STREAM, ASSIGN_PREFIX = "ROTA_ASSIGN", "rota.assign"   # the controller's orders, per node
HEARTBEAT_PREFIX = "rota.hb"                                   # rota.hb.<node>: plain messages


def agent_consumer(node: str) -> str:
    """The durable consumer through which ``node``'s agent pulls its assignments."""
    return f"agent-{node}"


def api_subject(verb: str) -> str:
    return f"{API}.{verb}"
