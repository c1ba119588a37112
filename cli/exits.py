"""The exit path every Slurm-named command shares."""
from __future__ import annotations

import sys


def exit_with(run) -> None:
    """Run ``run(argv) -> status`` on ``sys.argv`` and exit with it (a closed pipe or Ctrl-C is not a traceback)."""
    try:
        code = run(sys.argv[1:])
    except BrokenPipeError:
        code = 0
    except KeyboardInterrupt:
        code = 130
    raise SystemExit(code)
