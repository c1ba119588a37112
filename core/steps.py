"""Steps inside an allocation (``srun``): where a step's tasks go within its job's nodes, and how a
step ends (pure).

A step takes its share of the job's allocation: ``ntasks x cpus-per-task`` CPUs spread over the
nodes it uses (block distribution: consecutive ranks share a node, the first nodes take the extra
task), the GPUs it asks for (``--gpus-per-task``, ``--gres=gpu:N``; all of the job's GPUs on the node
otherwise, as in Slurm) and the memory it asks for. Steps that run at once do not share CPUs or the
GPUs they asked for, unless ``--overlap`` (Slurm 22.05's rule); a step that would fit once another
ends is *busy* (``srun`` retries), one that can never fit is refused with Slurm's words.
"""
from __future__ import annotations

from dataclasses import dataclass

from .events import NodeAlloc, StepAlloc
from .state import Job

MAX_TASKS_PER_NODE = 512    # Slurm's MaxTasksPerNode default: a step's tasks on one node
STEP_STATE_RANK = {"COMPLETED": 0, "FAILED": 1, "TIMEOUT": 2, "CANCELLED": 3, "OUT_OF_MEMORY": 4, "NODE_FAIL": 5}
"""How bad each end is: a step ends as the worst of its nodes' (and a node as the worst of its tasks')."""


@dataclass(frozen=True, slots=True)
class StepAsk:
    """What ``srun`` asked for (None: not given, the job's value applies)."""

    ntasks: int | None = None
    nodes: int | None = None
    ntasks_per_node: int | None = None
    cpus_per_task: int | None = None
    gpus_per_task: int | None = None
    gpus_per_node: int | None = None
    mem: int | None = None              # MiB per node
    nodelist: tuple[str, ...] = ()
    overlap: bool = False
    overcommit: bool = False            # more tasks than CPUs: the step takes the node's CPUs it was given


class StepRefused(Exception):
    """A step that cannot be made now (``busy``: it would fit once a running step ends)."""

    def __init__(self, words: str, busy: bool = False) -> None:
        super().__init__(words)
        self.words, self.busy = words, busy


def job_tasks(job: Job) -> int:
    """The job's task count (``SLURM_NTASKS``)."""
    if job.spec.ntasks_given:
        return job.spec.ntasks
    req = job.req
    return req.ntasks if req is not None else max(1, job.spec.ntasks)


def layout(job: Job, ask: StepAsk) -> tuple[tuple[StepAlloc, ...], list[str]]:
    """The step's share of each node it uses, and any warnings ``srun`` prints (Slurm's); raises
    :class:`StepRefused`."""
    alloc = list(job.alloc)
    if ask.nodelist:
        unknown = [n for n in ask.nodelist if n not in {a.node for a in alloc}]
        if unknown:
            raise StepRefused("Requested node configuration is not available")
        alloc = [a for a in alloc if a.node in ask.nodelist]
    if ask.nodes is not None and ask.nodes > len(alloc):
        raise StepRefused(f"Only allocated {len(alloc)} nodes asked for {ask.nodes}")
    warnings: list[str] = []
    ntasks, nnodes = _task_and_node_counts(job, ask, len(alloc), warnings)
    counts = _tasks_per_node(ask, ntasks, nnodes)
    if max(counts, default=0) > MAX_TASKS_PER_NODE:
        raise StepRefused("Requested node configuration is not available")
    cpt = ask.cpus_per_task or (job.spec.cpus_per_task if job.spec.cpus_per_task_given else 1)
    busy_cpus, busy_gpus = _in_use(job, ask.overlap)
    if nnodes < len(alloc) and not ask.nodelist:    # a step on some of the nodes: those with room for it first
        need = max(counts) * cpt
        alloc = sorted(alloc, key=lambda a: a.cpus - busy_cpus.get(a.node, 0) < need)
    out: list[StepAlloc] = []
    rank = 0
    for a, n in zip(alloc[:nnodes], counts):
        if n:
            cpus = min(n * cpt, a.cpus - busy_cpus.get(a.node, 0) or a.cpus) if ask.overcommit else n * cpt
            gpus = _share_of(a, ask, cpus, n, busy_cpus.get(a.node, 0), busy_gpus.get(a.node, set()))
            out.append(StepAlloc(node=a.node, tasks=tuple(range(rank, rank + n)), cpus=cpus, mem=ask.mem or 0,
                                 gpus=gpus, gpus_per_task=ask.gpus_per_task or 0))
            rank += n
    return tuple(out), warnings


