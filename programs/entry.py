"""``rota``'s entry point. The log's lookups (``rota why``, ``replay``, ``history``) go to this host's warm command
server when it serves them (``rota up``'s does), skipping Python's imports of rota; every other command, and
those where no server takes them, runs in this process (:mod:`rota.programs.main`). Only the standard library
is imported before that choice."""
from __future__ import annotations

import sys


def child_argv() -> list[str]:
    """How a process of rota's starts ``rota`` as its child: this Python, isolated (``-I``), this entry point."""
    return [sys.executable, "-I", "-m", "rota.programs.entry"]


def main() -> None:
    from rota.cli.thin import LOG_COMMANDS, call

    if len(sys.argv) > 1 and sys.argv[1] in LOG_COMMANDS:
        code = call("rota", sys.argv[1:])
        if code is not None:
            raise SystemExit(code)
    from rota.programs.main import main as run_here

    run_here("rota")       # the name its usage lines give, however it was started (python -m as a child)


if __name__ == "__main__":
    main()
