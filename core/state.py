"""rota's state: plain slotted dataclasses, built only by :func:`rota.core.apply.apply`.

``State`` holds primary facts (what a snapshot stores) and a few derived indexes
(rebuilt by :meth:`State.rebuild_indexes`, never stored).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .depspec import outcome_ids
from .events import AccountRecord, Association, ClusterConfig, JobSpec, NodeAlloc, NodeConfig, QosRecord, StepStarted
from .request import NodeRequest, PartitionShape, partition_shape
from .sharing import shared_spec, shared_value
from .timeaccuracy import NAMES_KEPT

from .states import (  # noqa: F401 - re-exported: the job state names live in a light module
    ACTIVE_STATES, CANCELLED, COMPLETED, FAILED, NODE_FAIL, OUT_OF_MEMORY, PENDING, PREEMPTED, RUNNING, STATE_CODES,
    TERMINAL_STATES, TIMEOUT,
)


@dataclass(slots=True)
class Job:
    job_id: int
    spec: JobSpec
    submit_seq: int
    submit_time: int
    state: str = PENDING
    hold: str | None = None                 # None, "user" or "admin"
    priority_override: int | None = None    # set by an admin update
    nice: int = 0
    time_limit: int | None = None           # explicit limit (spec or update); None = partition default
    partition: str = ""                     # chosen partition once started; first requested before
    eligible_time: int = 0
    start_time: int = 0
    end_time: int = 0
    alloc: tuple[NodeAlloc, ...] = ()
    exit_code: int = 0
    signal: int = 0
    max_rss: int = 0                        # KiB
    elapsed: int = 0
    array_job_id: int | None = None         # set on array records and tasks
    array_task_id: int | None = None        # set on started tasks
    array_pending: list[int] | None = None  # pending indices of the array's remainder record
    array_throttle: int = 0
    restarts: int = 0
    cancel_by: int | None = None            # uid that cancelled it
    backfilled: bool = False
    start_cycle: int = 0
    req: NodeRequest | None = None          # per-node request in ``partition`` (kept by apply)
    next_step: int = 0                      # the id the run's next step gets (``srun``)
    steps: dict[int, "Step"] | None = None  # the run's steps still running (None: none yet)
    preempted_by: int | None = None         # the job that preempted this run (it ends at its grace time)
    preempt_mode: str = ""                  # how: "cancel" or "requeue"
    idle_since: int | None = None           # its GPUs idle since then, as its agent reported (rota.core.idle)

    @property
    def is_array_remainder(self) -> bool:
        return self.array_pending is not None


@dataclass(slots=True)
class Step:
    """A step of a running job (``srun``): what started it, and each of its nodes' ends as reported."""

    started: StepStarted
    start: int
    state: str = RUNNING
    end: int = 0
    exit_code: int = 0
    signal: int = 0
    max_rss: int = 0                        # KiB, the largest task's
    elapsed: int = 0
    ended: dict[str, tuple[str, int, int, int]] = field(default_factory=dict)   # node -> (state, code, signal, rss)

    @property
    def step_id(self) -> int:
        return self.started.step_id

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(a.node for a in self.started.alloc)


SHARED = -1      # the owner of a GPU that --gres=shard jobs share (Node.shard_used counts their shards)


@dataclass(slots=True)
class Node:
    name: str
    index: int
    cpus: int
    memory: int
    gpu_types: list[str]                    # type of each GPU slot, by index
    features: tuple[str, ...]
    weight: int = 1
    alloc_cpus: int = 0
    alloc_mem: int = 0
    gpu_owner: list[int] = field(default_factory=list)   # job id holding each GPU index, 0 = free
    jobs: list[int] = field(default_factory=list)        # running job ids, in start order
    drain: bool = False
    down: bool = False
    not_responding: bool = False
    invalid_reg: bool = False
    registered: bool = False
    reason: str | None = None
    reason_by: str | None = None
    reason_time: int = 0
    last_busy: int = 0
    boot_time: int = 0
    reported_gpus: int | None = None
    awaiting_agent: bool = False            # agents configured and this node's never registered
    shards_per_gpu: int = 0                 # each GPU's shards (Gres=shard:N over its GPUs)
    shard_used: list[int] = field(default_factory=list)  # shards in use on each GPU (its owner is then SHARED)

    @property
    def gpu_count(self) -> int:
        return len(self.gpu_types)

    @property
    def free_gpus(self) -> int:
        return self.gpu_owner.count(0)

    @property
    def usable(self) -> bool:
        """Can take new work: not drained, down or unresponsive."""
        return not (self.drain or self.down or self.not_responding or self.awaiting_agent)

    def display_state(self) -> str:
        """Slurm-like state, e.g. IDLE, MIXED, ALLOCATED, DRAINING, DRAINED, DOWN."""
        if self.drain and not self.down and not self.awaiting_agent:
            return "DRAINING" if self.jobs else "DRAINED"
        return self.base_state()

    def base_state(self) -> str:
        """Slurm's base state, without flags such as DRAIN: DOWN, UNKNOWN, IDLE, MIXED or ALLOCATED.
        ALLOCATED means every CPU is allocated: a node whose GPUs are all taken but CPUs are not is MIXED,
        as in Slurm."""
        if self.down:
            return "DOWN"
        if self.awaiting_agent:
            return "UNKNOWN"
        if not self.jobs:
            return "IDLE"
        return "ALLOCATED" if self.alloc_cpus >= self.cpus else "MIXED"


