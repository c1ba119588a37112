"""The ranges a job's fields must lie in (Slurm's types bound them), and the check (pure).

Every submit is checked here before it can reach the state, so a negative memory, a time limit
past Slurm's largest, a name with terminal escape codes or a 50 MB script never enters the log.
"""
from __future__ import annotations

from .mailtypes import KINDS

TYPE_CHECKING = False   # (typing.TYPE_CHECKING without importing typing: the commands import this module)
if TYPE_CHECKING:       # a light module: the commands read its limits without loading pydantic
    from .events import JobSpec

NO_VAL32 = 0xFFFFFFFE                      # Slurm's NO_VAL: the largest 32-bit count is one less
MAX_COUNT = NO_VAL32 - 1                   # nodes, tasks (uint32)
MAX_CPUS_PER_TASK = 0xFFFE - 1             # uint16
MAX_TIME_MINUTES = 0xFFFFFFFD              # Slurm's longest finite limit (INFINITE is 0xFFFFFFFF)
MAX_TIME = MAX_TIME_MINUTES * 60           # seconds
MAX_MEM_MIB = 1 << 40                      # 1 EiB: far past any node, small enough for exact arithmetic
MAX_GPUS = MAX_COUNT
MAX_NICE = 2147483645                      # Slurm: nice must be within +-(NICE_OFFSET - 3)
MAX_EPOCH = 1 << 34                        # begin times up to the year 2514
MAX_SCRIPT = 4 * 1024 * 1024               # Slurm's max_script_size default
MAX_ENV = 1024 * 1024                      # bytes of environment (names and values)
MAX_ENV_VARS = 16384
MAX_ARGV = 4096
MAX_NAME = 1024                            # names, accounts, QOS, features, dependency/array specs
MAX_PATH = 4096                            # PATH_MAX
MAX_LIST = 65536                           # node lists, task lists

_OPTION = {
    "nodes": "--nodes", "ntasks": "--ntasks", "ntasks_per_node": "--ntasks-per-node",
    "cpus_per_task": "--cpus-per-task", "mem_per_node": "--mem", "mem_per_cpu": "--mem-per-cpu",
    "gpus_per_node": "--gres", "gpus_total": "--gpus", "time_limit": "--time", "time_min": "--time-min",
    "begin": "--begin", "nice": "--nice", "name": "--job-name", "account": "--account", "qos": "--qos",
    "partitions": "--partition", "constraint": "--constraint", "dependency": "--dependency",
    "array": "--array", "workdir": "--chdir", "output": "--output", "error": "--error", "input": "--input",
    "nodelist": "--nodelist", "exclude": "--exclude", "comment": "--comment", "gpu_type": "--gres",
    "signal": "--signal", "submit_host": "submit host", "submit_line": "submit line", "mail_user": "--mail-user",
}
_RANGES = (
    ("nodes", 1, MAX_COUNT), ("ntasks", 1, MAX_COUNT), ("ntasks_per_node", 1, MAX_COUNT),
    ("cpus_per_task", 1, MAX_CPUS_PER_TASK), ("mem_per_node", 0, MAX_MEM_MIB), ("mem_per_cpu", 0, MAX_MEM_MIB),
    ("gpus_per_node", 0, MAX_GPUS), ("gpus_total", 0, MAX_GPUS), ("time_limit", 0, MAX_TIME),
    ("time_min", 0, MAX_TIME), ("begin", 0, MAX_EPOCH), ("nice", -MAX_NICE, MAX_NICE),
)
_TEXT = ("name", "account", "qos", "constraint", "dependency", "array", "comment", "gpu_type", "signal",
         "submit_host", "mail_user")
_PATHS = ("workdir", "output", "error", "input")


def control_free(text: str) -> bool:
    """No C0/C1 control characters and no DEL (they would reach terminals raw), and valid Unicode."""
    if text.isprintable():   # the common case, decided in C (printable text has none of them)
        return True
    return not any(c < " " or "\x7f" <= c <= "\x9f" or "\ud800" <= c <= "\udfff" for c in text)


