"""Test and demo helpers shipped with the core: a cluster builder and a harness that appends
events with increasing sequence numbers on a manual clock and runs cycles like the controller."""
from __future__ import annotations

from typing import Any

from . import commands
from . import events as ev
from .apply import apply
from .changes import Changes
from .schedule import Decision, schedule
from .state import State


def make_cluster(nodes: int = 4, gpus: int = 8, gpu_type: str = "a100", cpus: int = 64,
                 memory: int = 257000, prefix: str = "gpu", max_time: int = 3600,
                 policy: str = "conservative", features: tuple[str, ...] = (),
                 extra_partitions: tuple[ev.PartitionConfig, ...] = (), **sched: Any) -> ev.ClusterConfig:
    """``nodes`` identical nodes ``gpu01..`` in one default partition ``short``."""
    names = tuple(f"{prefix}{i:02d}" for i in range(1, nodes + 1))
    gcfg = (ev.GpuConfig(type=gpu_type, count=gpus),) if gpus else ()
    node_cfgs = tuple(ev.NodeConfig(name=n, cpus=cpus, memory=memory, gpus=gcfg, features=features)
                      for n in names)
    part = ev.PartitionConfig(name="short", nodes=names, max_time=max_time, default=True)
    return ev.ClusterConfig(nodes=node_cfgs, partitions=(part,) + extra_partitions,
                            scheduler=ev.SchedulerParams(policy=policy, **sched))  # type: ignore[arg-type]


class Harness:
    """An in-memory log with a manual clock, driving ``apply`` and ``schedule``."""

    def __init__(self, config: ev.ClusterConfig, now: int = 1_000_000) -> None:
        self.state = State()
        self.log: list[ev.Envelope] = []
        self.now = now
        self.put(ev.ClusterConfigured(config=config, source="test"), actor="admin")

    def put(self, event: Any, actor: str = "test") -> ev.Envelope:
        env = ev.Envelope(seq=len(self.log) + 1, ts=self.now, actor=actor,
                          idem=f"t-{len(self.log) + 1}", event=event)
        apply(self.state, env)
        self.log.append(env)
        return env

    def batch(self, *events: Any) -> Changes:
        """Apply ``events`` as one batch (as the controller commits them); what they changed."""
        changes = Changes()
        for event in events:
            env = ev.Envelope(seq=len(self.log) + 1, ts=self.now, actor="test", idem=f"t-{len(self.log) + 1}",
                              event=event)
            apply(self.state, env, changes)
            self.log.append(env)
        return changes

    def advance(self, seconds: int) -> int:
        self.now += seconds
        return self.now

    def submit(self, **spec: Any) -> int:
        """Validate and submit a job (JobSpec fields as keywords); returns its id."""
        spec.setdefault("user", "alice")
        if "time_limit" not in spec:
            spec["time_limit"] = 600
        for flag, given in (("nodes", "nodes_given"), ("ntasks", "ntasks_given"),
                            ("cpus_per_task", "cpus_per_task_given")):
            if flag in spec:
                spec.setdefault(given, True)
        job_id = self.state.next_job_id
        self.put(commands.submit(self.state, ev.JobSpec(**spec), job_id), actor=spec["user"])
        return job_id

    def cycle(self, policy: str | None = None, explain: bool = True) -> Decision:
        d = schedule(self.state, self.now, policy, explain=explain)
        event = d.event()
        if event is not None:
            self.put(event, actor="controller")
        return d

    def finish(self, job_id: int, state: ev.JobEndState = "COMPLETED", exit_code: int = 0, **kw: Any) -> None:
        self.put(ev.JobExited(job_id=job_id, state=state, exit_code=exit_code, **kw), actor="agent")
