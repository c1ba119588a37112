"""The controller as its parts see it: the one seam between the process (:class:`~rota.controller.service.Controller`)
and the front door, the verbs, the views and the leadership loop.

A part takes a :class:`ControllerPort`, never the concrete controller, so mypy checks every use and a test
can hand in anything with these members.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol, Sequence

from rota.core import events as ev
from rota.core.orders import Order
from rota.core.schedule import Decision
from rota.core.state import State

if TYPE_CHECKING:
    from rota.wire.keys import Keyring

    from .eventlog import EventLog
    from .metrics_view import CycleHistogram
    from .outbox import Outbox
    from .views import Views
    from .writer import Prepare, Writer

# (command, argv, caller's uid, the only uid whose jobs the caller may see or None) -> (status, stdout, stderr)
ReportRunner = Callable[[str, list[str], int, "int | None", int], tuple[int, str, str]]


class ControllerPort(Protocol):
    """What the controller's parts may read and do."""

    log: EventLog
    writer: Writer
    views: Views
    outbox: Outbox | None                                  # orders for the agents (None: no agents run jobs)
    keyring: Keyring | None                                # the cluster's keys (None: no credentials checked)
    clock: Callable[[], float]
    reload_config: Callable[[], ev.ClusterConfig] | None   # scontrol reconfigure: read the file again
    reports: ReportRunner | None                           # sacct/sinfo/scontrol show over a projection
    timetravel_env: dict[str, str] | None                  # how time travel runs for callers who cannot read the log
    timetravel_argv: list[str]                             # the program time travel runs as (composition root's)
    last_decision: tuple[int, Decision] | None             # the latest cycle's decision, by state sequence
    cycle_hist: CycleHistogram                             # every cycle's duration (/metrics)
    agent_seen: dict[str, float]                           # node -> monotonic time of its last heartbeat

    @property
    def state(self) -> State: ...

    @property
    def leader(self) -> bool: ...

    def now(self) -> int: ...

    def check_space(self, writes: bool) -> None: ...

    async def append(self, event: ev.Event, actor: str, idem: str = "") -> ev.Envelope: ...

    async def write(self, prepare: Prepare, actor: str, idem: str = "") -> tuple[ev.Envelope, bool]: ...

    async def changed(self, timeout: float) -> bool: ...

    def send(self, orders: Sequence[tuple[str, Order]]) -> None: ...

    def cycle_figures(self) -> dict[str, float]: ...

    async def nc_reply(self, subject: str, data: bytes) -> None: ...

    async def lead(self, name: str = "", host: str = "") -> None: ...
