"""Accounts, users' associations and QOS, as ``sacctmgr`` manages them (pure).

:func:`plan` turns one ``sacctmgr`` command (add, modify or delete; account, user or qos; names, ``where``
conditions and ``set`` values, as the command line gave them) into the :class:`AccountingChanged` event
that carries the new records whole, or refuses it with a sentence saying what and how to fix it.
:func:`check_submit` is the submit-time rule: with ``AccountingStorageEnforce=associations`` a job's
account must be one of its user's, and its QOS one the association allows.
"""
from __future__ import annotations

from typing import Any, Callable

from . import events as ev
from .limits import MAX_NAME
from .state import State
from .timefmt import TimeSpecError, parse_time_limit

ENTITIES = ("account", "user", "qos")
INVALID_ACCOUNT = "Invalid account or account/partition combination specified"
INVALID_QOS = "Invalid qos specification"
TRES_NAMES = ("cpu", "mem", "node", "gres/gpu")


class AccountingError(ValueError):
    """A sacctmgr command that cannot be carried out (the message says why and how to fix it)."""


def plan(state: State, op: str, entity: str, names: list[str], where: dict[str, str], values: dict[str, str],
         by: str = "") -> ev.AccountingChanged:
    """The event for ``sacctmgr OP ENTITY NAMES [where ...] [set ...]``; raises :class:`AccountingError`.

    Keys of ``where`` and ``values`` are lower-cased option names (``account``, ``maxjobsperuser``...)."""
    if entity not in ENTITIES:
        raise AccountingError(f"unknown entity {entity!r}: use account, user or qos")
    names = [n for n in names + [v for v in where.get("name", "").split(",") if v] if n]
    if not names:
        raise AccountingError(f"no {entity} named: give its name (sacctmgr {op} {entity} NAME)")
    for n in names:
        if len(n) > MAX_NAME or not n.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise AccountingError(f"invalid name {n!r}: letters, digits, '-', '_' and '.' only")
    if op == "add":
        return _add(state, entity, names, {**where, **values}, by)
    if op == "modify":
        return _modify(state, entity, names, where, values, by)
    if op == "delete":
        return _delete(state, entity, names, where, by)
    raise AccountingError(f"unknown command {op!r}: use add, modify or delete")


# ---------------------------------------------------------------- add


def _add(state: State, entity: str, names: list[str], v: dict[str, str], by: str) -> ev.AccountingChanged:
    if entity == "account":
        exists = [n for n in names if n in state.accounts]
        if exists:
            raise AccountingError(f"account {exists[0]} already exists (change it with: sacctmgr modify account "
                                  f"{exists[0]} set ...)")
        return ev.AccountingChanged(accounts=tuple(_account(state, ev.AccountRecord(name=n), v) for n in names), by=by)
    if entity == "qos":
        exists = [n for n in names if n in state.qos]
        if exists:
            raise AccountingError(f"qos {exists[0]} already exists (change it with: sacctmgr modify qos {exists[0]} "
                                  "set ...)")
        return ev.AccountingChanged(qos=tuple(_qos(state, ev.QosRecord(name=n), v) for n in names), by=by)
    accounts = [a for a in v.pop("account", "").split(",") if a]
    if not accounts:
        raise AccountingError("a user is added to an account: sacctmgr add user NAME Account=ACCOUNT")
    missing = [a for a in accounts if a not in state.accounts]
    if missing:
        raise AccountingError(f"account {missing[0]} does not exist (add it first: sacctmgr add account {missing[0]})")
    default = v.pop("defaultaccount", "")
    if default and default not in accounts and not any((n, default) in state.associations for n in names):
        raise AccountingError(f"the default account {default} must be one of the user's accounts")
    assocs = tuple(_assoc(state, ev.Association(user=n, account=a), v) for n in names for a in accounts)
    defaults = {n: default or state.default_accounts.get(n) or accounts[0] for n in names}
    return ev.AccountingChanged(associations=assocs, default_accounts=defaults, by=by)


# ---------------------------------------------------------------- modify


def _modify(state: State, entity: str, names: list[str], where: dict[str, str], values: dict[str, str],
            by: str) -> ev.AccountingChanged:
    if not values:
        raise AccountingError("nothing to set: sacctmgr modify ... where Name=X set KEY=VALUE")
    if entity == "account":
        return ev.AccountingChanged(accounts=tuple(_account(state, _existing(state.accounts, n, "account"), values)
                                                   for n in names), by=by)
    if entity == "qos":
        # "normal" is there from the start, as Slurm's database makes it
        return ev.AccountingChanged(qos=tuple(_qos(state, state.qos.get(n) or ev.QosRecord(name=n) if n == "normal"
                                                   else _existing(state.qos, n, "qos"), values) for n in names), by=by)
    accounts = [a for a in where.get("account", "").split(",") if a]
    values = dict(values)
    default = values.pop("defaultaccount", "")
    assocs = [a for (u, acct), a in state.associations.items() if u in names and (not accounts or acct in accounts)]
    if not assocs:
        raise AccountingError(f"user {names[0]} has no association" + (f" with account {accounts[0]}" if accounts
                                                                        else "") + " (sacctmgr add user ...)")
    if default and not all((n, default) in state.associations for n in names):
        raise AccountingError(f"the default account {default} must be one of the user's accounts")
    changed = tuple(_assoc(state, a, values) for a in assocs) if values else ()
    return ev.AccountingChanged(associations=changed, default_accounts={n: default for n in names} if default else {},
                                by=by)


