"""Read a cluster configuration in ``slurm.conf`` syntax (plus ``gres.conf``), with diagnostics.

Pure: it takes text and a file name. Every problem is reported with ``file:line``, what is
wrong and how to fix it; :func:`parse_config` raises :class:`ConfigError` carrying all of them.
"""
from __future__ import annotations

import difflib
import shlex
from dataclasses import dataclass, field
from typing import Any, Callable

from . import events as ev
from .hostlist import HostlistError, expand
from .policies import POLICIES
from .timefmt import TimeSpecError, parse_time_limit


@dataclass(frozen=True, slots=True)
class Diagnostic:
    file: str
    line: int
    message: str
    hint: str = ""
    severity: str = "error"

    def __str__(self) -> str:
        hint = f" ({self.hint})" if self.hint else ""
        return f"{self.file}:{self.line}: {self.severity}: {self.message}{hint}"


class ConfigError(ValueError):
    def __init__(self, diagnostics: list[Diagnostic]) -> None:
        super().__init__("\n".join(str(d) for d in diagnostics))
        self.diagnostics = diagnostics


GLOBAL_KEYS = {
    "clustername", "defmempercpu", "defmempernode", "grestypes", "schedulertype", "schedulerparameters", "prioritytype",
    "priorityweightage", "priorityweightfairshare", "priorityweightjobsize", "priorityweightpartition",
    "priorityweightqos", "prioritymaxage", "priorityfavorsmall", "enforcepartlimits", "maxarraysize",
    "minjobage", "slurmuser", "authinfo", "privatedata", "adminusers", "operatorusers", "accountingstorageenforce",
    "priorityflags", "prioritydecayhalflife", "preempttype", "preemptmode", "maxjobcount", "slurmctldparameters",
    "rotaidlegpu", "rotapriorityweightaccuracy",
}
# rota's own keys for how its processes run here (not part of the cluster's configuration in the log)
SHELL_KEYS = {"rotanatslisten": "listen", "rotatlscertfile": "cert_file", "rotatlskeyfile": "key_file",
              "rotatlscafile": "ca_file", "rotanotifywebhook": "notify_webhook", "rotanotifysmtp": "notify_smtp",
              "rotanotifyfrom": "notify_from", "rotanotifycommand": "notify_command"}
# Slurm keys rota accepts and does not act on (so real slurm.conf files pass the check).
IGNORED_KEYS = {
    "authtype", "credtype", "mpidefault", "proctracktype",
    "returntoservice", "slurmctldpidfile", "slurmctldport", "slurmdpidfile", "slurmdport",
    "slurmdspooldir", "statesavelocation", "switchtype", "taskplugin", "inactivelimit",
    "killwait", "slurmctldtimeout", "slurmdtimeout", "waittime", "selecttype", "selecttypeparameters",
    "accountingstoragetype", "accountingstoragehost", "jobcomptype",
    "jobacctgathertype", "jobacctgatherfrequency", "slurmctlddebug", "slurmctldlogfile", "slurmddebug",
    "slurmdlogfile", "healthcheckprogram", "healthcheckinterval", "healthchecknodestate",
    "prologflags", "prolog", "epilog", "firstjobid", "maxjobid", "authinfo",
    "prioritycalcperiod", "priorityusageresetperiod",
    "overtimelimit", "messagetimeout", "include",
    "cgroupplugin", "launchparameters", "slurmdparameters", "schedulertimeslice",
    # the rest of Slurm 22.05's slurm.conf(5): a site's file loads as it is
    "accountingstorageexternalhost", "accountingstorageparameters", "accountingstoragepass",
    "accountingstorageport", "accountingstoragetres", "accountingstorageuser", "accountingstoreflags",
    "acctgatherenergytype", "acctgatherfilesystemtype", "acctgatherinterconnecttype", "acctgathernodefreq",
    "acctgatherprofiletype", "allowspecresourcesusage", "authaltparameters", "authalttypes",
    "backupaddr", "backupcontroller", "batchstarttimeout", "bcastexclude", "bcastparameters",
    "burstbuffertype", "clifilterplugins", "communicationparameters", "completewait", "controladdr",
    "cpufreqdef", "cpufreqgovernors", "debugflags", "defcpupergpu", "dependencyparameters",
    "disablerootjobs", "eiotimeout", "epilogmsgtime", "epilogslurmctld", "extsensorsfreq", "extsensorstype",
    "fairsharedampeningfactor", "federationparameters", "getenvtimeout", "gpufreqdef", "groupupdateforce",
    "groupupdatetime", "interactivestepoptions", "jobacctgatherparams", "jobcomphost", "jobcomploc",
    "jobcompparams", "jobcomppass", "jobcompport", "jobcompuser", "jobcontainertype", "jobfileappend",
    "jobrequeue", "jobsubmitplugins", "killonbadexit", "launchtype", "licenses", "logtimeformat",
    "maildomain", "mailprog", "maxdbdmsgs", "maxnodecount", "maxstepcount",
    "maxtaskspernode", "mcsparameters", "mcsplugin", "mpiparams", "nodefeaturesplugins", "plugindir",
    "plugstackconfig", "powerparameters", "powerplugin", "preemptexempttime",
    "preemptparameters", "prepparameters", "prepplugins", "priorityparameters",
    "prioritysitefactorparameters", "prioritysitefactorplugin", "prioritytype", "priorityweightassoc",
    "priorityweighttres", "prologepilogtimeout", "prologslurmctld", "propagateprioprocess",
    "propagateresourcelimits", "propagateresourcelimitsexcept", "rebootprogram", "reconfigflags",
    "requeueexit", "requeueexithold", "resumefailprogram", "resumeprogram", "resumerate", "resumetimeout",
    "resvepilog", "resvoverrun", "resvprolog", "routeplugin", "scronparameters", "slurmctldaddr",
    "slurmctldprimaryoffprog", "slurmctldprimaryonprog", "slurmctldsyslogdebug",
    "slurmdsyslogdebug", "slurmduser", "slurmschedlogfile", "slurmschedloglevel", "srunepilog",
    "srunportrange", "srunprolog", "suspendexcnodes", "suspendexcparts", "suspendprogram", "suspendrate",
    "suspendtime", "suspendtimeout", "switchparameters", "taskepilog", "taskpluginparam", "taskprolog",
    "tcptimeout", "tmpfs", "topologyparam", "topologyplugin", "trackwckey", "treewidth",
    "unkillablestepprogram", "unkillablesteptimeout", "usepam", "vsizefactor", "x11parameters",
}
IGNORED_KEYS |= {
    "accountingstoragebackuphost", "accountingstorageloc", "accountingstorejobcomment", "acctgatherinfinibandtype",
    "burstbufferparameters", "corespecplugin", "cryptotype", "fastschedule", "jobcredentialprivatekey",
    "jobcredentialpubliccertificate", "keepalivetime", "sallocdefaultcommand", "sbcastparameters", "schedulerauth",
    "slurmctldplugstack",
}
# Slurm settings that would change what a job gets and that rota does not apply: a warning names the difference
NOT_APPLIED = {
    "maxmempercpu": "a job may ask for more memory per CPU than this",
    "maxmempernode": "a job may ask for more memory per node than this",
    "defmempergpu": "a job that asks no memory gets DefMemPerCPU/DefMemPerNode's default, not a GPU-based one",
    "oversubscribe": "rota never shares a CPU between jobs (as OverSubscribe=NO); --exclusive still takes whole nodes",
    "sockets": "jobs get CPUs= of the node (else Sockets x CoresPerSocket x ThreadsPerCore) without socket placement",
    "corespersocket": "jobs get CPUs= of the node (else Sockets x CoresPerSocket x ThreadsPerCore) without core placement",
    "threadspercore": "a CPU is one hardware thread, as CR_CPU counts: CR_Core's whole cores are not allotted",
}
LINE_KINDS_IGNORED = {"downnodes", "nodeset", "frontendname"}   # whole lines rota has no use for
NODE_KEYS = {"nodename", "cpus", "realmemory", "gres", "feature", "features", "state", "weight",
             "sockets", "corespersocket", "threadspercore", "boards", "nodeaddr", "nodehostname",
             "tmpdisk", "port", "cpuspectlist", "cpuspeclist", "memspeclimit", "reason", "socketsperboard",
             "corespeccount", "procs", "bcastaddr", "cpubind"}
