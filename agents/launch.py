"""Turn an assignment into a running batch script: files, environment, user, process group."""
from __future__ import annotations

import os
import pwd
import re
import stat
import subprocess
from pathlib import Path
from typing import Any

from rota.core.hostlist import compress

_PATTERN = re.compile(r"%(%|\d*[jxuAaNn])")


def expand_pattern(pattern: str, a: dict[str, Any], node: str) -> str:
    """Slurm's filename patterns: %j job id, %x name, %u user, %A array id, %a task id, %N node, %%."""
    def sub(m: re.Match) -> str:
        tok = m.group(1)
        if tok == "%":
            return "%"
        width, code = tok[:-1], tok[-1]
        value: Any = {
            "j": a["job_id"], "x": a["name"], "u": a["user"], "N": node, "n": a.get("node_index", 0),
            "A": a.get("array_job_id") or a["job_id"],
            "a": a["array_task_id"] if a.get("array_task_id") is not None else 4294967294,
        }[code]
        return str(value).zfill(int(width)) if width else str(value)
    return _PATTERN.sub(sub, pattern)


def output_paths(a: dict[str, Any], node: str) -> tuple[Path, Path]:
    """Where stdout and stderr go (relative paths are from the submit directory)."""
    spec = a["spec"]
    default = "slurm-%A_%a.out" if a.get("array_task_id") is not None else "slurm-%j.out"
    out = Path(expand_pattern(spec.get("output") or default, a, node))
    err = Path(expand_pattern(spec["error"], a, node)) if spec.get("error") else out
    workdir = Path(spec.get("workdir") or "/")
    return (out if out.is_absolute() else workdir / out), (err if err.is_absolute() else workdir / err)


def job_env(a: dict[str, Any], node: str) -> dict[str, str]:
    """The submitted environment plus Slurm's variables and CUDA_VISIBLE_DEVICES = exactly its GPUs."""
    spec = a["spec"]
    env = dict(spec.get("env") or {})
    nodes = a["nodes"]
    gpus = a["gpus"]
    jid = str(a["job_id"])
    s = {
        "SLURM_JOB_ID": jid, "SLURM_JOBID": jid, "SLURM_JOB_NAME": a["name"], "SLURM_JOB_USER": a["user"],
        "SLURM_JOB_UID": str(spec.get("uid", 0)), "SLURM_JOB_GID": str(spec.get("gid", 0)),
        "SLURM_JOB_PARTITION": a["partition"], "SLURM_JOB_ACCOUNT": spec.get("account") or "",
        "SLURM_JOB_QOS": spec.get("qos") or "normal", "SLURM_CLUSTER_NAME": a.get("cluster", "rota"),
        "SLURMD_NODENAME": node, "SLURM_SUBMIT_DIR": spec.get("workdir") or "/",
        "SLURM_SUBMIT_HOST": spec.get("submit_host") or "",
        "SLURM_JOB_NODELIST": compress(nodes), "SLURM_NODELIST": compress(nodes),
        "SLURM_JOB_NUM_NODES": str(len(nodes)), "SLURM_NNODES": str(len(nodes)),
        "SLURM_JOB_CPUS_PER_NODE": _run_length(a["cpus_per_node"]),
        "SLURM_CPUS_ON_NODE": str(a["cpus"]), "SLURM_MEM_PER_NODE": str(a["mem"]),
        "SLURM_GPUS_ON_NODE": str(len(gpus)), "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
        "SLURM_NODEID": str(a.get("node_index", 0)), "SLURM_GTIDS": "0", "SLURM_TASK_PID": "",
        "SLURM_RESTART_COUNT": str(a.get("restarts", 0)), "SLURM_JOB_START_TIME": str(a["start_time"]),
        "SLURM_JOB_END_TIME": str(a["start_time"] + a["time_limit"]) if a.get("time_limit") else "0",
        "SLURM_NTASKS": str(a["ntasks"]), "SLURM_NPROCS": str(a["ntasks"]),
        "SLURM_TASKS_PER_NODE": _run_length(a["tasks_per_node"]),
        "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus)), "GPU_DEVICE_ORDINAL": ",".join(map(str, gpus)),
        "SLURM_JOB_GPUS": ",".join(map(str, gpus)),
    }
    if spec.get("cpus_per_task_given"):
        s["SLURM_CPUS_PER_TASK"] = str(spec.get("cpus_per_task", 1))
    if spec.get("ntasks_per_node"):
        s["SLURM_NTASKS_PER_NODE"] = str(spec["ntasks_per_node"])
    if spec.get("gpus_per_node") and spec.get("gpu_given"):
        gt = spec.get("gpu_type")
        s["SLURM_GPUS_PER_NODE"] = f"{gt}:{spec['gpus_per_node']}" if gt else str(spec["gpus_per_node"])
    if spec.get("mem_per_cpu"):
        s["SLURM_MEM_PER_CPU"] = str(spec["mem_per_cpu"])
    if a.get("array_task_id") is not None:
        s["SLURM_ARRAY_JOB_ID"] = str(a["array_job_id"])
        s["SLURM_ARRAY_TASK_ID"] = str(a["array_task_id"])
        for k in ("count", "min", "max", "step"):
            if a.get(f"array_{k}") is not None:
                s[f"SLURM_ARRAY_TASK_{k.upper()}"] = str(a[f"array_{k}"])
    if not gpus:
        s["CUDA_VISIBLE_DEVICES"] = ""
    env.update(s)
    env.setdefault("PATH", os.environ.get("PATH", "/usr/bin:/bin"))
    env["HOME"] = env.get("HOME") or _home(spec.get("uid", 0))
    return env