def encodable(text: str) -> bool:
    """Valid Unicode (no lone surrogates): it can be written as UTF-8 everywhere it goes."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _plainly_fine(spec: JobSpec) -> bool:
    """The common case, checked with a few C-level operations: every number in range, every name and
    path printable, a small script and environment. When this is not plainly so, the full check names
    what is wrong."""
    get = spec.__getattribute__          # a field at its default is the class's
    for field, lo, hi in _RANGES:
        value = get(field)
        if value is not None and not lo <= value <= hi:
            return False
    if spec.signal is not None or not KINDS.issuperset(spec.mail_type):
        return False
    texts = [t for t in map(get, _TEXT + _PATHS) if t is not None]
    texts += spec.partitions + spec.nodelist + spec.exclude
    if not "".join(texts).isprintable() or any(len(t) > MAX_NAME for t in texts[:len(_TEXT)]):
        return False
    env, script = spec.env, spec.script
    if len(script) > MAX_SCRIPT // 4 or len(env) > MAX_ENV_VARS // 4 or spec.argv or len(spec.submit_line) > 4096:
        return False
    names, values = "=".join(env), "".join(env.values())
    return (len(names) + len(values) <= MAX_ENV // 4 and names.count("=") == max(0, len(env) - 1)
            and all(env) and "\0" not in script + spec.submit_line + names + values
            and encodable(script + spec.submit_line + names + values)
            and all(len(t) <= MAX_PATH for t in texts))


def spec_problems(spec: JobSpec) -> list[str]:
    """What is out of range in ``spec``, each as one line naming the option and the allowed range."""
    if _plainly_fine(spec):
        return []
    return _option_problems(spec) + _payload_problems(spec)


def _option_problems(spec: JobSpec) -> list[str]:
    """Numbers out of range, names and paths too long or with control characters."""
    out: list[str] = []
    for field, lo, hi in _RANGES:
        value = getattr(spec, field)
        if value is not None and not (lo <= value <= hi):
            out.append(f"Invalid {_OPTION[field]} value {value}: it must be between {lo} and {hi}")
    for field in _TEXT:
        value = getattr(spec, field)
        if value is not None and (len(value) > MAX_NAME or not control_free(value)):
            out.append(f"Invalid {_OPTION[field]} value: at most {MAX_NAME} characters, no control characters")
    for field in _PATHS:
        value = getattr(spec, field)
        if value is not None and (len(value) > MAX_PATH or not control_free(value)):
            out.append(f"Invalid {_OPTION[field]} path: at most {MAX_PATH} characters, no control characters")
    unknown = [k for k in spec.mail_type if k not in KINDS]
    if unknown:
        out.append(f"Invalid --mail-type value {unknown[0][:MAX_NAME]!r}: give BEGIN, END, FAIL, REQUEUE, ALL, "
                   "TIME_LIMIT, TIME_LIMIT_90/80/50 or NONE")
    for field in ("partitions", "nodelist", "exclude"):
        values = getattr(spec, field)
        if len(values) > MAX_LIST or any(len(v) > MAX_NAME or not control_free(v) for v in values):
            out.append(f"Invalid {_OPTION[field]} value: at most {MAX_LIST} names of at most {MAX_NAME} "
                       "characters, no control characters")
    return out


def _payload_problems(spec: JobSpec) -> list[str]:
    """The script, environment, arguments and submit line (sizes, NULs, text that is not Unicode), and --signal."""
    out: list[str] = []
    script_bytes = len(spec.script.encode("utf-8", "surrogatepass"))
    if script_bytes > MAX_SCRIPT:
        out.append(f"Batch script is too large ({script_bytes:,} bytes; the limit is {MAX_SCRIPT:,}, Slurm's "
                   "max_script_size)")
    if "\0" in spec.script or not encodable(spec.script):
        out.append("Batch script contains a NUL character or text that is not valid Unicode")
    env_bytes = sum(len(k) + len(v) + 2 for k, v in spec.env.items())
    if len(spec.env) > MAX_ENV_VARS or env_bytes > MAX_ENV:
        out.append(f"Environment is too large ({len(spec.env)} variables, {env_bytes:,} bytes; the limit is "
                   f"{MAX_ENV_VARS} variables and {MAX_ENV:,} bytes)")
    names, values = "\0".join(spec.env), "".join(spec.env.values())
    if "\0" in values or "=" in names or not encodable(names + values) or \
            (spec.env and (not all(spec.env) or "\0\0" in names)):
        out.append("Invalid environment: variable names must be non-empty without '=' or NUL, values without NUL")
    if len(spec.argv) > MAX_ARGV or any("\0" in a or len(a) > MAX_PATH * 32 or not encodable(a) for a in spec.argv):
        out.append(f"Invalid script arguments: at most {MAX_ARGV}, without NUL characters")
    if len(spec.submit_line) > 65536 or "\0" in spec.submit_line or not encodable(spec.submit_line):
        out.append("Invalid submit line: at most 65,536 characters, without NUL characters")
    if spec.signal is not None:
        from .signals import parse_warning

        try:
            parse_warning(spec.signal)
        except ValueError as exc:
            out.append(str(exc)[0].upper() + str(exc)[1:])
    return out