PART_KEYS = {"partitionname", "nodes", "maxtime", "defaulttime", "prioritytier", "priorityjobfactor",
             "state", "allowaccounts", "default", "maxnodes", "minnodes", "oversubscribe", "allowgroups",
             "allowqos", "denyaccounts", "denyqos", "qos", "defmempergpu", "defmempercpu",
             "maxmempernode", "maxcpuspernode", "exclusiveuser", "defmempernode", "hidden", "rootonly", "graceTime".lower(),
             "allocnodes", "alternate", "cpubind", "defcpupergpu", "disablerootjobs", "lln", "maxcpuspersocket",
             "maxmempercpu", "overtimelimit", "powerdownonidle", "preemptmode", "reqresv", "resumetimeout",
             "selecttypeparameters", "suspendtime", "suspendtimeout", "tresbillingweights"}
SLURM_BF_MAX_JOB_TEST = 500   # SchedulerParameters=bf_max_job_test when slurm.conf does not set it, as Slurm's
NODE_STATES = {"UNKNOWN", "IDLE", "DOWN", "DRAIN", "FAIL", "FUTURE", "CLOUD"}
PART_STATES = {"UP", "DOWN", "DRAIN", "INACTIVE"}


@dataclass
class _Ctx:
    file: str
    diags: list[Diagnostic] = field(default_factory=list)
    origin: list[tuple[str, int]] | None = None    # (file, line) of each line, when includes were inlined

    def _at(self, line: int, message: str, hint: str, severity: str) -> None:
        where = self.origin[line - 1] if self.origin and 0 < line <= len(self.origin) else (self.file, line)
        self.diags.append(Diagnostic(where[0], where[1], message, hint, severity))

    def err(self, line: int, message: str, hint: str = "") -> None:
        self._at(line, message, hint, "error")

    def warn(self, line: int, message: str, hint: str = "") -> None:
        self._at(line, message, hint, "warning")

    def ignored(self, line: int, key: str) -> None:
        """A Slurm setting rota does not use: accepted, and listed by ``rota config check``."""
        self._at(line, f"{key} is a Slurm setting rota does not use", "", "ignored")


def _lines(text: str):
    """Logical lines (``\\`` continues a line) with their first physical line number."""
    buf, start = "", 0
    for no, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].rstrip()
        if not buf:
            start = no
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        if buf.strip():
            yield start, buf.strip()
        buf = ""
    if buf.strip():
        yield start, buf.strip()


def _pairs(ctx: _Ctx, lineno: int, line: str) -> list[tuple[str, str, str]]:
    try:
        tokens = shlex.split(line, posix=True)
    except ValueError as exc:
        ctx.err(lineno, f"cannot split the line: {exc}", "close the quote")
        return []
    out = []
    for tok in tokens:
        key, eq, value = tok.partition("=")
        if not eq:
            ctx.err(lineno, f"expected Key=Value, found {tok!r}", "write settings as Key=Value")
            continue
        out.append((key, key.lower(), value))
    return out


def _suggest(key: str, known: set[str]) -> str:
    close = difflib.get_close_matches(key.lower(), sorted(known), n=1)
    return f"did you mean {close[0]}?" if close else "see slurm.conf(5) for the keys rota reads"


