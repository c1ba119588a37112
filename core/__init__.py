"""rota's functional core: events, state, ``apply`` and ``schedule``. Pure: no I/O, no clock."""
from __future__ import annotations

from .apply import apply, fold
from .events import (
    ClusterConfig, ClusterConfigured, ControllerStarted, Envelope, Event, GpuConfig, GpuInfo,
    HealthFault, JobCancelled, JobExited, JobHeld, JobReleased, JobRequeued, JobSpec, JobsStarted,
    JobSubmitted, JobUpdated, NodeAlloc, NodeConfig, NodeDown, NodeDrained, NodeNotResponding,
    NodeRegistered, NodeResumed, PartitionConfig, PriorityWeights, QosConfig, SchedulerParams,
    Start, decode_envelope, encode_envelope,
)
from .schedule import POLICIES, Decision, Pending, Reservation, schedule
from .state import Job, Node, State, dump_snapshot, load_snapshot

__version__ = "0.1.0"

__all__ = [
    "apply", "fold", "schedule", "POLICIES", "Decision", "Pending", "Reservation",
    "State", "Job", "Node", "dump_snapshot", "load_snapshot",
    "Envelope", "Event", "encode_envelope", "decode_envelope",
    "ClusterConfig", "NodeConfig", "PartitionConfig", "GpuConfig", "SchedulerParams",
    "PriorityWeights", "QosConfig", "JobSpec", "NodeAlloc", "Start", "GpuInfo",
    "ClusterConfigured", "ControllerStarted", "JobSubmitted", "JobCancelled", "JobHeld",
    "JobReleased", "JobUpdated", "JobRequeued", "JobsStarted", "JobExited", "NodeRegistered",
    "NodeDrained", "NodeResumed", "NodeDown", "NodeNotResponding", "HealthFault",
    "__version__",
]
