"""Turn a launch order into a running batch script: files, environment, user, process group."""
from __future__ import annotations

import functools
import logging
import os
import pwd
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from rota.core.hostlist import compress
from rota.core.events import JobEndState
from rota.core.orders import Launch

log = logging.getLogger("rota.agent")

EXEC_HELPER = "rota-exec"   # agents/native/rota_exec.c, built beside the commands where there is a C compiler
_PATTERN = re.compile(r"%(%|\d*[jJxuAaNnst])")
NO_VALUE = 4294967294     # what Slurm writes for a value a file name asks for but the job has none of


def expand_pattern(pattern: str, o: Launch, node: str, step: int | None = None, task: int | None = None,
                   node_index: int | None = None) -> str:
    """Slurm's filename patterns: %j job id, %J job.step (the job id for a batch script), %s step, %t task
    rank, %n node index, %N node, %x name, %u user, %A array id, %a task id, %%."""
    def sub(m: re.Match) -> str:
        tok = m.group(1)
        if tok == "%":
            return "%"
        width, code = tok[:-1], tok[-1]
        value: Any = {
            "j": o.job_id, "J": o.job_id if step is None else f"{o.job_id}.{step}", "x": o.name, "u": o.user,
            "N": node, "n": o.node_index if node_index is None else node_index,
            "s": NO_VALUE if step is None else step, "t": 0 if task is None else task,
            "A": o.array_job_id or o.job_id,
            "a": o.array_task_id if o.array_task_id is not None else NO_VALUE,
        }[code]
        if width and code == "J":
            head, _, tail = str(value).partition(".")
            return head.zfill(min(int(width), 64)) + (f".{tail}" if tail else "")
        return str(value).zfill(min(int(width), 64)) if width else str(value)
    return _PATTERN.sub(sub, pattern)


def output_paths(o: Launch, node: str) -> tuple[Path, Path]:
    """Where stdout and stderr go (relative paths are from the submit directory)."""
    spec = o.spec
    default = "slurm-%A_%a.out" if o.array_task_id is not None else "slurm-%j.out"
    out = Path(expand_pattern(spec.output or default, o, node))
    err = Path(expand_pattern(spec.error, o, node)) if spec.error else out
    workdir = Path(spec.workdir or "/")
    return (out if out.is_absolute() else workdir / out), (err if err.is_absolute() else workdir / err)


# each node's GPU slots as CUDA names them ("0", or a MIG instance's "MIG-..." UUID), set by its agent from NVML
DEVICES: dict[str, tuple[str, ...]] = {}


def device_names(inventory: list) -> tuple[str, ...]:
    """What CUDA calls each GPU slot of an inventory: its index, or, where any GPU is in MIG mode (slots are then no
    longer the physical order), each slot's UUID."""
    if any(g.uuid.startswith("MIG-") for g in inventory):
        return tuple(g.uuid for g in inventory)
    return tuple(str(g.index) for g in inventory)


def cuda_devices(node: str, gpus: tuple[int, ...]) -> str:
    """CUDA_VISIBLE_DEVICES for GPU slots ``gpus`` of ``node``: their indices, or their MIG instances' UUIDs."""
    names = DEVICES.get(node, ())
    return ",".join(names[g] if g < len(names) else str(g) for g in gpus)


