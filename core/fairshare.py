"""Fair-share over the account tree (pure): each user association's factor from shares and decayed usage.

Usage is CPU-seconds (Slurm's billing without TRESBillingWeights), decayed by :mod:`rota.core.usage`; a
running job's counts as it runs.
Two algorithms, as Slurm 22.05 has them:

* **Fair Tree** (the default): at each level every child's Level Fairshare is ``LF = S / U``, its shares
  over its siblings' and its usage over its siblings' (no usage: infinite); children are visited in
  descending LF, users ranked in the order met, depth first; a user's factor is ``rank / users`` (the
  first met gets 1.0). At equal LF users come before accounts and share a rank; accounts with equal LF
  have their children ranked together, the first of them sharing the rank of what tied before it.
* **classic** (``PriorityFlags=NO_FAIR_TREE``): ``F = 2^(-UE/S)`` with S the shares normalised down the
  tree and UE the effective usage, ``U + (UE(parent) - U) * shares / siblings' shares`` (``U`` for
  children of root); 0.5 means exactly at its share.

Factors are parts per million, computed with exact fractions and integer powers of two, so every
machine replaying the log ranks jobs the same way.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from .state import State
from .usage import Q, decay_factor, rolled_up, value_at, with_running

PPM = 1_000_000
ROOT = "root"


@dataclass(slots=True)
class ShareRow:
    """One line of ``sshare``: an account (``user`` empty) or a user's association."""

    account: str
    user: str
    depth: int
    raw_shares: int
    norm_shares: Fraction
    raw_usage: int                    # CPU-seconds, decayed to now
    norm_usage: Fraction              # of the whole cluster's
    effective_usage: Fraction
    level_fs: Fraction | None = None  # S / U at its level (None: no usage, infinitely under its share)
    factor: int = 0                   # users: the fair-share factor, parts per million


def _exp2_neg(x: Fraction) -> int:
    """2 ** -x in parts per million (x >= 0)."""
    if x <= 0:
        return PPM
    return decay_factor(x.numerator, x.denominator) * PPM >> Q


def share_rows(state: State, now: int) -> list[ShareRow]:
    """The account tree with each account's and association's shares, usage and factor, in ``sshare``
    order (root, then depth first: an account's users, then its sub-accounts, each by name)."""
    cfg = state.config
    half_life = cfg.priority.decay_half_life if cfg is not None else 0
    fair_tree = cfg.priority.fair_tree if cfg is not None else True
    parents = {name: (a.parent if a.parent in state.accounts else ROOT) for name, a in state.accounts.items()}
    by_account, by_assoc = _running_use(state, now)
    accounts = rolled_up(with_running(state.usage, by_account, now, half_life), parents, now, half_life)
    assoc_usage = with_running(state.assoc_usage, by_assoc, now, half_life)
    kids: dict[str, list[str]] = {ROOT: []}
    for name in sorted(parents):
        kids.setdefault(parents[name], []).append(name)
    users: dict[str, list[str]] = {ROOT: [ROOT]}    # Slurm's database gives root's account a root user
    for user, account in sorted(state.associations):
        if (user, account) != (ROOT, ROOT):
            users.setdefault(account, []).append(user)
    total = accounts[ROOT][0]
    root = ShareRow(ROOT, "", 0, 0, Fraction(1), total, Fraction(1) if total else Fraction(0), Fraction(1))
    rows = [root]

    def level(parent: ShareRow, account: str, depth: int) -> list[ShareRow]:
        """The rows below ``account`` (whose own row is ``parent``), depth first."""
        members: list[tuple[str, str, int, int]] = []      # (account, user, raw shares, usage)
        for user in users.get(account, ()):
            assoc = state.associations.get((user, account))
            members.append((account, user, assoc.fairshare if assoc is not None else 1,
                            value_at(assoc_usage.get((user, account)), now, half_life)[0]))
        for sub in kids.get(account, ()):
            members.append((sub, "", state.accounts[sub].fairshare, accounts.get(sub, (0, 0))[0]))
        sums = (sum(m[2] for m in members), sum(m[3] for m in members))
        out: list[ShareRow] = []
        for member in members:
            row = _member_row(parent, account == ROOT, member, sums, total, depth, fair_tree)
            out.append(row)
            if not row.user:
                out.extend(level(row, row.account, depth + 1))
        return out

    rows.extend(level(root, ROOT, 1))
    if fair_tree:
        _rank(rows)
    return rows