def node_from_config(cfg: NodeConfig, index: int, agents: bool = False) -> Node:
    types: list[str] = []
    for g in cfg.gpus:
        types.extend([g.type] * g.count)
    node = Node(name=cfg.name, index=index, cpus=cfg.cpus, memory=cfg.memory, gpu_types=types,
                features=cfg.features, weight=cfg.weight, gpu_owner=[0] * len(types), awaiting_agent=agents,
                shards_per_gpu=cfg.shards // len(types) if types else 0, shard_used=[0] * len(types))
    st = cfg.state.upper()
    if st in ("DOWN", "FAIL"):
        node.down, node.reason, node.reason_by = True, "configured down", "slurm.conf"
    elif st == "DRAIN":
        node.drain, node.reason, node.reason_by = True, "configured drain", "slurm.conf"
    return node


def job_weight(job: Job) -> int:
    """What a job counts toward its user's submit limits, as slurmctld counts: each pending task of an array's
    remainder, else 1 while pending or running, 0 once it ended."""
    if job.state != PENDING and job.state != RUNNING:
        return 0
    return len(job.array_pending) if job.array_pending is not None else 1


@dataclass(slots=True)
class State:
    config: ClusterConfig | None = None
    config_seq: int = 0
    seq: int = 0                            # last applied log sequence
    now: int = 0                            # latest log timestamp seen
    next_job_id: int = 1
    cycle: int = 0                          # last logged scheduling cycle
    controller_version: str = ""
    jobs: dict[int, Job] = field(default_factory=dict)
    nodes: dict[str, Node] = field(default_factory=dict)
    # jobs purged MinJobAge after they ended that the afterok/afternotok of a job still here reads (dep_refs):
    # id -> (members that completed with exit 0, other members), all dependencies need of them
    ended: dict[int, tuple[int, int]] = field(default_factory=dict)
    # accounting (sacctmgr): accounts, users' associations (user, account), users' default accounts, QOS
    accounts: dict[str, AccountRecord] = field(default_factory=dict)
    associations: dict[tuple[str, str], Association] = field(default_factory=dict)
    default_accounts: dict[str, str] = field(default_factory=dict)
    qos: dict[str, QosRecord] = field(default_factory=dict)
    # what ended runs used (allocated x elapsed on the log's clock), decayed: per account (its own jobs) and
    # per (user, account) association, each [CPU-seconds, GPU-seconds, as of] (rota.core.usage)
    usage: dict[str, list[int]] = field(default_factory=dict)
    assoc_usage: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    # how honest limits are (rota.core.timeaccuracy): per (user, account) [accuracy ppm, runs]; per (user, job
    # name) the seconds its last completed runs used
    time_accuracy: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    time_runs: dict[str, dict[str, list[int]]] = field(default_factory=dict)    # rota.core.timeaccuracy.Runs
    # derived indexes (rebuilt, not stored):
    pending: dict[int, None] = field(default_factory=dict)
    running: dict[int, None] = field(default_factory=dict)
    array_tasks: dict[int, list[int]] = field(default_factory=dict)
    # each user's jobs that count toward submit limits (MaxSubmitJobs, MaxJobCount), as job_weight counts them
    active_in: dict[str, dict[tuple[str, str], int]] = field(default_factory=dict)   # user -> (QOS, account) -> jobs
    active_total: int = 0                   # every user's, summed
    dep_refs: dict[int, int] = field(default_factory=dict)   # job -> the jobs in the state whose afterok/afternotok name it
    part_shapes: dict[str, PartitionShape] = field(default_factory=dict)
    part_nodes: dict[str, list[Node]] = field(default_factory=dict, compare=False, repr=False)
    part_configs: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)   # name -> PartitionConfig
    default_part: str = field(default="", compare=False, repr=False)    # the config's default partition's name
    finished: deque[tuple[int, int]] = field(default_factory=deque, compare=False)   # (end time, job id), purge order
    min_job_age: int = 300                  # from the config; 0 keeps finished jobs forever
    # records the reducer could not apply, as (sequence, why): reported by the shell, never stored
    set_aside: list[tuple[int, str]] = field(default_factory=list, compare=False, repr=False)

    def refresh_partition_shapes(self) -> None:
        """Recompute each partition's node shape (after a configuration change)."""
        self.part_shapes, self.part_nodes, self.part_configs, self.default_part = {}, {}, {}, ""
        if self.config is not None:
            self.min_job_age = self.config.scheduler.min_job_age
            default = self.config.default_partition()
            self.default_part = default.name if default is not None else ""
            for p in self.config.partitions:
                self.part_configs[p.name] = p
                nodes = self.part_nodes[p.name] = [self.nodes[n] for n in p.nodes if n in self.nodes]
                self.part_shapes[p.name] = partition_shape(nodes, p)

    def rebuild_indexes(self) -> None:
        """Recompute the derived indexes from the primary facts."""
        self.refresh_partition_shapes()
        self.pending = {}
        self.running = {}
        self.array_tasks = {}
        self.active_in, self.active_total, self.dep_refs = {}, 0, {}
        finished = []
        for jid, job in self.jobs.items():
            self.recount(job, 0)
            if job.spec.dependency and job.array_task_id is None:    # a job as submitted (not an array's task)
                self.reads_outcomes(job.spec.dependency, 1)
            if job.state == PENDING:
                self.pending[jid] = None
            elif job.state == RUNNING:
                self.running[jid] = None
            elif job.state in TERMINAL_STATES:
                finished.append((job.end_time, jid))
            if job.array_job_id is not None and job.array_task_id is not None:
                self.array_tasks.setdefault(job.array_job_id, []).append(jid)
        finished.sort()
        self.finished = deque(finished)
        for tasks in self.array_tasks.values():
            tasks.sort()
        # (a state saved before outcomes left with their last reader holds every one)
        self.ended = {jid: v for jid, v in self.ended.items() if jid in self.dep_refs}

    def recount(self, job: Job, before: int) -> None:
        """Bring the job's user's count of active jobs up to date: ``before`` is its job_weight before it changed."""
        delta = job_weight(job) - before
        if delta:
            self.active_total += delta
            spec = job.spec
            user = spec.user
            mine = self.active_in.get(user)
            if mine is None:
                mine = self.active_in[user] = {}
            key = (spec.qos, spec.account)
            n = mine.get(key, 0) + delta
            if n:
                mine[key] = n
            else:
                del mine[key]
                if not mine:
                    del self.active_in[user]

    def reads_outcomes(self, dependency: str, step: int) -> None:
        """A job with this dependency was submitted (``step`` 1) or purged (-1): a purged job's outcome that no job
        in the state reads any more leaves it."""
        refs = self.dep_refs
        for jid in outcome_ids(dependency):
            n = refs.get(jid, 0) + step
            if n > 0:
                refs[jid] = n
            else:
                refs.pop(jid, None)
                self.ended.pop(jid, None)

    def active_jobs(self, user: str | None = None) -> int:
        """The jobs that count toward MaxJobCount: every user's active count (or ``user``'s)."""
        if user is None:
            return self.active_total
        return sum(self.active_in.get(user, {}).values())

    def members(self, job_id: int) -> list[Job]:
        """The job, or for an array's id every task record and the head (the pending remainder).

        The one definition of array membership: cancel, hold, release, update and requeue act on
        these, and the array leaves the state (MinJobAge) when all of them have ended.
        """
        job = self.jobs.get(job_id)
        if job is None:
            return []
        if job.array_job_id != job_id:
            return [job]
        jobs = self.jobs
        out = [jobs[t] for t in self.array_tasks.get(job_id, ()) if t in jobs]
        if job.array_task_id is None:
            out.append(job)
        return out

    def counted_members(self, job_id: int) -> list[Job] | None:
        """The members whose ends a dependency on ``job_id`` waits for (None: no such job).

        An array's head counts while it still holds pending tasks, or when no task ever ran; an
        emptied remainder (every index started or cancelled) is not a job of its own.
        """
        members = self.members(job_id)
        if not members:
            return None
        head = members[-1]
        if head.job_id == job_id and head.array_task_id is None and len(members) > 1 and not head.array_pending:
            return members[:-1]
        return members

    def partition(self, name: str):  # -> PartitionConfig | None
        return self.part_configs.get(name)