def job_env(o: Launch, node: str) -> dict[str, str]:
    """The submitted environment plus Slurm's variables and CUDA_VISIBLE_DEVICES = exactly its GPUs."""
    spec = o.spec
    env = dict(spec.env)
    nodes = list(o.nodes)
    gpus = o.gpus
    jid = str(o.job_id)
    s = {
        "SLURM_JOB_ID": jid, "SLURM_JOBID": jid, "SLURM_JOB_NAME": o.name, "SLURM_JOB_USER": o.user,
        "SLURM_JOB_UID": str(spec.uid), "SLURM_JOB_GID": str(spec.gid),
        "SLURM_JOB_PARTITION": o.partition, "SLURM_JOB_ACCOUNT": spec.account,
        "SLURM_JOB_QOS": spec.qos or "normal", "SLURM_CLUSTER_NAME": "rota",
        "SLURMD_NODENAME": node, "SLURM_SUBMIT_DIR": spec.workdir or "/",
        "SLURM_SUBMIT_HOST": spec.submit_host,
        "SLURM_JOB_NODELIST": compress(nodes), "SLURM_NODELIST": compress(nodes),
        "SLURM_JOB_NUM_NODES": str(len(nodes)), "SLURM_NNODES": str(len(nodes)),
        "SLURM_JOB_CPUS_PER_NODE": run_length(o.cpus_per_node),
        "SLURM_CPUS_ON_NODE": str(o.cpus), "SLURM_MEM_PER_NODE": str(o.mem),
        "SLURM_GPUS_ON_NODE": str(len(gpus)), "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
        "SLURM_NODEID": str(o.node_index), "SLURM_GTIDS": "0", "SLURM_TASK_PID": "",
        "SLURM_RESTART_COUNT": str(o.restarts), "SLURM_JOB_START_TIME": str(o.start_time),
        "SLURM_JOB_END_TIME": str(o.start_time + o.time_limit) if o.time_limit else "0",
        "SLURM_NTASKS": str(o.ntasks), "SLURM_NPROCS": str(o.ntasks),
        "SLURM_TASKS_PER_NODE": run_length(o.tasks_per_node),
        "CUDA_VISIBLE_DEVICES": cuda_devices(node, gpus), "GPU_DEVICE_ORDINAL": ",".join(map(str, gpus)),
        "SLURM_JOB_GPUS": ",".join(map(str, gpus)),
    }
    if spec.shards_per_node:           # shards of the one GPU above, shared with other shard jobs
        s["SLURM_SHARDS_ON_NODE"] = str(spec.shards_per_node)
    if spec.cpus_per_task_given:
        s["SLURM_CPUS_PER_TASK"] = str(spec.cpus_per_task)
    if spec.ntasks_per_node:
        s["SLURM_NTASKS_PER_NODE"] = str(spec.ntasks_per_node)
    if spec.gpus_per_node and spec.gpu_given:
        gt = spec.gpu_type
        s["SLURM_GPUS_PER_NODE"] = f"{gt}:{spec.gpus_per_node}" if gt else str(spec.gpus_per_node)
    if spec.mem_per_cpu:
        s["SLURM_MEM_PER_CPU"] = str(spec.mem_per_cpu)
    if o.array_task_id is not None:
        s["SLURM_ARRAY_JOB_ID"] = str(o.array_job_id)
        s["SLURM_ARRAY_TASK_ID"] = str(o.array_task_id)
        for k, v in (("COUNT", o.array_count), ("MIN", o.array_min), ("MAX", o.array_max), ("STEP", o.array_step)):
            if v is not None:
                s[f"SLURM_ARRAY_TASK_{k}"] = str(v)
    if not gpus:
        s["CUDA_VISIBLE_DEVICES"] = ""
    env.update(s)
    env.setdefault("PATH", os.environ.get("PATH", "/usr/bin:/bin"))
    env["HOME"] = env.get("HOME") or _home(spec.uid)
    return env


def run_length(values: tuple[int, ...]) -> str:
    out: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[i]:
            j += 1
        out.append(f"{values[i]}(x{j - i + 1})" if j > i else str(values[i]))
        i = j + 1
    return ",".join(out)


