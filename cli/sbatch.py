"""``sbatch``: submit a batch script: Slurm's options (command line, then ``#SBATCH`` lines), ``--wrap``.

A hot command (tools call it thousands of times): it imports nothing heavy, reads its options with
:mod:`rota.cli.options` and talks to the controller over one plain-socket NATS request.
"""
from __future__ import annotations

import os
import sys

from .options import NO, OPTIONAL, REQUIRED, OptionError, node_count, parse, unsupported, table

from rota.core.limits import MAX_MEM_MIB, MAX_SCRIPT, MAX_TIME
from rota.core.mailtypes import MailTypeError, expand

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
    if not v.isdecimal() or len(v) > 20 or int(int(v) * UNITS[unit]) > MAX_MEM_MIB:
        raise SbatchError("Invalid --mem specification", 255)
    return int(int(v) * UNITS[unit])


# sbatch's long options (Slurm 22.05), so that prefixes resolve and are ambiguous exactly as there.
# What rota does not implement is either ignored with a warning (it changes neither what runs nor
# where) or refused, never silently dropped.
OPTIONS = table(
    ("A", "account", REQUIRED, "account"), ("", "acctg-freq", REQUIRED, "~acctg-freq"),
    ("a", "array", REQUIRED, "array"), ("", "batch", REQUIRED, "!batch"), ("", "bb", REQUIRED, "!bb"),
    ("", "bbf", REQUIRED, "!bbf"), ("b", "begin", REQUIRED, "begin"), ("D", "chdir", REQUIRED, "chdir"),
    ("", "cluster-constraint", REQUIRED, "!cluster-constraint"), ("M", "clusters", REQUIRED, "!clusters"),
    ("", "comment", REQUIRED, "~comment"), ("C", "constraint", REQUIRED, "constraint"),
    ("", "container", REQUIRED, "!container"), ("", "contiguous", NO, "!contiguous"),
    ("S", "core-spec", REQUIRED, "!core-spec"), ("", "cores-per-socket", REQUIRED, "!cores-per-socket"),
    ("", "cpu-freq", REQUIRED, "~cpu-freq"), ("", "cpus-per-gpu", REQUIRED, "!cpus-per-gpu"),
    ("c", "cpus-per-task", REQUIRED, "cpus_per_task"), ("", "deadline", REQUIRED, "!deadline"),
    ("", "delay-boot", REQUIRED, "~delay-boot"), ("d", "dependency", REQUIRED, "dependency"),
    ("m", "distribution", REQUIRED, "~distribution"), ("e", "error", REQUIRED, "error"),
    ("x", "exclude", REQUIRED, "exclude"), ("", "exclusive", OPTIONAL, "exclusive"),
    ("", "export", REQUIRED, "export"), ("", "export-file", REQUIRED, "!export-file"),
    ("B", "extra-node-info", REQUIRED, "!extra-node-info"), ("", "get-user-env", OPTIONAL, "~get-user-env"),
    ("", "gid", REQUIRED, "!gid"), ("", "gpu-bind", REQUIRED, "~gpu-bind"), ("", "gpu-freq", REQUIRED, "~gpu-freq"),
    ("G", "gpus", REQUIRED, "gpus"), ("", "gpus-per-node", REQUIRED, "gpus_per_node"),
    ("", "gpus-per-socket", REQUIRED, "!gpus-per-socket"), ("", "gpus-per-task", REQUIRED, "!gpus-per-task"),
    ("", "gres", REQUIRED, "gres"), ("", "gres-flags", REQUIRED, "~gres-flags"), ("h", "help", NO, "help"),
    ("", "hint", REQUIRED, "~hint"), ("H", "hold", NO, "hold"), ("", "ignore-pbs", NO, "~ignore-pbs"),
    ("i", "input", REQUIRED, "!input"), ("J", "job-name", REQUIRED, "job_name"),
    ("", "kill-on-invalid-dep", REQUIRED, "~kill-on-invalid-dep"), ("L", "licenses", REQUIRED, "!licenses"),
    ("", "mail-type", REQUIRED, "mail_type"), ("", "mail-user", REQUIRED, "mail_user"),
    ("", "mcs-label", REQUIRED, "!mcs-label"), ("", "mem", REQUIRED, "mem"), ("", "mem-bind", REQUIRED, "~mem-bind"),
    ("", "mem-per-cpu", REQUIRED, "mem_per_cpu"), ("", "mem-per-gpu", REQUIRED, "mem_per_gpu"),
    ("", "mincpus", REQUIRED, "mincpus"), ("", "network", REQUIRED, "!network"), ("", "nice", OPTIONAL, "nice"),
    ("k", "no-kill", OPTIONAL, "~no-kill"), ("", "no-requeue", NO, "no_requeue"), ("F", "nodefile", REQUIRED, "!nodefile"),
    ("w", "nodelist", REQUIRED, "nodelist"), ("N", "nodes", REQUIRED, "nodes"), ("n", "ntasks", REQUIRED, "ntasks"),
    ("", "ntasks-per-core", REQUIRED, "!ntasks-per-core"), ("", "ntasks-per-gpu", REQUIRED, "!ntasks-per-gpu"),
    ("", "ntasks-per-node", REQUIRED, "ntasks_per_node"), ("", "ntasks-per-socket", REQUIRED, "!ntasks-per-socket"),
    ("", "open-mode", REQUIRED, "open_mode"), ("o", "output", REQUIRED, "output"), ("O", "overcommit", NO, "overcommit"),
    ("s", "oversubscribe", NO, "!oversubscribe"), ("", "parsable", NO, "parsable"), ("p", "partition", REQUIRED, "partition"),
    ("", "power", REQUIRED, "!power"), ("", "priority", REQUIRED, "!priority"), ("", "profile", REQUIRED, "~profile"),
    ("", "propagate", OPTIONAL, "~propagate"), ("q", "qos", REQUIRED, "qos"), ("Q", "quiet", NO, "~quiet"),
    ("", "reboot", NO, "!reboot"), ("", "requeue", NO, "requeue"), ("", "reservation", REQUIRED, "!reservation"),
    ("", "signal", REQUIRED, "signal"), ("", "sockets-per-node", REQUIRED, "!sockets-per-node"),
    ("", "spread-job", NO, "!spread-job"), ("", "switches", REQUIRED, "!switches"), ("", "test-only", NO, "test_only"),
    ("", "thread-spec", REQUIRED, "!thread-spec"), ("", "threads-per-core", REQUIRED, "!threads-per-core"),
    ("t", "time", REQUIRED, "time"), ("", "time-min", REQUIRED, "!time-min"), ("", "tmp", REQUIRED, "!tmp"),
    ("", "uid", REQUIRED, "!uid"), ("", "usage", NO, "usage"), ("", "use-min-nodes", NO, "!use-min-nodes"),
    ("v", "verbose", NO, "~verbose"), ("V", "version", NO, "version"), ("W", "wait", NO, "wait"),
    ("", "wait-all-nodes", REQUIRED, "~wait-all-nodes"), ("", "wckey", REQUIRED, "~wckey"),
    ("", "wrap", REQUIRED, "wrap"))


