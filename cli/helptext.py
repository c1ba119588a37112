"""``--usage`` and ``--help`` in the layouts of Slurm 22.05's commands, made from each command's option table.

``--usage`` is Slurm's bracketed synopsis (``Usage: squeue [-A account] [--array] ...``), wrapped as Slurm
wraps it; ``--help`` lists every option with its value and one line on what it does. An option rota
refuses (``!`` in the table) or ignores (``~``) says so, so the page never promises what rota does not do.
One word list serves every command: an option with one name means one thing in each of them.
"""
from __future__ import annotations

from .options import NO, OPTIONAL, Option

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

WIDTH = 79

# long name -> (the value's name, what it does)
WORDS: dict[str, tuple[str, str]] = {
    "account": ("name", "charge job to specified account"),
    "accounts": ("account_list", "only jobs of these accounts"),
    "all": ("", "all of them: every partition, user or job the command would otherwise leave out"),
    "allusers": ("", "jobs of all users"),
    "array": ("indexes", "job array index values"),
    "batch": ("", "signal the batch step only"),
    "begin": ("time", "defer job until HH:MM MM/DD/YY"),
    "chdir": ("path", "change remote current working directory"),
    "clusters": ("cluster_names", "the clusters to ask (rota: the one cluster, or all)"),
    "constraint": ("list", "specify a list of constraints"),
    "cpus-per-gpu": ("n", "number of CPUs required per allocated GPU"),
    "cpus-per-task": ("ncpus", "number of cpus required per task"),
    "dependency": ("type:jobid[:time]", "defer job until condition on jobid is satisfied"),
    "endtime": ("time", "select jobs eligible before this time"),
    "error": ("err", "file for batch script's standard error"),
    "exclude": ("hosts...", "exclude a specific list of hosts"),
    "exclusive": ("", "allocate nodes in exclusive mode"),
    "export": ("names", "specify environment variables to export"),
    "format": ("format", "format specification"),
    "Format": ("format", "format specification (field:width, comma separated)"),
    "gpus": ("n", "count of GPUs required for the job"),
    "gpus-per-node": ("n", "number of GPUs required per allocated node"),
    "gpus-per-task": ("n", "number of GPUs required per spawned task"),
    "gres": ("list", "required generic resources"),
    "hold": ("", "submit job in held state"),
    "immediate": ("secs", "exit if resources not available in \"secs\""),
    "input": ("in", "file for batch script's standard input"),
    "job-name": ("jobname", "name of job"),
    "jobs": ("job(s)", "comma separated list of jobs"),
    "label": ("", "prepend task number to lines of stdout/err"),
    "long": ("", "long report"),
    "mail-type": ("type", "notify on state change: BEGIN, END, FAIL or ALL"),
    "mail-user": ("user", "who to send email notification for job state changes"),
    "me": ("", "equivalent to --user=<my username>"),
    "mem": ("MB", "minimum amount of real memory"),
    "mem-per-cpu": ("MB", "maximum amount of real memory per allocated cpu required by the job"),
    "mem-per-gpu": ("MB", "real memory required per allocated GPU"),
    "mincpus": ("n", "minimum number of logical processors per node"),
    "name": ("name", "comma separated list of job names"),
    "nice": ("value", "decrease scheduling priority by value"),
    "nodelist": ("hosts...", "request a specific list of hosts"),
    "nodes": ("N", "number of nodes on which to run (N = min[-max])"),
    "noheader": ("", "no headers on output"),
    "ntasks": ("ntasks", "number of tasks to run"),
    "ntasks-per-node": ("n", "number of tasks to invoke on each node"),
    "output": ("out", "file for batch script's standard output"),
    "overcommit": ("", "overcommit resources"),
    "overlap": ("", "allow this step to share resources with other steps"),
    "parsable": ("", "output is '|' delimited with a '|' at the end"),
    "parsable2": ("", "output is '|' delimited without a '|' at the end"),
    "partition": ("partition", "partition requested"),
    "partitions": ("partitions", "comma separated list of partitions"),
    "qos": ("qos", "quality of service"),
    "quiet": ("", "quiet mode (suppress informational messages)"),
    "requeue": ("", "if set, permit the job to be requeued"),
    "no-requeue": ("", "if set, do not permit the job to be requeued"),
    "signal": ("name", "signal to send"),
    "sort": ("fields", "comma separated list of fields to sort on"),
    "starttime": ("time", "select jobs eligible after this time"),
    "state": ("state_list", "select jobs based on their state"),
    "states": ("states", "comma separated list of states"),
    "test-only": ("", "validate the request and report when it would start; submit nothing"),
    "time": ("minutes", "time limit"),
    "time-min": ("minutes", "minimum time limit (if distinct)"),
    "user": ("user_name", "the user whose jobs are meant"),
    "users": ("user_list", "only these users' jobs"),
    "verbose": ("", "verbose mode (multiple -v's increase verbosity)"),
    "version": ("", "output version information and exit"),
    "wait": ("", "wait for the job to end before exiting"),
    "weights": ("", "show the weights of the priority factors"),
    "wrap": ("command string", "wrap command string in a sh script and submit"),
}
OWN = frozenset({"help", "usage"})