def _running_use(state: State, now: int) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
    """The CPU-seconds running jobs have used so far, per account and per association (Slurm charges a
    running job as it runs; its whole run is charged when it ends)."""
    by_account: dict[str, int] = {}
    by_assoc: dict[tuple[str, str], int] = {}
    for jid in state.running:
        job = state.jobs[jid]
        used = sum(a.cpus for a in job.alloc) * max(0, now - job.start_time)
        if used:
            spec = job.spec
            by_account[spec.account] = by_account.get(spec.account, 0) + used
            by_assoc[(spec.user, spec.account)] = by_assoc.get((spec.user, spec.account), 0) + used
    return by_account, by_assoc


def _member_row(parent: ShareRow, under_root: bool, member: tuple[str, str, int, int], sums: tuple[int, int],
                total: int, depth: int, fair_tree: bool) -> ShareRow:
    """One account's or association's row among its siblings (``sums``: their raw shares and usage)."""
    acct, user, shares, used = member
    shares_sum, usage_sum = sums
    s_level = Fraction(shares, shares_sum) if shares_sum else Fraction(0)
    u = Fraction(used, total) if total else Fraction(0)
    effective = u if under_root else u + (parent.effective_usage - u) * s_level
    # NormShares as sshare shows them: among its siblings under Fair Tree, down the whole tree for classic
    row = ShareRow(acct, user, depth, shares, s_level if fair_tree else parent.norm_shares * s_level, used, u, effective)
    u_level = Fraction(used, usage_sum) if usage_sum else Fraction(0)
    # no usage: the highest level fair-share (None), unless it has no shares either: the lowest
    row.level_fs = s_level / u_level if u_level else None if s_level else Fraction(0)
    if fair_tree:
        row.effective_usage = u_level
    elif user:
        row.factor = _exp2_neg(effective / row.norm_shares) if row.norm_shares else 0
    return row


def _rank(rows: list[ShareRow]) -> None:
    """Fair Tree: rank the users depth first in descending Level Fairshare; factor = rank / users."""
    below: dict[int, list[int]] = {}          # row index -> its children's indices
    stack: list[int] = [0]
    for i in range(1, len(rows)):
        while rows[stack[-1]].depth >= rows[i].depth:
            stack.pop()
        below.setdefault(stack[-1], []).append(i)
        if not rows[i].user:
            stack.append(i)
    count = sum(1 for r in rows if r.user)
    rank = rnt = count

    def lf_key(i: int) -> tuple:
        lf = rows[i].level_fs
        return (0, Fraction(0)) if lf is None else (1, -lf)

    def visit(children: list[int], tied_in: bool) -> None:
        """Rank the users under ``children`` (siblings, or the merged children of tied accounts): descending
        level fair-share, users before accounts; a user tied with the one before shares its rank, and so does
        the first below an account tied with the one before it (``tied_in``)."""
        nonlocal rank, rnt
        kids = sorted(children, key=lambda k: (lf_key(k), not rows[k].user, rows[k].account, rows[k].user))
        prev: tuple | None = None
        i = 0
        while i < len(kids):
            k = kids[i]
            tied = tied_in if i == 0 else lf_key(k) == prev
            j = i + 1
            if rows[k].user:
                if not tied:
                    rank = rnt
                rows[k].factor = rank * PPM // count
                rnt -= 1
            else:
                while j < len(kids) and not rows[kids[j]].user and lf_key(kids[j]) == lf_key(k):
                    j += 1
                visit([c for m in kids[i:j] for c in below.get(m, ())], tied)
            prev = lf_key(k)
            i = j

    if count:
        visit(below.get(0, []), False)


def factors(state: State, now: int) -> dict[tuple[str, str], int]:
    """Each (user, account) association's fair-share factor at ``now``, parts per million."""
    if not state.associations:
        return {}
    return {(r.user, r.account): r.factor for r in share_rows(state, now) if r.user}