# ---------------------------------------------------------------- snapshots
#
# A snapshot is the primary facts as compact JSON: jobs and nodes as positional rows (field order
# below), job specs stored once and referenced by index. Loading trusts nothing but the version.

SNAPSHOT_VERSION = 7
_READS = (6, 7)                            # 7: each environment once, the specs naming it
_JOB_SCALARS = ("job_id", "submit_seq", "submit_time", "state", "hold", "priority_override", "nice",
                "time_limit", "partition", "eligible_time", "start_time", "end_time", "exit_code", "signal",
                "max_rss", "elapsed", "array_job_id", "array_task_id", "array_pending", "array_throttle",
                "restarts", "cancel_by", "backfilled", "start_cycle", "next_step", "preempted_by", "preempt_mode",
                "idle_since")
_NODE_SCALARS = ("name", "index", "cpus", "memory", "gpu_types", "weight", "alloc_cpus", "alloc_mem",
                 "gpu_owner", "jobs", "drain", "down", "not_responding", "invalid_reg", "registered", "reason",
                 "reason_by", "reason_time", "last_busy", "boot_time", "reported_gpus", "awaiting_agent",
                 "shards_per_gpu", "shard_used")
_META = ("config_seq", "seq", "now", "next_job_id", "cycle", "controller_version")


