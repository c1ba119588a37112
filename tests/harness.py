"""The core's test harness: an in-memory log on a manual clock that appends events with increasing
sequence numbers and runs cycles as the controller does."""
from __future__ import annotations

from typing import Any

from rota.core import commands
from rota.core import events as ev
from rota.core.changes import Changes
from rota.core.schedule import Decision, schedule
from rota.core.slurmconf import make_cluster
from rota.core.state import State
from rota.core.timeline import Timeline

__all__ = ["Harness", "make_cluster"]


class Harness:
    """An in-memory log with a manual clock, driving ``apply`` and ``schedule``."""

    def __init__(self, config: ev.ClusterConfig, now: int = 1_000_000) -> None:
        self.log: list[ev.Envelope] = []
        self.timeline = Timeline(idem="t-", record=self.log)
        self.state: State = self.timeline.state
        self.now = now
        self.put(ev.ClusterConfigured(config=config, source="test"), actor="admin")

    def put(self, event: Any, actor: str = "test") -> ev.Envelope:
        return self.timeline.put(self.now, event, actor)

    def batch(self, *events: Any) -> Changes:
        """Apply ``events`` as one batch (as the controller commits them); what they changed."""
        changes = Changes()
        for event in events:
            self.timeline.put(self.now, event, "test", changes)
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
