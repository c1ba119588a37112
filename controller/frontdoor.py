"""The controller's front door: authenticate, resolve rights once, validate, dispatch, answer once.

Every API request arrives on ``rota.api.<verb>`` with a credential issued by the caller's local
signer. Here, in this order and nowhere else:

1. the credential is checked (key, binding to subject, request id and payload, lifetime, replay);
2. the caller's name comes from its uid (``pwd``) and its rights from the configuration;
3. the body is validated by the verb's request model (:mod:`rota.controller.requests`);
4. the verb's handler runs; the core commands check the caller's rights against what it touches,
   and a refusal is appended to the log as ``request.denied``;
5. exactly one reply goes back, carrying the request id it answers (its first key, ``rid``, so the
   signer can check it without decoding the rest).
"""
from __future__ import annotations

import asyncio
import logging
import pwd
from typing import Any, Callable

from pydantic import ValidationError

from rota.core import __version__, commands
from rota.core import credentials as creds
from rota.core import events as ev
from rota.core.auth import Caller, caller as make_caller
from rota.wire.subjects import CRED_HEADER, RID_HEADER, pack_reply

from . import accounting_views, requests as rq
from .requests import VERBS, verb
from .eventlog import FencedError, LogUnavailable
from .leadership import controllers_of
from .ratelimit import SubmitRate
from .recent import Recent
from .views import Raw, encode_reply, too_large

log = logging.getLogger("rota.controller.api")

class FrontDoor:
    def __init__(self, controller: Any, keyring: Any = None) -> None:
        self.c = controller
        self.keyring = keyring
        self.replay = creds.ReplayCache()
        self._results: Recent[tuple[int, str], dict] = Recent(100_000)   # (uid, request id) -> the answer a retry gets
        self._names: dict[int, str | None] = {}
        self.refused = 0
        self.rate = SubmitRate()
        self.answering = 0        # requests being answered in the event loop now (the reason lane gives way to them)
        self.reading = 0          # those that only read (a cycle off the loop gives way to them)

    # ------------------------------------------------------------ identity

    def user_name(self, uid: int) -> str | None:
        """The name ``uid`` has on this host (what the log and the views call the caller)."""
        if uid not in self._names:
            if len(self._names) > 65536:
                self._names.clear()
            try:
                self._names[uid] = pwd.getpwuid(uid).pw_name
            except KeyError:
                self._names[uid] = None
        return self._names[uid]

    def authenticate(self, subject: str, rid: str, credential: str | None, payload: bytes) -> Caller:
        """The caller a request's credential proves, with its rights; raises CredentialError."""
        if self.keyring is None:
            raise creds.CredentialError(creds.INVALID, "this controller has no cluster key")
        cfg = self.c.state.config
        ttl = cfg.auth.cred_ttl if cfg is not None else creds.DEFAULT_TTL
        cred = creds.verify(self.keyring.key_of, credential, f"{subject} {rid}", payload, int(self.c.clock()),
                            kind="req", replay=self.replay, max_ttl=ttl)
        name = self.user_name(cred.uid)
        if name is None:
            raise commands.Rejected("Invalid user id", code="permission")
        return make_caller(cfg.auth if cfg is not None else None, cred.uid, cred.gid, name, cred.host)

    # ------------------------------------------------------------ NATS

    async def on_message(self, msg: Any) -> None:
        """Answer one ``rota.api.<verb>`` message: one reply, always, carrying its request id."""
        if not msg.reply:
            return      # a publish, not a request: nobody to answer
        rid, data = await self.answer(msg.subject, msg.headers or {}, msg.data or b"")
        from nats.errors import MaxPayloadError
        try:
            try:
                await self.c.nc_reply(msg.reply, data)
            except MaxPayloadError:    # even compressed: say so rather than leave the caller waiting
                await self.c.nc_reply(msg.reply, too_large(rid, len(data)))
        except Exception as exc:  # noqa: BLE001 - the caller is gone or the connection closed
            log.warning("could not answer request %s: %s", rid[:64], exc)

    async def answer(self, subject: str, headers: dict, payload: bytes) -> tuple[str, bytes]:
        """The request id and the reply to one signed request (from NATS, or from this process's signer)."""
        rid = headers.get(RID_HEADER, "")
        verb_name = subject.rsplit(".", 1)[-1]
        try:
            if not rid or len(rid) > 64 or not _RID_CHARS.issuperset(rid):
                rid = ""
                raise commands.Rejected("bad request: no request id (letters, digits, '_' and '-')",
                                        code="bad_request")
            caller = self.authenticate(subject, rid, headers.get(CRED_HEADER), payload)
            result = await self.dispatch(verb_name, payload or b"{}", caller, rid)
        except creds.CredentialError as exc:
            self.refused += 1
            log.warning("refused %s (request %s): %s%s", subject, rid[:64], exc.words,
                        f"; {exc.detail}" if exc.detail else "")
            result = {"ok": False, "error": [f"Protocol authentication error: {exc.words}"
                                              + (f" ({exc.detail})" if exc.words == creds.REWOUND else "")],
                      "code": "auth"}
        except commands.Rejected as r:
            result = {"ok": False, "error": list(r.lines), "code": r.code}
        except Exception as exc:  # one reply per request, whatever happened
            log.exception("request %s on %s failed", rid[:64], subject)
            result = {"ok": False, "error": [f"internal error: {type(exc).__name__}"], "code": "internal"}
        return rid, pack_reply(rid, encode_reply(result, rid))

    # ------------------------------------------------------------ dispatch

    async def dispatch(self, verb_name: str, body: bytes, caller: Caller, rid: str = "") -> dict | Raw:
        """Validate ``body`` for ``verb_name`` and run its handler as ``caller``; errors become answers."""
        spec = VERBS.get(verb_name)
        if spec is None:
            return {"ok": False, "error": [f"unknown request {verb_name[:40]!r}"], "code": "unknown"}
        key = (caller.uid, rid)
        if rid and spec.writes and key in self._results:
            return self._results[key]
        request = None
        self.answering += (here := not spec.elsewhere)
        self.reading += (reads := here and not spec.writes)
        try:
            request = spec.model.model_validate_json(body)
            self.c.check_space(spec.writes)
            if verb_name in SUBMITS and self.c.state.config is not None:
                self.rate.take(self.c.state.config.rate_limit, caller, len(getattr(request, "specs", ())) or 1,
                               float(self.c.clock()))
            result = await spec.handler(self.c, caller, request, rid)
        except ValidationError as exc:
            result = {"ok": False, "error": [f"bad request: {rq.first_problem(exc)}"], "code": "bad_request"}
        except ValueError as exc:   # orjson and friends on a body that is not JSON
            result = {"ok": False, "error": [f"bad request: {str(exc).splitlines()[0] if str(exc) else 'invalid'}"],
                      "code": "bad_request"}
        except commands.Rejected as r:
            result = {"ok": False, "error": list(r.lines), "code": r.code}
            if r.code == "permission":
                await self._record_denial(verb_name, caller, request, r)
        except FencedError:
            result = {"ok": False, "error": ["controller is not the leader"], "code": "not_leader"}
        except LogUnavailable as exc:
            result = {"ok": False, "error": [f"event log unavailable ({exc}); retry"], "code": "unavailable"}
        finally:
            self.answering -= here
            self.reading -= reads
        if rid and spec.writes and isinstance(result, dict) and result.get("ok"):
            self._results[key] = result
        return result

    async def _record_denial(self, verb_name: str, caller: Caller, request: Any, r: commands.Rejected) -> None:
        target = ""
        if hasattr(request, "job_id"):
            target = f"job {request.job_id}"
        elif hasattr(request, "node"):
            target = f"node {request.node}"
        try:
            await self.c.append(commands.denied(caller, verb_name, target, r.lines[-1]), caller.actor())
        except Exception as exc:  # noqa: BLE001 - the refusal stands even if the log cannot take the record
            log.warning("refused %s by %s (%s) not recorded: %s", verb_name, caller.actor(), target, exc)


