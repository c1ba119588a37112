"""``scontrol``: show node|partition|hostnames|hostlist, update NodeName=/JobId=, hold, release, requeue."""
from __future__ import annotations

import os
import re
import sys

from rota.core.hostlist import compress, expand
from rota.projections import queries
from rota.wire.formats import memory, timestamp
from .options import SLURM_VERSION

TYPE_CHECKING = False    # (typing's, without importing typing: the command stays light)
if TYPE_CHECKING:
    from typing import Any


def _when(t: int | None) -> str:
    return timestamp(t, "None")


def _size(mib: int) -> str:
    return memory(mib, "0M")


class Fail(Exception):
    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class _Remote(Exception):
    """The projection is not readable here: the controller shows it (as the caller)."""


def _db(given: str | None = None) -> Any:
    from rota.wire.paths import projections_db

    path = given or projections_db()
    if not os.access(path, os.R_OK):
        if given is None:
            raise _Remote
        raise Fail(f"no rota cluster state at {path}; is `rota up` running (or ROTA_STATE_DIR set)?")
    return queries.connect(path)


SHOW_FROM_PROJECTION = ("node", "nodes", "partition", "partitions")


FLAGS = ("-o", "--oneliner", "-d", "--details")
HELP = """\
scontrol [<OPTION>] [<COMMAND>]
    Valid <OPTION> values are:
     -d or --details: make 'show' command print more details
     -h or --help: equivalent to "help" command
     -o or --oneliner: equivalent to "oneliner" command: one line per record
     -V or --version: equivalent to "version" command

    Valid <COMMAND> values are:
     help                     print this description of use.
     hold <job_list>          prevent specified job from starting.
     ping                     print status of slurmctld daemons.
     reconfigure              re-read the configuration file.
     release <job_list>       permit specified job to start.
     requeue <job_id>         re-queue a batch job.
     requeuehold <job_id>     re-queue and hold a batch job.
     show <ENTITY> [<ID>]     display state of identified entity, default is all records.
     uhold <job_list>         place a user hold on the specified job.
     update <SPECIFICATIONS>  update job or node configuration (JobId=... TimeLimit=...,
                              NodeName=... State=DRAIN|DOWN|RESUME Reason=...).
     version                  display tool version number.

  <ENTITY> may be "config", "hostlist", "hostnames", "job", "node" or "partition".
  <ID> may be a job id (an array's, or ID_TASK), a node name or list, or a partition name.
"""


def run_show(argv: list[str], out, err, *, db: str, uid: int | None = None) -> int:
    """``scontrol show node|partition`` over the projection ``db`` (the controller runs it for callers
    who cannot read the projection; nothing but these read-only views)."""
    args = [a for a in argv if a not in FLAGS]
    if len(args) < 2 or args[0] != "show" or args[1].lower() not in SHOW_FROM_PROJECTION:
        err.write("scontrol: error: only `show node` and `show partition` can be run by the controller\n")
        return 1
    return run(argv, out, err, db=db)


