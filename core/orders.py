"""Orders from the controller to a node's agent: launch a job, kill, update or signal one.

They are typed values (pydantic, like the events): :mod:`rota.core.effects` derives them from what
the reducer changed, :mod:`rota.wire.orders` carries them, and the agent acts on the type. An order
always names the run it is meant for (``restarts``): a requeued job's old run and new run are
different runs, and an order for one never touches the other.
"""
from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field

from .events import JobSpec, Model, StepStarted


class Launch(Model):
    """Run a started job's batch script on its first node (as in Slurm), confined to what it was given."""

    op: Literal["launch"] = "launch"
    job_id: int
    restarts: int = 0
    name: str
    user: str
    partition: str
    nodes: tuple[str, ...]                  # the whole allocation; the batch script runs on nodes[0]
    node_index: int = 0
    cpus: int                               # on the batch node
    mem: int                                # MiB on the batch node; 0 = unconfined
    gpus: tuple[int, ...] = ()              # GPU indices on the batch node
    cpus_per_node: tuple[int, ...]
    tasks_per_node: tuple[int, ...]
    ntasks: int
    time_limit: int = 0                     # seconds, 0 = UNLIMITED
    start_time: int
    array_job_id: int | None = None
    array_task_id: int | None = None
    array_count: int | None = None
    array_min: int | None = None
    array_max: int | None = None
    array_step: int | None = None
    spec: JobSpec


class Kill(Model):
    """Stop a run: ``cancelled`` (scancel: the agent reports CANCELLED) or ``stopped`` (the log has
    already ended or requeued it: nothing to report)."""

    op: Literal["kill"] = "kill"
    job_id: int
    restarts: int | None = None             # None: whichever run of the job is there
    reason: Literal["cancelled", "stopped"]
    signal: int = 15


class Update(Model):
    """A running job's new time limit (``scontrol update TimeLimit=``)."""

    op: Literal["update"] = "update"
    job_id: int
    restarts: int = 0
    time_limit: int


class Signal(Model):
    """Deliver a signal to a run's processes (``scancel --signal``, ``--signal`` before the time limit):
    to its batch shell's processes (``batch``) or to its steps' tasks on this node (all steps, or
    ``step_id``); the job goes on."""

    op: Literal["signal"] = "signal"
    job_id: int
    restarts: int = 0
    signal: int
    batch: bool = True
    steps: bool = False
    step_id: int | None = None


class StepLaunch(Model):
    """Run a step's tasks that belong on this node, confined to the step's share of the job here."""

    op: Literal["step"] = "step"
    job_id: int
    restarts: int = 0
    step_id: int
    job: Launch                             # the job's facts, for this node (its CPUs, memory, GPUs here)
    step: StepStarted


class StepKill(Model):
    """Stop a step's tasks on this node (the step's job ended, or the step was cancelled)."""

    op: Literal["step_kill"] = "step_kill"
    job_id: int
    restarts: int = 0
    step_id: int
    signal: int = 9


class Heartbeat(Model):
    """What a node's agent says every few seconds besides "I am here": the jobs it runs (the controller
    kills any the log says ended) and the order stream's sequence of the last order it acted on, with the
    stream it read (when it was made): the controller purges the node's orders up to it, in that stream only."""

    running: tuple[int, ...] = ()
    orders: int = Field(default=0, ge=0, le=2**63 - 1)     # a stream sequence: what NATS can take
    order_stream: str = Field(default="", max_length=64)


Order = Annotated[Union[Launch, Kill, Update, Signal, StepLaunch, StepKill], Field(discriminator="op")]
"""Any order (decoded by its ``op``)."""

REPEATABLE = (Update, Signal)
"""Orders that may be sent twice on purpose (a second update or signal is a new order, not a retry)."""
