"""How the daemons (`rota up`, `rota agent`) write their log lines: who is speaking, and when, as
slurmctld's and slurmd's logs give it (``[2026-12-06T21:20:00.123]``), so a fault's story can be read in
order across the pieces."""
from __future__ import annotations

import logging


def daemon_logging(who: str, level: str | int = logging.WARNING) -> None:
    """Log lines as ``who: [time] message`` on standard error, from ``level`` on."""
    logging.basicConfig(level=level, format=f"{who}: [%(asctime)s.%(msecs)03d] %(message)s",
                        datefmt="%Y-%m-%dT%H:%M:%S")
