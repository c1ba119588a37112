"""Per-job cgroups: memory limit, CPU set, process limit (pids), OOM detection, peak memory, kill-all (v2, else v1).

Where neither is usable (not root, no controllers), :func:`detect` says why and the agent falls back
to polling the RSS of the job's processes.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


class Cgroups:
    """Where job cgroups are made: ``version`` 2 or 1, under ``rota/<scope>``. The scope names this
    node of this cluster (its name and a tag derived from its key), so a second cluster, or a test run,
    with a node of the same name on the same host never touches this one's jobs."""

    def __init__(self, version: int, node: str, root: Path = ROOT, pids: bool = False) -> None:
        self.version, self.node, self.root, self.pids = version, node, root, pids

    def base(self, controller: str) -> Path:
        if self.version == 2:
            return self.root / "rota" / self.node
        return self.root / controller / "rota" / self.node

    def create(self, job_id: int, mem_mib: int, cpus: list[int] | None, restarts: int = 0,
               tasks: int = 0) -> "JobCgroup":
        """A run's cgroup (each run of a requeued job has its own: the old one may still be dying), holding at
        most ``tasks`` processes and threads (0: no limit of its own)."""
        return JobCgroup(self, run_name(job_id, restarts), mem_mib, cpus, tasks=tasks)

    def create_step(self, job_id: int, restarts: int, step_id: int, mem_mib: int) -> "JobCgroup":
        """A step's cgroup inside its job's (``mem_mib`` 0: the job's limit applies; so does its process limit)."""
        return JobCgroup(self, f"{run_name(job_id, restarts)}/step_{step_id}", mem_mib, None)

    def existing(self, job_id: int, restarts: int = 0) -> "JobCgroup | None":
        cg = JobCgroup(self, run_name(job_id, restarts), 0, None, make=False)
        return cg if cg.exists() else None


def run_name(job_id: int, restarts: int) -> str:
    return f"job_{job_id}" if not restarts else f"job_{job_id}.{restarts}"


def detect(node: str, root: Path = ROOT, all_tasks: int = 0) -> tuple[Cgroups | None, str]:
    """The usable cgroup hierarchy under ``rota/<node>`` (``node``: the node's scope), or None with the
    reason (said at agent start). ``all_tasks``: the most processes all of this node's jobs may hold together
    (where the pids controller is there)."""
    if os.geteuid() != 0:
        return None, "not running as root: memory enforced by polling RSS, no CPU binding"
    if (root / "cgroup.controllers").exists():
        controllers = (root / "cgroup.controllers").read_text().split()
        if "memory" in controllers:
            return _v2(node, root, "pids" in controllers, all_tasks)
    if (root / "memory" / "memory.limit_in_bytes").exists():
        return _v1(node, root, all_tasks)
    return None, "no cgroup memory controller: memory enforced by polling RSS"


def _v2(node: str, root: Path, pids: bool, all_tasks: int) -> tuple[Cgroups | None, str]:
    wanted = "+memory +cpuset" + (" +pids" if pids else "")
    try:
        base = root / "rota"
        base.mkdir(exist_ok=True)
        (root / "cgroup.subtree_control").write_text(wanted)
        (base / "cgroup.subtree_control").write_text(wanted)
        (base / node).mkdir(exist_ok=True)
        (base / node / "cgroup.subtree_control").write_text(wanted)
        if pids and all_tasks:
            _try_write(base / node / "pids.max", str(all_tasks))
        return Cgroups(2, node, root, pids), "cgroup v2 (memory, cpuset" + (", pids)" if pids else ")")
    except OSError as exc:
        return None, f"cgroup v2 not writable ({exc}): memory enforced by polling RSS"


def _v1(node: str, root: Path, all_tasks: int) -> tuple[Cgroups | None, str]:
    try:
        (root / "memory" / "rota" / node).mkdir(parents=True, exist_ok=True)
        cpuset = root / "cpuset"
        if (cpuset / "cpuset.cpus").exists():
            for d in (cpuset / "rota", cpuset / "rota" / node):
                d.mkdir(exist_ok=True)
                for f in ("cpuset.cpus", "cpuset.mems"):
                    if not (d / f).read_text().strip():
                        (d / f).write_text((d.parent / f).read_text())
        pids = (root / "pids" / "cgroup.procs").exists()
        if pids:
            (root / "pids" / "rota" / node).mkdir(parents=True, exist_ok=True)
            if all_tasks:
                _try_write(root / "pids" / "rota" / node / "pids.max", str(all_tasks))
        return Cgroups(1, node, root, pids), "cgroup v1 (memory, cpuset" + (", pids)" if pids else ")")
    except OSError as exc:
        return None, f"cgroup v1 not writable ({exc}): memory enforced by polling RSS"


