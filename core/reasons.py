"""Why a job is pending: a closed, ranked set of reasons (pure).

Every reason has Slurm's code (what ``squeue %r`` and ``sacct -o Reason`` show), a tier (when
several hold at once, the lowest tier is the one shown: a hold before the partition's limits,
those before dependencies, begin times and array limits, and capacity last), the sentence
``rota why`` says, and the numbers behind it as numbers (what the job asks against the limit, what
it needs against what is free), rendered to words in one place.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from .timefmt import format_utc

Code = Literal[
    "JobHeldAdmin", "JobHeldUser",
    "PartitionConfig", "PartitionDown", "PartitionInactive", "PartitionTimeLimit", "PartitionNodeLimit",
    "BadConstraints", "ReqNodeNotAvail", "QOSMaxWallDurationPerJobLimit", "Resources",
    "DependencyNeverSatisfied", "Dependency", "BeginTime", "JobArrayTaskLimit",
    "QOSMaxJobsPerUserLimit", "QOSMaxGRESPerUser", "QOSMaxCpuPerUserLimit",
    "AssocMaxJobsLimit", "AssocGrpJobsLimit", "AssocGrpGRES", "AssocGrpCpuLimit",
    "AssocGrpCPUMinutesLimit", "AssocGrpGRESMinutes",
    "Priority",
]
"""Every reason rota gives, in rank order (the tier is the position)."""

CODES: tuple[Code, ...] = get_args(Code)

SENTENCES: dict[Code, str] = {
    "JobHeldAdmin": "held by an administrator",
    "JobHeldUser": "held by its owner",
    "PartitionConfig": "its partition no longer exists",
    "PartitionDown": "its partition was down",
    "PartitionInactive": "its partition was inactive",
    "PartitionTimeLimit": "its time limit is longer than the partition allows",
    "PartitionNodeLimit": "it asks for more nodes than the partition allows",
    "BadConstraints": "no node has the features it asks for",
    "ReqNodeNotAvail": "nodes it can use were unavailable (drained, down or not responding)",
    "Resources": "waiting for the resources it needs to free up",
    "DependencyNeverSatisfied": "its dependency can never be satisfied",
    "Dependency": "waiting for the jobs it depends on",
    "BeginTime": "its requested begin time had not come",
    "JobArrayTaskLimit": "its array already ran as many tasks as its limit allows",
    "QOSMaxWallDurationPerJobLimit": "its time limit is longer than its QOS allows (MaxWall)",
    "QOSMaxJobsPerUserLimit": "its user already ran as many jobs as its QOS allows each user (MaxJobsPerUser)",
    "QOSMaxGRESPerUser": "its user's running jobs already held as many GPUs as its QOS allows (MaxTRESPerUser)",
    "QOSMaxCpuPerUserLimit": "its user's running jobs already held as many CPUs as its QOS allows (MaxTRESPerUser)",
    "AssocMaxJobsLimit": "its user already ran as many jobs in its account as the association allows (MaxJobs)",
    "AssocGrpJobsLimit": "its account already ran as many jobs as it may (GrpJobs)",
    "AssocGrpGRES": "its account's running jobs already held as many GPUs as it may (GrpTRES)",
    "AssocGrpCpuLimit": "its account's running jobs already held as many CPUs as it may (GrpTRES)",
    "AssocGrpCPUMinutesLimit": "its account's CPU-minutes (used, and reserved by its running jobs) would pass "
                               "its GrpTRESMins",
    "AssocGrpGRESMinutes": "its account's GPU-minutes (used, and reserved by its running jobs) would pass its "
                           "GrpTRESMins",
    "Priority": "waiting behind higher-priority jobs",
}
"""The plain sentence for each reason (``rota why``)."""

TIERS: dict[Code, int] = {code: tier for tier, code in enumerate(CODES)}

REQ_NODE_NOT_AVAIL_ALL = ("Nodes required for job are DOWN, DRAINED or reserved for jobs in "
                          "higher priority partitions")
"""slurmctld's %R when every node able to hold the job is unusable."""


@dataclass(frozen=True, slots=True)
class Amounts:
    """Resources on one node (or, for ``nodes``, a count of nodes)."""

    nodes: int = 0
    cpus: int = 0
    mem: int = 0                  # MiB
    gpus: int = 0
    gpu_type: str | None = None
    whole: bool = False           # --exclusive: all of a node