def _int(ctx: _Ctx, lineno: int, key: str, value: str, minimum: int = 0) -> int | None:
    try:
        v = int(value)
    except ValueError:
        ctx.err(lineno, f"{key}={value} is not a whole number", f"write {key} as an integer")
        return None
    if v < minimum:
        ctx.err(lineno, f"{key}={value} must be at least {minimum}")
        return None
    return v


def _time(ctx: _Ctx, lineno: int, key: str, value: str) -> int | None:
    try:
        return parse_time_limit(value)
    except TimeSpecError:
        ctx.err(lineno, f"{key}={value} is not a time", "use minutes, H:M:S, D-H:M:S or UNLIMITED")
        return None


def _gres(ctx: _Ctx, lineno: int, value: str, gres_types: set[str] | None) -> list[ev.GpuConfig]:
    out: list[ev.GpuConfig] = []
    if value.lower() in ("", "(null)", "none"):
        return out
    for item in value.split(","):
        parts = item.split(":")
        name = parts[0]
        if gres_types is not None and name not in gres_types:
            ctx.err(lineno, f"Gres={item}: gres type {name!r} is not listed in GresTypes",
                    f"add GresTypes={name} (rota schedules gpu)")
            continue
        if name == "shard":       # counted by _shards
            continue
        if name != "gpu":
            continue
        count_s = parts[-1].split("(")[0] if len(parts) > 1 else "1"
        gtype = parts[1] if len(parts) == 3 else ""
        if len(parts) == 2 and not count_s.isdecimal():
            gtype, count_s = parts[1], "1"
        if not count_s.isdecimal() or len(parts) > 3:
            ctx.err(lineno, f"Gres={item} is not gpu[:type]:count", "for example Gres=gpu:a100:4")
            continue
        out.append(ev.GpuConfig(type=gtype, count=int(count_s)))
    return out


def _shards(ctx: _Ctx, lineno: int, value: str, gpus: int) -> int:
    """``shard:N`` among a node's Gres: N shards, spread evenly over its GPUs (as Slurm's gres/shard)."""
    total = 0
    for item in value.split(","):
        parts = item.split(":")
        if parts[0] != "shard":
            continue
        count = parts[-1].split("(")[0]
        if len(parts) != 2 or not count.isdecimal():
            ctx.err(lineno, f"Gres={item} is not shard:count", "for example Gres=gpu:a100:4,shard:32")
            continue
        total += int(count)
    if total and (not gpus or total % gpus):
        ctx.err(lineno, f"Gres=shard:{total} cannot be spread evenly over the node's {gpus} GPU(s)",
                "give a multiple of its GPU count, e.g. shard:8 per GPU")
        return 0
    return total


def parse_config(text: str, file: str = "slurm.conf", gres_text: str | None = None,
                 gres_file: str = "gres.conf", origin: list[tuple[str, int]] | None = None) -> ev.ClusterConfig:
    """Parse slurm.conf text into a :class:`ClusterConfig`; raise :class:`ConfigError` on errors (``origin``:
    where each line came from, when the text inlines included files)."""
    cfg, diags = check_config(text, file, gres_text, gres_file, origin)
    errors = [d for d in diags if d.severity == "error"]
    if errors or cfg is None:
        raise ConfigError(errors or diags)
    return cfg


@dataclass
class _Lines:
    """A slurm.conf's lines by what they define."""

    globals: dict[str, tuple[int, str]] = field(default_factory=dict)    # key -> (line, value)
    controllers: list[str] = field(default_factory=list)    # SlurmctldHost lines: the first leads when all run
    nodes: list[tuple[int, list[tuple[str, str, str]]]] = field(default_factory=list)
    partitions: list[tuple[int, list[tuple[str, str, str]]]] = field(default_factory=list)


def _sort_lines(ctx: _Ctx, text: str) -> _Lines:
    out = _Lines()
    for lineno, line in _lines(text):
        pairs = _pairs(ctx, lineno, line)
        if not pairs:
            continue
        first = pairs[0][1]
        if first in LINE_KINDS_IGNORED:
            ctx.ignored(lineno, pairs[0][0])
        elif first == "nodename":
            out.nodes.append((lineno, pairs))
        elif first == "partitionname":
            out.partitions.append((lineno, pairs))
        else:
            for key, low, value in pairs:
                _sort_global(ctx, out, lineno, key, low, value)
    return out


def _sort_global(ctx: _Ctx, out: _Lines, lineno: int, key: str, low: str, value: str) -> None:
    if low in ("slurmctldhost", "controlmachine"):      # one line per controller, in order
        name = value.split("(", 1)[0].strip()
        if name and name not in out.controllers:
            out.controllers.append(name)
    elif low in GLOBAL_KEYS:
        out.globals[low] = (lineno, value)
    elif low in NOT_APPLIED:
        ctx.warn(lineno, f"{key}={value} is not applied by rota: {NOT_APPLIED[low]}")
    elif low in IGNORED_KEYS:
        ctx.ignored(lineno, key)
    elif low not in SHELL_KEYS and low not in ("nodename", "partitionname"):
        ctx.err(lineno, f"unknown key {key!r}", _suggest(key, GLOBAL_KEYS | IGNORED_KEYS | set(SHELL_KEYS)))


