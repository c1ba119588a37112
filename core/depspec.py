"""A ``--dependency`` value read: ``afterok:1:2,afterany:3``, ``?``-lists, ``singleton`` (pure; what the terms
say of the state is :mod:`rota.core.deps`)."""
from __future__ import annotations

from dataclasses import dataclass

DEP_TYPES = ("after", "afterany", "afterok", "afternotok", "singleton", "aftercorr")


class DependencySpecError(ValueError):
    """A --dependency value Slurm would reject."""


@dataclass(frozen=True, slots=True)
class DepTerm:
    kind: str
    job_id: int = 0
    delay: int = 0   # seconds, for after:id+min


@dataclass(frozen=True, slots=True)
class Dependency:
    terms: tuple[DepTerm, ...]
    any_of: bool     # "?" separated


def parse_dependency(text: str) -> Dependency:
    """Parse a ``--dependency`` string; ``,`` means all, ``?`` means any (not mixed)."""
    raw = text.strip()
    if "," in raw and "?" in raw:
        raise DependencySpecError("dependency list cannot mix ',' and '?'")
    any_of = "?" in raw
    terms: list[DepTerm] = []
    for item in raw.split("?" if any_of else ","):
        item = item.strip()
        if item == "singleton":
            terms.append(DepTerm("singleton"))
            continue
        kind, colon, rest = item.partition(":")
        if kind not in DEP_TYPES or not colon or not rest:
            raise DependencySpecError(f"invalid dependency {item!r}: use TYPE:JOBID[:JOBID...]")
        for ident in rest.split(":"):
            jid_s, plus, delay_s = ident.partition("+")
            jid_s = jid_s.split("_")[0]
            if not jid_s.isdecimal() or (plus and not delay_s.isdecimal()):
                raise DependencySpecError(f"invalid job id {ident!r} in dependency {item!r}")
            terms.append(DepTerm(kind, int(jid_s), int(delay_s) * 60 if plus else 0))
    return Dependency(tuple(terms), any_of)


OUTCOME_KINDS = ("afterok", "afternotok")   # the terms that read how a job ended, after it left the state


def outcome_ids(text: str) -> tuple[int, ...]:
    """The jobs whose outcome a job with this dependency reads (none when it does not parse)."""
    try:
        return tuple(t.job_id for t in parse_dependency(text).terms if t.kind in OUTCOME_KINDS)
    except DependencySpecError:
        return ()
