"""``sbatch``: submit a batch script (first version: the resource flags, --wrap, --parsable, #SBATCH)."""
from __future__ import annotations

import argparse
import getpass
import os
import shlex
import sys

from rota.core.arrays import ArraySpecError, parse_array
from rota.core.timefmt import TimeSpecError, parse_time_limit

UNITS = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


class SbatchError(Exception):
    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def parse_mem(value: str) -> int:
    """``16G``, ``16GB``, ``16384`` (MiB), ``0`` = whole node; whole numbers only."""
    v = value.strip().upper().removesuffix("B")
    unit = "M"
    if v and v[-1] in UNITS:
        unit, v = v[-1], v[:-1]
    if not v.isdigit():
        raise SbatchError("Invalid --mem specification", 255)
    return int(int(v) * UNITS[unit])


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sbatch", add_help=True, allow_abbrev=False)
    a = p.add_argument
    a("-J", "--job-name")
    a("-p", "--partition")
    a("-N", "--nodes")
    a("-n", "--ntasks", type=int)
    a("--ntasks-per-node", type=int)
    a("-c", "--cpus-per-task", type=int)
    a("--mem")
    a("--mem-per-cpu")
    a("--gres")
    a("-G", "--gpus")
    a("--gpus-per-node")
    a("-t", "--time")
    a("-C", "--constraint")
    a("-w", "--nodelist")
    a("-x", "--exclude")
    a("-a", "--array")
    a("-d", "--dependency")
    a("-b", "--begin")
    a("-H", "--hold", action="store_true")
    a("-A", "--account")
    a("-q", "--qos")
    a("-o", "--output")
    a("-e", "--error")
    a("-D", "--chdir")
    a("--wrap")
    a("--parsable", action="store_true")
    a("--test-only", action="store_true")
    a("--exclusive", action="store_true")
    a("--requeue", action="store_true")
    a("--nats", help=argparse.SUPPRESS)
    a("script", nargs="?")
    a("args", nargs=argparse.REMAINDER)
    return p


def directives(script: str) -> list[str]:
    """#SBATCH options, read until the first line that is not a comment or blank."""
    out: list[str] = []
    for line in script.splitlines()[1:]:
        s = line.strip()
        if not s:
            continue
        if not s.startswith("#"):
            break
        if line.startswith("#SBATCH"):
            body = line[len("#SBATCH"):]
            out += shlex.split(body, comments=True)
    return out


def build_spec(argv: list[str]) -> tuple[dict, bool]:
    p = parser()
    cli = p.parse_args(argv)
    if cli.wrap is not None:
        if cli.script:
            raise SbatchError("Script arguments not permitted with --wrap option")
        script = f"#!/bin/sh\n# This script was created by sbatch --wrap.\n\n{cli.wrap}\n"
        name = "wrap"
    else:
        if not cli.script:
            if sys.stdin.isatty():
                raise SbatchError("Batch script is empty!")
            script, name = sys.stdin.read(), "sbatch"
        else:
            try:
                script = open(cli.script).read()
            except OSError:
                raise SbatchError(f"Unable to open file {cli.script}") from None
            name = os.path.basename(cli.script)
        if not script.strip():
            raise SbatchError("Batch script is empty!")
        if not script.startswith("#!"):
            raise SbatchError("This does not look like a batch script.  The first\n"
                              "sbatch: error: line must start with #! followed by the path to an interpreter.\n"
                              "sbatch: error: For instance: #!/bin/sh")
        if "\r\n" in script:
            raise SbatchError("Batch script contains DOS line breaks (\\r\\n)")
    merged = p.parse_args(directives(script) + argv) if cli.wrap is None else cli
    spec = _spec(merged, script, name)
    if merged.test_only:
        spec["_test_only"] = True
    return spec, merged.parsable