def check_config(text: str, file: str = "slurm.conf", gres_text: str | None = None,
                 gres_file: str = "gres.conf", origin: list[tuple[str, int]] | None = None,
                 ) -> tuple[ev.ClusterConfig | None, list[Diagnostic]]:
    """Parse and diagnose: the config (None when it has errors) and every diagnostic."""
    ctx = _Ctx(file, origin=origin)
    lines = _sort_lines(ctx, text)
    global_vals, controllers, node_lines, part_lines = lines.globals, lines.controllers, lines.nodes, lines.partitions
    gres_types = None
    if "grestypes" in global_vals:
        gres_types = {g.strip() for g in global_vals["grestypes"][1].split(",") if g.strip()}
    declared: dict[str, None] = {}   # ordered: config order is replay order
    nodes = _parse_nodes(ctx, node_lines, gres_types, declared)
    parts = _with_memory_defaults(ctx, _parse_partitions(ctx, part_lines, nodes, declared), global_vals)
    sched, prio, cluster_name = _parse_globals(ctx, global_vals)
    auth = _parse_auth(ctx, global_vals)
    rate_limit = _parse_rate_limit(ctx, global_vals)
    idle_gpu = _parse_idle_gpu(ctx, global_vals)
    enforce = _parse_enforce(ctx, global_vals)
    preempt_type, preempt_mode = _parse_preempt(ctx, global_vals)
    if gres_text is not None:
        nodes = _apply_gres_conf(ctx, gres_text, gres_file, nodes)
    if not node_lines:
        ctx.err(1, "no nodes are defined", "add a NodeName=... line")
    if not part_lines and node_lines:
        ctx.err(1, "no partitions are defined", "add a PartitionName=... Nodes=... Default=YES line")
    if any(d.severity == "error" for d in ctx.diags):
        return None, _ordered(ctx.diags)
    try:
        cfg = ev.ClusterConfig(cluster_name=cluster_name, nodes=tuple(nodes.values()),
                               partitions=tuple(parts), scheduler=sched, priority=prio, auth=auth,
                               gres_types=tuple(sorted(gres_types)) if gres_types else ("gpu",),
                               accounting_enforce=enforce, preempt_type=preempt_type,
                               preempt_mode=preempt_mode, controllers=tuple(controllers),
                               rate_limit=rate_limit, idle_gpu=idle_gpu)
    except ValueError as exc:   # pydantic validation: should not happen after the checks above
        ctx.err(1, f"invalid configuration: {exc}")
        return None, _ordered(ctx.diags)
    return cfg, _ordered(ctx.diags)


ENFORCE_WORDS = ("associations", "limits", "qos", "safe", "wckeys", "nojobs", "nosteps", "all", "none")


def _parse_enforce(ctx: _Ctx, vals: dict[str, tuple[int, str]]) -> tuple[str, ...]:
    """AccountingStorageEnforce: which accounting rules submits must satisfy (``limits`` and ``qos`` imply
    ``associations``, as in Slurm)."""
    if "accountingstorageenforce" not in vals:
        return ()
    lineno, value = vals["accountingstorageenforce"]
    words = [w.strip().lower() for w in value.split(",") if w.strip()]
    bad = [w for w in words if w not in ENFORCE_WORDS]
    if bad:
        ctx.err(lineno, f"AccountingStorageEnforce={value}: {bad[0]!r} is not one of its words",
                "use associations, limits, qos, safe (comma-separated) or none")
        return ()
    if "none" in words:
        return ()
    if "all" in words:
        words = ["associations", "limits", "qos", "safe"]
    if {"limits", "qos", "safe"} & set(words) and "associations" not in words:
        words.append("associations")
    return tuple(sorted(set(words) & {"associations", "limits", "qos", "safe"}))


def _parse_preempt(ctx: _Ctx, vals: dict[str, tuple[int, str]]) -> tuple[Any, Any]:
    """PreemptType (preempt/none or preempt/qos) and the cluster's PreemptMode (OFF, CANCEL or REQUEUE)."""
    ptype, mode = "none", "off"
    if "preempttype" in vals:
        lineno, value = vals["preempttype"]
        kinds = {"preempt/none": "none", "preempt/qos": "qos"}
        if value.lower() not in kinds:
            ctx.err(lineno, f"PreemptType={value} is not supported", "use preempt/qos or preempt/none")
        else:
            ptype = kinds[value.lower()]
    if "preemptmode" in vals:
        lineno, value = vals["preemptmode"]
        words = [w.strip().lower() for w in value.split(",") if w.strip()]
        modes = [w for w in words if w in ("off", "cancel", "requeue")]
        if len(modes) != 1 or len(words) != 1:
            ctx.err(lineno, f"PreemptMode={value} is not supported", "use OFF, CANCEL or REQUEUE "
                    "(SUSPEND and GANG are not)")
        else:
            mode = modes[0]
    return ptype, mode


def _with_memory_defaults(ctx: _Ctx, parts: list[ev.PartitionConfig], vals: dict[str, tuple[int, str]]
                          ) -> list[ev.PartitionConfig]:
    """The cluster's DefMemPerCPU/DefMemPerNode for each partition that sets neither."""
    given = {k: v for k, (_, v) in vals.items() if k in ("defmempercpu", "defmempernode")}
    if not given:
        return parts
    per_cpu, per_node = _memory_default(ctx, min(vals[k][0] for k in given), given)
    return [p if p.def_mem_per_cpu is not None or p.def_mem_per_node is not None
            else p.model_copy(update={"def_mem_per_cpu": per_cpu, "def_mem_per_node": per_node}) for p in parts]


def _ordered(diags: list[Diagnostic]) -> list[Diagnostic]:
    return sorted(diags, key=lambda d: (d.file, d.line))


