"""rota's functional core: events, state, ``apply`` and ``schedule``. Pure: no I/O, no clock."""
from __future__ import annotations

# Names are imported on first use (PEP 562), so a light command importing one helper module of the
# core (time formats, hostlists) does not pay for pydantic and the scheduler.
_LAZY = {
    "apply": ".apply", "fold": ".apply",
    "schedule": ".schedule", "POLICIES": ".schedule", "Decision": ".schedule", "Pending": ".schedule",
    "Reservation": ".schedule",
    "State": ".state", "Job": ".state", "Node": ".state", "dump_snapshot": ".state", "load_snapshot": ".state",
}


def __getattr__(name: str):
    import importlib

    module = _LAZY.get(name, ".events" if name in __all__ else None)
    if module is None:
        raise AttributeError(f"module 'rota.core' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


__version__ = "0.1.0"

__all__ = [
    "apply", "fold", "schedule", "POLICIES", "Decision", "Pending", "Reservation",
    "State", "Job", "Node", "dump_snapshot", "load_snapshot",
    "Envelope", "Event", "encode_envelope", "decode_envelope",
    "ClusterConfig", "NodeConfig", "PartitionConfig", "GpuConfig", "SchedulerParams",
    "PriorityWeights", "QosConfig", "JobSpec", "NodeAlloc", "Start", "GpuInfo",
    "ClusterConfigured", "ControllerStarted", "JobSubmitted", "JobCancelled", "JobHeld",
    "JobReleased", "JobUpdated", "JobRequeued", "JobsStarted", "JobExited", "NodeRegistered",
    "NodeDrained", "NodeResumed", "NodeDown", "NodeNotResponding", "HealthFault", "RequestDenied", "AuthConfig",
    "__version__",
]
