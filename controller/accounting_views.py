"""What ``sacctmgr show``, ``sshare`` and ``sprio`` show, from the controller's state: the accounting
records, the account tree's shares, usage and fair-share factors, and each pending job's weighted
priority factors."""
from __future__ import annotations

from rota.core.auth import Caller
from rota.core.fairshare import share_rows
from rota.core.schedule import factors_of
from rota.core.state import State

from .views import private_jobs


def records(state: State) -> dict:
    """``sacctmgr show``'s records: accounts, associations, default accounts, QOS, the cluster's name."""
    return {"accounts": [a.model_dump(mode="json") for a in state.accounts.values()],
            "associations": [a.model_dump(mode="json") for a in state.associations.values()],
            "defaults": state.default_accounts, "qos": [q.model_dump(mode="json") for q in state.qos.values()],
            "cluster": state.config.cluster_name if state.config is not None else "rota"}


def shares(state: State, now: int, caller: Caller) -> dict:
    """``sshare``'s rows (other users' hidden from a non-operator under PrivateData=usage)."""
    cfg = state.config
    hide = cfg is not None and "usage" in cfg.auth.private_data and not caller.operator
    mins = {a.name: a.grp_tres_mins for a in state.accounts.values()}
    running: dict[str, list[int]] = {}        # account -> [CPU-minutes, GPU-minutes] its running jobs have left
    for jid in state.running:
        job = state.jobs[jid]
        left = max(0, job.start_time + (job.time_limit or 0) - now) // 60 if job.time_limit else 0
        held = running.setdefault(job.spec.account, [0, 0])
        held[0] += sum(a.cpus for a in job.alloc) * left
        held[1] += sum(len(a.gpus) for a in job.alloc) * left
    rows = []
    for row in share_rows(state, now):
        if hide and row.user and row.user != caller.user:
            continue
        account_row = not row.user
        rows.append({"account": row.account, "user": row.user, "depth": row.depth, "raw_shares": row.raw_shares,
                     "norm_shares": float(row.norm_shares), "raw_usage": row.raw_usage,
                     "norm_usage": float(row.norm_usage), "effective_usage": float(row.effective_usage),
                     "level_fs": None if row.level_fs is None else float(row.level_fs),
                     "factor": row.factor / 1_000_000, "grp_tres_mins": mins.get(row.account, {}) if account_row else {},
                     "run_mins": running.get(row.account, [0, 0]) if account_row else [0, 0]})
    return {"rows": rows, "fair_tree": cfg.priority.fair_tree if cfg is not None else True, "caller": caller.user}


def priorities(state: State, now: int, caller: Caller) -> dict:
    """``sprio``'s rows: each pending job the caller may see, its partition and weighted factors; the weights."""
    cfg = state.config
    mine = private_jobs(state, caller)
    ids = [j for j in state.pending if not mine or state.jobs[j].spec.uid == caller.uid]
    rows = [{"job_id": jid, "partition": part, "user": state.jobs[jid].spec.user,
             "account": state.jobs[jid].spec.account, "factors": list(f)}
            for jid, (part, f) in factors_of(state, now, ids).items()]
    return {"rows": rows, "weights": cfg.priority.model_dump(mode="json") if cfg is not None else {}}
