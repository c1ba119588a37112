"""Where a running rota keeps its state (a light module: every command imports it)."""
from __future__ import annotations

import os
from pathlib import Path


def default_state_dir() -> Path:
    """``$ROTA_STATE_DIR``, else ``$XDG_DATA_HOME/rota``, else ``~/.local/share/rota``."""
    env = os.environ.get("ROTA_STATE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "rota"


def projections_db() -> Path:
    """The projection database of the local cluster (``$ROTA_PROJECTIONS`` overrides)."""
    return Path(os.environ.get("ROTA_PROJECTIONS") or default_state_dir() / "projections.sqlite")