_dump_spec = JobSpec.__pydantic_serializer__.to_json     # a spec's JSON, with no dict made on the way
_ENV = {"env"}


def dump_snapshot(state: State) -> bytes:
    """Serialise the primary facts of ``state`` as compact JSON bytes."""
    import orjson

    spec_index: dict[int, int] = {}
    specs: list[Any] = []
    env_index: dict[int, int] = {}
    envs: list[dict[str, str]] = []
    spec_envs: list[int] = []
    jobs = []
    for job in state.jobs.values():
        key = id(job.spec)
        si = spec_index.get(key)
        if si is None:
            si = spec_index[key] = len(specs)
            specs.append(orjson.Fragment(_dump_spec(job.spec, exclude_defaults=True, exclude=_ENV)))
            env = job.spec.env
            ei = env_index.get(id(env))
            if ei is None:
                ei = env_index[id(env)] = len(envs)
                envs.append(env)
            spec_envs.append(ei)
        jobs.append([si, [getattr(job, f) for f in _JOB_SCALARS],
                     [[a.node, a.cpus, a.mem, a.gpus] for a in job.alloc],
                     list(job.req) if job.req is not None else None,
                     [[st.started.model_dump(mode="json", exclude_defaults=True), st.start,
                       [[n, *r] for n, r in st.ended.items()]] for st in (job.steps or {}).values()]])
    nodes = [[[getattr(n, f) for f in _NODE_SCALARS], n.features] for n in state.nodes.values()]
    doc = {"snapshot_version": SNAPSHOT_VERSION, "meta": [getattr(state, f) for f in _META],
           "config": state.config.model_dump(mode="json") if state.config is not None else None,
           "envs": envs, "specs": specs, "spec_envs": spec_envs, "jobs": jobs, "nodes": nodes,
           # most purged jobs are single jobs that did (1, 0) or did not (0, 1) complete: two id lists
           "ended_ok": [k for k, v in state.ended.items() if v == (1, 0)],
           "ended_bad": [k for k, v in state.ended.items() if v == (0, 1)],
           "ended": [[k, g, b] for k, (g, b) in state.ended.items() if (g, b) not in ((1, 0), (0, 1))],
           "accounting": {"accounts": [a.model_dump(mode="json") for a in state.accounts.values()],
                          "associations": [a.model_dump(mode="json") for a in state.associations.values()],
                          "defaults": state.default_accounts,
                          "qos": [q.model_dump(mode="json") for q in state.qos.values()],
                          "usage": state.usage,
                          "assoc_usage": [[u, a, *v] for (u, a), v in state.assoc_usage.items()]},
           "time": {"accuracy": [[u, a, *v] for (u, a), v in state.time_accuracy.items()],
                    "runs": [[u, n, v] for u, names in state.time_runs.items() for n, v in names.items()]}}
    return orjson.dumps(doc)


