"""``squeue -s``: the running steps of the jobs a caller may see, in Slurm's step layout."""
from __future__ import annotations

from typing import Any

from rota.core.timefmt import format_limit, format_squeue_time
from rota.wire.formats import Column

from .squeue_view import FormatError, _hostlist, _when, render, requested_ids

STEP_DEFAULT = "%.15i %.8j %.9P %.8u %.9M %N"
# squeue -s's specifiers: a column over one running step (a row made by :func:`step_rows`)
STEP_COLUMNS: dict[str, Column] = {
    "i": Column("STEPID", lambda s, now: s["id"]), "j": Column("NAME", lambda s, now: s["name"]),
    "P": Column("PARTITION", lambda s, now: s["partition"]), "u": Column("USER", lambda s, now: s["user"]),
    "M": Column("TIME", lambda s, now: format_squeue_time(max(0, now - s["start"]))),
    "N": Column("NODELIST", lambda s, now: _hostlist(s["nodes"])),
    "l": Column("TIME_LIMIT", lambda s, now: format_limit(s["time_limit"])),
    "S": Column("START_TIME", lambda s, now: _when(s["start"])),
    "A": Column("TASKS", lambda s, now: str(s["ntasks"])),
}


def step_rows(state: Any, request: dict, only_uid: int | None) -> list[dict]:
    """Each running step of the jobs the request names (all the caller may see otherwise), by job and step."""
    wanted = requested_ids(request["jobs"]) if request.get("jobs") else None
    given = request.get("steps")
    steps = {s.strip() for s in given.split(",")} if isinstance(given, str) else set()
    rows = []
    for job_id in sorted(state.running):
        job = state.jobs[job_id]
        if (only_uid is not None and job.spec.uid != only_uid) or (isinstance(wanted, set) and job_id not in wanted):
            continue
        for step_id, step in sorted((job.steps or {}).items()):
            sid = f"{job_id}.{step_id}"
            if step.state != "RUNNING" or (steps and sid not in steps and str(job_id) not in steps):
                continue
            rows.append({"id": sid, "name": step.started.name, "partition": job.partition, "user": job.spec.user,
                         "start": step.start, "nodes": list(step.nodes), "time_limit": job.time_limit,
                         "ntasks": step.started.ntasks})
    return rows


def answer_steps(state: Any, request: dict, only_uid: int | None, now: int) -> dict:
    """``squeue -s``: the running steps in Slurm's step layout (``-o`` with the step specifiers)."""
    try:
        fmt = request.get("format") or STEP_DEFAULT
        rows = render(fmt, step_rows(state, request, only_uid), now, header=not request.get("noheader"),
                      columns=STEP_COLUMNS)
    except FormatError as exc:
        return {"ok": False, "error": [f"squeue: error: {exc}"], "code": "invalid"}
    return {"ok": True, "text": "".join(row + "\n" for row in rows)}