def _parse_nodes(ctx: _Ctx, lines, gres_types, declared: dict[str, None]) -> dict[str, ev.NodeConfig]:
    """Node definitions; ``declared`` collects every name a line named, valid or not."""
    nodes: dict[str, ev.NodeConfig] = {}
    where: dict[str, int] = {}
    defaults: dict[str, tuple[str, str]] = {}
    for lineno, pairs in lines:
        name_expr = pairs[0][2]
        vals = dict(defaults)
        for key, low, value in pairs[1:]:
            if low not in NODE_KEYS:
                ctx.err(lineno, f"unknown node key {key!r}", _suggest(key, NODE_KEYS))
                continue
            if low in NOT_APPLIED and value != "1":
                ctx.warn(lineno, f"{key}={value} is not applied by rota: {NOT_APPLIED[low]}")
            vals[low] = (key, value)
        if name_expr.upper() == "DEFAULT":
            defaults = vals
            continue
        try:
            names = expand(name_expr)
        except HostlistError as exc:
            ctx.err(lineno, f"bad hostlist NodeName={name_expr}: {exc}", "write ranges like gpu[01-16]")
            continue
        declared.update(dict.fromkeys(names))
        cpus = None
        if "cpus" in vals:
            cpus = _int(ctx, lineno, "CPUs", vals["cpus"][1], 1)
        else:
            s = _int(ctx, lineno, "Sockets", vals.get("sockets", ("", "1"))[1], 1)
            c = _int(ctx, lineno, "CoresPerSocket", vals.get("corespersocket", ("", "1"))[1], 1)
            t = _int(ctx, lineno, "ThreadsPerCore", vals.get("threadspercore", ("", "1"))[1], 1)
            cpus = s * c * t if None not in (s, c, t) else None  # type: ignore[operator]
        mem = _int(ctx, lineno, "RealMemory", vals.get("realmemory", ("", "1"))[1], 1)
        weight = _int(ctx, lineno, "Weight", vals.get("weight", ("", "1"))[1], 0)
        gpus = _gres(ctx, lineno, vals.get("gres", ("", ""))[1], gres_types)
        shards = _shards(ctx, lineno, vals.get("gres", ("", ""))[1], sum(g.count for g in gpus))
        feats = tuple(f for f in vals.get("features", vals.get("feature", ("", "")))[1].split(",") if f)
        state = vals.get("state", ("", "UNKNOWN"))[1].upper()
        if state not in NODE_STATES:
            ctx.err(lineno, f"State={state} is not a node state", "use UNKNOWN, IDLE, DOWN, DRAIN or FUTURE")
            continue
        if cpus is None or mem is None or weight is None:
            continue
        for n in names:
            if n in nodes:
                ctx.err(lineno, f"node {n} is defined twice (first on line {where[n]})",
                        "define each node once")
                continue
            nodes[n] = ev.NodeConfig(name=n, cpus=cpus, memory=mem, gpus=tuple(gpus), features=feats,
                                     weight=weight, state=state, shards=shards)
            where[n] = lineno
    return nodes


def _yes(value: str) -> bool:
    return value.strip().upper() in ("YES", "TRUE", "1")


def _parse_partitions(ctx: _Ctx, lines, nodes: dict[str, ev.NodeConfig],
                      declared: dict[str, None]) -> list[ev.PartitionConfig]:
    parts: list[ev.PartitionConfig] = []
    seen: dict[str, int] = {}
    default_line = 0
    for lineno, pairs in lines:
        name = pairs[0][2]
        vals: dict[str, str] = {}
        for key, low, value in pairs[1:]:
            if low not in PART_KEYS:
                ctx.err(lineno, f"unknown partition key {key!r}", _suggest(key, PART_KEYS))
                continue
            if low in NOT_APPLIED and not (low == "oversubscribe" and value.upper() in ("NO", "EXCLUSIVE")):
                ctx.warn(lineno, f"{key}={value} is not applied by rota: {NOT_APPLIED[low]}")
            vals[low] = value
        if name in seen:
            ctx.err(lineno, f"partition {name} is defined twice (first on line {seen[name]})")
            continue
        seen[name] = lineno
        members = _partition_nodes(ctx, lineno, name, vals.get("nodes", ""), declared)
        part = _partition(ctx, lineno, name, vals, members) if members is not None else None
        if part is None:
            continue
        if part.default and default_line:
            ctx.err(lineno, f"partition {name} is Default=YES but so is the one on line {default_line}",
                    "keep one default partition")
            continue
        if part.default:
            default_line = lineno
        parts.append(part)
    return parts


def _partition_nodes(ctx: _Ctx, lineno: int, name: str, expr: str, declared: dict[str, None]) -> list[str] | None:
    """A partition's Nodes= as node names (None: refused, and said why)."""
    if not expr:
        ctx.err(lineno, f"partition {name} has no Nodes=", "list its nodes, e.g. Nodes=gpu[01-04] or ALL")
        return None
    if expr.upper() == "ALL":
        return list(declared)
    try:
        members = expand(expr)
    except HostlistError as exc:
        ctx.err(lineno, f"bad hostlist Nodes={expr}: {exc}", "write ranges like gpu[01-16]")
        return None
    unknown = [n for n in members if n not in declared]
    if unknown:
        ctx.err(lineno, f"partition {name} names unknown node(s) {', '.join(unknown[:5])}",
                "define them with NodeName= or fix the hostlist")
        return None
    return members


def _partition(ctx: _Ctx, lineno: int, name: str, vals: dict[str, str], members: list[str]
               ) -> ev.PartitionConfig | None:
    """One PartitionName= line's settings (None: refused, and said why)."""
    max_time = _time(ctx, lineno, "MaxTime", vals["maxtime"]) if "maxtime" in vals else 0
    default_time = _time(ctx, lineno, "DefaultTime", vals["defaulttime"]) if "defaulttime" in vals else None
    tier = _int(ctx, lineno, "PriorityTier", vals.get("prioritytier", "1"), 0)
    pjf = _int(ctx, lineno, "PriorityJobFactor", vals.get("priorityjobfactor", "1"), 0)
    max_nodes = vals.get("maxnodes", "0")
    max_nodes_i = 0 if max_nodes.upper() == "UNLIMITED" else _int(ctx, lineno, "MaxNodes", max_nodes, 0)
    min_nodes = _int(ctx, lineno, "MinNodes", vals.get("minnodes", "1"), 0)
    state = vals.get("state", "UP").upper()
    if state not in PART_STATES:
        ctx.err(lineno, f"State={state} is not a partition state", "use UP, DOWN, DRAIN or INACTIVE")
        return None
    if None in (max_time, tier, pjf, max_nodes_i, min_nodes) or ("defaulttime" in vals and default_time is None):
        return None
    if max_time and default_time and default_time > max_time:
        ctx.err(lineno, f"DefaultTime of partition {name} exceeds its MaxTime", "lower DefaultTime or raise MaxTime")
        return None
    accounts = tuple(a for a in vals.get("allowaccounts", "ALL").split(",") if a)
    per_cpu, per_node = _memory_default(ctx, lineno, vals)
    return ev.PartitionConfig(
        name=name, nodes=tuple(members), max_time=max_time or 0, default_time=default_time,
        priority_tier=tier or 0, priority_job_factor=pjf or 0, state=state,  # type: ignore[arg-type]
        allow_accounts=accounts or ("ALL",), default=_yes(vals.get("default", "NO")), max_nodes=max_nodes_i or 0,
        min_nodes=min_nodes if min_nodes is not None else 1, def_mem_per_cpu=per_cpu, def_mem_per_node=per_node)