def directives(script: str) -> list[str]:
    """#SBATCH options, read until the first line that is not a comment or blank."""
    out: list[str] = []
    for number, line in enumerate(script.splitlines()[1:], start=2):
        s = line.strip()
        if not s:
            continue
        if not s.startswith("#"):
            break
        if line.startswith("#SBATCH"):
            import shlex

            try:
                out += shlex.split(line[len("#SBATCH"):], comments=True)
            except ValueError as exc:   # an unbalanced quote
                raise SbatchError(f"sbatch: error: line {number} of the batch script: {line.strip()[:200]!r}: "
                                  f"{exc} (close the quote or remove it)", 255) from None
    return out


def _text(data: bytes, what: str) -> str:
    """A script as text; one clear line when it is not UTF-8 (rota keeps scripts as text)."""
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise SbatchError(f"sbatch: error: {what} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                          f"{exc.start}); save it as UTF-8") from None


def read_options(argv: list[str], script_options: list[str] | None = None) -> tuple[dict, list[str]]:
    """Options of the script's #SBATCH lines, then the command line's (which win)."""
    try:
        if script_options:
            values, _ = parse("sbatch", list(script_options), OPTIONS, stop_at_operand=True)
        else:
            values = {}
        given, operands = parse("sbatch", argv, OPTIONS, stop_at_operand=True)
    except OptionError as exc:
        raise SbatchError(f"{exc}\nTry \"sbatch --help\" for more information", 255) from None
    values.update(given)
    return values, operands