def group_members(pgid: int) -> list[int]:
    """The processes of process group ``pgid``."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdecimal():
            try:
                if int((p / "stat").read_text().rsplit(")", 1)[1].split()[2]) == pgid:
                    out.append(int(p.name))
            except (OSError, IndexError, ValueError):
                continue
    return out


def group_rss_kib(pgid: int) -> int:
    """The resident memory (KiB) of process group ``pgid``, summed over its processes."""
    total = 0
    for p in Path("/proc").iterdir():
        if not p.name.isdecimal():
            continue
        try:
            fields = (p / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:
                continue
            for line in (p / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total


def _home(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_dir
    except KeyError:
        return "/"


# The shepherd runs as the job's user: it opens the job's files itself (so a job can only ever write
# where its user may), records the script's exit status for a restarted agent, and explains a file it
# cannot open in "<status>.why". Each file is tried first without truncating anything (`command exec`: a
# failed redirection does not end the shell, and no subshell is forked for the try).
#   sh -c SHEPHERD STATUS OUT ERR IN MODE SCRIPT ARGS...
SHEPHERD = r"""st=$0 out=$1 err=$2 in=$3 mode=$4; shift 4
why() { printf '%s\n' "$1" > "$st.why"; exit 1; }
command exec 3>>"$out" || why "cannot open the output file $out"
[ "$err" = "$out" ] || command exec 3>>"$err" || why "cannot open the error file $err"
command exec 3<"$in" || why "cannot read the input file $in"
exec 3<&-
if [ "$mode" = a ]; then exec >>"$out"; else exec >"$out"; fi
if [ "$err" = "$out" ]; then exec 2>&1; elif [ "$mode" = a ]; then exec 2>>"$err"; else exec 2>"$err"; fi
exec <"$in"
"$@"; s=$?; echo $s > "$st"; exit $s
"""


def identity(o: Launch) -> tuple[int, int, list[int], str]:
    """The job's uid, gid, supplementary groups and user name (an account this node does not know
    is refused)."""
    uid, gid = o.spec.uid, o.spec.gid
    if uid < 0 or gid < 0:
        raise LaunchError("the launch names no valid uid and gid")
    try:
        name = pwd.getpwuid(uid).pw_name
        groups = os.getgrouplist(name, gid)
    except KeyError:
        raise LaunchError(f"uid {uid} has no account on this node") from None
    return uid, gid, groups, name


class LaunchError(Exception):
    """A job that cannot be started here (reported as FAILED with this reason)."""


def job_dir(spool: Path, o: Launch) -> Path:
    return spool / f"job{o.job_id:07d}.{o.restarts}"


def prepare_job_dir(spool: Path, o: Launch, uid: int, gid: int) -> tuple[Path, Path]:
    """The job's private directory (its user's, mode 0700) holding the script and the status file.

    Made and filled as root before it is handed to the user, so nothing the user does can redirect
    what root writes; returns (script, status file)."""
    import shutil

    spool.mkdir(parents=True, exist_ok=True)
    d = job_dir(spool, o)
    if d.exists() or d.is_symlink():
        shutil.rmtree(d, ignore_errors=True)
    d.mkdir(mode=0o700)
    script = d / "script"
    fd = os.open(script, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o700)
    with os.fdopen(fd, "w") as fh:
        fh.write(o.spec.script or "#!/bin/sh\n")
    status = d / "status"
    os.close(os.open(status, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    if os.geteuid() == 0:
        for f in (script, status, d):   # the directory last: until then the user cannot touch it
            os.chown(f, uid, gid)
    return script, status


def start(o: Launch, node: str, spool: Path, cgroup: Any | None) -> tuple[subprocess.Popen, Path]:
    """Start the batch script in its own session and process group, as the submitting user; returns
    the shepherd's process and the status file.

    The child joins the job's cgroup, then becomes the job's user (groups, gid, uid), takes its umask
    and its working directory, and only then does anything on the job's behalf.
    """
    spec = o.spec
    uid, gid, groups, _name = identity(o)
    me = os.geteuid()
    if me != 0 and uid != me:
        raise LaunchError(f"this node's agent does not run as root: it can run only jobs of uid {me}")
    script, status = prepare_job_dir(spool, o, uid, gid)
    out_path, err_path = output_paths(o, node)
    mode = "a" if spec.open_mode == "append" else "w"
    workdir = spec.workdir or "/"
    cg_procs = [str(p) for p in cgroup.proc_files()] if cgroup is not None else []
    env = job_env(o, node)
    try:
        umask = int(env.get("SLURM_UMASK", "0022"), 8) & 0o777
    except ValueError:
        umask = 0o022
    argv = ["/bin/sh", "-c", SHEPHERD, str(status), str(out_path), str(err_path),
            spec.input or "/dev/null", mode, str(script), *spec.argv]
    proc = spawn(argv, env=env, cg_procs=cg_procs, user=(uid, gid, groups) if me == 0 else None, umask=umask,
                 workdir=workdir, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, status


def end_state(killed: str | None, oom: bool, exit_code: int, sig: int) -> JobEndState:
    """How a run or a task ended: CANCELLED (an order stopped it), TIMEOUT, OUT_OF_MEMORY, else by its status."""
    if killed in ("cancelled", "stopped"):
        return "CANCELLED"
    if killed == "timeout":
        return "TIMEOUT"
    if oom:
        return "OUT_OF_MEMORY"
    if killed == "tasks":
        return "FAILED"
    return "COMPLETED" if exit_code == 0 and sig == 0 else "FAILED"


def enter(cg_procs: list[str], user: tuple[int, int, list[int]] | None) -> None:
    """In a forked child before it execs (plain syscalls only): join the cgroups whose ``cgroup.procs``
    files are named, then become ``user`` (uid, gid, groups), if given, for good."""
    pid = str(os.getpid())
    for f in cg_procs:
        with open(f, "w") as fh:
            fh.write(pid)
    if user is not None:
        uid, gid, groups = user
        os.setgroups(groups)
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)


@functools.cache
def exec_helper() -> str | None:
    """``rota-exec`` beside this Python (or where ``ROTA_EXEC`` names it) when this process may run it
    (see :func:`trusted_helper`); None: launches fork this process instead (also when ``ROTA_EXEC=0``)."""
    named = os.environ.get("ROTA_EXEC", "")
    if named == "0":
        return None
    return trusted_helper(Path(named) if os.path.isabs(named) else Path(sys.executable).parent / EXEC_HELPER)


def trusted_helper(path: Path) -> str | None:
    """``path`` when it is an executable that only root or this process's user may change (it and its
    directory belong to one of them and no one else may write them), else None."""
    try:
        real = path.resolve(strict=True)
        for p in (real, real.parent):
            st = p.stat()
            if st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022:
                log.warning("not starting jobs through %s: another user may change %s", path, p)
                return None
    except OSError:
        return None
    return str(path) if os.access(real, os.X_OK) else None


def spawn(argv: list[str], *, cg_procs: list[str], user: tuple[int, int, list[int]] | None,
          env: dict[str, str] | None = None, umask: int | None = None, workdir: str | None = None,
          files: dict[int, tuple[str, int]] | None = None, **popen: Any) -> subprocess.Popen:
    """Start ``argv`` in a session of its own once it has joined the cgroups whose ``cgroup.procs`` files
    are ``cg_procs``, become ``user`` (uid, gid, groups) for good when given, taken ``umask`` and gone to
    ``workdir`` (else /tmp, as slurmstepd does), and opened ``files`` ({0, 1 or 2: (path, open flags)})
    as that user, with ``env`` (this process's environment when None) as its environment. Through
    ``rota-exec`` where it is installed (this process is not copied: a vfork and an exec; the helper runs
    with no environment and passes ``env`` on to the command alone), else in a forked child of this
    process. Raises LaunchError when any step fails."""
    environment = dict(os.environ if env is None else env)
    bad = next((k for k, v in environment.items() if "\0" in k or "=" in k or "\0" in v), None)
    if bad is not None:
        raise LaunchError(f"the environment variable {bad[:100]!r} cannot be passed to a process")
    helper = exec_helper()
    if helper is None:
        return _forked(argv, cg_procs, user, environment, umask, workdir, files or {}, popen)
    return _through_helper(helper, argv, cg_procs, user, environment, umask, workdir, files or {}, popen)


def _through_helper(helper: str, argv: list[str], cg_procs: list[str], user: tuple[int, int, list[int]] | None,
                    env: dict[str, str], umask: int | None, workdir: str | None,
                    files: dict[int, tuple[str, int]], popen: dict[str, Any]) -> subprocess.Popen:
    options: list[str] = []
    for f in cg_procs:
        options += ["--cgroup", f]
    if user is not None:
        uid, gid, groups = user
        options += ["--user", f"{uid}:{gid}:{','.join(map(str, groups))}"]
    if umask is not None:
        options += ["--umask", f"{umask:o}"]
    if workdir is not None:
        options += ["--cwd", workdir]
    for fd, (path, flags) in files.items():
        options += ["--open", f"{fd}:{flags}:{path}"]
    report, told = os.pipe()
    given, to_give = os.pipe()
    try:
        args = [helper, str(told), str(given), *options, "--", *argv]
        # the helper starts as this process's user with no environment: the command's comes through a pipe
        proc = subprocess.Popen(args, env={}, start_new_session=True, close_fds=True,
                                pass_fds=(told, given, *popen.pop("pass_fds", ())), **popen)
    except BaseException as exc:
        os.close(report)
        os.close(to_give)
        if isinstance(exc, OSError):
            raise LaunchError(f"cannot run {helper}: {exc.strerror or exc}") from None
        raise
    finally:
        os.close(told)
        os.close(given)
    try:
        with open(to_give, "wb") as fh:
            fh.write(b"".join(os.fsencode(k) + b"=" + os.fsencode(v) + b"\0" for k, v in env.items()))
    except BrokenPipeError:   # the helper gave up before reading it: its report says why
        pass
    with os.fdopen(report, "rb") as fh:   # closed by the exec: nothing in it when the command runs
        why = fh.read(8192).decode(errors="replace").strip()
    if why:
        proc.wait()
        raise LaunchError(why)
    return proc


def _forked(argv: list[str], cg_procs: list[str], user: tuple[int, int, list[int]] | None,
            env: dict[str, str], umask: int | None, workdir: str | None,
            files: dict[int, tuple[str, int]], popen: dict[str, Any]) -> subprocess.Popen:
    def in_child() -> None:   # runs in the forked child before exec: plain syscalls only
        enter(cg_procs, user)
        if umask is not None:
            os.umask(umask)
        if workdir is not None:
            try:
                os.chdir(workdir)
            except OSError:
                os.chdir("/tmp")
        for fd, (path, flags) in files.items():
            opened = os.open(path, flags, 0o644)
            os.dup2(opened, fd)
            os.close(opened)

    try:
        return subprocess.Popen(argv, env=env, start_new_session=True, close_fds=True, preexec_fn=in_child, **popen)
    except OSError as exc:
        raise LaunchError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
    except subprocess.SubprocessError:   # what failed stays in the child: only that it did comes back
        raise LaunchError("cannot join the job's cgroup, become its user or open its files") from None


def append_as_user(o: Launch, path: Path, line: str) -> None:
    """Append a line to one of the job's files with the job's own rights (never root's)."""
    try:
        uid, gid, groups, _name = identity(o)
    except LaunchError:
        return
    try:
        proc = spawn(["/bin/sh", "-c", 'printf "%s\\n" "$1" >> "$2"', "sh", line, str(path)], cg_procs=[],
                     user=(uid, gid, groups) if os.geteuid() == 0 else None, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except (OSError, LaunchError):
        return
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