def _run_length(values: list[int]) -> str:
    out: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[i]:
            j += 1
        out.append(f"{values[i]}(x{j - i + 1})" if j > i else str(values[i]))
        i = j + 1
    return ",".join(out)


def _home(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_dir
    except KeyError:
        return "/"


def write_script(a: dict[str, Any], spool: Path) -> Path:
    """The batch script as a private executable file in the agent's spool directory."""
    spool.mkdir(parents=True, exist_ok=True)
    path = spool / f"job{a['job_id']:07d}.{a.get('restarts', 0)}.sh"
    script = a["spec"].get("script") or "#!/bin/sh\n"
    path.write_text(script)
    path.chmod(stat.S_IRWXU)
    uid, gid = a["spec"].get("uid", 0), a["spec"].get("gid", 0)
    if os.geteuid() == 0 and uid:
        os.chown(path, uid, gid)
    return path


def start(a: dict[str, Any], node: str, spool: Path, cgroup: Any | None,
          shepherd: tuple[str, str] | None = None) -> subprocess.Popen:
    """Start the batch script in its own session and process group, as the submitting user.

    The child joins the job's cgroup before it execs, so nothing it starts escapes the limits.
    ``shepherd`` = (shell code, status file): run the script under ``sh -c CODE STATUS SCRIPT ARGS...``.
    """
    spec = a["spec"]
    script = write_script(a, spool)
    out_path, err_path = output_paths(a, node)
    mode = "ab" if spec.get("open_mode") == "append" else "wb"
    uid, gid = spec.get("uid", 0), spec.get("gid", 0)
    as_user = os.geteuid() == 0 and uid != 0
    workdir = spec.get("workdir") or "/"
    if not os.path.isdir(workdir):
        workdir = "/tmp"
    cg_procs = [str(p) for p in cgroup.proc_files()] if cgroup is not None else []

    def in_child() -> None:   # runs in the forked child before exec: keep it to plain syscalls
        pid = str(os.getpid())
        for f in cg_procs:
            with open(f, "w") as fh:
                fh.write(pid)
        if as_user:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)

    stdin_path = spec.get("input") or "/dev/null"
    with open(out_path, mode) as out, open(stdin_path, "rb") as stdin:
        err = out if err_path == out_path else open(err_path, mode)
        if as_user:
            for f in {out_path, err_path}:
                os.chown(f, uid, gid)
        try:
            argv = [str(script), *spec.get("argv", [])]
            if shepherd is not None:
                argv = ["/bin/sh", "-c", shepherd[0], shepherd[1], *argv]
            return subprocess.Popen(argv, cwd=workdir, env=job_env(a, node),
                                    stdin=stdin, stdout=out, stderr=err, start_new_session=True,
                                    preexec_fn=in_child, close_fds=True)
        finally:
            if err is not out:
                err.close()
