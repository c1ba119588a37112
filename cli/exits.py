"""The exit path every Slurm-named command shares."""
from __future__ import annotations

import sys
from typing import Callable, NoReturn


def exit_with(run: Callable[[list[str]], int]) -> NoReturn:
    """Run a command on ``sys.argv`` and exit with its status (a closed pipe or Ctrl-C is not a traceback)."""
    try:
        code = run(sys.argv[1:])
    except BrokenPipeError:
        code = 0
    except KeyboardInterrupt:
        code = 130
    raise SystemExit(code)
