"""QOS and association limits, as slurmctld applies them with AccountingStorageEnforce=limits (pure): what
each user's running jobs hold under each QOS and in each account, what each account's jobs hold (an
account's Grp limits count everything below it in the tree), and the reason a job would break a limit by
starting."""
from __future__ import annotations

from .events import QosRecord
from .reasons import Code, Reason
from .request import NodeRequest
from .state import Job, State
from .usage import ancestors, rolled_up


def limits_enforced(state: State) -> bool:
    cfg = state.config
    return cfg is not None and "limits" in cfg.accounting_enforce and bool(state.qos or state.associations)


def job_amounts(job: Job, req: NodeRequest | None) -> tuple[int, int]:
    """(CPUs, GPUs) a job holds when it runs, or will hold under ``req``."""
    if job.alloc:
        return sum(a.cpus for a in job.alloc), sum(len(a.gpus) for a in job.alloc)
    if req is None:
        return job.spec.cpus_per_task, job.spec.gpus_per_node
    return req.cpus * req.nnodes, req.gpus * req.nnodes


class LimitUse:
    """Running jobs, CPUs and GPUs per (user, QOS), per (user, account) and per account (with its
    sub-accounts'), from the running jobs at ``now``; a cycle adds what it starts."""

    __slots__ = ("qos", "accounts", "assocs", "use", "by_assoc", "by_account", "used", "reserved", "parents",
                 "safe", "accrued", "now", "full", "verdicts")

    def __init__(self, state: State, now: int) -> None:
        self.qos: dict[str, QosRecord] = state.qos
        self.accounts, self.assocs = state.accounts, state.associations
        self.parents = {name: a.parent for name, a in state.accounts.items()}
        self.use: dict[tuple[str, str], list[int]] = {}
        self.by_assoc: dict[tuple[str, str], int] = {}
        self.by_account: dict[str, list[int]] = {}
        half_life = state.config.priority.decay_half_life if state.config is not None else 0
        # ended runs: CPU- and GPU-seconds per account and below, decayed to now
        self.used = rolled_up(state.usage, self.parents, now, half_life)
        self.reserved: dict[str, list[int]] = {}      # running jobs, to their limits (-1: one has none)
        self.accrued: dict[str, list[int]] = {}       # running jobs, so far
        # AccountingStorageEnforce=safe: a job starts only if it cannot break a GrpTRESMins limit by running to
        # its own limit; without it, only once the minutes used reach the limit
        self.safe = state.config is not None and "safe" in state.config.accounting_enforce
        self.now = now
        # (user, QOS) at the QOS's MaxJobsPerUser: their every other job is held by it until one of theirs starts
        self.full: dict[tuple[str, str], Reason] = {}
        # verdicts by everything :meth:`blocking` reads of a job, until the next start changes what is held
        self.verdicts: dict[tuple, Reason | None] = {}
        jobs = state.jobs
        for jid in state.running:
            job = jobs[jid]
            self.add(job, None, job.time_limit or 0)

    def add(self, job: Job, req: NodeRequest | None, limit: int) -> None:
        """Count a running (or just started) job, whose effective time limit is ``limit`` (0: none)."""
        cpus, gpus = job_amounts(job, req)
        spec = job.spec
        self.full.pop((spec.user, spec.qos), None)
        self.verdicts.clear()
        u = self.use.setdefault((spec.user, spec.qos), [0, 0, 0])
        u[0] += 1
        u[1] += cpus
        u[2] += gpus
        self.by_assoc[(spec.user, spec.account)] = self.by_assoc.get((spec.user, spec.account), 0) + 1
        for account in ancestors(self.parents, spec.account) if spec.account else ():
            r = self.reserved.setdefault(account, [0, 0])
            if limit <= 0 or r[0] < 0:
                r[0] = r[1] = -1
            else:
                r[0] += cpus * limit
                r[1] += gpus * limit
            if job.alloc and job.start_time < self.now:
                so_far = self.accrued.setdefault(account, [0, 0])
                so_far[0] += cpus * (self.now - job.start_time)
                so_far[1] += gpus * (self.now - job.start_time)
            a = self.by_account.setdefault(account, [0, 0, 0])
            a[0] += 1
            a[1] += cpus
            a[2] += gpus

    def blocking(self, job: Job, req: NodeRequest | None, limit: int) -> Reason | None:
        """The limit this job (effective time limit ``limit``, 0: none) would break by starting now (None:
        none): its QOS's per-user limits, then its association's, then its account's."""
        spec = job.spec
        full = self.full.get((spec.user, spec.qos))
        if full is not None:
            return full
        key = (spec.user, spec.qos, spec.account, job_amounts(job, req), limit)
        verdicts = self.verdicts
        if key in verdicts:
            return verdicts[key]
        why = self._qos(job, req)
        if why is None:
            why = self._assoc(job, req)
        if why is None:
            why = self._minutes(job, req, limit)
        verdicts[key] = why
        return why

    def _minutes(self, job: Job, req: NodeRequest | None, limit: int) -> Reason | None:
        """GrpTRESMins of the job's account and each above it: what ended runs there used (decayed), what its
        running jobs reserve to their limits and what this job would reserve to its own, against its minutes."""
        for name in ancestors(self.parents, job.spec.account) if job.spec.account else ():
            account = self.accounts.get(name)
            if account is not None and account.grp_tres_mins:
                why = self._account_minutes(account, job, req, limit)
                if why is not None:
                    return why
        return None

    def _account_minutes(self, account, job: Job, req: NodeRequest | None, limit: int) -> Reason | None:
        used = self.used.get(account.name, (0, 0))
        reserved = self.reserved.get(account.name, (0, 0))
        want = job_amounts(job, req)
        checks: tuple[tuple[str, Code], ...] = (("cpu", "AssocGrpCPUMinutesLimit"), ("gres/gpu", "AssocGrpGRESMinutes"))
        for i, (tres, code) in enumerate(checks):
            cap = account.grp_tres_mins.get(tres)
            if cap is None or (i == 1 and not want[1]):
                continue
            if not self.safe:
                so_far = (used[i] + self.accrued.get(account.name, (0, 0))[i]) // 60
                if so_far >= cap:
                    return Reason(code, about=account.name, asked=so_far, limit=cap)
                continue
            if reserved[i] < 0 or limit <= 0:     # a job without a time limit could use any number of minutes
                return Reason(code, about=account.name, asked=(used[i] + max(reserved[i], 0)) // 60, limit=cap,
                              note="an unlimited number")
            have = (used[i] + reserved[i]) // 60
            adds = want[i] * limit // 60
            if have + adds > cap:
                return Reason(code, about=account.name, asked=have, limit=cap, note=str(adds))
        return None

    def _assoc(self, job: Job, req: NodeRequest | None) -> Reason | None:
        spec = job.spec
        assoc = self.assocs.get((spec.user, spec.account))
        if assoc is not None and assoc.max_jobs is not None:
            running = self.by_assoc.get((spec.user, spec.account), 0)
            if running + 1 > assoc.max_jobs:
                return Reason("AssocMaxJobsLimit", about=spec.account, asked=running, limit=assoc.max_jobs)
        for name in ancestors(self.parents, spec.account) if spec.account else ():
            account = self.accounts.get(name)
            if account is None or (account.grp_jobs is None and not account.grp_tres):
                continue
            jobs, cpus, gpus = self.by_account.get(name, (0, 0, 0))
            if account.grp_jobs is not None and jobs + 1 > account.grp_jobs:
                return Reason("AssocGrpJobsLimit", about=name, asked=jobs, limit=account.grp_jobs)
            why = _tres_over(account.grp_tres, ("AssocGrpGRES", "AssocGrpCpuLimit"), name, (cpus, gpus),
                             job_amounts(job, req))
            if why is not None:
                return why
        return None

    def _qos(self, job: Job, req: NodeRequest | None) -> Reason | None:
        q = self.qos.get(job.spec.qos)
        if q is None:
            return None
        jobs, cpus, gpus = self.use.get((job.spec.user, job.spec.qos), (0, 0, 0))
        if q.max_jobs_per_user is not None and jobs + 1 > q.max_jobs_per_user:
            why = self.full[(job.spec.user, job.spec.qos)] = Reason("QOSMaxJobsPerUserLimit", about=q.name,
                                                                    asked=jobs, limit=q.max_jobs_per_user)
            return why
        if not q.max_tres_per_user:
            return None
        return _tres_over(q.max_tres_per_user, ("QOSMaxGRESPerUser", "QOSMaxCpuPerUserLimit"), q.name, (cpus, gpus),
                          job_amounts(job, req))


def _tres_over(limits: dict[str, int], codes: tuple[Code, Code], about: str, held: tuple[int, int],
               want: tuple[int, int]) -> Reason | None:
    """The GPU, then CPU, limit in ``limits`` that ``held`` (CPUs, GPUs) plus ``want`` would pass (None: none);
    ``codes``: the reason for GPUs and for CPUs."""
    for i, tres, code in ((1, "gres/gpu", codes[0]), (0, "cpu", codes[1])):
        cap = limits.get(tres)
        if cap is not None and want[i] and held[i] + want[i] > cap:
            return Reason(code, about=about, asked=held[i], limit=cap, note=str(want[i]))
    return None


def wall_reason(state: State, job: Job, limit: int | None) -> Reason | None:
    """QOSMaxWallDurationPerJobLimit when the job's effective time limit (0: unlimited) exceeds its QOS's MaxWall."""
    q = state.qos.get(job.spec.qos)
    if q is None or q.max_wall is None or limit is None:
        return None
    if limit == 0 or limit > q.max_wall:
        return Reason("QOSMaxWallDurationPerJobLimit", about=q.name, asked=limit, limit=q.max_wall)
    return None
