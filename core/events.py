"""The events of rota's log: a pydantic v2 discriminated union on ``type``.

Every event carries ``v`` (its schema version). Events evolve by adding fields with defaults;
an older version is upcast on read by :func:`upcast` (never rewritten in the log). The
:class:`Envelope` adds what the log knows: sequence, append time, actor and idempotency id.
"""
from __future__ import annotations

from typing import Annotated, Any, Callable, Literal, Mapping, Union

from pydantic import BaseModel, ConfigDict, Field, SerializationInfo, TypeAdapter, model_serializer, model_validator

from .sharing import KEEP, share_spec


class Model(BaseModel):
    """Base of every event payload: immutable, unknown fields rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid")


# ---------------------------------------------------------------- cluster configuration


class GpuConfig(Model):
    """GPUs of one type on a node (gres.conf / ``Gres=gpu:TYPE:N``)."""

    type: str = ""          # "" = untyped
    count: int = 0


class NodeConfig(Model):
    """One node as slurm.conf describes it (``NodeName=``)."""

    name: str
    cpus: int
    memory: int             # MiB (RealMemory)
    gpus: tuple[GpuConfig, ...] = ()
    features: tuple[str, ...] = ()
    weight: int = 1
    state: str = "UNKNOWN"  # configured State= (UNKNOWN, DOWN, DRAIN, ...)
    shards: int = 0         # ``Gres=...,shard:N``: N shards spread evenly over its GPUs (--gres=shard:K jobs share one)

    @property
    def gpu_count(self) -> int:
        return sum(g.count for g in self.gpus)


class PartitionConfig(Model):
    """One partition: its nodes, limits, priority tier, state and who may use it (``PartitionName=``)."""

    name: str
    nodes: tuple[str, ...]
    max_time: int = 0                 # seconds, 0 = UNLIMITED
    default_time: int | None = None   # seconds; None = use max_time
    priority_tier: int = 1
    priority_job_factor: int = 1
    state: Literal["UP", "DOWN", "DRAIN", "INACTIVE"] = "UP"
    allow_accounts: tuple[str, ...] = ("ALL",)
    default: bool = False
    max_nodes: int = 0                # 0 = unlimited
    min_nodes: int = 1
    def_mem_per_cpu: int | None = None    # MiB a CPU brings to a job that asks no memory (DefMemPerCPU)
    def_mem_per_node: int | None = None   # MiB a node brings to such a job (DefMemPerNode); None: rota's default


class PriorityWeights(Model):
    """The multifactor priority: weights (``PriorityWeight*``), ``PriorityMaxAge``, and how usage is
    decayed (``PriorityDecayHalfLife``) and turned into a fair-share factor (``PriorityFlags``: Fair Tree,
    Slurm's default, or the classic ``2^(-U/S)`` with ``NO_FAIR_TREE``)."""

    age: int = 1000
    fairshare: int = 0
    job_size: int = 0
    partition: int = 1000
    qos: int = 0
    max_age: int = 7 * 86400          # PriorityMaxAge, seconds
    favor_small: bool = False
    decay_half_life: int = 7 * 86400  # PriorityDecayHalfLife, seconds (0: no decay)
    fair_tree: bool = True            # False: PriorityFlags=NO_FAIR_TREE (classic fair-share)
    small_relative_to_time: bool = False   # PriorityFlags=SMALL_RELATIVE_TO_TIME: job size per minute of its limit
    # rota's RotaPriorityWeightAccuracy: weight of how much of their limits the association's runs used (0: off)
    accuracy: int = 0


class SchedulerParams(Model):
    """How the scheduler runs: its policy, backfill window and resolution, limits (``SchedulerParameters``)."""

    policy: Literal["fifo", "easy", "easy_strict", "conservative"] = "conservative"
    bf_window: int = 1440 * 60        # seconds
    bf_resolution: int = 60           # seconds
    bf_max_job_test: int = 0          # 0 = every pending job
    # "rota": the policy runs in every cycle (at each change); "slurm" (rota_cadence=slurm): as Slurm's
    # controller, a change gets the main scheduler's strict-priority pass (fifo) and the policy runs every
    # bf_interval seconds
    cadence: Literal["rota", "slurm"] = "rota"
    # "resources": a reservation holds what its job needs on its nodes, later jobs may use the rest;
    # "nodes" (rota_reserve=nodes): it holds its nodes whole, as Slurm's backfill does
    reserve: Literal["resources", "nodes"] = "resources"
    bf_interval: int = 30             # seconds
    max_array_size: int = 1001
    enforce_part_limits: Literal["NO", "ANY", "ALL"] = "NO"
    min_job_age: int = 300
    max_job_count: int = 10000        # MaxJobCount: jobs pending or running at once, every user's
    # rota_max_submit_per_user: one user's share of them when no QOS or association limit says otherwise
    # (0: half of MaxJobCount), so one user's flood cannot fill the queue for everyone
    max_submit_per_user: int = 0


class QosConfig(Model):
    """A quality of service and the priority it adds."""

    name: str
    priority: int = 0


class AuthConfig(Model):
    """Who may do what, and how long a credential lives (slurm.conf ``SlurmUser``, ``AuthInfo=ttl=``,
    ``PrivateData``, and rota's ``AdminUsers``/``OperatorUsers``, Slurm's AdminLevel as names)."""

    slurm_user: str = "root"                  # the service user: an administrator
    admins: tuple[str, ...] = ()              # AdminLevel=Administrator
    operators: tuple[str, ...] = ()           # AdminLevel=Operator
    cred_ttl: int = 300                       # seconds a credential lives (munge's default)
    private_data: tuple[str, ...] = ()        # "jobs": users see only their own jobs


class RateLimit(Model):
    """Each user's submissions through a token bucket (Slurm's ``SlurmctldParameters=rl_enable,rl_bucket_size=N,
    rl_refill_rate=N,rl_refill_period=N``): up to ``bucket_size`` jobs at once, ``refill_rate`` more every
    ``refill_period`` seconds; a bulk request counts each of its jobs. Operators and administrators are exempt."""

    enabled: bool = False
    bucket_size: int = 30
    refill_rate: int = 2
    refill_period: int = 1


class IdleGpuPolicy(Model):
    """What happens to a job whose GPUs sit idle (``RotaIdleGpu=after=2h,action=cancel,grace=30m,...``): after
    ``after`` seconds idle its owner is warned; ``grace`` seconds later the job is cancelled or requeued (``action``
    warn: only warned). ``partitions``: where it applies (all when empty); ``exempt_qos``: QOS it spares."""

    after: int = 0                    # seconds; 0 = off
    action: Literal["warn", "cancel", "requeue"] = "warn"
    grace: int = 0
    partitions: tuple[str, ...] = ()
    exempt_qos: tuple[str, ...] = ()


class ClusterConfig(Model):
    """The whole cluster configuration, as parsed from slurm.conf (or made for this machine)."""

    cluster_name: str = "rota"
    nodes: tuple[NodeConfig, ...]
    partitions: tuple[PartitionConfig, ...]
    scheduler: SchedulerParams = SchedulerParams()
    priority: PriorityWeights = PriorityWeights()
    qos: tuple[QosConfig, ...] = (QosConfig(name="normal"),)
    gres_types: tuple[str, ...] = ("gpu",)
    auth: AuthConfig = AuthConfig()
    agents: bool = False          # nodes run jobs through agents: a node takes work once its agent registered
    accounting_enforce: tuple[str, ...] = ()   # AccountingStorageEnforce: associations, limits, qos, safe
    preempt_type: Literal["none", "qos"] = "none"   # PreemptType: preempt/none or preempt/qos
    preempt_mode: Literal["off", "cancel", "requeue"] = "off"   # PreemptMode: for QOS that set none
    controllers: tuple[str, ...] = ()  # SlurmctldHost lines, in order (the first is the primary)
    rate_limit: RateLimit = RateLimit()
    idle_gpu: IdleGpuPolicy = IdleGpuPolicy()

    def default_partition(self) -> PartitionConfig | None:
        for p in self.partitions:
            if p.default:
                return p
        return self.partitions[0] if self.partitions else None


# ---------------------------------------------------------------- job request


class JobSpec(Model):
    """What the user asked for, as validated at submit (Slurm's option names in comments)."""

    name: str = "sbatch"                  # --job-name
    user: str = "root"
    uid: int = 0
    gid: int = 0
    account: str = ""                     # --account
    qos: str = "normal"                   # --qos
    qos_given: bool = False               # --qos was named (else the association's default QOS applies)
    partitions: tuple[str, ...] = ()      # --partition (empty = default partition)
    nodes: int = 1                        # --nodes (minimum)
    nodes_given: bool = False
    ntasks: int = 1                       # --ntasks
    ntasks_given: bool = False
    ntasks_per_node: int | None = None    # --ntasks-per-node
    cpus_per_task: int = 1                # --cpus-per-task
    cpus_per_task_given: bool = False
    mincpus: int = 0                      # --mincpus: at least this many CPUs on each node
    mem_per_node: int | None = None       # --mem, MiB; 0 = whole node
    mem_per_cpu: int | None = None        # --mem-per-cpu, MiB
    gpus_per_node: int = 0                # --gres=gpu[:type]:N / --gpus-per-node
    shards_per_node: int = 0              # --gres=shard:N: N shards of one GPU it shares with other such jobs
    gpus_total: int | None = None         # --gpus
    gpu_type: str | None = None
    time_limit: int | None = None         # --time, seconds; 0 = UNLIMITED; None = partition default
    time_min: int | None = None
    constraint: str | None = None         # --constraint: "a&b", "a|b", "a,b"
    nodelist: tuple[str, ...] = ()        # --nodelist (required nodes)
    exclude: tuple[str, ...] = ()         # --exclude
    exclusive: bool = False
    overcommit: bool = False              # -O/--overcommit: CPUs as for one task per node, however many tasks
    begin: int | None = None              # --begin, epoch seconds
    hold: bool = False                    # --hold
    dependency: str | None = None         # --dependency, raw
    array: str | None = None              # --array, raw
    requeue: bool = False
    nice: int = 0
    mail_type: tuple[str, ...] = ()       # --mail-type, expanded (ALL named by its parts): rota.core.notify
    mail_user: str = ""                   # --mail-user (the submitting user when empty)
    # --time=auto: the controller set time_limit from the user's own completed runs of jobs with this name
    time_auto: bool = False
    script: str = ""
    argv: tuple[str, ...] = ()
    workdir: str = "/"
    env: dict[str, str] = Field(default_factory=dict)
    output: str | None = None
    error: str | None = None
    input: str | None = None
    open_mode: Literal["append", "truncate"] = "truncate"
    comment: str | None = None
    signal: str | None = None
    submit_host: str = ""
    submit_line: str = ""
    gpu_given: bool = False
    allocation: bool = False              # an allocation for ``srun``/``salloc``: no batch script of its own

    @model_validator(mode="after")
    def _shared(self) -> "JobSpec":
        share_spec(self, SPEC_FIELDS)      # a deep queue repeats its environment and script: one copy per process
        return self

    @model_serializer(mode="plain")
    def _dump(self, info: SerializationInfo) -> dict[str, Any]:
        d = self.__dict__
        doc = d if info.exclude_defaults else {k: d.get(k, v) for k, v in SPEC_FIELDS}
        leave = info.exclude
        return {k: v for k, v in doc.items() if k not in leave} if leave else doc

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> "JobSpec":
        copied = super().model_copy(update=update, deep=deep)
        share_spec(copied, SPEC_FIELDS)     # as every spec is: equal specs have equal dicts
        return copied


# A spec's __dict__ leaves out the fields at their default (rota.core.sharing): the class holds those whose default
# is an immutable value, and a spec's dump puts them back (every field, in order; or, with exclude_defaults, none).
SPEC_FIELDS: tuple[tuple[str, Any], ...] = tuple(
    (name, f.default if f.default_factory is None and isinstance(f.default, (type(None), bool, int, str, tuple))
     else KEEP) for name, f in JobSpec.model_fields.items())
for _name, _default in SPEC_FIELDS:
    if _default is not KEEP:
        type.__setattr__(JobSpec, _name, _default)


# ---------------------------------------------------------------- allocations


class NodeAlloc(Model):
    """What a job holds on one node: CPUs, memory and the exact GPUs."""

    node: str
    cpus: int
    mem: int                      # MiB
    gpus: tuple[int, ...] = ()    # concrete GPU indices on the node
    shards: int = 0               # shards of ``gpus[0]`` it holds (--gres=shard:N); the GPU is shared, not its own


class Start(Model):
    """One job (or array task) a cycle started: where, with what, and for how long."""

    job_id: int                   # the running job's own id (a new id for split array tasks)
    array_job_id: int | None = None
    array_task_id: int | None = None
    partition: str
    alloc: tuple[NodeAlloc, ...]
    time_limit: int               # effective seconds, 0 = UNLIMITED
    backfilled: bool = False


# ---------------------------------------------------------------- the events


class ClusterConfigured(Model):
    """The cluster's configuration became this one (at first start, and on every change an admin applies)."""

    type: Literal["cluster.configured"] = "cluster.configured"
    v: int = 1
    config: ClusterConfig
    source: str = ""              # file name / "auto"


class ControllerStarted(Model):
    """A controller took over writing the log: its version, policy and host (who decided what follows)."""

    type: Literal["controller.started"] = "controller.started"
    v: int = 1
    version: str
    policy: str
    host: str = ""
    name: str = ""                # which controller leads from this sequence on (several may stand by)
    audit_key: str = ""           # the public key (hex) its signatures of the log's hash chain verify with


class JobSubmitted(Model):
    """A job was accepted into the queue with this id and this validated request."""

    type: Literal["job.submitted"] = "job.submitted"
    v: int = 1
    job_id: int
    spec: JobSpec


class JobCancelled(Model):
    """A user or admin cancelled a job, some of an array's tasks, or all of it (pending parts end now; running
    parts end when their agent reports, with the signal it was told to send).
    """

    type: Literal["job.cancelled"] = "job.cancelled"
    v: int = 1
    job_id: int
    tasks: tuple[int, ...] | None = None   # array task indices; None = the whole job
    by_uid: int = 0
    signal: int = 15
    reason: str = ""              # why, when a policy cancelled it (its GPUs idle)


class JobHeld(Model):
    """A pending job was held (by its owner, or by an operator: an admin hold its owner cannot release)."""

    type: Literal["job.held"] = "job.held"
    v: int = 1
    job_id: int
    admin: bool = False


class JobReleased(Model):
    """A held job may run again."""

    type: Literal["job.released"] = "job.released"
    v: int = 1
    job_id: int


class JobUpdated(Model):
    """A job's time limit, priority or nice value was changed (``scontrol update``)."""

    type: Literal["job.updated"] = "job.updated"
    v: int = 1
    job_id: int
    time_limit: int | None = None
    priority: int | None = None
    nice: int | None = None


class JobRequeued(Model):
    """A job that ran goes back to the queue under the same id (``scontrol requeue``; optionally held)."""

    type: Literal["job.requeued"] = "job.requeued"
    v: int = 1
    job_id: int
    hold: bool = False
    user_hold: bool = False       # held by its owner (requeuehold by a user), not by an administrator
    reason: str = ""              # why, when a policy requeued it (its GPUs idle)


class Victim(Model):
    """A running job preempted for another: how it stops (``cancel``: PREEMPTED; ``requeue``: back to the
    queue, keeping its id) and after how long (GraceTime: SIGTERM now, killed when it runs out)."""

    job_id: int
    restarts: int = 0             # the run preempted
    mode: Literal["cancel", "requeue"]
    grace: int = 0                # seconds


class Preemption(Model):
    """A pending job that preempts running jobs of QOS its own QOS may preempt (PreemptType=preempt/qos):
    the victims, and every candidate it chose them from, in the order tried (fewest victims per node,
    then the lowest QOS priority, then the youngest)."""

    by: int
    victims: tuple[Victim, ...]
    candidates: tuple[int, ...] = ()


class JobsStarted(Model):
    """One scheduling cycle's decisions (only cycles that started or preempted something are logged)."""

    type: Literal["jobs.started"] = "jobs.started"
    v: int = 1
    cycle: int
    now: int
    policy: str
    starts: tuple[Start, ...]
    preemptions: tuple[Preemption, ...] = ()
    shadow: tuple[int, int] | None = None     # easy_strict: (head job, shadow) the cycle kept from before


JobEndState = Literal["COMPLETED", "FAILED", "TIMEOUT", "OUT_OF_MEMORY", "CANCELLED", "NODE_FAIL"]


class JobExited(Model):
    """A running job ended, as its node's agent saw it: how (state), exit code, signal, peak memory, run time."""

    type: Literal["job.exited"] = "job.exited"
    v: int = 1
    job_id: int
    state: JobEndState
    exit_code: int = 0
    signal: int = 0
    max_rss: int = 0              # KiB
    elapsed: int = 0              # seconds
    node: str = ""
    reason: str = ""              # why it could not run, when it never started (a file it cannot open)
    released: bool = False        # an allocation its ``srun``/``salloc`` gave back (its agent is told to stop it)


class StepAlloc(Model):
    """What one node gives a step from its job's allocation there: its tasks (global ranks), CPUs, memory, GPUs."""

    node: str
    tasks: tuple[int, ...]        # the step's task ranks on this node, ascending
    cpus: int
    mem: int = 0                  # MiB; 0 = the job's memory on this node
    gpus: tuple[int, ...] = ()    # concrete GPU indices (a subset of the job's on this node)
    gpus_per_task: int = 0        # each task sees only its own slice of ``gpus`` when set


class StepStarted(Model):
    """A step began inside a running job's allocation (``srun``): its id, its tasks and where they run.

    ``io`` is where the step's ``srun`` waits for the nodes' agents to connect for stdin, stdout and
    stderr (``host:port``, empty when the tasks write to files); ``io_key`` is the one-time secret they
    present there.
    """

    type: Literal["step.started"] = "step.started"
    v: int = 1
    job_id: int
    restarts: int = 0
    step_id: int
    name: str
    ntasks: int
    cpus_per_task: int = 1
    alloc: tuple[StepAlloc, ...]
    argv: tuple[str, ...]
    workdir: str = "/"
    env: dict[str, str] = Field(default_factory=dict)
    io: str = ""
    io_key: str = ""
    output: str | None = None
    error: str | None = None
    input: str | None = None
    label: bool = False


StepEndState = Literal["COMPLETED", "FAILED", "CANCELLED", "OUT_OF_MEMORY", "TIMEOUT", "NODE_FAIL"]


class StepEnded(Model):
    """One node's tasks of a step ended, as that node's agent saw them (the worst of its tasks); the step
    has ended once every node of it has reported."""

    type: Literal["step.ended"] = "step.ended"
    v: int = 1
    job_id: int
    restarts: int = 0
    step_id: int
    node: str
    state: StepEndState
    exit_code: int = 0
    signal: int = 0
    max_rss: int = 0              # KiB, the largest task's on this node
    elapsed: int = 0


class QosRecord(Model):
    """A QOS as ``sacctmgr`` defines it: its priority and what it allows each user's jobs."""

    name: str
    description: str = ""
    priority: int = 0
    max_jobs_per_user: int | None = None          # MaxJobsPerUser: running at once
    max_submit_jobs_per_user: int | None = None   # MaxSubmitJobsPerUser: pending and running
    max_tres_per_user: dict[str, int] = Field(default_factory=dict)   # MaxTRESPerUser: cpu, mem, gres/gpu
    max_wall: int | None = None                   # MaxWall, seconds
    preempt: tuple[str, ...] = ()                 # QOS whose jobs this one's may preempt
    preempt_mode: str = "cluster"                 # how its jobs stop when preempted: cluster, off, cancel, requeue
    grace_time: int = 0                           # GraceTime, seconds between SIGTERM and the kill


class AccountRecord(Model):
    """An account in the tree (``sacctmgr add account``): its parent and its fair-share shares."""

    name: str
    parent: str = "root"
    description: str = ""
    organization: str = ""
    fairshare: int = 1
    grp_tres: dict[str, int] = Field(default_factory=dict)   # GrpTRES: what the account's running jobs may hold
    grp_jobs: int | None = None                              # GrpJobs: how many of them may run
    grp_tres_mins: dict[str, int] = Field(default_factory=dict)   # GrpTRESMins: cpu and gres/gpu minutes in all


class Association(Model):
    """A user's membership of an account, with the QOS it may use and its own limits."""

    user: str
    account: str
    fairshare: int = 1
    qos: tuple[str, ...] = ("normal",)
    default_qos: str = ""
    max_jobs: int | None = None
    max_submit_jobs: int | None = None


class AccountingChanged(Model):
    """``sacctmgr`` changed accounts, users' associations or QOS: the new records whole, and what was deleted."""

    type: Literal["accounting.changed"] = "accounting.changed"
    v: int = 1
    accounts: tuple[AccountRecord, ...] = ()
    deleted_accounts: tuple[str, ...] = ()
    associations: tuple[Association, ...] = ()
    deleted_associations: tuple[tuple[str, str], ...] = ()    # (user, account)
    default_accounts: dict[str, str] = Field(default_factory=dict)   # user -> default account
    qos: tuple[QosRecord, ...] = ()
    deleted_qos: tuple[str, ...] = ()
    by: str = ""


class GpuInfo(Model):
    """One GPU a node's agent found (NVML): index, UUID, model, type and memory."""

    index: int
    uuid: str = ""
    model: str = ""
    type: str = ""
    memory: int = 0               # MiB


class NodeRegistered(Model):
    """A node's agent (re)started and reported what the node has and which jobs it still runs."""

    type: Literal["node.registered"] = "node.registered"
    v: int = 1
    node: str
    cpus: int
    memory: int
    gpus: tuple[GpuInfo, ...] = ()
    agent_version: str = ""
    boot_time: int = 0
    running: tuple[int, ...] | None = None   # job ids the agent still runs (None = not reported)


class NodeDrained(Model):
    """A node takes no new jobs (its running ones finish), with the reason and who said so."""

    type: Literal["node.drained"] = "node.drained"
    v: int = 1
    node: str
    reason: str
    by: str = "root"


class NodeResumed(Model):
    """A drained or down node takes jobs again (an admin's ``scontrol update State=RESUME``)."""

    type: Literal["node.resumed"] = "node.resumed"
    v: int = 1
    node: str
    by: str = "root"
    undrain_only: bool = False


class NodeDown(Model):
    """A node is down: its jobs fail, or go back to the queue when they asked to be requeued."""

    type: Literal["node.down"] = "node.down"
    v: int = 1
    node: str
    reason: str
    by: str = "root"


class NodeNotResponding(Model):
    """A node's agent has been silent half the timeout: the node takes no new jobs until it is heard."""

    type: Literal["node.not_responding"] = "node.not_responding"
    v: int = 1
    node: str
    reason: str = "Not responding"


class HealthFault(Model):
    """A node's agent found a fault (an NVML XID, a failed health check): the node drains with this reason, or,
    for a warning (``drains`` False: an application's XID, throttling...), it is only recorded. A fault that took
    a GPU from under its job (rota.core.gpuhealth.gpu_gone) ends that job, requeued where it allows."""

    type: Literal["node.health_fault"] = "node.health_fault"
    v: int = 1
    node: str
    reason: str                   # readable, e.g. "gpu 2: xid 79 (fell off the bus): RESTART_BM"
    gpu_index: int | None = None
    code: str = ""                # "xid:79", "remap:pending", "lost", "throttle", "pcie", "temp", "healthcheck"
    action: str = ""              # NVIDIA's resolution bucket, e.g. RESET_GPU (rota.core.gpuhealth)
    drains: bool = True


class GpuSample(Model):
    """One NVML reading of one GPU of a job: when, which GPU, its utilisation (percent) and memory in use (MiB)."""

    t: int
    gpu: int
    util: int
    mem: int


class GpuIdle(Model):
    """A job's agent found its GPUs idle since ``since``: the samples that show it (``rota idle``, the idle
    policy of rota.core.idle, and ``why`` read them)."""

    type: Literal["job.gpu_idle"] = "job.gpu_idle"
    v: int = 1
    node: str
    job_id: int
    restarts: int = 0
    since: int
    samples: tuple[GpuSample, ...] = ()


class GpuBusy(Model):
    """The GPUs of a job reported idle are in use again."""

    type: Literal["job.gpu_busy"] = "job.gpu_busy"
    v: int = 1
    node: str
    job_id: int
    restarts: int = 0


class RequestDenied(Model):
    """A request refused for want of rights: the audit trail of attempts (changes no state)."""

    type: Literal["request.denied"] = "request.denied"
    v: int = 1
    verb: str                     # the API verb, e.g. "cancel"
    uid: int                      # the authenticated caller
    user: str
    host: str = ""                # where the caller's credential was issued
    target: str = ""              # "job 12", "node gpu01"
    reason: str = ""              # Slurm's words, e.g. "Access/permission denied"


EVENT_TYPES: tuple[type[Model], ...] = (
    ClusterConfigured, ControllerStarted, JobSubmitted, JobCancelled, JobHeld, JobReleased,
    JobUpdated, JobRequeued, JobsStarted, JobExited, NodeRegistered, NodeDrained,
    NodeResumed, NodeDown, NodeNotResponding, HealthFault, RequestDenied, StepStarted, StepEnded,
    AccountingChanged, GpuIdle, GpuBusy,
)

Event = Annotated[Union[ClusterConfigured, ControllerStarted, JobSubmitted, JobCancelled, JobHeld, JobReleased,
                        JobUpdated, JobRequeued, JobsStarted, JobExited, NodeRegistered, NodeDrained,
                        NodeResumed, NodeDown, NodeNotResponding, HealthFault, RequestDenied, StepStarted,
                        StepEnded, AccountingChanged, GpuIdle, GpuBusy],
                  Field(discriminator="type")]   # the same types as EVENT_TYPES (a test keeps them equal)


class Envelope(Model):
    """An event as the log holds it."""

    seq: int                      # log sequence number (1-based)
    ts: int                       # seconds since the epoch, stamped by the controller on append
    actor: str = "system"         # authenticated sender
    idem: str = ""                # idempotency id (Nats-Msg-Id)
    event: Event

    @classmethod
    def trusted(cls, seq: int, ts: int, actor: str, idem: str, event: Any) -> "Envelope":
        """Build without validation from values already checked (the log's replay hot path)."""
        env = cls.__new__(cls)
        _set = object.__setattr__
        _set(env, "__dict__", {"seq": seq, "ts": ts, "actor": actor, "idem": idem, "event": event})
        _set(env, "__pydantic_fields_set__", _ENVELOPE_FIELDS)
        _set(env, "__pydantic_extra__", None)
        _set(env, "__pydantic_private__", None)
        return env


_ENVELOPE_FIELDS = frozenset(("seq", "ts", "actor", "idem", "event"))


EVENT_ADAPTER: TypeAdapter[Any] = TypeAdapter(Event)
ENVELOPE_ADAPTER: TypeAdapter[Envelope] = TypeAdapter(Envelope)
EVENT_LIST_ADAPTER: TypeAdapter[list[Any]] = TypeAdapter(list[Event])

# ---------------------------------------------------------------- upcasting

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]
_UPCASTERS: dict[tuple[str, int], Upcaster] = {}
CURRENT_VERSIONS: dict[str, int] = {
    t.model_fields["type"].default: t.model_fields["v"].default for t in EVENT_TYPES
}