def show_node(names: list[str], db_path: str | None = None) -> list[str]:
    db = _db(db_path)
    rows = queries.nodes(db)
    if names:
        wanted = set(names)
        rows = [r for r in rows if r["name"] in wanted]
        if not rows:
            raise Fail(f"Node {names[0]} not found")
    out: list[str] = []
    for n in rows:
        state = n["base"] + ("+DRAIN" if n["drain"] else "") + ("*" if n["not_responding"] else "")
        gpus = n["gpus"]
        cfg_tres = f"cpu={n['cpus']},mem={n['memory']}M,billing={n['cpus']}" + (f",gres/gpu={gpus}" if gpus else "")
        alloc_tres = ""
        if n["alloc_cpus"]:
            alloc_tres = f"cpu={n['alloc_cpus']},mem={_size(n['alloc_mem'])}" + \
                (f",gres/gpu={n['alloc_gpus']}" if n["alloc_gpus"] else "")
        out += [
            f"NodeName={n['name']} Arch=x86_64 CoresPerSocket={n['cpus']} ",
            f"   CPUAlloc={n['alloc_cpus']} CPUEfctv={n['cpus']} CPUTot={n['cpus']} CPULoad=N/A",
            f"   AvailableFeatures={n['features'] or '(null)'}",
            f"   ActiveFeatures={n['features'] or '(null)'}",
            f"   Gres={n['gres'] or '(null)'}",
            f"   NodeAddr={n['name']} NodeHostName={n['name']} Version=rota",
            f"   RealMemory={n['memory']} AllocMem={n['alloc_mem']} FreeMem=N/A Sockets=1 Boards=1",
            f"   State={state} ThreadsPerCore=1 TmpDisk=0 Weight={n['weight'] or 1} Owner=N/A MCS_label=N/A",
            f"   Partitions={n['partitions']} ",
            f"   BootTime={_when(n['boot_time'])} SlurmdStartTime={_when(n['boot_time'])}",
            f"   LastBusyTime={_when(n['last_busy'])}",
            f"   CfgTRES={cfg_tres}",
            f"   AllocTRES={alloc_tres}",
            "   CapWatts=n/a",
            "   CurrentWatts=0 AveWatts=0",
            "   ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s",
        ]
        if n["reason"]:
            out.append(f"   Reason={n['reason']} [{n['reason_by'] or 'root'}@{_when(n['reason_time'])}]")
        out.append("")
    return out


END_REASONS = {"TIMEOUT": "TimeLimit", "FAILED": "NonZeroExitCode", "OUT_OF_MEMORY": "OutOfMemory",
               "NODE_FAIL": "NodeDown"}


def show_job(ids: list[str], details: bool = False) -> list[str]:
    """Slurm's ``scontrol show job`` layout, from the controller's view: every job it holds, or one job
    (an array's id: all its tasks; ``ID_TASK``: that task). ``-d``: each node's CPUs, memory and GPUs too."""
    jobs, now = _jobs_shown(ids[0] if ids else None)
    if not jobs:
        return ["No jobs in the system"]
    lines: list[str] = []
    for j in jobs:
        d = _JobFigures(j, now)
        lines += _job_state_lines(j, d, now) + _job_resource_lines(j, d, details)
    return lines


def _jobs_shown(which: str | None) -> tuple[list[dict], int]:
    """The controller's views of the jobs ``scontrol show job [which]`` prints, and its clock."""
    if which is None:
        reply = _request("jobs", {})
        return reply["jobs"], reply["now"]
    head, _, task = which.partition("_")
    if not head.isdecimal() or not (task.isdecimal() or not task) or len(head) > 9:
        raise Fail("slurm_load_jobs error: Invalid job id specified")
    reply = _request("job", {"job_id": int(head)}) if not task else {"ok": False}
    if reply.get("ok") and reply["job"]["array_task_id"] is None:
        return [reply["job"]], reply["now"]
    tasks = _request("jobs", {"array_job_id": int(head)})
    jobs = [j for j in tasks["jobs"] if not task or j["array_task_id"] == int(task)
            or int(task) in (j.get("array_pending") or ())]
    if task and jobs and jobs[0]["array_task_id"] is None:
        jobs[0]["asked_task"] = int(task)       # a pending task: the remainder, named as that task
    if not jobs and reply.get("ok"):
        jobs = [reply["job"]]       # a task named by its own job id
    if not jobs:
        raise Fail("slurm_load_jobs error: Invalid job id specified")
    return jobs, tasks["now"]


