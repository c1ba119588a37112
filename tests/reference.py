"""A slow, obviously-correct reference for checking scheduler plans (tests only)."""
from __future__ import annotations

from rota.core.profile import UNLIMITED_DURATION
from rota.core.schedule import Decision
from rota.core.state import State

HORIZON = 1 << 61


def usage_plan(state: State, decision: Decision):
    """Per node, the list of (start, end, cpus, mem, gpus) the plan holds: running + starts + reservations."""
    now = decision.now
    plan: dict[str, list[tuple[int, int, int, int, int, int]]] = {n: [] for n in state.nodes}
    for jid in state.running:
        job = state.jobs[jid]
        end = job.start_time + job.time_limit if job.time_limit else HORIZON
        for a in job.alloc:
            plan[a.node].append((now, max(end, now + 1), a.cpus, a.mem, len(a.gpus), jid))
    for s in decision.starts:
        d = s.time_limit or UNLIMITED_DURATION
        for a in s.alloc:
            plan[a.node].append((now, now + d, a.cpus, a.mem, len(a.gpus), s.job_id))
    return plan


def usage_at(items, t):
    c = m = g = 0
    for s, e, ci, mi, gi, _ in items:
        if s <= t < e:
            c, m, g = c + ci, m + mi, g + gi
    return c, m, g


def fits(state: State, plan, node: str, t: int, d: int, c: int, m: int, g: int) -> bool:
    n = state.nodes[node]
    items = plan[node]
    points = {t} | {s for s, *_ in items if t < s < t + d}
    for p in points:
        uc, um, ug = usage_at(items, p)
        if uc + c > n.cpus or um + m > n.memory or ug + g > n.gpu_count:
            return False
    return True


def check_capacity(state: State, plan) -> None:
    """No node is ever over-committed at any moment of the plan."""
    for name, items in plan.items():
        n = state.nodes[name]
        for s, *_ in items:
            uc, um, ug = usage_at(items, s)
            assert uc <= n.cpus and um <= n.memory and ug <= n.gpu_count, (name, s, uc, um, ug)
