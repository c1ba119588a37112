"""The context of one scheduling cycle (pure): node timelines, eligibility filters, per-partition
requests, searches and their caches, and the GPUs picked so far."""
from __future__ import annotations

from typing import Iterable, NamedTuple, Sequence

from . import events as ev
from .deps import Singletons
from .fairshare import factors
from .preempt import Preempter
from .priority import JobSize, PriorityContext
from .profile import INF, ShapeSearch, Timeline
from .reasons import Reason
from .request import NodeRequest, constraint_matches, effective_time_limit, node_request, partition_shape
from .state import RUNNING, SHARED, Job, Node, State
from .usage_limits import LimitUse, limits_enforced


# What makes two jobs' placements the same problem: (partition, constraint, nodelist, exclude, per-node request,
# shards asked by --gres=shard:N); a plain tuple, made for every job a cycle walks.
SearchKey = tuple[str, "str | None", tuple[str, ...], tuple[str, ...], NodeRequest, int]


def search_key(part: str, spec: ev.JobSpec, req: NodeRequest) -> SearchKey:
    return (part, spec.constraint, spec.nodelist, spec.exclude, req, spec.shards_per_node)


class FilterKey(NamedTuple):
    """What decides a job's candidate nodes in a partition."""

    partition: str
    constraint: str | None
    nodelist: tuple[str, ...]
    exclude: tuple[str, ...]
    gpu_type: str | None
    shards: int = 0


class NodeBases:
    """What each usable node's timeline is built from (its free amounts, its running jobs' releases and
    items), kept between the cycles of a walk over a changing state (time travel), and dropped for the
    nodes each change touches (:meth:`touched`): only changed nodes are read again."""

    __slots__ = ("of", "built", "lent")

    def __init__(self) -> None:
        self.of: dict[str, tuple] = {}
        self.built: dict[str, Timeline] = {}     # each node's timeline as last built, before any reservation
        self.lent: dict[str, Timeline] = {}      # the copy of it the last cycle was given (it may have booked on it)

    def touched(self, names: Iterable[str]) -> None:
        of, built, lent = self.of, self.built, self.lent
        for name in names:
            of.pop(name, None)
            built.pop(name, None)
            lent.pop(name, None)

    def clear(self) -> None:
        self.of.clear()
        self.built.clear()
        self.lent.clear()


