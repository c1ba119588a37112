"""``--export``: which of the submitter's environment variables a job or step gets, as Slurm 22.05 reads it.

``ALL`` (the default): every one. ``NONE``: only ``SLURM_*`` ones, on top of a login-like base (``HOME``,
``USER``, ``LOGNAME``, ``SHELL``, a standard ``PATH``), as Slurm loads the user's own environment then.
``A,B``: only those and ``SLURM_*``; ``ALL,A=1``: every one, ``A`` set to ``1``. ``NAME=value`` items may
contain commas only at the end of the list (Slurm's rule as well: the value runs to the next comma).
"""
from __future__ import annotations

import os

LOGIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class ExportError(ValueError):
    """An ``--export`` value that names no variable; its text says which item."""


def _login_base(environ: dict[str, str]) -> dict[str, str]:
    import pwd

    try:
        pw = pwd.getpwuid(os.getuid())
        home, user, shell = pw.pw_dir, pw.pw_name, pw.pw_shell or "/bin/sh"
    except KeyError:
        home, user, shell = "/", str(os.getuid()), "/bin/sh"
    return {"HOME": home, "USER": user, "LOGNAME": user, "SHELL": shell, "PATH": LOGIN_PATH}


def exported(value: str | None, environ: dict[str, str]) -> dict[str, str]:
    """The environment ``--export=value`` gives a job submitted from ``environ``."""
    if value is None or value.strip().upper() == "ALL":
        return dict(environ)
    items = [item for item in value.split(",") if item]
    if not items:
        raise ExportError("--export needs ALL, NONE or a list of variable names")
    words = {item.upper() for item in items if "=" not in item}
    if "ALL" in words:
        env = dict(environ)
    else:
        env = _login_base(environ) if "NONE" in words else {}
        env.update({k: v for k, v in environ.items() if k.startswith("SLURM_")})
    for item in items:
        name, eq, val = item.partition("=")
        if not name or not (name.replace("_", "a").isalnum() and not name[0].isdigit()):
            raise ExportError(f"--export: '{item}' is not a variable name (letters, digits and '_')")
        if eq:
            env[name] = val
        elif name.upper() not in ("ALL", "NONE") and name in environ:
            env[name] = environ[name]
    if "ALL" not in words and "NONE" not in words and "PATH" not in env:
        env.update({k: v for k, v in _login_base(environ).items() if k not in env})
    return env