SUBMITS = frozenset({"submit", "submit_many"})
_RID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


# ---------------------------------------------------------------- the verbs


def _spec(spec: ev.JobSpec, caller: Caller) -> ev.JobSpec:
    """The job as submitted, with who submitted it taken from the credential (never from the body)."""
    return spec.model_copy(update={"user": caller.user, "uid": caller.uid, "gid": caller.gid,
                                   "submit_host": caller.host or spec.submit_host})


async def submit_one(c: Any, caller: Caller, spec: ev.JobSpec, idem: str) -> int:
    """Append one job's submission (``idem``: a retry of the same request lands once); its id."""
    spec = _spec(spec, caller)
    env, duplicate = await c.write(lambda state: commands.submit(state, spec, state.next_job_id, caller),
                                   caller.actor(), idem)
    job_id = next((j.job_id for j in c.state.jobs.values() if j.submit_seq == env.seq), None) if duplicate \
        else env.event.job_id            # a retried submit: the job its first try created
    if job_id is None:
        raise commands.Rejected("this request was accepted earlier, but its job is no longer known", code="duplicate")
    return job_id


@verb("submit", rq.Submit, writes=True)
async def _submit(c: Any, caller: Caller, request: rq.Submit, rid: str) -> dict:
    return {"ok": True, "job_id": await submit_one(c, caller, request.spec, f"{caller.uid}:{rid}" if rid else "")}


@verb("test_submit", rq.Submit)
async def _test_submit(c: Any, caller: Caller, request: rq.Submit, rid: str) -> dict:
    return c.views.test_submit(_spec(request.spec, caller), caller)


