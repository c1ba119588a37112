"""Verbs for many jobs at once (``rota.client``, ``rota submit --file``): registered with the front door
when the controller's service imports this module."""
from __future__ import annotations

import asyncio
from typing import Any

from rota.core import commands
from rota.core import events as ev
from rota.core.auth import Caller

from . import requests as rq
from .eventlog import FencedError, LogUnavailable
from .frontdoor import submit_one, verb


@verb("submit_many", rq.SubmitMany, writes=True)
async def _submit_many(c: Any, caller: Caller, request: rq.SubmitMany, rid: str) -> dict:
    """Many jobs in one request: each checked and appended as a submit of its own (one refused does not
    stop the others), all at once, so the log's group commit makes them few fsyncs. ``job_ids`` in the
    order given, None where refused; ``errors``: [index, why]."""
    async def one(i: int, spec: ev.JobSpec) -> int:
        return await submit_one(c, caller, spec, f"{caller.uid}:{rid}:{i}" if rid else "")
    # a user who may hold no more jobs gets every one refused at once, not one by one (the writer's time is
    # everyone's)
    full = commands.count_limits_refusal(c.state, request.specs[0].model_copy(update={"user": caller.user})) \
        if request.specs else None
    results: list = [full] * len(request.specs) if full is not None else \
        await asyncio.gather(*(one(i, s) for i, s in enumerate(request.specs)), return_exceptions=True)
    for r in results:
        if isinstance(r, (FencedError, LogUnavailable)):
            raise r                       # the whole request is retried (each item lands once)
        if isinstance(r, BaseException) and not isinstance(r, commands.Rejected):
            raise r
    return {"ok": True, "job_ids": [r if isinstance(r, int) else None for r in results],
            "errors": [[i, r.lines[-1]] for i, r in enumerate(results) if isinstance(r, commands.Rejected)]}


@verb("job_states", rq.JobStates)
async def _job_states(c: Any, caller: Caller, request: rq.JobStates, rid: str) -> dict:
    return {"ok": True, "jobs": c.views.job_states(request.job_ids, caller)}
