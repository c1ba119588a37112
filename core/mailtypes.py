"""``--mail-type``'s words (pure, and light: sbatch reads them in the command server, which imports little)."""
from __future__ import annotations

KINDS = frozenset(("NONE", "BEGIN", "END", "FAIL", "REQUEUE", "ALL", "INVALID_DEPEND", "STAGE_OUT", "TIME_LIMIT",
                   "TIME_LIMIT_90", "TIME_LIMIT_80", "TIME_LIMIT_50", "ARRAY_TASKS", "IDLE_GPU"))
ALL = ("BEGIN", "END", "FAIL", "REQUEUE", "INVALID_DEPEND", "STAGE_OUT")


class MailTypeError(ValueError):
    """A --mail-type that names no kind of notice."""


def expand(text: str) -> tuple[str, ...]:
    """``--mail-type`` as the kinds it asks for: ALL named by its parts, NONE as none."""
    out: list[str] = []
    for word in (w.strip().upper() for w in text.split(",")):
        if word not in KINDS:
            raise MailTypeError(word)
        out.extend(ALL if word == "ALL" else () if word == "NONE" else (word,))
    return tuple(dict.fromkeys(out))