class _JobFigures:
    """What ``show job`` derives from the controller's view: counts, times, reason, paths."""

    def __init__(self, j: dict, now: int) -> None:
        spec = j["spec"]
        req = j["req"] or [spec.get("nodes", 1), 1, 0, 0, None, False, False, False, 1]
        self.nnodes, self.cpn, self.mem_node, self.gpn = req[0], req[1], req[2], req[3]
        self.ntasks = req[8] if len(req) > 8 else self.nnodes
        state = j["state"]
        pending = state == "PENDING"
        self.reason = (j["reason"] or "None") if pending else END_REASONS.get(state, "None")
        self.limit = j["time_limit"]
        self.start = j["start_time"] or (j["expected_start"] if pending else 0)
        self.end = j["end_time"] or (self.start + self.limit if self.start and self.limit else 0)
        self.run_time = (j["end_time"] or now) - j["start_time"] if j["start_time"] else 0
        self.exit_code = f"{j['exit_code']}:{j['signal']}" if state != "TIMEOUT" else "0:15"
        self.workdir = spec.get("workdir") or "/"
        default_out = f"slurm-{j['array_job_id']}_{j['array_task_id']}.out" if j["array_task_id"] is not None \
            else f"slurm-{j['job_id']}.out"
        out_path = spec.get("output") or default_out
        self.out_path = out_path if out_path.startswith("/") else f"{self.workdir.rstrip('/')}/{out_path}"
        self.err_path = spec.get("error") or self.out_path
        self.cpus = j["alloc_cpus"] or self.cpn * self.nnodes
        self.mem = j["alloc_mem"] or self.mem_node * self.nnodes
        self.gpus = j["alloc_gpus"] or self.gpn * self.nnodes


def _job_state_lines(j: dict, d: _JobFigures, now: int) -> list[str]:
    """Who, what state and why, when, and where."""
    from rota.core.hostlist import compress
    from rota.core.timefmt import format_duration

    spec = j["spec"]
    user, uid, gid = spec.get("user", "?"), spec.get("uid", 0), spec.get("gid", 0)
    head = f"JobId={j['job_id']} "
    if j["array_task_id"] is not None or j.get("array_pending"):
        head += f"ArrayJobId={j['array_job_id']} ArrayTaskId={_array_tasks(j)} "
        if j.get("array_throttle"):
            head += f"ArrayTaskThrottle={j['array_throttle']} "
    lines = [
        head + f"JobName={spec.get('name', '')}",
        f"   UserId={user}({uid}) GroupId={user}({gid}) MCS_label=N/A",
        f"   Priority={j['priority']} Nice={j['nice']} Account={spec.get('account') or '(null)'} "
        f"QOS={spec.get('qos') or 'normal'}",
        f"   JobState={j['state']} Reason={d.reason} Dependency={spec.get('dependency') or '(null)'}",
        f"   Requeue={1 if spec.get('requeue') else 0} Restarts={j['restarts']} "
        f"BatchFlag={0 if spec.get('allocation') else 1} Reboot=0 "
        f"ExitCode={d.exit_code}",
        f"   RunTime={format_duration(d.run_time)} TimeLimit={format_duration(d.limit) if d.limit else 'UNLIMITED'} "
        "TimeMin=N/A",
        f"   SubmitTime={_when(j['submit_time'])} EligibleTime={_when(j['eligible_time'])}",
        f"   AccrueTime={_when(j['eligible_time'])}",
        f"   StartTime={_when(d.start) if d.start else 'Unknown'} EndTime={_when(d.end) if d.end else 'Unknown'} "
        "Deadline=N/A",
        f"   SuspendTime=None SecsPreSuspend=0 LastSchedEval={_when(now)} "
        f"Scheduler={'Backfill' if j['backfilled'] else 'Main'}",
        f"   Partition={j['partition']} AllocNode:Sid={spec.get('submit_host') or 'localhost'}:0",
        f"   ReqNodeList={','.join(spec.get('nodelist') or []) or '(null)'} "
        f"ExcNodeList={','.join(spec.get('exclude') or []) or '(null)'}",
        f"   NodeList={compress(j['nodes']) if j['nodes'] else ''}",
    ]
    if j["nodes"]:
        lines.append(f"   BatchHost={j['nodes'][0]}")
    return lines


def _array_tasks(j: dict) -> str:
    """ArrayTaskId=: a task's index; the remainder's pending indices (``1-3%2``), or the one asked for."""
    from rota.core.arrays import format_indices

    if j["array_task_id"] is not None:
        return str(j["array_task_id"])
    if j.get("asked_task") is not None:
        return str(j["asked_task"])
    return format_indices(j["array_pending"], j.get("array_throttle") or 0)