def _memory_default(ctx: _Ctx, lineno: int, vals: dict[str, str]) -> tuple[int | None, int | None]:
    """DefMemPerCPU / DefMemPerNode (MiB; Slurm's ``UNLIMITED`` or 0 for DefMemPerNode: the whole node)."""
    if "defmempercpu" in vals and "defmempernode" in vals:
        ctx.err(lineno, "DefMemPerCPU and DefMemPerNode are mutually exclusive", "keep one of them")
    per_cpu = _int(ctx, lineno, "DefMemPerCPU", vals["defmempercpu"], 1) if "defmempercpu" in vals else None
    node = vals.get("defmempernode")
    per_node = None if node is None else 0 if node.upper() == "UNLIMITED" else _int(ctx, lineno, "DefMemPerNode", node, 0)
    return per_cpu, per_node


# ---------------------------------------------------------------- the cluster-wide keys, by table

# (ctx, line, key as Slurm spells it, value) -> the setting, or None when refused (the reader said why)
Reader = Callable[[_Ctx, int, str, str], Any]


def _count(minimum: int, scale: int = 1) -> Reader:
    def read(ctx: _Ctx, lineno: int, key: str, value: str) -> int | None:
        n = _int(ctx, lineno, key, value, minimum)
        return None if n is None else n * scale
    return read


def _duration(ctx: _Ctx, lineno: int, key: str, value: str) -> int | None:
    return _time(ctx, lineno, key, value)


def _max_age(ctx: _Ctx, lineno: int, key: str, value: str) -> int | None:
    return _time(ctx, lineno, key, value) or None      # 0: the default stands


def _choice(options: dict[str, str], problem: str, fix: str) -> Reader:
    def read(ctx: _Ctx, lineno: int, key: str, value: str) -> str | None:
        if value not in options:
            ctx.err(lineno, f"{key}={value} {problem}", fix)
            return None
        return options[value]
    return read


def _flag(ctx: _Ctx, lineno: int, key: str, value: str) -> bool:
    return _yes(value)


def _fair_tree(ctx: _Ctx, lineno: int, key: str, value: str) -> bool:
    words = {w.strip().upper() for w in value.split(",") if w.strip()}
    if "NO_FAIR_TREE" in words and "FAIR_TREE" in words:
        ctx.err(lineno, f"{key}={value} asks for both FAIR_TREE and NO_FAIR_TREE", "keep one")
    return "NO_FAIR_TREE" not in words


def _enforce(ctx: _Ctx, lineno: int, key: str, value: str) -> str | None:
    v = "ALL" if value.upper() == "YES" else value.upper()
    return _choice({"NO": "NO", "ANY": "ANY", "ALL": "ALL"}, "is not valid", "use NO, ANY or ALL")(ctx, lineno, key, v)


# slurm.conf key (lower case) -> (its spelling, scheduler or priority, the field it sets, how its value reads)
GLOBAL_SETTINGS: dict[str, tuple[str, str, str, Reader]] = {
    "schedulertype": ("SchedulerType", "sched", "policy", _choice(
        {"sched/backfill": "conservative", "sched/builtin": "fifo"}, "is not supported", "use sched/backfill or sched/builtin")),
    "priorityweightage": ("PriorityWeightAge", "prio", "age", _count(0)),
    "priorityweightfairshare": ("PriorityWeightFairshare", "prio", "fairshare", _count(0)),
    "priorityweightjobsize": ("PriorityWeightJobSize", "prio", "job_size", _count(0)),
    "priorityweightpartition": ("PriorityWeightPartition", "prio", "partition", _count(0)),
    "priorityweightqos": ("PriorityWeightQOS", "prio", "qos", _count(0)),
    "prioritymaxage": ("PriorityMaxAge", "prio", "max_age", _max_age),
    "rotapriorityweightaccuracy": ("RotaPriorityWeightAccuracy", "prio", "accuracy", _count(0)),
    "priorityfavorsmall": ("PriorityFavorSmall", "prio", "favor_small", _flag),
    "prioritydecayhalflife": ("PriorityDecayHalfLife", "prio", "decay_half_life", _duration),
    "priorityflags": ("PriorityFlags", "prio", "fair_tree", _fair_tree),
    "enforcepartlimits": ("EnforcePartLimits", "sched", "enforce_part_limits", _enforce),
    "maxarraysize": ("MaxArraySize", "sched", "max_array_size", _count(1)),
    "minjobage": ("MinJobAge", "sched", "min_job_age", _count(0)),
    "maxjobcount": ("MaxJobCount", "sched", "max_job_count", _count(1)),
}
# SchedulerParameters= items rota acts on -> (the scheduler field it sets, how its value reads); Slurm's others
# are accepted and ignored
SCHEDULER_PARAMETERS: dict[str, tuple[str, Reader]] = {
    "bf_window": ("bf_window", _count(1, scale=60)),          # minutes in slurm.conf, seconds in rota
    "bf_resolution": ("bf_resolution", _count(1)),
    "bf_max_job_test": ("bf_max_job_test", _count(0)),
    "bf_interval": ("bf_interval", _count(1)),
    "rota_reserve": ("reserve", _choice({"resources": "resources", "nodes": "nodes"}, "is not a way to reserve",
                                        "use resources or nodes")),
    "rota_cadence": ("cadence", _choice({"rota": "rota", "slurm": "slurm"}, "is not a cadence", "use rota or slurm")),
    "rota_max_submit_per_user": ("max_submit_per_user", _count(1)),
    "rota_policy": ("policy", _choice({p: p for p in POLICIES}, "is not a policy", "use fifo, easy or conservative")),
}