def register_upcaster(event_type: str, from_version: int) -> Callable[[Upcaster], Upcaster]:
    """Register a function turning ``event_type`` version N (a dict) into version N+1."""

    def deco(fn: Upcaster) -> Upcaster:
        _UPCASTERS[(event_type, from_version)] = fn
        return fn

    return deco


def upcast(raw: dict[str, Any]) -> dict[str, Any]:
    """Bring a raw event dict up to its current schema version."""
    etype = raw.get("type")
    v = raw.get("v", 1)
    target = CURRENT_VERSIONS.get(etype, v)  # type: ignore[arg-type]
    while v < target:
        fn = _UPCASTERS.get((etype, v))  # type: ignore[arg-type]
        if fn is None:
            raise ValueError(f"no upcaster for {etype} v{v}")
        raw = fn(dict(raw))
        v += 1
        raw["v"] = v
    return raw


def decode_event(raw: dict[str, Any]) -> Any:
    """Validate a raw dict (any known version) into an event model."""
    return EVENT_ADAPTER.validate_python(upcast(raw))


def encode_envelope(env: Envelope) -> bytes:
    return ENVELOPE_ADAPTER.dump_json(env)


def decode_envelope(data: bytes | str) -> Envelope:
    """Decode one stored envelope, upcasting an older event version first."""
    import json

    raw = json.loads(data)
    event = raw.get("event")
    if isinstance(event, dict) and event.get("v", 1) < CURRENT_VERSIONS.get(str(event.get("type")), 1):
        raw["event"] = upcast(event)
    return ENVELOPE_ADAPTER.validate_python(raw)