def _spec(o: argparse.Namespace, script: str, default_name: str) -> dict:
    if o.mem is not None and o.mem_per_cpu is not None:
        raise SbatchError("--mem, --mem-per-cpu, and --mem-per-gpu are mutually exclusive.", 1)
    spec: dict = {"name": o.job_name or default_name, "user": getpass.getuser(), "uid": os.getuid(),
                  "gid": os.getgid(), "script": script, "workdir": o.chdir or os.getcwd(),
                  "env": dict(os.environ), "hold": o.hold, "exclusive": o.exclusive, "requeue": o.requeue,
                  "submit_line": " ".join(["sbatch"] + sys.argv[1:])}
    if o.partition:
        spec["partitions"] = o.partition.split(",")
    if o.nodes:
        if not o.nodes.split("-")[0].isdigit():
            raise SbatchError("Invalid node count specification", 255)
        spec["nodes"], spec["nodes_given"] = int(o.nodes.split("-")[0]), True
    if o.ntasks:
        spec["ntasks"], spec["ntasks_given"] = o.ntasks, True
    if o.ntasks_per_node:
        spec["ntasks_per_node"] = o.ntasks_per_node
    if o.cpus_per_task:
        spec["cpus_per_task"], spec["cpus_per_task_given"] = o.cpus_per_task, True
    if o.mem is not None:
        spec["mem_per_node"] = parse_mem(o.mem)
    if o.mem_per_cpu is not None:
        spec["mem_per_cpu"] = parse_mem(o.mem_per_cpu)
    if o.gres:
        for item in o.gres.split(","):
            parts = item.split(":")
            if parts[0] != "gpu":
                raise SbatchError("Invalid generic resource (gres) specification")
            count = parts[-1] if len(parts) > 1 else "1"
            if len(parts) == 3:
                spec["gpu_type"] = parts[1]
            elif len(parts) == 2 and not count.isdigit():
                spec["gpu_type"], count = parts[1], "1"
            if not count.isdigit():
                raise SbatchError("Invalid generic resource (gres) specification")
            spec["gpus_per_node"], spec["gpu_given"] = int(count), True
    for attr, key in (("gpus", "gpus_total"), ("gpus_per_node", "gpus_per_node")):
        val = getattr(o, attr)
        if val:
            gtype, _, count = val.rpartition(":")
            if not count.isdigit():
                raise SbatchError("Invalid generic resource (gres) specification")
            spec[key] = int(count)
            if gtype:
                spec["gpu_type"] = gtype
    if o.time:
        try:
            spec["time_limit"] = parse_time_limit(o.time)
        except TimeSpecError:
            raise SbatchError("Invalid --time specification", 255) from None
    if o.array:
        try:
            parse_array(o.array, 10**7)
        except ArraySpecError:
            raise SbatchError("Batch job submission failed: Invalid job array specification") from None
        spec["array"] = o.array
    for attr in ("constraint", "dependency", "account", "qos", "output", "error"):
        if getattr(o, attr):
            spec[attr] = getattr(o, attr)
    if o.nodelist:
        from rota.core.hostlist import expand

        spec["nodelist"] = expand(o.nodelist)
    if o.exclude:
        from rota.core.hostlist import expand

        spec["exclude"] = expand(o.exclude)
    return spec


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        spec, parsable = build_spec(args)
        from .client import NoCluster, request

        nats = None
        if "--nats" in args:
            nats = args[args.index("--nats") + 1]
        test_only = spec.pop("_test_only", False)
        reply = request("test_submit" if test_only else "submit", {"spec": spec}, url=nats)
    except SbatchError as exc:
        print(f"sbatch: error: {exc}", file=sys.stderr)
        return exc.code
    except SystemExit as exc:   # argparse: unknown option etc.
        return 255 if exc.code else 0
    except Exception as exc:  # noqa: BLE001 - the cluster is absent or unreachable
        from .client import NoCluster

        if isinstance(exc, NoCluster):
            print(f"sbatch: error: {exc}", file=sys.stderr)
            return 1
        raise
    if not reply.get("ok"):
        lines = reply.get("error") or ["unknown error"]
        for line in lines[:-1]:
            print(f"sbatch: error: {line}", file=sys.stderr)
        print(f"sbatch: error: Batch job submission failed: {lines[-1]}", file=sys.stderr)
        return 1
    if test_only:   # Slurm prints this on stderr
        print(f"sbatch: Job {reply['job_id']} to start at {reply['start']} using {reply['cpus']} processors on "
              f"nodes {reply['nodes']} in partition {reply['partition']}", file=sys.stderr)
        return 0
    print(reply["job_id"] if parsable else f"Submitted batch job {reply['job_id']}")
    return 0


def main_exit() -> None:
    sys.exit(main())


if __name__ == "__main__":
    main_exit()
