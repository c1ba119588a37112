"""Turn a job's options into a per-node resource request for one partition (pure).

Every node of a job gets the same request (tasks are spread evenly, rounding up), which is
how rota places multi-node jobs. ``whole_*`` flags mean "all of the node's CPUs / memory"
(``--exclusive`` or ``--mem=0``).
"""
from __future__ import annotations

from dataclasses import dataclass

from .events import JobSpec, PartitionConfig
from .state import Node


@dataclass(frozen=True, slots=True)
class NodeRequest:
    nnodes: int
    cpus: int
    mem: int
    gpus: int
    gpu_type: str | None
    whole_cpus: bool = False
    whole_mem: bool = False
    whole_gpus: bool = False
    ntasks: int = 1

    @property
    def total_cpus(self) -> int:
        return self.cpus * self.nnodes


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def default_mem_per_cpu(nodes: list[Node]) -> int:
    """The memory a CPU brings when a job asks for none: the smallest MiB/CPU in the partition."""
    ratios = [n.memory // n.cpus for n in nodes if n.cpus > 0]
    return min(ratios) if ratios else 0


def node_request(spec: JobSpec, nodes: list[Node], def_mem_per_cpu: int) -> NodeRequest:
    """The per-node request of ``spec`` on a partition whose nodes are ``nodes``."""
    max_cpus = max((n.cpus for n in nodes), default=1) or 1
    cpt = max(1, spec.cpus_per_task)
    ntasks = max(1, spec.ntasks)
    if spec.nodes_given:
        nnodes = max(1, spec.nodes)
    elif spec.ntasks_per_node:
        nnodes = _ceil_div(ntasks, spec.ntasks_per_node)
    else:
        nnodes = max(1, _ceil_div(ntasks * cpt, max_cpus))
        if spec.gpus_total:
            max_gpus = max((n.gpu_count for n in nodes), default=0)
            if max_gpus:
                nnodes = max(nnodes, _ceil_div(spec.gpus_total, max_gpus))
    if spec.ntasks_per_node:
        tasks_per_node = spec.ntasks_per_node
        if not spec.ntasks_given:
            ntasks = tasks_per_node * nnodes
    else:
        tasks_per_node = _ceil_div(ntasks, nnodes) if (spec.ntasks_given or ntasks > 1) else 1
    cpus = tasks_per_node * cpt
    gpus = spec.gpus_per_node
    if spec.gpus_total:
        gpus = _ceil_div(spec.gpus_total, nnodes)
    if spec.mem_per_node is not None:
        mem = spec.mem_per_node
    elif spec.mem_per_cpu is not None:
        mem = spec.mem_per_cpu * cpus
    else:
        mem = def_mem_per_cpu * cpus
    return NodeRequest(
        nnodes=nnodes, cpus=cpus, mem=mem, gpus=gpus, gpu_type=spec.gpu_type,
        whole_cpus=spec.exclusive, whole_mem=spec.exclusive or spec.mem_per_node == 0,
        whole_gpus=spec.exclusive, ntasks=ntasks,
    )


def constraint_matches(constraint: str | None, features: tuple[str, ...]) -> bool:
    """``a&b`` / ``a,b`` = all, ``a|b`` = any; plain name = that feature."""
    if not constraint:
        return True
    fs = set(features)
    for alternative in constraint.split("|"):
        needed = [t.strip() for t in alternative.replace(",", "&").split("&") if t.strip()]
        if all(t in fs for t in needed):
            return True
    return False


def effective_time_limit(limit: int | None, part: PartitionConfig) -> int:
    """The limit a job runs under in ``part``: its own, else DefaultTime, else MaxTime (0 = none)."""
    if limit is not None:
        return limit
    if part.default_time is not None:
        return part.default_time
    return part.max_time