class Cycle:
    """What one scheduling cycle knows and caches: the state, partitions, node timelines, requests,
searches and verdicts (keys named by :class:`SearchKey`)."""

    def __init__(self, state: State, now: int, policy: str, explain: bool, timelines: bool = True,
                 bases: NodeBases | None = None) -> None:
        cfg = state.config
        assert cfg is not None
        self.state, self.now, self.policy, self.explain = state, now, policy, explain
        self.focus: int | None = None
        self.cfg = cfg
        self.params = cfg.scheduler
        self.parts = {p.name: p for p in cfg.partitions}
        if state.part_nodes.keys() == self.parts.keys():    # kept by the reducer with the config
            self.part_nodes, self.part_shapes = state.part_nodes, state.part_shapes
        else:
            self.part_nodes = {p.name: [state.nodes[n] for n in p.nodes if n in state.nodes]
                               for p in cfg.partitions}
            self.part_shapes = {name: partition_shape(ns, self.parts[name]) for name, ns in self.part_nodes.items()}
        self.timelines: dict[str, Timeline] = {}
        self.booked: list[int] = []          # each booking's node (index), in order (searches read what changed)
        if timelines:   # static reasons alone do not need them
            self._build_timelines(bases)
        self.filters: dict[FilterKey, tuple[list[Timeline], list[Node]]] = {}
        self.eligible_sets: dict[FilterKey, frozenset[str]] = {}
        self.searches: dict[tuple[SearchKey, int, int], ShapeSearch] = {}   # (key, duration, horizon)
        self.seeds: dict[SearchKey, list[tuple]] = {}
        self.searched: set[SearchKey] = set()    # requests searched for at some duration
        self.requests: dict[str, dict[int, NodeRequest]] = {}
        self.fit_counts: dict[SearchKey, tuple[int, int]] = {}
        self.verdicts: dict[SearchKey, Reason | None] = {}
        self.gpu_owner: dict[str, list[int]] = {}
        self.shards: dict[str, tuple[list[int], dict[int, int]]] = {}    # node -> shards used per GPU, held until
        self.next_id = state.next_job_id
        self.singletons: Singletons | None = None     # made on the first ``singleton`` dependency asked about
        # per-user QOS limits (AccountingStorageEnforce=limits): what each user holds under each QOS
        self.limit_use = LimitUse(state, now) if limits_enforced(state) else None
        # PreemptType=preempt/qos with a QOS that may preempt another
        self.preempter = Preempter(state, now) if cfg.preempt_type == "qos" and \
            any(q.preempt for q in state.qos.values()) else None
        shares = factors(state, now) if cfg.priority.fairshare and state.associations else None
        self.prio_ctx = PriorityContext(cfg, sum(n.cpus for n in state.nodes.values()), state.qos, shares,
                                        len(state.nodes), state.time_accuracy)
        default = cfg.default_partition()
        self.default_parts: tuple[str, ...] = (default.name,) if default is not None else ()

    def job_parts(self, job: Job) -> Sequence[str]:
        """The partitions a job may run in, in its order (the default partition when it named none): a
        fresh list when there are several, which :func:`rota.core.static_reasons.static_reason` narrows to
        the usable ones."""
        named = job.spec.partitions
        if not named:
            return self.default_parts
        return named if len(named) == 1 else list(named)

    def _build_timelines(self, bases: NodeBases | None) -> None:
        now, explain, timelines, booked = self.now, self.explain, self.timelines, self.booked
        lent = bases.lent if bases is not None else None
        for node in self.state.nodes.values():
            if not node.usable:
                continue
            name = node.name
            if lent is not None:
                # the last cycle's copy moved to now in place, where that cycle booked nothing on it (it still
                # shares its amounts with the timeline as built, whose steps from now on are the same)
                tl = lent.get(name)
                if tl is not None and not tl.owned:
                    last = bases.built.get(name)   # type: ignore[union-attr]
                    if last is not None and last.movable(now):
                        tl.times[0] = now
                        if explain:
                            self._items(tl, bases.of[name])   # type: ignore[union-attr]
                        tl.log = booked
                        timelines[name] = tl
                        continue
            timelines[name] = self._timeline(node, bases)

    def _timeline(self, node: Node, bases: NodeBases | None) -> Timeline:
        """The node's timeline built (or moved from the one last built) at now, ready for this cycle."""
        now, name = self.now, node.name
        kept = bases.of if bases is not None else None
        built = bases.built if bases is not None else None
        base = kept.get(name) if kept is not None else None
        if base is None:
            base = self._node_base(node)
            if kept is not None:
                kept[name] = base
        free_c, free_m, free_g, free_by_type, releases = base[:5]
        last = built.get(name) if built is not None else None
        tl = last.moved_to(now) if last is not None else None
        if tl is None:
            tl = Timeline(name, node.index, node.weight, node.cpus, node.memory, len(node.gpu_types),
                          now, free_c, free_m, free_g, free_by_type, list(releases))
            copy = tl.moved_to(now) if built is not None else None
            if built is not None and copy is not None:   # kept as built; this cycle's reservations go on a copy
                built[name], tl = tl, copy
        if bases is not None:
            bases.lent[name] = tl
        if self.explain:
            self._items(tl, base)
        tl.log = self.booked
        return tl

    def _items(self, tl: Timeline, base: tuple) -> None:
        """The node's running jobs as the timeline's items (what explain mode says holds the node); a run past
        its limit ends "soon", never now."""
        items, first_end, now = base[5], base[6], self.now
        tl.items = list(items) if first_end > now else \
            [(s, e if e > now else now + 1, jid, kind) for s, e, jid, kind in items]

    def _node_base(self, node: Node) -> tuple:
        """(free CPUs, MiB, GPUs, free GPUs by type or None, releases by time, (start, end, job, "running") items,
        the earliest of their ends)."""
        jobs = self.state.jobs
        types = node.gpu_types
        multi = bool(types) and types.count(types[0]) != len(types)
        name = node.name
        releases: list[tuple[int, int, int, int, dict[str, int] | None]] = []
        items: list[tuple[int, int, int, str]] = []
        for jid in node.jobs:
            job = jobs[jid]
            limit = job.time_limit
            items.append((job.start_time, job.start_time + limit if limit else INF, jid, "running"))
            if job.state != RUNNING or not limit:
                continue   # unlimited jobs never give their resources back
            for a in job.alloc:
                if a.node == name:
                    by_type: dict[str, int] | None = None
                    if multi and not a.shards:
                        by_type = {}
                        for gi in a.gpus:
                            t = types[gi]
                            by_type[t] = by_type.get(t, 0) + 1
                    releases.append((job.start_time + limit, a.cpus, a.mem, 0 if a.shards else len(a.gpus), by_type))
                    break
        releases.extend(self._shared_releases(node))
        releases.sort(key=lambda r: r[0])
        free_by_type: dict[str, int] | None = None
        if multi:
            free_by_type = {}
            for t, owner in zip(types, node.gpu_owner):
                free_by_type[t] = free_by_type.get(t, 0) + (owner == 0)
        return (node.cpus - node.alloc_cpus, node.memory - node.alloc_mem, node.gpu_owner.count(0), free_by_type,
                tuple(releases), tuple(items), min((i[1] for i in items), default=INF))

    def shared_until(self, node: Node) -> dict[int, int]:
        """Each shared GPU of ``node`` (SHARED: --gres=shard jobs on it) -> when its last shard job's limit ends (INF:
        one runs unlimited)."""
        out: dict[int, int] = {}
        for jid in node.jobs:
            job = self.state.jobs[jid]
            for a in job.alloc:
                if a.node == node.name and a.shards and job.state == RUNNING:
                    end = job.start_time + job.time_limit if job.time_limit else INF
                    out[a.gpus[0]] = max(out.get(a.gpus[0], 0), end)
        return out

    def _shared_releases(self, node: Node) -> list[tuple[int, int, int, int, dict[str, int] | None]]:
        """A shared GPU comes back whole when the last of its shard jobs ends."""
        if not node.shards_per_gpu or SHARED not in node.gpu_owner:
            return []
        multi = bool(node.gpu_types) and node.gpu_types.count(node.gpu_types[0]) != len(node.gpu_types)
        return [(end, 0, 0, 1, {node.gpu_types[g]: 1} if multi else None)
                for g, end in self.shared_until(node).items() if end < INF]

    # -- eligibility

    def eligible(self, spec: ev.JobSpec, part: str) -> tuple[list[Timeline], list[Node]]:
        """Usable timelines and all candidate nodes (usable or not) of ``spec`` in ``part``."""
        key = FilterKey(part, spec.constraint, spec.nodelist, spec.exclude, spec.gpu_type, spec.shards_per_node)
        hit = self.filters.get(key)
        if hit is not None:
            return hit
        nodes = self.part_nodes.get(part, [])
        if spec.nodelist:
            wanted = set(spec.nodelist)
            nodes = [n for n in nodes if n.name in wanted]
        if spec.exclude:
            unwanted = set(spec.exclude)
            nodes = [n for n in nodes if n.name not in unwanted]
        if spec.constraint:
            nodes = [n for n in nodes if constraint_matches(spec.constraint, n.features)]
        if spec.gpu_type:
            nodes = [n for n in nodes if spec.gpu_type in n.gpu_types]
        if spec.shards_per_node:
            nodes = [n for n in nodes if n.shards_per_gpu >= spec.shards_per_node]
        tls = [self.timelines[n.name] for n in nodes if n.name in self.timelines]
        self.filters[key] = (tls, nodes)
        return tls, nodes

    def eligible_names(self, spec: ev.JobSpec, part: str) -> frozenset[str]:
        """The names of :meth:`eligible`'s usable timelines."""
        key = FilterKey(part, spec.constraint, spec.nodelist, spec.exclude, spec.gpu_type, spec.shards_per_node)
        hit = self.eligible_sets.get(key)
        if hit is None:
            hit = self.eligible_sets[key] = frozenset(tl.name for tl in self.eligible(spec, part)[0])
        return hit

    def job_size(self, job: Job, part: str) -> JobSize:
        """What the job-size factor reads of the job in ``part``: its nodes, its CPUs (as a pending job's in
        Slurm: those its tasks ask, one a node for ``--exclusive``) and its time limit in minutes."""
        req = self.request(job, part)
        limit = effective_time_limit(job.time_limit, self.parts[part]) if part in self.parts else 0
        return JobSize(req.nnodes, req.total_cpus, limit // 60 if limit else 0xFFFFFFFF)

    def request(self, job: Job, part: str) -> NodeRequest:
        """The job's per-node request in ``part`` (kept by apply for its first partition)."""
        if job.req is not None and part == job.partition:
            return job.req
        cache = self.requests.get(part)
        if cache is None:
            cache = self.requests[part] = {}
        req = cache.get(job.job_id)
        if req is None:
            shape = self.part_shapes.get(part) or partition_shape([])
            req = cache[job.job_id] = node_request(job.spec, shape)
        return req

    def search(self, job: Job, part: str, d: int, tmax: int) -> ShapeSearch:
        """The earliest-start search for this job's exact shape (created on first use).

        The first duration of a request evaluates every node; from the second on, each starts from the
        shared lower bounds of a one-second job of that request, so only the nodes near the top are evaluated.
        """
        req = self.request(job, part)
        spec = job.spec
        base_key = search_key(part, spec, req)
        key = (base_key, d, tmax)
        s = self.searches.get(key)
        if s is None:
            tls, _ = self.eligible(spec, part)
            seed = self.seeds.get(base_key)
            if seed is None and base_key in self.searched and self.focus != job.job_id:
                base = ShapeSearch(tls, req.cpus, req.mem, req.gpus, req.gpu_type, req.whole_cpus,
                                   req.whole_mem, req.whole_gpus, 1, req.nnodes, self.now, INF)
                seed = self.seeds[base_key] = base.seed()
            self.searched.add(base_key)
            s = ShapeSearch(tls, req.cpus, req.mem, req.gpus, req.gpu_type, req.whole_cpus,
                            req.whole_mem, req.whole_gpus, d, req.nnodes, self.now, tmax, seed, self.booked)
            self.searches[key] = s
        return s

    def fit_counts_for(self, spec: ev.JobSpec, part: str, req: NodeRequest) -> tuple[int, int]:
        """How many candidate nodes could ever hold one node's share, and how many are usable."""
        key = search_key(part, spec, req)
        hit = self.fit_counts.get(key)
        if hit is None:
            _tls, cands = self.eligible(spec, part)
            fit = usable = 0
            for n in cands:
                if node_can_ever_fit(n, req):
                    fit += 1
                    usable += n.usable
            hit = (fit, usable)
            self.fit_counts[key] = hit
        return hit

    def _shards_of(self, node_name: str) -> tuple[list[int], dict[int, int]]:
        """This cycle's view of a node's shards in use per GPU and when each shared GPU is held until."""
        hit = self.shards.get(node_name)
        if hit is None:
            node = self.state.nodes[node_name]
            hit = self.shards[node_name] = (list(node.shard_used), self.shared_until(node))
        return hit

    def shared_gpu(self, tl: Timeline, shards: int, gpu_type: str | None, end: int) -> int | None:
        """A GPU of the node that shard jobs share with room for ``shards`` more until ``end`` (None: none): held
        already until then, or free on the timeline from its hold's end to ``end`` (no plan wants it then)."""
        node = self.state.nodes[tl.name]
        used, until = self._shards_of(tl.name)
        owner = self.gpu_owner.get(tl.name, node.gpu_owner)
        for g, o in enumerate(owner):
            if o != SHARED or used[g] + shards > node.shards_per_gpu or gpu_type not in (None, node.gpu_types[g]):
                continue
            held = until.get(g, INF)
            garr = tl.gpu_array(node.gpu_types[g] if tl.fgt is not None else None)
            if held >= end or tl.fits_at(0, 0, 1, garr, end - held, held):
                return g
        return None

    def share(self, tl: Timeline, g: int, shards: int, end: int, gpu_type: str | None, job_id: int,
              fresh: bool = False) -> None:
        """Shard job ``job_id`` takes ``shards`` of GPU ``g`` until ``end``: the GPU is shared (``fresh``: newly,
        its booking made by the caller) and held on the timeline until its last shard job's end."""
        used, until = self._shards_of(tl.name)
        used[g] += shards
        if fresh:
            until[g] = end
            owner = self.gpu_owner.setdefault(tl.name, list(self.state.nodes[tl.name].gpu_owner))
            owner[g] = SHARED
        elif end > until.get(g, 0):
            if until.get(g, 0) < INF:
                tl.reserve(until.get(g, self.now), end, 0, 0, 1, gpu_type, job_id, "start")
            until[g] = end

    def pick_gpus(self, node_name: str, count: int, gpu_type: str | None, job_id: int) -> tuple[int, ...]:
        owner = self.gpu_owner.get(node_name)
        if owner is None:
            owner = list(self.state.nodes[node_name].gpu_owner)
            self.gpu_owner[node_name] = owner
        types = self.state.nodes[node_name].gpu_types
        picked: list[int] = []
        for i, o in enumerate(owner):
            if len(picked) == count:
                break
            if o == 0 and (gpu_type is None or types[i] == gpu_type):
                picked.append(i)
        for i in picked:
            owner[i] = job_id
        return tuple(picked)


def node_can_ever_fit(n: Node, req: NodeRequest) -> bool:
    types = n.gpu_types
    return n.cpus >= req.cpus and n.memory >= req.mem and \
        (len(types) if req.gpu_type is None else types.count(req.gpu_type)) >= req.gpus
