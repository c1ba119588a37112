"""Getting an allocation for ``srun`` (outside a job) and ``salloc``, waiting for it, giving it back.

The allocation is a job like any other (submitted, scheduled, accounted, explained by ``rota why``);
on its first node it holds nothing but a placeholder until its ``srun``/``salloc`` gives it back.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

from .client import AllocationError, NoCluster, request
from .sbatch import SbatchError, spec_from_options

PLACEHOLDER = "#!/bin/sh\n# an allocation held by srun or salloc; it ends when they give it back\nexec sleep infinity\n"

IMMEDIATE = 1.0      # seconds ``--immediate`` gives an allocation to start
QUIET_WAIT = 1.0     # seconds an allocation may take before srun/salloc says it waits


def allocate(prog: str, values: dict, default_name: str, err: Any = sys.stderr, immediate: Any = None) -> dict:
    """Submit an allocation with the job options in ``values`` and wait until it runs; its ``job`` view.

    Says, as Slurm does, that it waits and why (the pending reason, each time it changes); Ctrl-C
    while waiting gives the request back; ``immediate`` (``--immediate``'s value) bounds the wait."""
    try:
        spec = spec_from_options(values, PLACEHOLDER, default_name)
    except SbatchError as exc:
        raise AllocationError(str(exc).split("error: ", 1)[-1].replace("sbatch: ", f"{prog}: ")) from None
    for warning in spec.pop("_warnings"):
        err.write(warning.replace("sbatch:", f"{prog}:") + "\n")
    spec.update(allocation=True, output="/dev/null", submit_line=" ".join([prog, *sys.argv[1:]]))
    reply = request("submit", {"spec": spec})
    if not reply.get("ok"):
        raise AllocationError(f"Job submit/allocate failed: {(reply.get('error') or ['unknown error'])[-1]}")
    job_id = int(reply["job_id"])
    if prog == "salloc":
        err.write(f"salloc: Pending job allocation {job_id}\n")
    view, waited = _wait_until_running(prog, job_id, err, _immediate(immediate))
    if waited:
        err.write(f"{prog}: job {job_id} has been allocated resources\n")
    if prog == "salloc":
        err.write(f"salloc: Granted job allocation {job_id}\n")
    return view


def _immediate(given: Any) -> float | None:
    """``--immediate[=secs]``: how long the allocation may take (rota decides at submit: a second unless told)."""
    if given is None:
        return None
    if given is True:
        return IMMEDIATE
    if not str(given).isdecimal():
        raise AllocationError(f"Invalid --immediate value: {given}")
    return max(IMMEDIATE, float(given))


def _wait_until_running(prog: str, job_id: int, err: Any, within: float | None = None) -> tuple[dict, bool]:
    """The job's view once it runs, and whether it had to wait (said, with each new pending reason); with
    ``within``, the request is given back and refused (Slurm's words) when it has not started by then."""
    said: str | None = None
    waited = False
    asked = time.monotonic()
    previous = signal.getsignal(signal.SIGINT)
    try:
        while True:
            view = job_view(job_id)
            state = view.get("state")
            if state == "RUNNING":
                break
            if state != "PENDING":
                raise AllocationError(f"Job allocation {job_id} has been revoked.")
            if within is not None and time.monotonic() - asked > within:
                request("cancel", {"job_id": job_id})
                raise AllocationError("Unable to allocate resources: Requested nodes are busy")
            reason = view.get("reason")
            if (reason is None and time.monotonic() - asked < QUIET_WAIT) or within is not None:
                time.sleep(0.02)     # not yet through a scheduling cycle: most allocations start now
                continue
            if not waited:
                err.write(f"{prog}: job {job_id} queued and waiting for resources\n")
                waited = True
            if reason is not None and reason != said:
                err.write(f"{prog}: job {job_id} is pending: {reason}\n")
                said = reason
            err.flush()
            time.sleep(0.5)
    except KeyboardInterrupt:
        try:
            request("cancel", {"job_id": job_id})
        except NoCluster:
            pass
        raise AllocationError(f"Job allocation {job_id} has been revoked.") from None
    finally:
        signal.signal(signal.SIGINT, previous)
    return view, waited


def job_view(job_id: int) -> dict:
    """What the controller says of the job (``scontrol show job``'s facts)."""
    for _ in range(100):
        reply = request("job", {"job_id": job_id})
        if reply.get("ok"):
            return dict(reply["job"])
        if reply.get("code") != "unavailable":
            raise AllocationError((reply.get("error") or ["unknown error"])[-1])
        time.sleep(0.1)
    raise AllocationError("the controller does not answer")


def release(job_id: int, exit_code: int = 0, sig: int = 0, step: int | None = None) -> None:
    """Give the allocation back: the job ends, COMPLETED or FAILED with this exit code (after ``step``'s
    end is on the log, so that it is accounted as it ended, not as cut short)."""
    try:
        deadline = time.monotonic() + 5
        while step is not None and time.monotonic() < deadline and step in (job_view(job_id).get("steps") or ()):
            time.sleep(0.01)
    except AllocationError:
        pass
    try:
        request("release_allocation", {"job_id": job_id, "exit_code": min(max(exit_code, 0), 255), "signal": sig})
    except NoCluster:
        pass


def allocation_env(view: dict) -> dict[str, str]:
    """The variables ``salloc`` sets for what runs in the allocation (and ``srun`` finds there)."""
    from rota.core.hostlist import compress

    nodes = view.get("nodes") or []
    spec = view.get("spec") or {}
    jid = str(view["job_id"])
    env = {"SLURM_JOB_ID": jid, "SLURM_JOBID": jid, "SLURM_JOB_NAME": spec.get("name", ""),
           "SLURM_JOB_NODELIST": compress(nodes), "SLURM_NODELIST": compress(nodes),
           "SLURM_JOB_NUM_NODES": str(len(nodes)), "SLURM_NNODES": str(len(nodes)),
           "SLURM_JOB_PARTITION": view.get("partition") or "", "SLURM_CLUSTER_NAME": "rota",
           "SLURM_SUBMIT_DIR": os.getcwd(), "SLURM_SUBMIT_HOST": os.uname().nodename,
           "SLURM_JOB_CPUS_PER_NODE": str(view.get("alloc_cpus", 0) // max(1, len(nodes)))}
    if spec.get("ntasks_given"):
        env["SLURM_NTASKS"] = env["SLURM_NPROCS"] = str(spec.get("ntasks"))
    return env
