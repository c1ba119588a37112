"""Job dependencies: ``afterok:1:2,afterany:3``, ``?``-lists, ``singleton`` (pure)."""
from __future__ import annotations

from .depspec import DEP_TYPES, OUTCOME_KINDS, Dependency, DependencySpecError, DepTerm, parse_dependency  # noqa: F401 - re-exported
from .state import COMPLETED, PENDING, RUNNING, TERMINAL_STATES, Job, State

OK, WAIT, NEVER = "ok", "wait", "never"


def _term_status(state: State, term: DepTerm, job_id: int, now: int, index: Singletons | None) -> str:
    if term.kind == "singleton":
        return _singleton_status(state, job_id, index)
    members = state.counted_members(term.job_id)
    if members is None:
        ended = state.ended.get(term.job_id)
        if ended is None:     # gone (or never was): done, as Slurm assumes; how it ended is unknown
            return OK if term.kind not in OUTCOME_KINDS else NEVER
        good, bad = ended   # purged MinJobAge after it ended
        if term.kind == "afterok":
            return NEVER if bad else OK
        if term.kind == "afternotok":
            return NEVER if good else OK
        return OK
    statuses = {_member_status(m, term, now) for m in members}
    return NEVER if NEVER in statuses else WAIT if WAIT in statuses else OK


Singletons = dict[tuple[str, str], int]    # (user, job name) -> submit order of the one that may go (-1: one runs)


def singletons(state: State) -> Singletons:
    """For ``singleton``: which job of each user's job name may go (one pass over the active jobs; a cycle keeps
    it for every job it asks about)."""
    out: Singletons = {}
    jobs = state.jobs
    for jid in state.running:
        spec = jobs[jid].spec
        out[(spec.user, spec.name)] = -1
    for jid in state.pending:
        job = jobs[jid]
        key = (job.spec.user, job.spec.name)
        first = out.get(key)
        if first is None or job.submit_seq < first:
            out[key] = job.submit_seq
    return out


def _singleton_status(state: State, job_id: int, index: Singletons | None) -> str:
    """``singleton`` of a pending job: no other job of the same user and name running, nor submitted before this
    one and waiting."""
    me = state.jobs.get(job_id)
    if me is None:
        return OK     # it is gone: nothing of its own waits
    first = (index if index is not None else singletons(state)).get((me.spec.user, me.spec.name))
    return OK if first is None or first == me.submit_seq else WAIT


def _member_status(m: Job, term: DepTerm, now: int) -> str:
    """One job (or array task) a term waits on: has it done what the term waits for, can it still?"""
    pending_tasks = m.array_pending is not None and len(m.array_pending) > 0
    if term.kind == "after":
        waiting = m.state == PENDING or pending_tasks or (m.state == RUNNING and now < m.start_time + term.delay)
        return WAIT if waiting else OK
    if m.state not in TERMINAL_STATES or pending_tasks:
        return WAIT
    good = m.state == COMPLETED and m.exit_code == 0
    if term.kind in ("afterany", "aftercorr"):
        return OK
    if term.kind == "afterok":
        return OK if good else NEVER
    return NEVER if good else OK       # afternotok


def dependency_status(state: State, dep: Dependency, job_id: int, now: int, index: Singletons | None = None) -> str:
    """``ok``, ``wait`` or ``never`` for job ``job_id``'s dependency (``index``: :func:`singletons` of the state,
    for a pending job's ``singleton``)."""
    results = [_term_status(state, t, job_id, now, index) for t in dep.terms]
    if dep.any_of:
        if OK in results:
            return OK
        return NEVER if all(r == NEVER for r in results) else WAIT
    if NEVER in results:
        return NEVER
    return OK if all(r == OK for r in results) else WAIT
