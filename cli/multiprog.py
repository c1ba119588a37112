"""``srun --multi-prog FILE``: a different program for each task (MPMD), read as Slurm 22.05 reads the file.

Each line is ``RANKS PROGRAM [ARGS...]``: ``RANKS`` is ``*`` or a comma list of task ids and ranges
(``0,3``, ``1-2``); in the arguments ``%t`` is the task's id and ``%o`` its offset within the line's ids.
A line ending in ``\\`` goes on; ``#`` starts a comment line. Every task needs a line (a ``*`` line serves
the rest). The step runs one shell script that picks each task's program by ``SLURM_PROCID``; the script
travels in the step's environment (``ROTA_TASK_SCRIPT``: a command line holds no line breaks) and each task
drops it before its program runs.
"""
from __future__ import annotations

import shlex


class MultiProgError(ValueError):
    """Slurm's words for a file it would refuse."""


def read(path: str, ntasks: int | None) -> list[tuple[list[int] | None, list[str]]]:
    """The file's lines as (task ids, or None for ``*``; the program and its arguments)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        raise MultiProgError(f"Unable to open configuration file {path}") from None
    entries: list[tuple[list[int] | None, list[str]]] = []
    seen: set[int] = set()
    for number, line in _logical_lines(text):
        try:
            words = shlex.split(line)
        except ValueError:
            words = []
        if len(words) < 2:
            raise MultiProgError(f"Line {number} of configuration file {path} invalid")
        ranks = None if words[0] == "*" else _ranks(words[0], ntasks, number, path)
        if ranks is not None:
            seen.update(ranks)
        entries.append((ranks, words[1:]))
    if ntasks is not None and not any(r is None for r, _ in entries):
        missing = [i for i in range(ntasks) if i not in seen]
        if missing:
            raise MultiProgError(f"Configuration file {path} invalid, no record for task id {missing[0]}")
    return entries


def _logical_lines(text: str) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), start=1):
        if not pending:
            start = number
            if raw.lstrip().startswith("#") or not raw.strip():
                continue
        if raw.endswith("\\"):
            pending += raw[:-1] + " "
            continue
        out.append((start, pending + raw))
        pending = ""
    if pending.strip():
        out.append((start, pending))
    return out


def _ranks(text: str, ntasks: int | None, number: int, path: str) -> list[int]:
    ids: list[int] = []
    for part in text.split(","):
        low, dash, high = part.partition("-")
        if not low.isdecimal() or (dash and not high.isdecimal()) or (dash and int(high) < int(low)):
            raise MultiProgError(f"Line {number} of configuration file {path} invalid")
        ids.extend(range(int(low), int(high if dash else low) + 1))
    if ntasks is not None and any(i >= ntasks for i in ids):
        raise MultiProgError(f"Line {number} of configuration file {path} invalid")
    return ids


def _word(arg: str, task: str, offset: str) -> str:
    """One argument for the shell: literal text quoted, ``%t``/``%o`` as the given shell words."""
    out, i = [], 0
    while i < len(arg):
        if arg.startswith(("%t", "%o"), i):
            out.append(task if arg[i + 1] == "t" else offset)
            i += 2
        else:
            j = min([k for k in (arg.find("%t", i), arg.find("%o", i)) if k >= 0] or [len(arg)])
            out.append(shlex.quote(arg[i:j]))
            i = j
    return "".join(out) or "''"


SCRIPT_VAR = "ROTA_TASK_SCRIPT"


def as_step(script: str, name: str) -> tuple[list[str], dict[str, str]]:
    """The step's command and the variable that carries ``script`` to it."""
    return ["/bin/sh", "-c", f'__rota_s=${SCRIPT_VAR}; unset {SCRIPT_VAR}; eval "$__rota_s"', name], {SCRIPT_VAR: script}


def script(path: str, ntasks: int | None) -> str:
    """The shell script that runs each task's program from the file at ``path``."""
    arms = []
    star = None
    proc = '"$SLURM_PROCID"'
    for ranks, argv in read(path, ntasks):
        if ranks is None:
            star = star or argv
            continue
        for offset, rank in enumerate(ranks):
            arms.append(f"{rank}) exec {' '.join(_word(a, str(rank), str(offset)) for a in argv)} ;;")
    if star is not None:
        arms.append(f"*) exec {' '.join(_word(a, proc, proc) for a in star)} ;;")
    else:
        arms.append(f"*) echo \"srun: error: {shlex.quote(path)}: no program for task $SLURM_PROCID\" >&2; exit 1 ;;")
    return 'case "$SLURM_PROCID" in\n' + "\n".join(arms) + "\nesac"


def with_task_scripts(body: str, prolog: str | None, epilog: str | None) -> str:
    """``--task-prolog``/``--task-epilog`` around ``body`` (a script): each task runs the prolog first, taking
    what it prints as Slurm does (``export NAME=value``, ``unset NAME``, ``print TEXT``), then its command, then
    the epilog, apart from the task's output and not waited for (the task's exit status stays its command's; what
    the epilog leaves running ends with the step)."""
    lines = []
    if prolog:
        lines += [f"__rota_said=$({shlex.quote(prolog)}) || true",
                  'while IFS= read -r __rota_line; do',
                  '  case "$__rota_line" in',
                  '    "export "*) export "${__rota_line#export }" 2>/dev/null ;;',
                  '    "unset "*) unset "${__rota_line#unset }" 2>/dev/null ;;',
                  '    "print "*) printf \'%s\\n\' "${__rota_line#print }" ;;',
                  '  esac',
                  'done <<__ROTA_END__', '$__rota_said', '__ROTA_END__']
    if epilog:
        lines += ["(", body, ")", "__rota_code=$?", f"{shlex.quote(epilog)} </dev/null >/dev/null 2>&1 &",
                  'exit "$__rota_code"']
    else:
        lines += [body]
    return "\n".join(lines)
