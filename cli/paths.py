"""Where a running rota keeps its state (a light module: every command imports it, so no pathlib)."""
from __future__ import annotations

import os


def state_dir() -> str:
    """``$ROTA_STATE_DIR``, else ``$XDG_DATA_HOME/rota``, else ``~/.local/share/rota``."""
    env = os.environ.get("ROTA_STATE_DIR")
    if env:
        return env
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "rota")


def default_state_dir():  # -> pathlib.Path
    from pathlib import Path

    return Path(state_dir())


def projections_db() -> str:
    """The projection database of the local cluster (``$ROTA_PROJECTIONS`` overrides)."""
    return os.environ.get("ROTA_PROJECTIONS") or os.path.join(state_dir(), "projections.sqlite")