# the numbers behind a reason, in words: {about} (what it is about), {asked}, {limit}, {note}, {at}
NUMBERS: dict[str, str] = {
    "PartitionConfig": "partition {about} no longer exists",
    "PartitionDown": "partition {about} is DOWN",
    "PartitionInactive": "partition {about} is INACTIVE",
    "PartitionTimeLimit": "time limit {asked}s exceeds partition {about} MaxTime {limit}s",
    "PartitionNodeLimit": "needs {asked} nodes; partition {about} has {limit}",
    "BadConstraints": "no node in {about} has features {note}",
    "DependencyNeverSatisfied": "dependency {about} can never be met",
    "Dependency": "waiting for {about}",
    "BeginTime": "not before {at} UTC ({asked}s from now)",
    "JobArrayTaskLimit": "{asked} tasks running, array limit %{limit}",
    "QOSMaxWallDurationPerJobLimit": "time limit {asked}s exceeds QOS {about} MaxWall {limit}s",
    "QOSMaxJobsPerUserLimit": "{asked} of the user's jobs running under QOS {about}, MaxJobsPerUser {limit}",
    "AssocMaxJobsLimit": "{asked} of the user's jobs running in account {about}, MaxJobs {limit}",
    "AssocGrpJobsLimit": "{asked} jobs of account {about} running, GrpJobs {limit}",
    "AssocGrpGRES": "account {about}'s running jobs hold {asked} GPUs, this job adds {note}; GrpTRES allows {limit}",
    "AssocGrpCpuLimit": "account {about}'s running jobs hold {asked} CPUs, this job adds {note}; GrpTRES allows {limit}",
    "AssocGrpCPUMinutesLimit": "account {about} has used or reserved {asked} CPU-minutes, this job would add {note}; "
                               "GrpTRESMins allows {limit}",
    "AssocGrpGRESMinutes": "account {about} has used or reserved {asked} GPU-minutes, this job would add {note}; "
                           "GrpTRESMins allows {limit}",
    "QOSMaxGRESPerUser": "the user's running jobs under QOS {about} hold {asked} GPUs, this job adds {note}; "
                         "MaxTRESPerUser allows {limit}",
    "QOSMaxCpuPerUserLimit": "the user's running jobs under QOS {about} hold {asked} CPUs, this job adds {note}; "
                             "MaxTRESPerUser allows {limit}",
}
# GrpTRESMins without AccountingStorageEnforce=safe: only the minutes already used count
USED_ONLY = {
    "AssocGrpCPUMinutesLimit": "account {about} has used {asked} CPU-minutes; GrpTRESMins allows {limit} (without "
                               "AccountingStorageEnforce=safe jobs start until the minutes are used up)",
    "AssocGrpGRESMinutes": "account {about} has used {asked} GPU-minutes; GrpTRESMins allows {limit} (without "
                           "AccountingStorageEnforce=safe jobs start until the minutes are used up)",
}


@dataclass(frozen=True, slots=True)
class Reason:
    """One reason, with what it is about and its numbers (all optional, by code)."""

    code: Code
    text: str = ""                # squeue's %R when it says more than the code
    about: str = ""               # a partition, a node list, a dependency, a constraint
    asked: int | None = None      # what the job asks (a time limit, a node count) or uses (running tasks)
    limit: int | None = None      # the bound it meets
    at: int | None = None         # a moment (BeginTime)
    needs: Amounts | None = None  # what it needs (per node)
    free: Amounts | None = None   # what is free for it (the freest usable node, and how many nodes fit now)
    note: str = ""                # a fact without numbers (why Priority: a blocked partition, a test limit)

    @property
    def tier(self) -> int:
        return TIERS[self.code]

    @property
    def display(self) -> str:
        """What ``squeue %R`` shows in parentheses."""
        return self.text or self.code

    @property
    def sentence(self) -> str:
        return SENTENCES[self.code]

    def numbers(self) -> str:
        """The numbers behind the reason, in words ("" when it has none)."""
        template = USED_ONLY.get(self.code) if not self.note else None
        template = template or NUMBERS.get(self.code)
        if template is not None:
            at = format_utc(self.at) if self.at is not None else None
            return template.format(about=self.about, asked=self.asked, limit=self.limit, note=self.note, at=at)
        if self.code == "ReqNodeNotAvail":
            if self.needs is None or self.free is None:
                return f"required nodes {self.about} are not available"
            return (f"needs {self.needs.nodes} node(s) able to hold it; {self.free.nodes} of {self.limit} are "
                    "usable (the rest are down or drained)")
        if self.needs is not None and self.free is not None:
            n, f = self.needs, self.free
            need = "all of its CPUs and memory (--exclusive)" if n.whole else f"{n.cpus} CPUs, {n.mem} MiB"
            if n.gpus and not n.whole:
                need += f", {n.gpus} GPU(s)" + (f" of type {n.gpu_type}" if n.gpu_type else "")
            if n.nodes > 1:     # a multi-node job: how many nodes could hold a share, not the freest one
                return (f"needs {n.nodes} nodes{' each with' if n.whole else ' with'} {need}"
                        f"{'' if n.whole else ' each'}; {f.nodes} of the {self.limit} usable nodes could hold that now")
            return (f"needs 1 node{', ' if n.whole else ' with '}{need}; the freest usable node now has "
                    f"{f.cpus} CPUs, {f.mem} MiB, {f.gpus} GPU(s) free")
        return self.note


def most_severe(reasons: list[Reason]) -> Reason | None:
    """The reason to show when several hold: the lowest tier (the first given among equals)."""
    best: Reason | None = None
    for r in reasons:
        if best is None or TIERS[r.code] < TIERS[best.code]:
            best = r
    return best