def build_spec(argv: list[str], now: float | None = None, script: str | None = None) -> tuple[dict, bool]:
    """The job spec for a command line (reading its script, unless ``script`` gives its text), and whether
    ``--parsable`` was given."""
    cli, operands = read_options(argv)
    if cli.get("help") or cli.get("usage") or cli.get("version"):
        import io

        from .helptext import answered

        page = io.StringIO()
        answered("sbatch", cli, OPTIONS, page, tail="executable [args...]")
        raise SbatchError(page.getvalue().rstrip("\n"), 0)
    if cli.get("wrap") is not None:
        if operands:
            raise SbatchError("sbatch: error: Script arguments not permitted with --wrap option")
        script = f"#!/bin/sh\n# This script was created by sbatch --wrap.\n\n{cli['wrap']}\n"
        name = "wrap"
        merged = cli
    else:
        script, name = _script(operands, script)
        merged, _ = read_options(argv, directives(script))
    if len(script) > MAX_SCRIPT or len(script.encode("utf-8", "surrogateescape")) > MAX_SCRIPT:
        _too_large()
    spec = spec_from_options(merged, script, name, now)
    if merged.get("test_only"):
        spec["_test_only"] = True
    if merged.get("wait"):
        spec["_wait"] = True
    return spec, bool(merged.get("parsable"))


def _script(operands: list[str], script: str | None) -> tuple[str, str]:
    """The batch script's text (given, from its file, or from standard input) and the job's default name;
    refused, in sbatch's words, when it is empty, too large, no script or written with DOS line breaks."""
    if script is not None:
        name = "sbatch"
    elif not operands:
        if sys.stdin.isatty():
            raise SbatchError("sbatch: error: Batch script is empty!")
        script, name = _text(sys.stdin.buffer.read(MAX_SCRIPT + 1), "the batch script on standard input"), "sbatch"
    else:
        try:
            with open(operands[0], "rb") as fh:
                data = fh.read(MAX_SCRIPT + 1)
        except (OSError, ValueError):   # ValueError: a NUL in the name
            raise SbatchError(f"sbatch: error: Unable to open file {operands[0]}") from None
        if len(data) > MAX_SCRIPT:
            _too_large()
        script, name = _text(data, f"the batch script {operands[0]}"), os.path.basename(operands[0])
    if not script.strip():
        raise SbatchError("sbatch: error: Batch script is empty!")
    if not script.startswith("#!"):
        raise SbatchError("sbatch: error: This does not look like a batch script.  The first\n"
                          "sbatch: error: line must start with #! followed by the path to an interpreter.\n"
                          "sbatch: error: For instance: #!/bin/sh")
    if "\r\n" in script:
        raise SbatchError("sbatch: error: Batch script contains DOS line breaks (\\r\\n)\n"
                          "sbatch: error: instead of expected UNIX line breaks (\\n).")
    return script, name


def _too_large() -> None:
    raise SbatchError(f"sbatch: error: Batch job submission failed: Batch script is too large (the limit is "
                      f"{MAX_SCRIPT:,} bytes, Slurm's max_script_size)")