def _existing(records: dict, name: str, what: str):
    if name not in records:
        raise AccountingError(f"{what} {name} does not exist (sacctmgr show {what})")
    return records[name]


# ---------------------------------------------------------------- delete


def _delete(state: State, entity: str, names: list[str], where: dict[str, str], by: str) -> ev.AccountingChanged:
    if entity == "account":
        for n in names:
            _existing(state.accounts, n, "account")
            users = sorted(u for (u, a) in state.associations if a == n)
            if users:
                raise AccountingError(f"account {n} still has users ({', '.join(users[:5])}): remove them first "
                                      f"(sacctmgr delete user {users[0]} where Account={n})")
            children = sorted(a.name for a in state.accounts.values() if a.parent == n)
            if children:
                raise AccountingError(f"account {n} still has sub-accounts ({', '.join(children[:5])}): delete or "
                                      "move them first")
        return ev.AccountingChanged(deleted_accounts=tuple(names), by=by)
    if entity == "qos":
        for n in names:
            _existing(state.qos, n, "qos")
            used = sorted(f"{a.user}/{a.account}" for a in state.associations.values() if n in a.qos)
            if used:
                raise AccountingError(f"qos {n} is still allowed to {', '.join(used[:5])}: change their QOS first")
        return ev.AccountingChanged(deleted_qos=tuple(names), by=by)
    accounts = [a for a in where.get("account", "").split(",") if a]
    keys = tuple(k for k in state.associations if k[0] in names and (not accounts or k[1] in accounts))
    if not keys:
        raise AccountingError(f"user {names[0]} has no association to delete")
    return ev.AccountingChanged(deleted_associations=keys, by=by)


# ---------------------------------------------------------------- values


def _account(state: State, record: ev.AccountRecord, v: dict[str, str]) -> ev.AccountRecord:
    fields: dict = {}
    for key, value in v.items():
        if key == "parent":
            if value != "root" and value not in state.accounts:
                raise AccountingError(f"parent account {value} does not exist")
            if value == record.name:
                raise AccountingError("an account cannot be its own parent")
            fields["parent"] = value
        elif key in ("description", "organization"):
            fields[key] = value[:MAX_NAME]
        elif key == "fairshare":
            fields["fairshare"] = _number(key, value, 1)
        elif key == "grptres":
            fields["grp_tres"] = _tres(value)
        elif key == "grpjobs":
            fields["grp_jobs"] = _limit(key, value)
        elif key == "grptresmins":
            fields["grp_tres_mins"] = _tres(value)
        elif key != "name":
            raise AccountingError(f"unknown account option {key!r}: Parent, Description, Organization, Fairshare, "
                                  "GrpTRES, GrpTRESMins, GrpJobs")
    return record.model_copy(update=fields)


def _assoc(state: State, assoc: ev.Association, v: dict[str, str]) -> ev.Association:
    fields: dict = {}
    for key, value in v.items():
        if key == "fairshare":
            fields["fairshare"] = _number(key, value, 1)
        elif key == "qos":
            names = tuple(q for q in value.split(",") if q)
            missing = [q for q in names if q not in state.qos and q != "normal"]
            if missing:
                raise AccountingError(f"qos {missing[0]} does not exist (sacctmgr add qos {missing[0]})")
            fields["qos"] = names
        elif key == "defaultqos":
            fields["default_qos"] = value
        elif key in ("maxjobs", "maxsubmitjobs", "maxsubmit"):
            fields["max_jobs" if key == "maxjobs" else "max_submit_jobs"] = _limit(key, value)
        elif key not in ("name", "user"):
            raise AccountingError(f"unknown user option {key!r}: Account, DefaultAccount, QOS, DefaultQOS, "
                                  "Fairshare, MaxJobs, MaxSubmitJobs")
    out = assoc.model_copy(update=fields)
    if out.default_qos and out.default_qos not in out.qos:
        raise AccountingError(f"the default QOS {out.default_qos} must be one of the user's QOS ({','.join(out.qos)})")
    return out