class JobCgroup:
    def __init__(self, cgroups: Cgroups, name: str, mem_mib: int, cpus: list[int] | None,
                 make: bool = True, tasks: int = 0) -> None:
        self.cg = cgroups
        self.v2 = cgroups.version == 2
        self.mem = cgroups.base("memory") / name
        self.cpuset = None if self.v2 else cgroups.base("cpuset") / name
        if self.v2:
            self.cpuset = self.mem
        self.pids_dir = None if not cgroups.pids else (self.mem if self.v2 else cgroups.base("pids") / name)
        if make:
            self._make(mem_mib, cpus, tasks)

    def exists(self) -> bool:
        return self.mem.is_dir()

    def _make(self, mem_mib: int, cpus: list[int] | None, tasks: int) -> None:
        if self.mem.is_dir() or any(d is not None and d.is_dir() for d in (self.cpuset, self.pids_dir)):
            self.remove()   # left by an earlier run of this job id (another cluster, a crash): start clean
        self.mem.mkdir()
        if self.pids_dir is not None:
            self.pids_dir.mkdir(exist_ok=True)
            if tasks > 0:
                (self.pids_dir / "pids.max").write_text(str(tasks))
        limit = str(mem_mib * 1024 * 1024) if mem_mib > 0 else ("max" if self.v2 else "-1")
        if self.v2:
            (self.mem / "memory.max").write_text(limit)
            _try_write(self.mem / "memory.swap.max", "0")
        else:
            (self.mem / "memory.limit_in_bytes").write_text(limit)
            _try_write(self.mem / "memory.memsw.limit_in_bytes", limit)   # no escape into swap
            _try_write(self.mem / "memory.swappiness", "0")
        if cpus and self.cpuset is not None:
            if not self.v2:
                self.cpuset.mkdir(exist_ok=True)
                (self.cpuset / "cpuset.mems").write_text((self.cpuset.parent / "cpuset.mems").read_text())
            _try_write(self.cpuset / "cpuset.cpus", ",".join(map(str, cpus)))

    def proc_files(self) -> list[Path]:
        """The ``cgroup.procs`` files a process writes its pid to, to join this job's cgroups."""
        files = [self.mem / "cgroup.procs"]
        if not self.v2:
            files += [d / "cgroup.procs" for d in (self.cpuset, self.pids_dir) if d is not None and d.is_dir()]
        return files

    def add(self, pid: int) -> None:
        (self.mem / "cgroup.procs").write_text(str(pid))
        if not self.v2:
            for d in (self.cpuset, self.pids_dir):
                if d is not None and d.is_dir():
                    _try_write(d / "cgroup.procs", str(pid))

    def tasks_limit(self) -> int:
        """The most processes and threads the cgroup may hold (0: no limit of its own, or no pids controller)."""
        if self.pids_dir is None:
            return 0
        try:
            text = (self.pids_dir / "pids.max").read_text().strip()
        except OSError:
            return 0
        return int(text) if text.isdecimal() else 0

    def forks_refused(self) -> int:
        """How many forks (or new threads) the kernel refused because the cgroup was at its process limit."""
        return _kv(self.pids_dir / "pids.events").get("max", 0) if self.pids_dir is not None else 0

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.mem / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def oom_killed(self) -> bool:
        """Whether the kernel's OOM killer killed something in this job's cgroup."""
        return self.oom_kills() > 0

    def oom_kills(self) -> int:
        """How many processes the kernel's OOM killer killed in this cgroup so far."""
        return _kv(self.mem / ("memory.events" if self.v2 else "memory.oom_control")).get("oom_kill", 0)

    def peak_kib(self) -> int:
        """Peak memory of the job (KiB)."""
        f = self.mem / ("memory.peak" if self.v2 else "memory.max_usage_in_bytes")
        try:
            return int(f.read_text().strip()) // 1024
        except (OSError, ValueError):
            return 0

    def kill_all(self, sig: int = signal.SIGKILL) -> None:
        for pid in self.pids():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def remove(self) -> None:
        """Kill anything left and remove the cgroup, its steps' first (retried while the kernel reaps the
        processes)."""
        for d in {d for d in (self.mem, self.cpuset, self.pids_dir) if d is not None}:
            for sub in (sorted(d.glob("step_*")) if d.is_dir() else []):
                if sub.is_dir():
                    JobCgroup(self.cg, f"{d.name}/{sub.name}", 0, None, make=False).remove()
            for _ in range(50):
                if not d.is_dir():
                    break
                self.kill_all()
                try:
                    d.rmdir()
                    break
                except OSError:
                    time.sleep(0.02)


def _try_write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError:
        pass


def _kv(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        for line in path.read_text().splitlines():
            k, _, v = line.partition(" ")
            if v.strip().isdecimal():
                out[k] = int(v)
    except OSError:
        pass
    return out