def _unsupported(o: dict) -> list[str]:
    """Warnings for options rota ignores; a refusal for those it cannot honour (options.unsupported)."""
    try:
        return unsupported("sbatch", o)
    except OptionError as exc:
        raise SbatchError(f"{exc}; remove it from the command line or the script's #SBATCH lines", 1) from None


def spec_from_options(o: dict, script: str, default_name: str, now: float | None = None) -> dict:
    """The job spec (as the submit request carries it) for sbatch-named options and a script."""
    if o.get("mem") is not None and (o.get("mem_per_cpu") is not None or o.get("mem_per_gpu") is not None):
        raise SbatchError("sbatch: fatal: --mem, --mem-per-cpu, and --mem-per-gpu are mutually exclusive.", 1)
    if o.get("mem_per_gpu") is not None:
        raise SbatchError("sbatch: error: --mem-per-gpu is not supported by rota; use --mem or --mem-per-cpu", 1)
    from .environment import ExportError, exported

    try:
        env = exported(o.get("export") or os.environ.get("SBATCH_EXPORT"), dict(os.environ))
    except ExportError as exc:
        raise SbatchError(f"sbatch: error: {exc}", 1) from None
    umask = os.umask(0o022)
    os.umask(umask)
    env["SLURM_UMASK"] = f"{umask:04o}"   # the job runs with the submitter's umask, as in Slurm
    spec: dict = {"name": o.get("job_name") or default_name, "script": script,
                  "workdir": o.get("chdir") or os.getcwd(),
                  "env": env, "hold": bool(o.get("hold")), "exclusive": bool(o.get("exclusive")),
                  "overcommit": bool(o.get("overcommit")),
                  "requeue": not o.get("no_requeue"),     # JobRequeue=1, Slurm's default
                  "submit_line": " ".join(["sbatch"] + sys.argv[1:])}
    spec["_warnings"] = _unsupported(o)
    _counts(o, spec)
    _memory_and_gpus(o, spec)
    _times(o, spec, now)
    _nice(o, spec)
    _mail(o, spec)
    _lists(o, spec)
    return spec


def _counts(o: dict, spec: dict) -> None:
    """Partitions, nodes, tasks and CPUs per task."""
    if o.get("partition"):
        spec["partitions"] = o["partition"].split(",")
    if o.get("nodes"):
        try:
            spec["nodes"], spec["nodes_given"] = node_count("sbatch", o["nodes"]), True
        except OptionError as exc:
            raise SbatchError(str(exc), 255) from None
    for key, given in (("ntasks", "ntasks_given"), ("ntasks_per_node", None), ("cpus_per_task", "cpus_per_task_given"),
                       ("mincpus", None)):
        if o.get(key):
            if not o[key].isdecimal() or int(o[key]) < 1:
                option = {"ntasks": "--ntasks", "ntasks_per_node": "--ntasks-per-node",
                          "cpus_per_task": "--cpus-per-task", "mincpus": "--mincpus"}[key]
                raise SbatchError(f"sbatch: error: Invalid numeric value \"{o[key]}\" for {option}.", 255)
            spec[key] = int(o[key])
            if given:
                spec[given] = True


def _memory_and_gpus(o: dict, spec: dict) -> None:
    """--mem, --mem-per-cpu, --gres=gpu[:type]:N, --gpus, --gpus-per-node."""
    if o.get("mem") is not None:
        spec["mem_per_node"] = parse_mem(o["mem"])
    if o.get("mem_per_cpu") is not None:
        spec["mem_per_cpu"] = parse_mem(o["mem_per_cpu"])
    if o.get("gres"):
        for item in o["gres"].split(","):
            _gres(item, spec)
    for attr, key in (("gpus", "gpus_total"), ("gpus_per_node", "gpus_per_node")):
        val = o.get(attr)
        if val:
            gtype, _, count = val.rpartition(":")
            if not count.isdecimal():
                raise SbatchError("sbatch: error: Invalid generic resource (gres) specification")
            spec[key] = int(count)
            if gtype:
                spec["gpu_type"] = gtype


