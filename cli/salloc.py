"""``salloc``: get an allocation, run a command (or a shell) here with its variables, give it back on exit."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

from .options import NO, OptionError, defined_options, parse, table, unsupported
from .srun import OPTIONS as STEP_OPTIONS, _job_options

OPTIONS = [*STEP_OPTIONS, *table(("", "no-shell", NO, "no_shell"))]


def _command_line(argv: list[str]) -> tuple[dict, list[str]] | int:
    """The options and the command; or the exit status when the command line settled it (a bad one, --help)."""
    try:
        values, command = parse("salloc", argv, OPTIONS, stop_at_operand=True)
        for warning in unsupported("salloc", values):
            sys.stderr.write(warning + "\n")
    except OptionError as exc:
        sys.stderr.write(f"{exc}\nTry \"salloc --help\" for more information\n")
        return 1
    from .helptext import answered

    if answered("salloc", values, OPTIONS, sys.stdout, tail="[command [args...]]"):
        return 0
    if values.get("verbose"):
        sys.stderr.write("".join(line + "\n" for line in defined_options("salloc", values, OPTIONS)))
    return values, command


def main(argv: list[str]) -> int:
    read = _command_line(argv)
    if isinstance(read, int):
        return read
    values, command = read
    from .allocation import AllocationError, allocate, allocation_env, job_view, release
    from .client import NoCluster

    no_shell = bool(values.pop("no_shell", False))
    command = command or [os.environ.get("SHELL") or "/bin/sh"]
    try:
        view = allocate("salloc", _job_options(values), "interactive" if len(command) == 1 and not argv else
                        os.path.basename(command[0]), immediate=values.get("immediate"))
    except (AllocationError, NoCluster) as exc:
        sys.stderr.write(f"salloc: error: {exc}\n")
        return 1
    job_id = int(view["job_id"])
    if no_shell:     # the allocation stays until its time limit or scancel; srun --jobid uses it
        return 0
    env = dict(os.environ, **allocation_env(view))
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C belongs to what runs in the allocation
    try:
        child = subprocess.Popen(command, env=env, restore_signals=True,
                                 preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    except OSError as exc:
        sys.stderr.write(f"salloc: error: cannot run {command[0]}: {exc.strerror}\n")
        release(job_id, 1)
        return 1
    revoked = threading.Event()

    def watch() -> None:     # the allocation ended under us (time limit, scancel): so does what runs in it
        while child.poll() is None:
            try:
                if job_view(job_id).get("state") != "RUNNING":
                    revoked.set()
                    sys.stderr.write(f"salloc: Job allocation {job_id} has been revoked.\n")
                    child.send_signal(signal.SIGHUP)
                    return
            except (AllocationError, NoCluster):
                pass
            revoked.wait(2.0)

    threading.Thread(target=watch, daemon=True).start()
    status = child.wait()
    signal.signal(signal.SIGINT, previous)
    code = status if status >= 0 else 128 - status
    if not revoked.is_set():
        sys.stderr.write(f"salloc: Relinquishing job allocation {job_id}\n")
        release(job_id, code if code < 128 else 0, code - 128 if code > 128 else 0)
    return code


def main_exit() -> None:
    from .exits import exit_with

    exit_with(main)


if __name__ == "__main__":
    main_exit()
