"""rota from Python: submit, watch and cancel jobs without a process per command (notebooks, pipelines,
workflow engines).

    from rota.client import Client

    c = Client()
    job = c.submit(wrap="python train.py", options=["--gres=gpu:1", "-t", "30"])
    jobs = c.submit_many([{"wrap": f"python sweep.py --lr {lr}", "options": ["-t", "10"]} for lr in lrs])
    c.wait(jobs)                       # {job id: "COMPLETED", ...}
    c.cancel(job)

Options are sbatch's, read exactly as `sbatch` reads them (``#SBATCH`` lines of a script included). Each
call is one request through this host's local signer, which learns who is asking from the kernel, as
for the commands: a ``Client`` holds no key and cannot claim to be anyone else. ``submit_many`` sends its jobs
in a few requests (up to 10,000 jobs or 3 MiB each): the controller appends each request's jobs
together, so the log writes them with a few fsyncs, not one per job. ``async`` twins (``asubmit``, ``asubmit_many``,
``astatus``, ``acancel``, ``await_jobs``) run the same calls off the event loop.
"""
from __future__ import annotations

import asyncio
import time
from typing import Iterable, Sequence

from rota.cli.client import NoCluster, request

from rota.core.states import TERMINAL_STATES
from rota.wire.subjects import MAX_BATCH

SETTLED = frozenset(TERMINAL_STATES) | {"ENDED", "UNKNOWN"}    # nothing more will happen to these

__all__ = ["Client", "JobError", "NoCluster"]


class JobError(Exception):
    """A request the controller refused (the message is its reason), or a job spec that does not parse."""


Job = dict | str     # one job for submit_many: {"script": ..., "wrap": ..., "options": [...]} or a command line


class Client:
    """One user's handle on the local cluster (see the module's docstring)."""

    def __init__(self, socket: str | None = None, timeout: float = 45.0) -> None:
        self.socket, self.timeout = socket, timeout

    def _call(self, verb: str, body: dict) -> dict:
        reply = request(verb, body, self.timeout, self.socket)
        if not reply.get("ok"):
            raise JobError((reply.get("error") or ["unknown error"])[-1])
        return reply

    @staticmethod
    def spec(script: str | None = None, *, wrap: str | None = None, options: Sequence[str] = ()) -> dict:
        """The job spec sbatch would send for ``options`` and a script (its text) or a ``wrap`` command."""
        from rota.cli.sbatch import SbatchError, build_spec

        if (script is None) == (wrap is None):
            raise JobError("give a script (its text) or wrap (a command line), not both and not neither")
        argv = [*options] + (["--wrap", wrap] if wrap is not None else [])
        try:
            spec, _ = build_spec(argv, script=script)
        except SbatchError as exc:
            raise JobError(str(exc).removeprefix("sbatch: error: ")) from None
        spec.pop("_warnings", None)
        spec.pop("_test_only", None)
        return spec

    def submit(self, script: str | None = None, *, wrap: str | None = None, options: Sequence[str] = ()) -> int:
        """Submit one job; its id."""
        return int(self._call("submit", {"spec": self.spec(script, wrap=wrap, options=options)})["job_id"])

    def submit_many(self, jobs: Iterable[Job], options: Sequence[str] = ()) -> list[int]:
        """Submit many jobs in a few requests (each job a dict of ``submit``'s arguments, or a command line
        to wrap; ``options`` apply to every one before its own); their ids in order. Raises JobError naming
        the first refused one after the others were submitted."""
        specs = []
        for job in jobs:
            if isinstance(job, str):
                specs.append(self.spec(wrap=job, options=options))
            else:
                specs.append(self.spec(job.get("script"), wrap=job.get("wrap"),
                                       options=[*options, *job.get("options", ())]))
        ids: list[int | None] = []
        errors: list[tuple[int, str]] = []
        for first, batch in _batches(specs):
            reply = self._call("submit_many", {"specs": batch})
            ids += reply["job_ids"]
            errors += [(first + i, why) for i, why in reply["errors"]]
        if errors:
            i, why = errors[0]
            done = [j for j in ids if j is not None]
            raise JobError(f"job {i} of {len(specs)} refused: {why} ({len(done)} submitted: {done[:5]}...)")
        return [int(j) for j in ids if j is not None]

    def status(self, job_ids: int | Iterable[int]) -> dict[int, str]:
        """Each job's state (PENDING, RUNNING, COMPLETED, ...; ENDED for one that ended unsuccessfully
        long enough ago that only sacct knows how; UNKNOWN for one the caller may not see)."""
        ids = [job_ids] if isinstance(job_ids, int) else list(job_ids)
        states: dict[int, str] = {}
        for k in range(0, len(ids), MAX_BATCH):
            reply = self._call("job_states", {"job_ids": ids[k:k + MAX_BATCH]})
            states.update({int(j): v["state"] for j, v in reply["jobs"].items()})
        return states

    def cancel(self, *job_ids: int) -> None:
        """Cancel jobs (scancel)."""
        for job_id in job_ids:
            self._call("cancel", {"job_id": job_id})

    def wait(self, job_ids: int | Iterable[int], timeout: float | None = None, poll: float = 1.0) -> dict[int, str]:
        """Wait until every job has ended; their final states. TimeoutError after ``timeout`` seconds."""
        ids = [job_ids] if isinstance(job_ids, int) else list(job_ids)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not _settled(states := self.status(ids), deadline):
            time.sleep(poll)
        return states

    async def asubmit(self, script: str | None = None, *, wrap: str | None = None, options: Sequence[str] = ()) -> int:
        return await asyncio.to_thread(self.submit, script, wrap=wrap, options=options)

    async def asubmit_many(self, jobs: Iterable[Job], options: Sequence[str] = ()) -> list[int]:
        return await asyncio.to_thread(self.submit_many, list(jobs), options)

    async def astatus(self, job_ids: int | Iterable[int]) -> dict[int, str]:
        return await asyncio.to_thread(self.status, job_ids)

    async def acancel(self, *job_ids: int) -> None:
        await asyncio.to_thread(self.cancel, *job_ids)

    async def await_jobs(self, job_ids: int | Iterable[int], timeout: float | None = None,
                         poll: float = 1.0) -> dict[int, str]:
        """``wait`` without blocking the event loop."""
        ids = [job_ids] if isinstance(job_ids, int) else list(job_ids)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not _settled(states := await self.astatus(ids), deadline):
            await asyncio.sleep(poll)
        return states


REQUEST_BYTES = 3 << 20      # one submit_many request stays well under what a NATS message carries


def _batches(specs: list[dict]) -> Iterable[tuple[int, list[dict]]]:
    """The specs in requests of at most MAX_BATCH jobs and REQUEST_BYTES each (with the index of each
    request's first spec)."""
    from rota.cli import lightjson

    first, size = 0, 0
    batch: list[dict] = []
    for i, spec in enumerate(specs):
        n = len(lightjson.dumps(spec))
        if batch and (size + n > REQUEST_BYTES or len(batch) == MAX_BATCH):
            yield first, batch
            first, batch, size = i, [], 0
        batch.append(spec)
        size += n
    if batch:
        yield first, batch


def _settled(states: dict[int, str], deadline: float | None) -> bool:
    """Whether every job has ended; TimeoutError past ``deadline``."""
    if all(s in SETTLED for s in states.values()):
        return True
    if deadline is not None and time.monotonic() > deadline:
        waiting = sorted(j for j, s in states.items() if s not in SETTLED)
        raise TimeoutError(f"{len(waiting)} job(s) still not ended: {waiting[:10]}")
    return False