def _parse_globals(ctx: _Ctx, vals: dict[str, tuple[int, str]]
                   ) -> tuple[ev.SchedulerParams, ev.PriorityWeights, str]:
    found: dict[str, dict[str, Any]] = {"sched": {}, "prio": {}}
    for low, (spelling, group, field_name, read) in GLOBAL_SETTINGS.items():
        if low in vals:
            lineno, value = vals[low]
            setting = read(ctx, lineno, spelling, value)
            if setting is not None:
                found[group][field_name] = setting
    if "schedulerparameters" in vals:
        lineno, value = vals["schedulerparameters"]
        for item in value.split(","):
            key, eq, v = item.partition("=")
            known = SCHEDULER_PARAMETERS.get(key.strip().lower())
            if known is not None and eq:
                setting = known[1](ctx, lineno, key.strip().lower(), v)
                if setting is not None:
                    found["sched"][known[0]] = setting
    if "priorityflags" in vals:
        words = {w.strip().upper() for w in vals["priorityflags"][1].split(",")}
        found["prio"]["small_relative_to_time"] = "SMALL_RELATIVE_TO_TIME" in words
    for weight in ("age", "fairshare", "job_size", "partition", "qos"):
        found["prio"].setdefault(weight, 0)       # Slurm's default weight: a factor counts only where the site says
    cluster = vals.get("clustername", (0, "rota"))[1]
    found["sched"].setdefault("bf_max_job_test", SLURM_BF_MAX_JOB_TEST)
    return ev.SchedulerParams(**found["sched"]), ev.PriorityWeights(**found["prio"]), cluster


def _names(value: str) -> tuple[str, ...]:
    return tuple(sorted({n.strip() for n in value.split(",") if n.strip()}))


def _parse_rate_limit(ctx: _Ctx, vals: dict[str, tuple[int, str]]) -> ev.RateLimit:
    """SlurmctldParameters' rate limit (rl_enable, rl_bucket_size, rl_refill_rate, rl_refill_period); its other
    parameters are accepted and ignored."""
    if "slurmctldparameters" not in vals:
        return ev.RateLimit()
    lineno, value = vals["slurmctldparameters"]
    fields: dict = {}
    for item in value.split(","):
        key, eq, v = item.strip().partition("=")
        key = key.lower()
        if key == "rl_enable":
            fields["enabled"] = True
        elif key in ("rl_bucket_size", "rl_refill_rate", "rl_refill_period"):
            if not eq:
                ctx.err(lineno, f"SlurmctldParameters: {key} needs a value", f"write {key}=N")
            elif (n := _int(ctx, lineno, key, v, 1)) is not None:
                fields[key[3:]] = n
    return ev.RateLimit(**fields)


def _parse_idle_gpu(ctx: _Ctx, vals: dict[str, tuple[int, str]]) -> ev.IdleGpuPolicy:
    """rota's RotaIdleGpu=after=TIME[,action=warn|cancel|requeue][,grace=TIME][,partitions=A:B][,exempt_qos=Q:R]
    (times as 90s, 30m, 2h or 1d, or as Slurm writes them: minutes, H:M:S, D-H:M:S)."""
    if "rotaidlegpu" not in vals:
        return ev.IdleGpuPolicy()
    lineno, value = vals["rotaidlegpu"]
    fields: dict = {}
    for item in value.split(","):
        key, _, v = item.strip().partition("=")
        key = key.lower()
        if key in ("after", "grace"):
            unit = {"s": 1, "m": 60, "h": 3600, "d": 86400}.get(v[-1:].lower())
            fields[key] = int(v[:-1]) * unit if unit and v[:-1].isdecimal() else \
                _time(ctx, lineno, f"RotaIdleGpu {key}", v) or 0
        elif key == "action" and v in ("warn", "cancel", "requeue"):
            fields[key] = v
        elif key in ("partitions", "exempt_qos"):
            fields[key] = tuple(sorted(n for n in v.split(":") if n))
        else:
            ctx.err(lineno, f"RotaIdleGpu: {item.strip()!r} is not understood",
                    "write RotaIdleGpu=after=2:00:00,action=cancel,grace=30,partitions=gpu:debug,exempt_qos=long")
    return ev.IdleGpuPolicy(**fields)


def _parse_auth(ctx: _Ctx, vals: dict[str, tuple[int, str]]) -> ev.AuthConfig:
    """SlurmUser, AuthInfo=ttl=N, PrivateData, and rota's AdminUsers/OperatorUsers (AdminLevel by name)."""
    auth: dict = {}
    if "slurmuser" in vals:
        auth["slurm_user"] = vals["slurmuser"][1].strip() or "root"
    for key, field_name in (("adminusers", "admins"), ("operatorusers", "operators")):
        if key in vals:
            auth[field_name] = _names(vals[key][1])
    if "authinfo" in vals:
        lineno, value = vals["authinfo"]
        for item in value.split(","):
            k, eq, v = item.partition("=")
            if k.strip().lower() == "ttl" and eq:
                n = _int(ctx, lineno, "AuthInfo ttl", v.strip(), 1)
                if n is not None and n > 3600:
                    ctx.err(lineno, f"AuthInfo=ttl={n}: a credential lives at most 3600 s", "use ttl=300")
                elif n is not None:
                    auth["cred_ttl"] = n
    if "privatedata" in vals:
        lineno, value = vals["privatedata"]
        kinds = _names(value.lower())
        unknown = [k for k in kinds if k not in ("jobs", "accounts", "events", "nodes", "partitions",
                                                 "reservations", "usage", "users")]
        if unknown:
            ctx.err(lineno, f"PrivateData={value}: {unknown[0]!r} is not a kind of data", "for example PrivateData=jobs")
        auth["private_data"] = kinds
    return ev.AuthConfig(**auth)