def _qos(state: State, record: ev.QosRecord, v: dict[str, str]) -> ev.QosRecord:
    fields: dict = {}
    for key, value in v.items():
        option = _QOS_OPTIONS.get(key)
        if option is not None:
            fields[option[0]] = option[1](state, record, key, value)
        elif key != "name":
            raise AccountingError(f"unknown qos option {key!r}: Priority, MaxJobsPerUser, MaxSubmitJobsPerUser, "
                                  "MaxTRESPerUser, MaxWall, Preempt, PreemptMode, GraceTime, Description")
    return record.model_copy(update=fields)


def _max_wall(state: State, record: ev.QosRecord, key: str, value: str) -> int | None:
    if value in ("-1", ""):
        return None
    try:
        return parse_time_limit(value)
    except TimeSpecError:
        raise AccountingError(f"MaxWall={value}: not a time (minutes, MM:SS, HH:MM:SS or D-HH)") from None


def _preempt(state: State, record: ev.QosRecord, key: str, value: str) -> tuple[str, ...]:
    names = tuple(q for q in value.split(",") if q)
    missing = [q for q in names if q not in state.qos and q != record.name and q != "normal"]
    if missing:
        raise AccountingError(f"Preempt={value}: qos {missing[0]} does not exist")
    return names


def _preempt_mode(state: State, record: ev.QosRecord, key: str, value: str) -> str:
    if value.lower() not in ("cluster", "off", "cancel", "requeue"):
        raise AccountingError(f"PreemptMode={value}: use cluster, off, cancel or requeue")
    return value.lower()


# sacctmgr's QOS options (lower case) -> (the record's field, how the value reads: state, record, key, value)
_QOS_OPTIONS: dict[str, tuple[str, Callable[[State, ev.QosRecord, str, str], Any]]] = {
    "priority": ("priority", lambda _s, _r, k, v: _number(k, v, 0)),
    "description": ("description", lambda _s, _r, _k, v: v[:MAX_NAME]),
    "maxwall": ("max_wall", _max_wall),
    "preempt": ("preempt", _preempt),
    "preemptmode": ("preempt_mode", _preempt_mode),
    "gracetime": ("grace_time", lambda _s, _r, k, v: _number(k, v, 0)),
    **{k: ("max_jobs_per_user", lambda _s, _r, k, v: _limit(k, v)) for k in ("maxjobsperuser", "maxjobspu")},
    **{k: ("max_submit_jobs_per_user", lambda _s, _r, k, v: _limit(k, v))
       for k in ("maxsubmitjobsperuser", "maxsubmitjobspu", "maxsubmitpu")},
    **{k: ("max_tres_per_user", lambda _s, _r, _k, v: _tres(v)) for k in ("maxtresperuser", "maxtrespu")},
}


def _number(key: str, value: str, low: int) -> int:
    if not value.isdecimal() or len(value) > 12 or int(value) < low:
        raise AccountingError(f"{key}={value}: a whole number of at least {low}")
    return int(value)


def _limit(key: str, value: str) -> int | None:
    """A count limit; -1 clears it, as in sacctmgr."""
    return None if value == "-1" else _number(key, value, 0)


def _tres(value: str) -> dict[str, int]:
    """``cpu=8,gres/gpu=4`` (``-1`` clears one)."""
    out: dict[str, int] = {}
    for item in value.split(","):
        name, eq, amount = item.partition("=")
        name = name.strip().lower()
        if name == "gpu":
            name = "gres/gpu"
        if not eq or name not in TRES_NAMES:
            raise AccountingError(f"TRES {item!r}: use NAME=COUNT with NAME one of {', '.join(TRES_NAMES)}")
        if amount != "-1":
            out[name] = _number(name, amount, 0)
    return out


# ---------------------------------------------------------------- at submit


def enforced(state: State) -> bool:
    """Whether submits must name an association (AccountingStorageEnforce includes associations)."""
    cfg = state.config
    return cfg is not None and "associations" in cfg.accounting_enforce


def check_submit(state: State, user: str, account: str, qos: str, qos_given: bool = True) -> tuple[str, str]:
    """The account and QOS a job of ``user`` runs under: the user's default account when none is named,
    the association's default QOS (else ``normal``) when none was named (``qos_given`` False and ``qos``
    the default ``normal``); raises AccountingError with Slurm's words when accounting is enforced and the
    association or QOS is not the user's."""
    if not enforced(state):
        return account, qos
    account = account or state.default_accounts.get(user, "")
    assoc = state.associations.get((user, account))
    if assoc is None:
        raise AccountingError(INVALID_ACCOUNT)
    if not qos or (not qos_given and qos == "normal"):
        qos = assoc.default_qos or "normal"
    if qos not in assoc.qos or (qos != "normal" and qos not in state.qos):
        raise AccountingError(INVALID_QOS)
    return account, qos