def _detail_lines(j: dict) -> list[str]:
    """``-d``: Slurm's per-node lines (nodes with the same holdings share one)."""
    from rota.core.hostlist import compress

    alloc = j.get("alloc") or []
    gtype = next((a[4] for a in alloc if a[4]), "")
    gpus = sum(len(a[3]) for a in alloc)
    lines = [f"   JOB_GRES=gpu:{gtype + ':' if gtype else ''}{gpus}" if gpus else "   JOB_GRES=(null)"]
    groups: dict[tuple, list[str]] = {}
    for node, cpu_ids, mem, idx, _type in alloc:
        groups.setdefault((cpu_ids, mem, tuple(idx)), []).append(node)
    for (cpu_ids, mem, idx), nodes in groups.items():
        gres = f" GRES=gpu:{gtype + ':' if gtype else ''}{len(idx)}(IDX:{_ranges(list(idx))})" if idx else ""
        lines.append(f"     Nodes={compress(nodes)} CPU_IDs={cpu_ids} Mem={mem}{gres}")
    return lines


def _ranges(values: list[int]) -> str:
    from rota.core.arrays import format_indices

    return format_indices(sorted(values), 0)


def _job_resource_lines(j: dict, d: _JobFigures, details: bool = False) -> list[str]:
    """What it holds or asks for, and its files."""
    spec = j["spec"]
    tres = f"cpu={d.cpus},mem={_size(d.mem)},node={d.nnodes},billing={d.cpus}" + \
        (f",gres/gpu={d.gpus}" if d.gpus else "")
    memory = (f"MinMemoryNode={_size(d.mem_node)}" if spec.get("mem_per_node")
              else f"MinMemoryCPU={_size(max(1, d.mem_node // max(1, d.cpn)))}")
    lines = [
        f"   NumNodes={d.nnodes} NumCPUs={d.cpus} NumTasks={d.ntasks} CPUs/Task={spec.get('cpus_per_task', 1)} "
        "ReqB:S:C:T=0:0:*:*",
        f"   TRES={tres}",
        "   Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=*",
        *(_detail_lines(j) if details and j.get("alloc") else []),
        f"   MinCPUsNode={d.cpn} {memory} MinTmpDiskNode=0",
        f"   Features={spec.get('constraint') or '(null)'} DelayBoot=00:00:00",
        "   OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null)",
        "   Command=(null)",
        f"   WorkDir={d.workdir}",
        f"   StdErr={d.err_path}",
        f"   StdIn={spec.get('input') or '/dev/null'}",
        f"   StdOut={d.out_path}",
        "   Power=",
    ]
    if d.gpn:
        lines.append(f"   TresPerNode=gres:gpu:{spec.get('gpu_type') + ':' if spec.get('gpu_type') else ''}{d.gpn}")
    return lines + ["   ", ""]


def show_partition(names: list[str], db_path: str | None = None) -> list[str]:
    from rota.core.timefmt import format_duration

    rows = queries.partitions(_db(db_path))
    if names:
        rows = [r for r in rows if r["name"] in set(names)]
        if not rows:
            raise Fail(f"Partition {names[0]} not found")
    out = []
    for p in rows:
        limit = format_duration(p["max_time"]) if p["max_time"] else "UNLIMITED"
        default_time = format_duration(p["default_time"]) if p["default_time"] else "NONE"
        out += [f"PartitionName={p['name']}",
                "   AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL",
                f"   Default={'YES' if p['is_default'] else 'NO'} QoS=N/A",
                f"   DefaultTime={default_time} DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO",
                f"   MaxNodes={p['max_nodes'] or 'UNLIMITED'} MaxTime={limit} MinNodes=0 LLN=NO",
                f"   Nodes={compress((p['nodes'] or '').split(',')) if p['nodes'] else '(null)'}",
                f"   PriorityJobFactor=1 PriorityTier={p['priority_tier']} RootOnly=NO ReqResv=NO OverSubscribe=NO",
                f"   State={p['state']}", ""]
    return out