def shell_settings(text: str) -> dict:
    """rota's own keys (TLS for the NATS servers, their listen address, where notices go), read from slurm.conf
    text."""
    out: dict = {}
    tls: dict[str, str] = {}
    for _lineno, line in _lines(text):
        try:
            tokens = shlex.split(line, posix=True)
        except ValueError:
            continue
        for tok in tokens:
            key, eq, value = tok.partition("=")
            name = SHELL_KEYS.get(key.lower()) if eq else None
            if name == "listen" or name is not None and name.startswith("notify_"):
                out[name] = value
            elif name is not None:
                tls[name] = value
    if tls:
        out["tls"] = tls
    return out


def _gres_line(gctx: _Ctx, lineno: int, vals: dict[str, str], nodes: dict[str, ev.NodeConfig]
               ) -> tuple[list[str], int] | None:
    """One Name=gpu line of gres.conf: the nodes it is about and how many GPUs it gives each (None: refused)."""
    try:
        targets = expand(vals["nodename"]) if "nodename" in vals else list(nodes)
    except HostlistError as exc:
        gctx.err(lineno, f"bad hostlist NodeName={vals['nodename']}: {exc}")
        return None
    if "file" not in vals:
        return targets, int(vals.get("count", "1")) if vals.get("count", "1").isdecimal() else 1
    try:
        return targets, len(expand(vals["file"]))
    except HostlistError as exc:
        gctx.err(lineno, f"bad File={vals['file']}: {exc}", "write File=/dev/nvidia[0-3]")
        return None


def _apply_gres_conf(ctx: _Ctx, text: str, file: str, nodes: dict[str, ev.NodeConfig]) -> dict[str, ev.NodeConfig]:
    """Check gres.conf against the nodes' Gres counts (File= device ranges, Count=, AutoDetect)."""
    gctx = _Ctx(file)
    counts: dict[str, dict[str, int]] = {}
    for lineno, line in _lines(text):
        pairs = _pairs(gctx, lineno, line)
        vals = {low: value for _k, low, value in pairs}
        if "autodetect" in vals and len(vals) == 1:
            if vals["autodetect"].lower() not in ("nvml", "nvidia", "rsmi", "oneapi", "nrt", "full", "off"):
                gctx.err(lineno, f"AutoDetect={vals['autodetect']} is not known", "use nvml or off")
            continue
        if vals.get("name") != "gpu":
            if "name" not in vals:
                gctx.err(lineno, "gres.conf line without Name=", "start lines with Name=gpu")
            continue
        line_gpus = _gres_line(gctx, lineno, vals, nodes)
        if line_gpus is None:
            continue
        targets, n = line_gpus
        for t in targets:
            if t not in nodes:
                gctx.err(lineno, f"gres.conf names unknown node {t}")
                continue
            by_type = counts.setdefault(t, {})
            by_type[vals.get("type", "")] = by_type.get(vals.get("type", ""), 0) + n
    for name, by_type in counts.items():
        configured = {g.type: g.count for g in nodes[name].gpus}
        if sum(by_type.values()) != sum(configured.values()):
            gctx.err(1, f"node {name}: gres.conf lists {sum(by_type.values())} GPUs but slurm.conf "
                        f"Gres says {sum(configured.values())}", "make the counts match")
    ctx.diags.extend(gctx.diags)
    return nodes


def auto_config(hostname: str, cpus: int, memory_mib: int, gpus: list[tuple[str, int]] | None = None,
                max_time: int = 0) -> ev.ClusterConfig:
    """A one-node cluster describing this machine (used when ``rota up`` has no --config)."""
    gcfg = tuple(ev.GpuConfig(type=t, count=n) for t, n in (gpus or []) if n)
    node = ev.NodeConfig(name=hostname, cpus=cpus, memory=memory_mib, gpus=gcfg)
    part = ev.PartitionConfig(name="main", nodes=(hostname,), max_time=max_time, default=True)
    return ev.ClusterConfig(cluster_name="rota", nodes=(node,), partitions=(part,))


def make_cluster(nodes: int = 4, gpus: int = 8, gpu_type: str = "a100", cpus: int = 64,
                 memory: int = 257000, prefix: str = "gpu", max_time: int = 3600,
                 policy: str = "conservative", features: tuple[str, ...] = (),
                 extra_partitions: tuple[ev.PartitionConfig, ...] = (), **sched: Any) -> ev.ClusterConfig:
    """``nodes`` identical nodes ``gpu01..`` in one default partition ``short`` (examples, the demo, benchmarks
    and tests)."""
    names = tuple(f"{prefix}{i:02d}" for i in range(1, nodes + 1))
    gcfg = (ev.GpuConfig(type=gpu_type, count=gpus),) if gpus else ()
    node_cfgs = tuple(ev.NodeConfig(name=n, cpus=cpus, memory=memory, gpus=gcfg, features=features)
                      for n in names)
    part = ev.PartitionConfig(name="short", nodes=names, max_time=max_time, default=True)
    return ev.ClusterConfig(nodes=node_cfgs, partitions=(part,) + extra_partitions,
                            scheduler=ev.SchedulerParams(policy=policy, **sched))  # type: ignore[arg-type]
