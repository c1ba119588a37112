"""What the agents must be told when an event lands: launch a started job, kill a stopped one,
update a running one's time limit. Each job's batch script runs on the first node of its allocation
(as in Slurm), so each message goes to exactly one node."""
from __future__ import annotations

from typing import Any

from rota.core import events as ev
from rota.core.arrays import parse_array
from rota.core.state import RUNNING, State


def watched(state: State, event: Any) -> list[tuple[int, int, str]]:
    """Before applying ``event``: the running jobs it may stop, as (job id, restarts, batch node)."""
    ids: list[int] = []
    if isinstance(event, (ev.JobCancelled, ev.JobRequeued)):
        ids = _members(state, event.job_id)
    elif isinstance(event, (ev.NodeDown, ev.NodeRegistered)):
        node = state.nodes.get(event.node)
        ids = list(node.jobs) if node is not None else []
    elif isinstance(event, ev.ClusterConfigured):
        ids = list(state.running)
    out = []
    for jid in ids:
        job = state.jobs.get(jid)
        if job is not None and job.state == RUNNING and job.alloc:
            out.append((jid, job.restarts, job.alloc[0].node))
    return out


def messages(state: State, event: Any, before: list[tuple[int, int, str]]) -> list[tuple[str, dict]]:
    """After applying ``event``: (node, message) for every agent that must act."""
    out: list[tuple[str, dict]] = []
    cancel = isinstance(event, ev.JobCancelled)
    for jid, restarts, node in before:
        job = state.jobs.get(jid)
        if cancel and job is not None and job.state == RUNNING and job.cancel_by is not None:
            # still RUNNING on the log until the agent has killed it and reports CANCELLED
            out.append((node, {"op": "kill", "job_id": jid, "restarts": restarts, "reason": "cancelled",
                               "signal": event.signal}))
        elif job is None or job.state != RUNNING or job.restarts != restarts:
            out.append((node, {"op": "kill", "job_id": jid, "restarts": restarts, "reason": "stopped"}))
    if isinstance(event, ev.JobsStarted):
        for s in event.starts:
            msg = launch_message(state, s.job_id)
            if msg is not None:
                out.append((msg["nodes"][0], msg))
    elif isinstance(event, ev.JobUpdated) and event.time_limit is not None:
        for jid in _members(state, event.job_id):
            job = state.jobs.get(jid)
            if job is not None and job.state == RUNNING and job.alloc:
                out.append((job.alloc[0].node, {"op": "update", "job_id": jid, "time_limit": job.time_limit}))
    return out


def launch_message(state: State, job_id: int) -> dict | None:
    """Everything the batch host's agent needs to run ``job_id`` (None when it is not running)."""
    job = state.jobs.get(job_id)
    if job is None or job.state != RUNNING or not job.alloc:
        return None
    spec = job.spec
    first = job.alloc[0]
    req = job.req
    ntasks = req.ntasks * req.nnodes if req is not None else spec.ntasks
    msg: dict[str, Any] = {
        "op": "launch", "job_id": job_id, "restarts": job.restarts, "name": spec.name, "user": spec.user,
        "partition": job.partition, "nodes": [a.node for a in job.alloc], "node_index": 0,
        "cpus": first.cpus, "mem": first.mem, "gpus": list(first.gpus),
        "cpus_per_node": [a.cpus for a in job.alloc], "tasks_per_node": [ntasks // len(job.alloc)] * len(job.alloc),
        "ntasks": ntasks, "time_limit": job.time_limit or 0, "start_time": job.start_time,
        "array_job_id": job.array_job_id, "array_task_id": job.array_task_id,
        "spec": spec.model_dump(mode="json", exclude={"script"}) | {"script": spec.script},
    }
    if job.array_task_id is not None and spec.array:
        try:
            indices = parse_array(spec.array, 1 << 30).indices
        except Exception:  # noqa: BLE001 - validated at submit; never fail a launch over it
            indices = ()
        if indices:
            step = indices[1] - indices[0] if len(indices) > 1 else 1
            msg.update(array_count=len(indices), array_min=min(indices), array_max=max(indices), array_step=step)
    return msg


def _members(state: State, job_id: int) -> list[int]:
    job = state.jobs.get(job_id)
    if job is None:
        return []
    if job.array_job_id == job_id:
        return sorted(set(state.array_tasks.get(job_id, [])) | {job_id})
    return [job_id]