def _gres(item: str, spec: dict) -> None:
    """One --gres item: ``gpu``, ``gpu:N``, ``gpu:TYPE``, ``gpu:TYPE:N`` or ``shard:N``."""
    parts = item.split(":")
    if parts[0] == "shard":
        if len(parts) != 2 or not parts[1].isdecimal() or int(parts[1]) < 1:
            raise SbatchError("sbatch: error: Invalid generic resource (gres) specification")
        spec["shards_per_node"] = int(parts[1])
        return
    if parts[0] != "gpu":
        raise SbatchError("sbatch: error: Invalid generic resource (gres) specification")
    count = parts[-1] if len(parts) > 1 else "1"
    if len(parts) == 3:
        spec["gpu_type"] = parts[1]
    elif len(parts) == 2 and not count.isdecimal():
        spec["gpu_type"], count = parts[1], "1"
    if not count.isdecimal():
        raise SbatchError("sbatch: error: Invalid generic resource (gres) specification")
    spec["gpus_per_node"], spec["gpu_given"] = int(count), True


def _times(o: dict, spec: dict, now: float | None) -> None:
    """--time (checked against Slurm's range; ``auto``: the controller sets it from the user's history) and --begin."""
    if o.get("time") == "auto":
        spec["time_auto"] = True
    elif o.get("time"):
        from rota.core.timefmt import TimeSpecError, parse_time_limit

        try:
            spec["time_limit"] = parse_time_limit(o["time"])
        except TimeSpecError:
            raise SbatchError("sbatch: error: Invalid --time specification", 255) from None
        if not 0 <= spec["time_limit"] <= MAX_TIME:
            raise SbatchError("sbatch: error: Invalid --time specification", 255)
    if o.get("begin"):
        from .timespec import MomentError, parse_moment

        try:
            import time

            spec["begin"] = parse_moment(o["begin"], time.time() if now is None else now, future=True)
        except MomentError as exc:
            raise SbatchError(f"{exc}\nsbatch: error: Invalid --begin specification", 255) from None


def _mail(o: dict, spec: dict) -> None:
    """--mail-type (BEGIN, END, FAIL, REQUEUE, ALL, TIME_LIMIT[_50|_80|_90], ... or NONE) and --mail-user (an
    address or a user name: one line of printable characters)."""
    if o.get("mail_type") is not None:
        try:
            spec["mail_type"] = expand(o["mail_type"])
        except MailTypeError as exc:
            raise SbatchError(f"sbatch: error: --mail-type={o['mail_type']} invalid: {exc} is not a notice "
                              "(BEGIN, END, FAIL, REQUEUE, ALL, TIME_LIMIT, TIME_LIMIT_90/80/50 or NONE)", 1) from None
    user = o.get("mail_user")
    if user is not None:
        if not user or len(user) > 254 or not user.isprintable() or any(c.isspace() for c in user):
            raise SbatchError(f"sbatch: error: --mail-user={user!r} invalid: give one address, as name@example.org", 1)
        spec["mail_user"] = user


def _nice(o: dict, spec: dict) -> None:
    """--nice[=ADJUSTMENT]: 100 when no adjustment is given, as in Slurm; a negative one is for operators (the
    controller checks)."""
    value = o.get("nice")
    if value is None:
        return
    from rota.core.limits import MAX_NICE

    try:
        nice = 100 if value is True else int(str(value).strip())
    except ValueError:
        raise SbatchError(f"sbatch: error: Invalid --nice value: {value} (give a whole number, as --nice=100)",
                          1) from None
    if abs(nice) > MAX_NICE:
        raise SbatchError(f"sbatch: error: Invalid --nice value, out of range (+/- {MAX_NICE})", 1)
    spec["nice"] = nice


