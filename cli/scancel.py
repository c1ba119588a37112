"""``scancel``: cancel jobs by id (``123``, ``123_4``, ``123_[1-3]``) or by filter (-u, -t, -n, -p)."""
from __future__ import annotations

import os
import re
import sys

from .options import NO, REQUIRED, OptionError, parse, unsupported, table

_ID = re.compile(r"(\d+)(?:_(\d+|\[[\d,\-]+\]))?(?:\.(\d+))?")


# scancel's options (Slurm 22.05), read as getopt_long reads them (see rota.cli.options)
OPTIONS = table(
    ("A", "account", REQUIRED, "!account"), ("b", "batch", NO, "batch"), ("c", "cron", NO, "!cron"),
    ("f", "full", NO, "~full"), ("H", "hurry", NO, "~hurry"), ("i", "interactive", NO, "!interactive"),
    ("M", "clusters", REQUIRED, "!clusters"), ("n", "name jobname", REQUIRED, "name"), ("", "me", NO, "me"),
    ("p", "partition", REQUIRED, "partition"), ("q", "qos", REQUIRED, "!qos"), ("Q", "quiet", NO, "quiet"),
    ("R", "reservation", REQUIRED, "!reservation"), ("", "sibling", REQUIRED, "!sibling"),
    ("s", "signal", REQUIRED, "signal"), ("t", "state", REQUIRED, "state"), ("u", "user", REQUIRED, "user"),
    ("v", "verbose", NO, "verbose"), ("V", "version", NO, "version"), ("w", "nodelist", REQUIRED, "!nodelist"),
    ("", "wckey", REQUIRED, "!wckey"), ("h", "help", NO, "help"), ("", "usage", NO, "usage"))


class _Options:
    def __init__(self, values: dict, ids: list[str]) -> None:
        self.values, self.ids = values, ids

    def __getattr__(self, name: str):
        return self.values.get(name)


def _signal(text: str | None) -> int:
    if text is None:
        return 15
    from rota.core.signals import signal_number

    sig = signal_number(text)
    if sig is None:
        raise ValueError(f"scancel: error: Unknown job signal: {text}")
    return sig


class _Usage(Exception):
    """A command line scancel refuses (its message is the error line)."""


def run(argv: list[str], out=sys.stdout, err=sys.stderr) -> int:
    from .client import NoCluster

    try:
        values, operands = parse("scancel", argv, OPTIONS)
        warnings = unsupported("scancel", values)
    except OptionError as exc:
        err.write(f"{exc}\nTry \"scancel --help\" for more information\n")
        return 1
    ns = _Options(values, operands)
    from .helptext import answered

    if answered("scancel", values, OPTIONS, out, tail="[job_id[_array_id][.step_id]]"):
        return 0
    for warning in warnings:
        err.write(warning + "\n")
    try:
        sig = _signal(ns.signal)
        targets = _targets(ns.ids)
        if not targets and not _filtered(ns):
            raise _Usage("scancel: error: No job identification provided")
        if _filtered(ns):
            targets = _matching(ns, targets)
        return _send(ns, targets, sig, err)
    except (ValueError, _Usage) as exc:
        err.write(f"{exc}\n")
        return 1
    except NoCluster as exc:
        err.write(f"scancel: error: {exc}\n")
        return 1


Target = tuple[int, "list[int] | None", "int | None"]


def _targets(ids: list[str]) -> list[Target]:
    """Job ids as given (``N``, ``N_T``, ``N_[1-3]``, ``N.S``, comma lists): (job id, array task indices or
    None, step id or None)."""
    targets: list[Target] = []
    for item in ids:
        for part in re.split(r",(?![^\[]*\])", item):
            m = _ID.fullmatch(part)
            if not m:
                raise _Usage(f"scancel: error: Invalid job id {part}")
            tasks = None
            if m.group(2):
                from rota.core.arrays import parse_array

                tasks = list(parse_array(m.group(2).strip("[]")).indices)
            targets.append((int(m.group(1)), tasks, int(m.group(3)) if m.group(3) else None))
    return targets


def _filtered(ns: "_Options") -> bool:
    return bool(ns.user or ns.me or ns.state or ns.name or ns.partition)


def _matching(ns: "_Options", targets: list[Target]) -> list[Target]:
    """The queued jobs the filters (--user, --me, --state, --name, --partition) select, among ``targets``
    when ids were given too."""
    from .client import request

    reply = request("queue", {})
    if not reply.get("ok"):
        raise _Usage(f"scancel: error: {'; '.join(reply.get('error') or ['unknown error'])}")
    users = set(ns.user.split(",")) if ns.user else None
    states = {s.strip().upper() for s in (ns.state or "").split(",") if s}
    states = {{"PD": "PENDING", "R": "RUNNING"}.get(s, s) for s in states}
    wanted = {t for t, _, _ in targets}
    return [(j["job_id"], None, None) for j in reply["jobs"]
            if (not ns.me or j["uid"] == os.getuid())
            and (users is None or j["user"] in users or str(j["uid"]) in users)
            and (not states or j["state"] in states)
            and (ns.name is None or j["name"] == ns.name)
            and (ns.partition is None or j["partition"] == ns.partition)
            and (not wanted or j["job_id"] in wanted)]


def _send(ns: "_Options", targets: list[Target], sig: int, err) -> int:
    """Cancel (or, with --signal, only signal) each target; 1 if any was refused.

    As in Slurm 22.05, ``--signal`` goes to the job's steps, not its batch shell; ``-b`` sends it to the
    batch shell only; ``N.S`` cancels (or signals) one step."""
    from .client import request

    code = 0
    for jid, tasks, step in targets:
        if ns.verbose:
            err.write(f"scancel: Terminating job {jid}" + (f".{step}" if step is not None else "") + "\n")
        body: dict[str, object] = {"job_id": jid, "signal": sig}
        if tasks is not None:
            body["tasks"] = tasks
        if step is not None:
            body.update(step_id=step, batch=False, steps=True, signal=sig if ns.signal is not None else 9)
        elif ns.signal is not None:
            body.update(batch=bool(ns.batch), steps=not ns.batch)
        # Slurm: --signal only signals the job (it is not cancelled unless the signal ends it)
        reply = request("signal" if ns.signal is not None or step is not None else "cancel", body)
        # Slurm 22.05 is silent (exit 0) for a job it no longer knows and for one that has already ended
        if not reply.get("ok") and reply.get("code") not in ("no_job", "finished"):
            err.write(f"scancel: error: Kill job error on job id {jid}: {reply['error'][0]}\n")
            code = 1
    return code


def main_exit() -> None:
    from .exits import exit_with

    exit_with(run)


if __name__ == "__main__":
    main_exit()