async def _write(c: Any, caller: Caller, rid: str, prepare: Callable) -> dict:
    await c.write(prepare, caller.actor(), f"{caller.uid}:{rid}" if rid else "")
    return {"ok": True}


@verb("cancel", rq.Cancel, writes=True)
async def _cancel(c: Any, caller: Caller, r: rq.Cancel, rid: str) -> dict:
    return await _write(c, caller, rid, lambda s: commands.cancel(s, r.job_id, caller, r.tasks, r.signal))


@verb("signal", rq.Signal)
async def _signal(c: Any, caller: Caller, r: rq.Signal, rid: str) -> dict:
    c.send(commands.signal(c.state, r.job_id, r.signal, caller, batch=r.batch, steps=r.steps, step_id=r.step_id))
    return {"ok": True}


STEP_BUSY_WAIT = 1.0    # seconds a step request waits for a running step to end before srun hears "busy"


@verb("step_create", rq.StepCreate, writes=True)
async def _step_create(c: Any, caller: Caller, r: rq.StepCreate, rid: str) -> dict:
    from rota.core.steps import StepAsk

    ask = StepAsk(ntasks=r.ntasks, nodes=r.nodes, ntasks_per_node=r.ntasks_per_node, cpus_per_task=r.cpus_per_task,
                  gpus_per_task=r.gpus_per_task, gpus_per_node=r.gpus_per_node, mem=r.mem, nodelist=r.nodelist,
                  overlap=r.overlap)
    fields = {"name": r.name or r.argv[0].rsplit("/", 1)[-1][:200], "argv": r.argv, "workdir": r.workdir,
              "env": r.env, "io": r.io, "io_key": r.io_key, "output": r.output, "error": r.error, "input": r.input,
              "label": r.label}
    warnings: list[str] = []
    # a step that would fit once a running one ends waits here a moment first: the step before it (srun a;
    # srun b) has ended on its nodes, and its end is on its way through the inbox
    deadline = asyncio.get_running_loop().time() + STEP_BUSY_WAIT
    while True:
        try:
            commands.step_create(c.state, r.job_id, ask, caller, **fields)
            break
        except commands.Rejected as refused:
            if refused.code != "busy" or asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.005)

    def prepare(state: Any) -> ev.StepStarted:
        event, said = commands.step_create(state, r.job_id, ask, caller, **fields)
        warnings[:] = said
        return event

    env, duplicate = await c.write(prepare, caller.actor(), f"{caller.uid}:{rid}" if rid else "")
    if duplicate:
        raise commands.Rejected("this step request was accepted earlier", code="duplicate")
    e = env.event
    return {"ok": True, "step_id": e.step_id, "ntasks": e.ntasks, "nodes": [a.node for a in e.alloc],
            "tasks": [list(a.tasks) for a in e.alloc], "warnings": warnings}


@verb("config", rq.NoArgs)
async def _config(c: Any, caller: Caller, r: rq.NoArgs, rid: str) -> dict:
    cfg = c.state.config
    return {"ok": True, "config": cfg.model_dump(mode="json") if cfg is not None else None,
            "since": c.state.config_seq, "now": c.now()}


@verb("reconfigure", rq.NoArgs, writes=True)
async def _reconfigure(c: Any, caller: Caller, r: rq.NoArgs, rid: str) -> dict:
    from rota.core.slurmconf import ConfigError

    if caller.level < 2:
        raise commands.Rejected(commands.INVALID_USER, code="permission")
    if c.reload_config is None:
        raise commands.Rejected("this controller has no configuration file to read again", code="config")
    try:
        config = await asyncio.to_thread(c.reload_config)
    except ConfigError as exc:
        raise commands.Rejected(*[str(d) for d in exc.diagnostics],
                                "the configuration has errors: nothing changed, the cluster runs on", code="config") \
            from None
    except (OSError, ValueError) as exc:
        raise commands.Rejected(f"{exc}: nothing changed, the cluster runs on", code="config") from None
    if config == c.state.config:
        return {"ok": True, "changed": False}
    await c.write(lambda s: commands.reconfigure(s, config, "scontrol reconfigure", caller), caller.actor(),
                  f"{caller.uid}:{rid}" if rid else "")
    return {"ok": True, "changed": True}


@verb("acct_change", rq.AccountingChange, writes=True)
async def _acct_change(c: Any, caller: Caller, r: rq.AccountingChange, rid: str) -> dict:
    done: list[ev.AccountingChanged] = []

    def prepare(state: Any) -> ev.AccountingChanged:
        event = commands.change_accounting(state, r.op, r.entity, list(r.names), dict(r.where), dict(r.values), caller)
        done[:] = [event]
        return event

    await c.write(prepare, caller.actor(), f"{caller.uid}:{rid}" if rid else "")
    return {"ok": True, "change": done[0].model_dump(mode="json") if done else None}