def _kv(args: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for a in args:
        k, eq, v = a.partition("=")
        if not eq:
            raise Fail(f"Invalid input: {a}\nRequest aborted")
        out[k.lower()] = v
    return out


def _request(verb: str, body: dict) -> dict:
    from .client import NoCluster, request

    try:
        return request(verb, body)
    except NoCluster as exc:
        raise Fail(f"slurm_load_partitions error: {exc}") from None


def update(args: list[str]) -> list[str]:
    kv = _kv(args)
    if "nodename" in kv:
        return _update_nodes(kv)
    if "jobid" in kv:
        if not args[0].lower().startswith("jobid="):
            raise Fail("JobId must precede other options\nRequest aborted")
        return _update_job(kv)
    raise Fail("No valid entity in update command\nInput line must include \"NodeName\", \"PartitionName\", "
               "\"Reservation\", \"JobId\" ...")


def _update_nodes(kv: dict[str, str]) -> list[str]:
    """``update NodeName=... State=DRAIN|DOWN|RESUME ... Reason=...``."""
    state = kv.get("state", "").upper()
    reason = kv.get("reason", "")
    if state in ("DRAIN", "DOWN", "FAIL") and not reason:
        raise Fail("You must specify a reason when DOWNING or DRAINING a node. Request denied")
    verb = {"DRAIN": "drain", "DOWN": "down", "FAIL": "drain", "RESUME": "resume", "UNDRAIN": "resume",
            "IDLE": "resume"}.get(state)
    if verb is None:
        raise Fail(f"Invalid node state specified: {kv.get('state', '')}\nslurm_update error: Invalid node "
                   "state specified")
    try:
        names = expand(kv["nodename"])
    except ValueError:
        raise Fail("slurm_update error: Invalid node name specified") from None
    for name in names:
        reply = _request(verb, {"node": name, "reason": reason})
        if not reply.get("ok"):
            raise Fail(f"slurm_update error: {reply['error'][0]}")
    return []


def _update_job(kv: dict[str, str]) -> list[str]:
    """``update JobId=N TimeLimit=[+-]T Priority=P``."""
    from rota.core.timefmt import TimeSpecError, parse_time_limit

    body: dict = {"job_id": int(kv["jobid"].split("_")[0])}
    limit = next((k for k in ("timelimit", "timelimit+", "timelimit-") if k in kv), None)
    if limit is not None:
        try:
            seconds = parse_time_limit(kv[limit])
        except TimeSpecError:
            raise Fail(f"Invalid TimeLimit value: {kv[limit]}") from None
        if limit != "timelimit":
            current = _current_limit(body["job_id"])
            seconds = current + seconds if limit.endswith("+") else max(0, current - seconds)
        body["time_limit"] = seconds
    if "priority" in kv:
        body["priority"] = int(kv["priority"])
    reply = _request("update_job", body)
    if not reply.get("ok"):
        raise Fail(f"{reply['error'][0]}\nslurm_update error: {reply['error'][0]}")
    return []


def _current_limit(job_id: int) -> int:
    for j in _request("queue", {}).get("jobs", []):
        if j["job_id"] == job_id:
            return j["time_limit"] or 0
    raise Fail("Invalid job id specified")


def job_verb(verb: str, ids: list[str]) -> list[str]:
    if not ids:
        raise Fail(f"Invalid job id specified\nscontrol {verb}: no job id given")
    failed = False
    lines = []
    for item in ",".join(ids).split(","):
        if not re.fullmatch(r"\d+(_\d+)?", item):
            raise Fail(f"Invalid job id specified: {item}")
        jid = int(item.split("_")[0])
        api = {"hold": "hold", "uhold": "hold", "release": "release", "requeue": "requeue",
               "requeuehold": "requeue"}[verb]
        body: dict = {"job_id": jid}
        if verb == "requeuehold":
            body["hold"] = True
        if verb == "uhold":
            body["user_hold"] = True
        reply = _request(api, body)
        if not reply.get("ok"):
            failed = True
            msg = reply["error"][0]
            lines.append(f"{msg} for job {item}")
            lines.append(f"slurm_suspend error: {msg}" if verb in ("hold", "uhold", "release")
                         else f"slurm_requeue error: {msg}")
    if failed:
        raise Fail("\n".join(lines))
    return []


def show_config() -> list[str]:
    """``scontrol show config``: the configuration the controller runs on, in Slurm's ``Key = Value`` layout."""
    from rota.core.steps import MAX_TASKS_PER_NODE
    from rota.core.timefmt import format_duration

    reply = _request("config", {})
    if not reply.get("ok") or reply.get("config") is None:
        raise Fail("slurm_load_ctl_conf error: the controller has no configuration yet")
    c, now = reply["config"], reply["now"]
    sched, prio, auth = c["scheduler"], c["priority"], c["auth"]
    params = [f"bf_window={sched['bf_window'] // 60}", f"bf_resolution={sched['bf_resolution']}"]
    if sched["bf_max_job_test"]:
        params.append(f"bf_max_job_test={sched['bf_max_job_test']}")
    pairs = [
        ("AuthType", "auth/rota (SO_PEERCRED, key-signed credentials)"),
        ("AuthInfo", f"ttl={auth['cred_ttl']}"), ("ClusterName", c["cluster_name"]),
        ("EnforcePartLimits", sched["enforce_part_limits"]), ("GresTypes", ",".join(c["gres_types"]) or "(null)"),
        ("JobRequeue", "1"), ("MaxArraySize", str(sched["max_array_size"])),
        ("MaxTasksPerNode", str(MAX_TASKS_PER_NODE)), ("MinJobAge", f"{sched['min_job_age']} sec"),
        ("PreemptType", f"preempt/{c.get('preempt_type', 'none')}"),
        ("PreemptMode", str(c.get("preempt_mode", "off")).upper()),
        ("DefMemPerCPU", _default_memory(c)), ("PriorityFavorSmall", "Yes" if prio["favor_small"] else "No"),
        ("PriorityMaxAge", format_duration(prio["max_age"]).replace("-", "-")), ("PriorityType", "priority/multifactor"),
        ("PriorityWeightAge", str(prio["age"])), ("PriorityWeightFairShare", str(prio["fairshare"])),
        ("PriorityWeightJobSize", str(prio["job_size"])), ("PriorityWeightPartition", str(prio["partition"])),
        ("PriorityWeightQOS", str(prio["qos"])), ("PrivateData", ",".join(auth["private_data"]) or "none"),
        ("SchedulerParameters", ",".join(params)),
        ("SchedulerType", "sched/builtin" if sched["policy"] == "fifo" else "sched/backfill"),
        ("RotaSchedulerPolicy", sched["policy"]), ("SelectType", "select/cons_tres"), ("SlurmUser", auth["slurm_user"]),
        ("SLURM_VERSION", SLURM_VERSION),
    ]
    return [f"Configuration data as of {_when(now)}"] + [f"{k:<23} = {v}" for k, v in sorted(pairs)] + [""]


def _default_memory(c: dict) -> str:
    """DefMemPerCPU as the default partition has it (rota's own default when the file sets none)."""
    part = next((p for p in c["partitions"] if p.get("default")), c["partitions"][0] if c["partitions"] else {})
    if part.get("def_mem_per_cpu") is not None:
        return str(part["def_mem_per_cpu"])
    if part.get("def_mem_per_node") is not None:
        return "UNLIMITED (DefMemPerNode)" if part["def_mem_per_node"] == 0 else f"{part['def_mem_per_node']} (DefMemPerNode)"
    return "the smallest MiB per CPU of the partition's nodes (rota's default)"


def reconfigure() -> list[str]:
    """``scontrol reconfigure``: the controller reads its configuration again (a broken file changes nothing)."""
    reply = _request("reconfigure", {})
    if not reply.get("ok"):
        lines = reply.get("error") or ["unknown error"]
        raise Fail("\n".join(lines[:-1] + [f"slurm_reconfigure error: {lines[-1]}"]))
    return []


def ping() -> list[str]:
    """``scontrol ping``: each controller and its state, the one that leads first, as Slurm shows them."""
    try:
        reply = _request("ping", {})
    except Fail:
        raise Fail("Slurmctld(primary) at (unknown) is DOWN", code=1) from None
    if not reply.get("ok"):
        raise Fail("Slurmctld(primary) at (unknown) is DOWN", code=1)
    listed = sorted(reply.get("controllers") or [], key=lambda c: (c.get("role") != "primary", c.get("name", "")))
    configured = reply.get("configured") or []
    if configured:       # SlurmctldHost lines: Slurm's labels by position, each UP when it runs
        running = {c.get("host") for c in listed if c.get("up", True)}
        return [f"Slurmctld({'primary' if i == 0 else 'backup'}) at {host} is {'UP' if host in running else 'DOWN'}"
                for i, host in enumerate(configured)]
    if not listed:
        return ["Slurmctld(primary) at (this cluster) is UP"]
    return [f"Slurmctld({c.get('role', 'backup')}) at {c.get('host') or c.get('name')} is "
            f"{'UP' if c.get('up', True) else 'DOWN'}" for c in listed]


def run(argv: list[str], out=sys.stdout, err=sys.stderr, db: str | None = None) -> int:
    details = any(a in ("-d", "--details") for a in argv)
    args = [a for a in argv if a not in FLAGS]
    if not args or args[0] in ("-h", "--help", "help", "--usage"):
        out.write(HELP)
        return 0
    if args[0] in ("-V", "--version", "version"):
        out.write(f"slurm {SLURM_VERSION}\n")
        return 0
    try:
        lines = _lines(args[0], args[1:], db, details)
        if any(a in ("-o", "--oneliner") for a in argv) and args[0].lower() == "show":
            lines = one_line_each(lines)
    except _Remote:   # the projection is private to the cluster's administrator: the controller shows it
        from .client import remote_command

        return remote_command("scontrol", argv, out, err)
    except Fail as exc:
        err.write(f"{exc}\n")
        return exc.code
    except ValueError as exc:
        err.write(f"scontrol: error: {exc}\n")
        return 1
    for line in lines:
        out.write(line + "\n")
    return 0


def one_line_each(lines: list[str]) -> list[str]:
    """``-o``: each record (lines up to a blank one) on one line, its fields apart by one space."""
    out: list[str] = []
    record: list[str] = []
    for line in [*lines, ""]:
        if line.strip():
            record.append(line.strip())
        elif record:
            out.append(" ".join(record))
            record = []
    return out


def _lines(word: str, rest: list[str], db: str | None, details: bool) -> list[str]:
    """What one scontrol command prints (raises Fail with Slurm's words)."""
    cmd = word.lower()
    if cmd == "show":
        return _show(rest[0].lower() if rest else "", rest[1:], db, details)
    if cmd == "update":
        return update(rest)
    if cmd in ("hold", "uhold", "release", "requeue", "requeuehold"):
        return job_verb(cmd, rest)
    if cmd in ("reconfigure", "reconfig"):
        return reconfigure()
    if cmd == "ping":
        return ping()
    raise Fail(f"invalid keyword: {word}")


def _show(what: str, names: list[str], db: str | None, details: bool) -> list[str]:
    if what in ("node", "nodes"):
        return show_node([n for arg in names for n in expand(arg)], db)
    if what in ("job", "jobs"):
        return show_job(names, details)
    if what in ("config", "conf"):
        return show_config()
    if what in ("partition", "partitions"):
        return show_partition(names, db)
    if what == "hostnames":
        return expand(names[0] if names else os.environ.get("SLURM_JOB_NODELIST", ""))
    if what == "hostlist":
        return [compress([h for arg in names for h in arg.split(",")])]
    raise Fail(f"invalid entity:{what} for keyword:show")


def main_exit() -> None:
    from .exits import exit_with

    exit_with(run)


if __name__ == "__main__":
    main_exit()
