"""The exit path every Slurm-named command shares."""
from __future__ import annotations

import sys
from typing import Callable

# called with the exit status just before the command leaves (the command server's child sets it, so a
# command that leaves with os._exit still reports its status to its caller)
before_exit: Callable[[int], None] | None = None


def exit_with(run, at_once: bool = False) -> None:
    """Run ``run(argv) -> status`` on ``sys.argv`` and exit with it (a closed pipe or Ctrl-C is not a traceback).
    ``at_once``: flush and leave without the interpreter's shutdown (a command with threads still blocked
    in reads, such as srun's)."""
    try:
        code = run(sys.argv[1:])
    except BrokenPipeError:
        code = 0
    except KeyboardInterrupt:
        code = 130
    if before_exit is not None:
        before_exit(code)
    if at_once:
        import os

        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (BrokenPipeError, ValueError):
            pass
        os._exit(code)
    raise SystemExit(code)