def load_snapshot(data: bytes) -> State:
    """Load a snapshot written by :func:`dump_snapshot`; the result equals the dumped state."""
    import orjson

    try:
        raw: dict[str, Any] = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"snapshot is not JSON: {exc}") from None
    if not isinstance(raw, dict) or raw.get("snapshot_version") not in _READS:
        found = raw.get("snapshot_version") if isinstance(raw, dict) else None
        raise ValueError(f"unsupported snapshot version {found!r} (this rota reads {SNAPSHOT_VERSION})")
    try:
        return _load(raw)
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise ValueError(f"corrupt snapshot: {type(exc).__name__}: {exc}") from None


def _spec_docs(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """The specs' documents, each with its environment (version 7 keeps each environment once)."""
    docs = raw["specs"]
    if "envs" in raw:
        envs = raw["envs"]
        for doc, ei in zip(docs, raw["spec_envs"], strict=True):
            if envs[ei]:
                doc["env"] = envs[ei]
    return docs


def _load(raw: dict[str, Any]) -> State:
    state = State(config=ClusterConfig.model_validate(raw["config"]) if raw["config"] is not None else None)
    for f, v in zip(_META, raw["meta"], strict=True):
        setattr(state, f, v)
    specs = [shared_spec(JobSpec.model_validate(s)) for s in _spec_docs(raw)]
    jobs = state.jobs
    for si, scalars, alloc, req, steps in raw["jobs"]:
        job = Job(job_id=0, spec=specs[si], submit_seq=0, submit_time=0)
        for f, v in zip(_JOB_SCALARS, scalars, strict=True):
            setattr(job, f, v)
        job.alloc = tuple(NodeAlloc.model_construct(node=a[0], cpus=a[1], mem=a[2], gpus=tuple(a[3]))
                          for a in alloc)
        job.req = shared_value(NodeRequest(*req)) if req is not None else None
        for started, start, ended in steps:
            step = Step(StepStarted.model_validate(started), start,
                        ended={r[0]: (r[1], r[2], r[3], r[4]) for r in ended})
            job.steps = job.steps or {}
            job.steps[step.step_id] = step
        jobs[job.job_id] = job
    for scalars, features in raw["nodes"]:
        node = Node(name="", index=0, cpus=0, memory=0, gpu_types=[], features=tuple(features))
        for f, v in zip(_NODE_SCALARS, scalars, strict=True):
            setattr(node, f, v)
        state.nodes[node.name] = node
    ended = dict.fromkeys(raw["ended_ok"], (1, 0))
    ended.update(dict.fromkeys(raw["ended_bad"], (0, 1)))
    ended.update({k: (g, b) for k, g, b in raw["ended"]})
    state.ended = ended
    acct = raw.get("accounting") or {}
    for a in acct.get("accounts", ()):
        record = AccountRecord.model_validate(a)
        state.accounts[record.name] = record
    for a in acct.get("associations", ()):
        assoc = Association.model_validate(a)
        state.associations[(assoc.user, assoc.account)] = assoc
    state.default_accounts = dict(acct.get("defaults", {}))
    for q in acct.get("qos", ()):
        qos = QosRecord.model_validate(q)
        state.qos[qos.name] = qos
    state.usage = {k: [int(v[0]), int(v[1]), int(v[2])] for k, v in acct.get("usage", {}).items()}
    state.assoc_usage = {(u, a): [int(c), int(g), int(t)] for u, a, c, g, t in acct.get("assoc_usage", ())}
    time = raw.get("time") or {}
    state.time_accuracy = {(u, a): [int(p), int(n)] for u, a, p, n in time.get("accuracy", ())}
    for u, n, v in time.get("runs", ()):
        names = state.time_runs.setdefault(u, {})
        names[n] = [int(x) for x in v]
        if len(names) > NAMES_KEPT:
            del names[next(iter(names))]
    state.rebuild_indexes()
    return state
