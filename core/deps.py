"""Job dependencies: ``afterok:1:2,afterany:3``, ``?``-lists, ``singleton`` (pure)."""
from __future__ import annotations

from .depspec import DEP_TYPES, OUTCOME_KINDS, Dependency, DependencySpecError, DepTerm, parse_dependency  # noqa: F401 - re-exported
from .state import COMPLETED, PENDING, RUNNING, TERMINAL_STATES, Job, State

OK, WAIT, NEVER = "ok", "wait", "never"


def _term_status(state: State, term: DepTerm, job_id: int, now: int) -> str:
    if term.kind == "singleton":
        return _singleton_status(state, job_id)
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


def _singleton_status(state: State, job_id: int) -> str:
    """``singleton``: no other job of the same user and name running, nor submitted before this one and waiting."""
    me = state.jobs.get(job_id)
    if me is None:
        return OK     # it is gone: nothing of its own waits
    for other_id in list(state.running) + list(state.pending):
        if other_id == job_id:
            continue
        o = state.jobs[other_id]
        if o.spec.user == me.spec.user and o.spec.name == me.spec.name:
            if o.state == RUNNING or o.submit_seq < me.submit_seq:
                return WAIT
    return OK


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


def dependency_status(state: State, dep: Dependency, job_id: int, now: int) -> str:
    """``ok``, ``wait`` or ``never`` for job ``job_id``'s dependency."""
    results = [_term_status(state, t, job_id, now) for t in dep.terms]
    if dep.any_of:
        if OK in results:
            return OK
        return NEVER if all(r == NEVER for r in results) else WAIT
    if NEVER in results:
        return NEVER
    return OK if all(r == OK for r in results) else WAIT