def _value(o: Option) -> str:
    return WORDS.get(o.longs[0], ("value", ""))[0] or "value" if o.longs else "value"


def _bracket(o: Option) -> str:
    """One option in a synopsis: ``[-p partition]``, ``[--mem=MB]``, ``[--hold]``."""
    if o.short:
        return f"[-{o.short}]" if o.arg != 1 else f"[-{o.short} {_value(o)}]"
    name = o.longs[0]
    return f"[--{name}]" if o.arg != 1 else f"[--{name}={_value(o)}]"


def usage(prog: str, options: Iterable[Option], tail: str = "") -> str:
    """``prog --usage``: every option in brackets, wrapped under the first, then ``tail``."""
    head = f"Usage: {prog} "
    lines, line = [], head
    items = [_bracket(o) for o in options if not (set(o.longs) & OWN)] + ([tail] if tail else [])
    for item in items:
        if len(line) + len(item) > WIDTH and line.strip() != head.strip():
            lines.append(line.rstrip())
            line = " " * len(head)
        line += item + " "
    lines.append(line.rstrip())
    return "\n".join(lines) + "\n"


def _option_line(o: Option, colon: bool) -> str:
    short = f"-{o.short}, " if o.short else "    "
    name = o.longs[0] if o.longs else ""
    value = "" if o.arg == NO else (f"[={_value(o)}]" if o.arg == OPTIONAL else f"={_value(o)}")
    words = WORDS.get(name, ("", ""))[1]
    if o.dest.startswith("!"):
        words = "not supported by rota (refused)"
    elif o.dest.startswith("~"):
        words = "ignored by rota"
    left = f"  {short}--{name}{':' if colon else value}"
    return f"{left:<32} {words}".rstrip() if len(left) < 32 else f"{left}\n{'':32} {words}".rstrip()


def help_page(prog: str, options: Iterable[Option], tail: str = "", colon: bool = False, extra: str = "") -> str:
    """``prog --help``: Slurm's ``Usage: prog [OPTIONS]`` page (``colon``: sacct's ``[<OPTION>]`` page)."""
    table = [o for o in options if not (set(o.longs) & OWN) and o.longs]
    if colon:
        head = [f"{prog} [<OPTION>]", "    Valid <OPTION> values are:"]
    else:
        head = [f"Usage: {prog} [OPTIONS]" + (f" {tail}" if tail else ""), ""]
    body = [_option_line(o, colon) for o in sorted(table, key=lambda o: (o.short or o.longs[0]).lower())]
    foot = ["", "Help options:", "  -h, --help                     show this help message",
            "      --usage                    display brief usage message", ""]
    return "\n".join(head + body + ([extra] if extra else []) + foot)


def answered(prog: str, values: dict, options: Iterable[Option], out, tail: str = "", colon: bool = False,
             extra: str = "") -> bool:
    """Write what ``--usage``, ``--help`` or ``--version`` asks for; whether one was asked."""
    from .options import VERSION_LINE

    if values.get("usage"):
        out.write(usage(prog, options, tail))
    elif values.get("help"):
        out.write(help_page(prog, options, tail, colon, extra))
    elif values.get("version"):
        out.write(VERSION_LINE + "\n")
    else:
        return False
    return True