@verb("acct_show", rq.NoArgs)
async def _acct_show(c: Any, caller: Caller, r: rq.NoArgs, rid: str) -> dict:
    return {"ok": True, **accounting_views.records(c.state)}


@verb("shares", rq.NoArgs)
async def _shares(c: Any, caller: Caller, r: rq.NoArgs, rid: str) -> dict:
    return {"ok": True, **accounting_views.shares(c.state, c.now(), caller)}


@verb("priorities", rq.NoArgs)
async def _priorities(c: Any, caller: Caller, r: rq.NoArgs, rid: str) -> dict:
    return {"ok": True, **accounting_views.priorities(c.state, c.now(), caller)}


@verb("release_allocation", rq.ReleaseAllocation, writes=True)
async def _release_allocation(c: Any, caller: Caller, r: rq.ReleaseAllocation, rid: str) -> dict:
    return await _write(c, caller, rid, lambda s: commands.release_allocation(s, r.job_id, r.exit_code, r.signal,
                                                                               caller))


@verb("hold", rq.Hold, writes=True)
async def _hold(c: Any, caller: Caller, r: rq.Hold, rid: str) -> dict:
    return await _write(c, caller, rid, lambda s: commands.hold(s, r.job_id, caller, r.user_hold))


@verb("release", rq.JobOnly, writes=True)
async def _release(c: Any, caller: Caller, r: rq.JobOnly, rid: str) -> dict:
    return await _write(c, caller, rid, lambda s: commands.release(s, r.job_id, caller))


@verb("requeue", rq.Requeue, writes=True)
async def _requeue(c: Any, caller: Caller, r: rq.Requeue, rid: str) -> dict:
    return await _write(c, caller, rid, lambda s: commands.requeue(s, r.job_id, r.hold, caller))


@verb("update_job", rq.UpdateJob, writes=True)
async def _update_job(c: Any, caller: Caller, r: rq.UpdateJob, rid: str) -> dict:
    return await _write(c, caller, rid, lambda s: commands.update_job(
        s, r.job_id, time_limit=r.time_limit, priority=r.priority, nice=r.nice, caller=caller))


@verb("drain", rq.NodeChange, writes=True)
async def _drain(c: Any, caller: Caller, r: rq.NodeChange, rid: str) -> dict:
    return await _write(c, caller, rid, lambda s: commands.drain(s, r.node, r.reason, caller))


@verb("down", rq.NodeChange, writes=True)
async def _down(c: Any, caller: Caller, r: rq.NodeChange, rid: str) -> dict:
    return await _write(c, caller, rid, lambda s: commands.down(s, r.node, r.reason, caller))


@verb("resume", rq.NodeChange, writes=True)
async def _resume(c: Any, caller: Caller, r: rq.NodeChange, rid: str) -> dict:
    return await _write(c, caller, rid, lambda s: commands.resume(s, r.node, caller))


@verb("job", rq.JobOnly)
async def _job(c: Any, caller: Caller, r: rq.JobOnly, rid: str) -> dict:
    return {"ok": True, "job": c.views.job(r.job_id, caller), "now": c.now()}


@verb("queue", rq.NoArgs)
async def _queue(c: Any, caller: Caller, r: rq.NoArgs, rid: str) -> dict:
    return {"ok": True, "jobs": Raw(c.views.queue_json(caller)), "now": c.now()}


@verb("squeue", rq.Squeue)
async def _squeue(c: Any, caller: Caller, r: rq.Squeue, rid: str) -> Raw:
    return Raw(c.views.squeue_reply(r.model_dump(), caller))


@verb("nodes", rq.NoArgs)
async def _nodes(c: Any, caller: Caller, r: rq.NoArgs, rid: str) -> dict:
    return {"ok": True, "nodes": c.views.nodes()}


@verb("accounting", rq.Accounting, elsewhere=True)
async def _accounting(c: Any, caller: Caller, r: rq.Accounting, rid: str) -> dict:
    return await c.views.accounting(r.command, list(r.argv), caller)


@verb("timetravel", rq.TimeTravel, elsewhere=True)
async def _timetravel(c: Any, caller: Caller, r: rq.TimeTravel, rid: str) -> dict:
    return await c.views.timetravel(r.command, list(r.argv), caller)


@verb("ping", rq.NoArgs)
async def _ping(c: Any, caller: Caller, r: rq.NoArgs, rid: str) -> dict:
    return {"ok": True, "seq": c.state.seq, "leader": c.leader, "version": __version__, "pending": len(c.state.pending),
            "user": caller.user, "uid": caller.uid, "level": caller.level, **c.cycle_figures(), **await controllers_of(c)}