def _lists(o: dict, spec: dict) -> None:
    """--array, the options taken as given, and the host lists."""
    if o.get("array"):
        from rota.core.arrays import ArraySpecError, parse_array

        try:
            parse_array(o["array"], 10**7)
        except ArraySpecError:
            raise SbatchError("sbatch: error: Batch job submission failed: Invalid job array specification") from None
        spec["array"] = o["array"]
    for attr in ("constraint", "dependency", "account", "qos", "output", "error"):
        if o.get(attr):
            spec[attr] = o[attr]
    if o.get("qos"):
        spec["qos_given"] = True
    _signal_and_open_mode(o, spec)
    for attr in ("nodelist", "exclude"):
        if o.get(attr):
            from rota.core.hostlist import HostlistError, expand

            try:
                spec[attr] = expand(o[attr])
            except HostlistError as exc:
                raise SbatchError(f"sbatch: error: Invalid --{attr} specification: {exc}", 255) from None


def _signal_and_open_mode(o: dict, spec: dict) -> None:
    """--signal (checked as Slurm reads it) and --open-mode."""
    if o.get("signal"):
        from rota.core.signals import parse_warning

        try:
            parse_warning(o["signal"])
        except ValueError as exc:
            raise SbatchError(f"sbatch: error: {exc}", 255) from None
        spec["signal"] = o["signal"]
    if o.get("open_mode"):
        mode = o["open_mode"].lower()
        if mode not in ("append", "truncate"):
            raise SbatchError(f"sbatch: error: Invalid --open-mode specification: {o['open_mode']} (append or truncate)",
                              255)
        spec["open_mode"] = mode


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        spec, parsable = build_spec(args)
    except SbatchError as exc:
        print(exc, file=sys.stdout if exc.code == 0 else sys.stderr)
        return exc.code
    for warning in spec.pop("_warnings"):
        print(warning, file=sys.stderr)
    test_only = spec.pop("_test_only", False)
    wait = spec.pop("_wait", False)
    from .client import NoCluster, request

    try:
        reply = request("test_submit" if test_only else "submit", {"spec": spec})
    except NoCluster as exc:
        print(f"sbatch: error: {exc}", file=sys.stderr)
        return 1
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
    print(reply["job_id"] if parsable else f"Submitted batch job {reply['job_id']}", flush=True)
    if reply.get("hint") and _hints_wanted():
        print(f"sbatch: hint: {reply['hint']}", file=sys.stderr)
    return wait_for_end(int(reply["job_id"]), bool(spec.get("array"))) if wait else 0


def _hints_wanted() -> bool:
    """Hints go to people (stderr a terminal, or ROTA_HINTS=1), not to tools reading sbatch's output."""
    wanted = os.environ.get("ROTA_HINTS", "")
    return wanted == "1" or (wanted != "0" and sys.stderr.isatty())


def wait_for_end(job_id: int, array: bool, poll: float = 0.25) -> int:
    """``--wait``: block until the job (every task of an array) has ended; its exit code, as Slurm's sbatch
    gives it (the highest of an array's; 1 for a job ended by a signal: cancelled, timed out, out of memory)."""
    import time

    from rota.core.states import TERMINAL_STATES

    from .client import NoCluster, request

    while True:
        try:
            if array:
                jobs = request("jobs", {"array_job_id": job_id}).get("jobs") or []
                states = [(j["state"], j["exit_code"]) for j in jobs]
            else:
                one = request("job_states", {"job_ids": [job_id]}).get("jobs", {}).get(str(job_id), {})
                states = [(one.get("state", "UNKNOWN"), one.get("exit_code"))]
        except NoCluster as exc:
            print(f"sbatch: error: {exc}", file=sys.stderr)
            return 1
        if states and all(s in TERMINAL_STATES or s in ("ENDED", "UNKNOWN") for s, _ in states):
            return max(_exit_of(s, code) for s, code in states)
        time.sleep(poll)


def _exit_of(state: str, code: int | None) -> int:
    if state == "COMPLETED":
        return 0
    if state == "FAILED" and code:
        return int(code)
    return 1


def main_exit() -> None:
    from .exits import exit_with

    exit_with(main)


if __name__ == "__main__":
    main_exit()
