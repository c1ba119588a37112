"""``-M/--clusters``: rota is one cluster, so a command given its name, or ``all``, runs as without the option."""
from __future__ import annotations


def unknown(given: str, name: str) -> list[str]:
    """The names in ``given`` (``-M``'s comma-separated list) that are neither ``all`` nor this cluster."""
    names = [n.strip() for n in given.split(",") if n.strip()]
    if any(n.lower() == "all" for n in names):
        return []
    return [n for n in names if n != name] if name in names else names or [given]


def refusal(prog: str, names: list[str]) -> str:
    """Slurm's words for a cluster it cannot reach."""
    return "\n".join(f"{prog}: error: '{n}' can't be reached now, or it is an invalid entry for --cluster.  "
                     "Use 'sacctmgr list clusters' to see available clusters." for n in names)


def heading(name: str) -> str:
    """What squeue and sinfo print above a cluster's table when ``-M`` is given (not with ``-h``)."""
    return f"CLUSTER: {name}"
