"""Who is asking, and what they may do: Slurm's rights, decided from the configuration (pure).

The shell authenticates a caller (a credential issued by a local signer from the kernel's
``SO_PEERCRED``) and resolves the user name from the uid; this module turns that identity into a
rights level. The commands in :mod:`rota.core.commands` check the level against the job or node
they touch, so a replay sees exactly the rules the controller applied.
"""
from __future__ import annotations

from dataclasses import dataclass

from .events import AuthConfig

USER, OPERATOR, ADMIN = 0, 1, 2
LEVEL_NAMES = {USER: "user", OPERATOR: "operator", ADMIN: "administrator"}


@dataclass(frozen=True, slots=True)
class Caller:
    """An authenticated caller: the kernel's uid/gid, the name its uid maps to, its rights level
    and the host whose signer vouched for it."""

    uid: int
    gid: int
    user: str
    level: int = USER
    host: str = ""

    @property
    def operator(self) -> bool:
        """Operators and administrators act on anyone's jobs and on nodes."""
        return self.level >= OPERATOR

    def owns(self, uid: int) -> bool:
        return self.uid == uid

    def may_touch(self, uid: int) -> bool:
        """Whether this caller may act on a job owned by ``uid``."""
        return self.uid == uid or self.level >= OPERATOR

    def actor(self) -> str:
        """How the log names this caller: ``user(uid)@host``."""
        return f"{self.user}({self.uid})" + (f"@{self.host}" if self.host else "")


ROOT = Caller(0, 0, "root", ADMIN)


def level_of(auth: AuthConfig, uid: int, user: str) -> int:
    """The rights of ``uid``/``user``: root and SlurmUser are administrators, then the named lists."""
    if uid == 0 or user == auth.slurm_user or user in auth.admins:
        return ADMIN
    if user in auth.operators:
        return OPERATOR
    return USER


def caller(auth: AuthConfig | None, uid: int, gid: int, user: str, host: str = "") -> Caller:
    """A :class:`Caller` with the rights ``auth`` gives it (no configuration yet: only root is an admin)."""
    return Caller(uid, gid, user, level_of(auth or AuthConfig(), uid, user), host)
