"""Turn a job's options into a per-node resource request for one partition (pure).

Every node of a job gets the same request (tasks are spread evenly, rounding up), which is
how rota places multi-node jobs. ``whole_*`` flags mean "all of the node's CPUs / memory"
(``--exclusive`` or ``--mem=0``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from .events import JobSpec, PartitionConfig
from .sharing import shared_value

if TYPE_CHECKING:
    from .state import Node


class NodeRequest(NamedTuple):
    """What a job needs on each of its nodes (a tuple: cheap to hash as a cache key)."""

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

    def on_node(self, cpus: int, mem: int, gpus: int) -> tuple[int, int, int]:
        """The CPUs, MiB and GPUs it takes on a node of those capacities (all of a kind it takes whole)."""
        return (cpus if self.whole_cpus else self.cpus, mem if self.whole_mem else self.mem,
                gpus if self.whole_gpus else self.gpus)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def default_mem_per_cpu(nodes: list["Node"]) -> int:
    """The memory a CPU brings when a job asks for none: the smallest MiB/CPU in the partition."""
    ratios = [n.memory // n.cpus for n in nodes if n.cpus > 0]
    return min(ratios) if ratios else 0


class NodeKind(NamedTuple):
    """One kind of node in a partition (what a submit is checked against: not each node of a big cluster,
    each distinct kind of node in it)."""

    cpus: int
    memory: int
    gpu_types: tuple[str, ...]
    features: tuple[str, ...]
    shards_per_gpu: int = 0


@dataclass(frozen=True, slots=True)
class PartitionShape:
    """What a partition's nodes look like, for turning options into per-node requests."""

    max_cpus: int
    max_gpus: int
    def_mem_per_cpu: int
    count: int = 0                          # its nodes
    kinds: tuple[NodeKind, ...] = ()        # its distinct kinds of node, in the order first seen
    def_mem_per_node: int | None = None     # DefMemPerNode: a node's memory for a job that asks none


def partition_shape(nodes: list["Node"], part: PartitionConfig | None = None) -> PartitionShape:
    """The shape of a partition of ``nodes`` (``part``: its configuration, for DefMemPerCPU/DefMemPerNode;
    without them a CPU brings the smallest MiB/CPU of the partition's nodes)."""
    kinds = dict.fromkeys(NodeKind(n.cpus, n.memory, tuple(n.gpu_types), n.features, n.shards_per_gpu) for n in nodes)
    per_cpu = part.def_mem_per_cpu if part is not None else None
    return PartitionShape(max((n.cpus for n in nodes), default=1) or 1,
                          max((n.gpu_count for n in nodes), default=0),
                          per_cpu if per_cpu is not None else default_mem_per_cpu(nodes),
                          len(nodes), tuple(kinds), part.def_mem_per_node if part is not None else None)


_REQUESTS_KEPT = 4096
_REQUESTS: dict[int, tuple[JobSpec, PartitionShape, NodeRequest]] = {}   # by the spec's id: the last one made


def node_request(spec: JobSpec, shape: PartitionShape) -> NodeRequest:
    """The per-node request of ``spec`` on a partition of the given shape (specs are frozen, and the jobs of a
    queue submitted alike share theirs: the last request made for each of the last few thousand is kept)."""
    kept = _REQUESTS.get(id(spec))
    if kept is not None and kept[0] is spec and kept[1] is shape:
        return kept[2]
    req = _node_request(spec, shape)
    if len(_REQUESTS) >= _REQUESTS_KEPT:
        _REQUESTS.clear()
    _REQUESTS[id(spec)] = (spec, shape, req)
    return req


def _node_request(spec: JobSpec, shape: PartitionShape) -> NodeRequest:
    cpt = spec.cpus_per_task if spec.cpus_per_task > 1 else 1
    ntasks = spec.ntasks if spec.ntasks > 1 else 1
    tpn = spec.ntasks_per_node
    if spec.nodes_given:
        nnodes = spec.nodes if spec.nodes > 1 else 1
    elif tpn:
        nnodes = _ceil_div(ntasks, tpn)
    else:
        nnodes = _ceil_div(ntasks * cpt, shape.max_cpus)
        if spec.gpus_total and shape.max_gpus:
            nnodes = max(nnodes, _ceil_div(spec.gpus_total, shape.max_gpus))
    if tpn:
        tasks_per_node = tpn
        if not spec.ntasks_given:
            ntasks = tpn * nnodes
    elif nnodes == 1:
        tasks_per_node = ntasks
    else:
        tasks_per_node = _ceil_div(ntasks, nnodes)
    cpus = max((1 if spec.overcommit else tasks_per_node) * cpt, spec.mincpus)
    # a shard job is planned as holding one GPU (it may share one already shared: rota.core.schedule)
    gpus = 1 if spec.shards_per_node else _ceil_div(spec.gpus_total, nnodes) if spec.gpus_total else spec.gpus_per_node
    if spec.mem_per_node is not None:
        mem = spec.mem_per_node
    elif spec.mem_per_cpu is not None:
        mem = spec.mem_per_cpu * cpus
    elif shape.def_mem_per_node is not None:
        mem = shape.def_mem_per_node     # 0 (UNLIMITED): the whole node's memory
    else:
        mem = shape.def_mem_per_cpu * cpus
    exclusive = spec.exclusive
    whole_mem = exclusive or spec.mem_per_node == 0 or (mem == 0 and shape.def_mem_per_node == 0)
    return shared_value(NodeRequest(nnodes, cpus, mem, gpus, spec.gpu_type, exclusive, whole_mem, exclusive, ntasks))


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


def over_time_limit(part: PartitionConfig, limit: int | None) -> bool:
    """Whether a job's own time limit breaks ``part``'s MaxTime (UNLIMITED does, in a limited partition):
    refused at submit under EnforcePartLimits, PartitionTimeLimit while it waits."""
    return bool(part.max_time) and limit is not None and (limit == 0 or limit > part.max_time)


def over_node_limits(part: PartitionConfig, nnodes: int, size: int) -> bool:
    """Whether ``nnodes`` nodes are more than ``part`` has (``size``) or outside its MaxNodes/MinNodes:
    refused at submit under EnforcePartLimits, PartitionNodeLimit while it waits."""
    return nnodes > size or bool(part.max_nodes and nnodes > part.max_nodes) or nnodes < part.min_nodes


def effective_time_limit(limit: int | None, part: PartitionConfig) -> int:
    """The limit a job runs under in ``part``: its own, else DefaultTime, else MaxTime (0 = none)."""
    if limit is not None:
        return limit
    if part.default_time is not None:
        return part.default_time
    return part.max_time