def _task_and_node_counts(job: Job, ask: StepAsk, allocated: int, warnings: list[str]) -> tuple[int, int]:
    """How many tasks the step runs, on how many of the job's ``allocated`` nodes (srun's defaults)."""
    nnodes = ask.nodes
    ntasks = ask.ntasks
    if ntasks is None:
        if ask.ntasks_per_node:
            ntasks = ask.ntasks_per_node * (nnodes or allocated)
        elif nnodes is not None:
            ntasks = nnodes
        else:
            ntasks = job_tasks(job)
    if nnodes is None:
        nnodes = min(allocated, ntasks)
    elif ntasks < nnodes:
        warnings.append(f"can't run {ntasks} processes on {nnodes} nodes, setting nnodes to {ntasks}")
        nnodes = ntasks
    return ntasks, nnodes


def _tasks_per_node(ask: StepAsk, ntasks: int, nnodes: int) -> list[int]:
    """The tasks on each of the step's nodes: filled up to --ntasks-per-node in order, else spread evenly."""
    if not ask.ntasks_per_node:
        base, extra = divmod(ntasks, nnodes)
        return [base + (1 if i < extra else 0) for i in range(nnodes)]
    if ntasks > ask.ntasks_per_node * nnodes:
        raise StepRefused("Requested node configuration is not available")
    counts, left = [], ntasks
    for _ in range(nnodes):
        counts.append(min(ask.ntasks_per_node, left))
        left -= counts[-1]
    return counts


def _share_of(a: NodeAlloc, ask: StepAsk, cpus: int, ntasks: int, busy_cpus: int, busy_gpus: set[int]
              ) -> tuple[int, ...]:
    """The GPUs the step gets on one of the job's nodes, once its CPUs, memory and GPUs are known to fit there."""
    if cpus > a.cpus:
        raise StepRefused("More processors requested than permitted")
    if ask.mem is not None and a.mem and ask.mem > a.mem:
        raise StepRefused("Memory required by task is not available")
    want_gpus = ntasks * ask.gpus_per_task if ask.gpus_per_task else ask.gpus_per_node
    if want_gpus is not None and want_gpus > len(a.gpus):
        raise StepRefused("Invalid generic resource (gres) specification")
    if cpus > a.cpus - busy_cpus:
        raise StepRefused("Requested nodes are busy", busy=True)
    if want_gpus is None:
        return a.gpus
    free = [g for g in a.gpus if g not in busy_gpus]
    if len(free) < want_gpus:
        raise StepRefused("Requested nodes are busy", busy=True)
    return tuple(free[:want_gpus])


def _in_use(job: Job, overlap: bool) -> tuple[dict[str, int], dict[str, set[int]]]:
    """CPUs and explicitly requested GPUs the job's running steps hold, per node (none for ``--overlap``)."""
    cpus: dict[str, int] = {}
    gpus: dict[str, set[int]] = {}
    if overlap:
        return cpus, gpus
    for step in (job.steps or {}).values():
        for a in step.started.alloc:
            if a.node in step.ended:
                continue
            cpus[a.node] = cpus.get(a.node, 0) + a.cpus
            if a.gpus_per_task or len(a.gpus) < _job_gpus(job, a.node):
                gpus.setdefault(a.node, set()).update(a.gpus)
    return cpus, gpus


def _job_gpus(job: Job, node: str) -> int:
    return next((len(a.gpus) for a in job.alloc if a.node == node), 0)


def worst(ends: list[tuple[str, int, int, int]]) -> tuple[str, int, int, int]:
    """The end of a step from its parts' ends (state, exit code, signal, MaxRSS): the worst state, the
    highest exit code (as ``srun`` exits), the signal of the worst, the largest MaxRSS."""
    state, _code, sig, _rss = max(ends, key=lambda e: (STEP_STATE_RANK.get(e[0], 1), e[2], e[1]))
    return state, max(e[1] for e in ends), sig, max(e[3] for e in ends)
