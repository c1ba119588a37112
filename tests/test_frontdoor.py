"""The controller's front door: credentials checked, rights resolved once, every body validated by its
verb's model, one reply per request (its own), refusals on the log."""
import asyncio
import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from rota.controller.eventlog import MemoryLog
from rota.controller.verbs import VERBS
from rota.controller.service import Controller
from rota.core import events as ev
from rota.core.auth import Caller
from harness import make_cluster
from rota.wire.keys import Keyring

from helpers import signed_headers

pytestmark = pytest.mark.fast    # make test-fast: the core and the front door, no process started

KEYRING = Keyring(cluster_key=b"c" * 64)
ALICE = Caller(65534, 65534, "nobody")
T = 1_800_000_000


class Clock:
    def __init__(self, t=T):
        self.t = t

    def __call__(self):
        return self.t


class Msg:
    """A NATS request as the front door sees it."""

    def __init__(self, subject, data, headers, reply="_INBOX.x"):
        self.subject, self.data, self.headers, self.reply = subject, data, headers, reply


async def controller(**kw):
    c = Controller(MemoryLog(), config=make_cluster(nodes=2, gpus=4), clock=Clock(), keyring=KEYRING, **kw)
    await c.start()
    replies = []

    async def reply(subject, data):
        answer = json.loads(data)
        rid = answer.pop("rid")
        if rid:     # the state the answer saw follows its request id
            assert answer.pop("seq") == c.state.seq
        replies.append((subject, answer, rid))

    c.nc_reply = reply
    return c, replies


def spec(**kw):
    kw.setdefault("time_limit", 600)
    return ev.JobSpec(**kw).model_dump(mode="json", exclude={"user", "uid", "gid"})


async def ask(c, verb, body, *, uid=65534, gid=65534, host="gpu01", rid="r1", headers=None, data=None):
    data = json.dumps(body).encode() if data is None else data
    subject = f"rota.api.{verb}"
    h = signed_headers(KEYRING, host, subject, rid, data, uid, gid, now=T) if headers is None else headers
    await c.frontdoor.on_message(Msg(subject, data, h))


async def test_identity_comes_from_the_credential_never_from_the_body():
    c, replies = await controller()
    await ask(c, "submit", {"spec": spec(name="mine")})
    assert replies[-1][1] == {"ok": True, "job_id": 1} and replies[-1][2] == "r1"
    job = c.state.jobs[1]
    assert (job.spec.user, job.spec.uid, job.spec.gid, job.spec.submit_host) == ("nobody", 65534, 65534, "gpu01")
    assert c.log.entries[-1].actor == "nobody(65534)@gpu01"
    for forged in ({"uid": 0}, {"user": "root"}, {"gid": 0}):
        await ask(c, "submit", {"spec": {**spec(), **forged}}, rid=f"f{len(replies)}")
        assert replies[-1][1]["code"] == "bad_request" and "Extra inputs are not permitted" in replies[-1][1]["error"][0]
    await ask(c, "drain", {"node": "gpu01", "reason": "x", "admin": True}, rid="adm")
    assert replies[-1][1]["code"] == "bad_request"


async def test_bad_credentials_get_munges_words():
    c, replies = await controller()
    body = json.dumps({"spec": spec()}).encode()
    good = signed_headers(KEYRING, "gpu01", "rota.api.submit", "r1", body, 0, 0, now=T)
    cases = {
        "no credential": {"Rota-Rid": "r1"},
        "tampered": {**good, "Rota-Cred": good["Rota-Cred"].replace(":0:0:", ":1:1:")},
        "another key": signed_headers(Keyring(cluster_key=b"x" * 64), "gpu01", "rota.api.submit", "r1", body, now=T),
    }
    words = {}
    for name, headers in cases.items():
        await ask(c, "submit", None, data=body, headers=headers)
        words[name] = replies[-1][1]["error"][0]
    assert words == {"no credential": "Protocol authentication error: Invalid credential format",
                     "tampered": "Protocol authentication error: Invalid credential",
                     "another key": "Protocol authentication error: Invalid credential"}
    await ask(c, "submit", None, data=body, headers=good)
    assert replies[-1][1]["ok"]
    await ask(c, "submit", None, data=body, headers=good)          # the same credential again
    assert replies[-1][1]["error"] == ["Protocol authentication error: Replayed credential"]
    c.clock.t = T + 301
    await ask(c, "ping", {}, rid="r9", headers=signed_headers(KEYRING, "gpu01", "rota.api.ping", "r9", b"{}", now=T))
    assert replies[-1][1]["error"] == ["Protocol authentication error: Expired credential"]
    c.clock.t = T - 400
    await ask(c, "ping", {}, rid="r8", headers=signed_headers(KEYRING, "gpu01", "rota.api.ping", "r8", b"{}", now=T))
    assert replies[-1][1]["error"] == ["Protocol authentication error: Rewound credential (check for out of sync "
                                       "clocks)"]
    assert len(c.state.jobs) == 1 and c.frontdoor.refused == 6


async def test_a_refusal_is_audited_on_the_log():
    c, replies = await controller()
    await c.handle("submit", {"spec": spec(hold=True)})             # root's job
    await ask(c, "cancel", {"job_id": 1})
    assert replies[-1][1] == {"ok": False, "error": ["Access/permission denied"], "code": "permission"}
    await ask(c, "drain", {"node": "gpu01", "reason": "mine now"}, rid="r2")
    assert replies[-1][1]["error"] == ["Invalid user id"]
    denials = [e for e in c.log.entries if e.event.type == "request.denied"]
    assert [(e.event.verb, e.event.uid, e.event.target) for e in denials] == [("cancel", 65534, "job 1"),
                                                                              ("drain", 65534, "node gpu01")]
    assert c.state.jobs[1].state == "PENDING" and not c.state.nodes["gpu01"].drain


async def test_retries_that_arrive_together_are_one_job_with_one_answer():
    """Two tries of one request in the same group commit (a client that timed out while the controller
    was stopped): one job, and both answers name it."""
    c, _ = await controller()
    body = {"spec": spec(name="once")}
    answers = await asyncio.gather(*(c.handle("submit", body, ALICE, rid="same") for _ in range(3)),
                                   c.handle("submit", {"spec": spec(name="other")}, ALICE, rid="other"))
    assert [a["job_id"] for a in answers[:3]] == [1, 1, 1] and answers[3]["job_id"] == 2
    assert [j.spec.name for j in c.state.jobs.values()] == ["once", "other"]
    # the same request id from another user is another request
    assert (await c.handle("submit", body, Caller(0, 0, "root"), rid="same"))["job_id"] == 3


async def test_requests_without_a_reply_subject_or_id_are_not_answered_or_are_refused():
    c, replies = await controller()
    await c.frontdoor.on_message(Msg("rota.api.submit", b"{}", {}, reply=None))
    assert replies == []
    await c.frontdoor.on_message(Msg("rota.api.submit", b"{}", {}))
    assert replies[-1][1]["error"] == ["bad request: no request id (letters, digits, '_' and '-')"]


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
                    max_leaves=20)
FIELDS = st.sampled_from(["job_id", "tasks", "signal", "spec", "node", "reason", "time_limit", "priority", "nice",
                          "user_hold", "hold", "command", "argv", "jobs", "users", "format", "me", "name", "mem_per_node",
                          "cpus_per_task", "script", "env"])
BODIES = st.one_of(
    JSON.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(FIELDS, JSON, max_size=5).map(lambda d: json.dumps(d).encode()),
    st.fixed_dictionaries({"spec": st.dictionaries(st.sampled_from(list(ev.JobSpec.model_fields)), JSON, max_size=6)})
    .map(lambda d: json.dumps(d).encode()),
    st.binary(max_size=200),
    st.integers(1, 3000).map(lambda n: b"[" * n + b"]" * n),                          # recursion bombs
    st.integers(1, 3000).map(lambda n: b'{"spec":' * n + b"{}" + b"}" * n),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(verb=st.sampled_from(sorted(VERBS) + ["nope", "", "x" * 40]), body=BODIES)
def test_fuzzed_requests_each_get_one_clear_answer(verb, body):
    async def go():
        c, replies = await controller()
        await c.handle("submit", {"spec": spec(hold=True)})
        await ask(c, verb, None, data=body, rid="fz")
        return replies

    replies = asyncio.run(go())
    assert len(replies) == 1
    answer = replies[0][1]
    assert replies[0][2] == "fz" and isinstance(answer, dict)
    assert answer.get("code") != "internal", answer
    assert answer.get("ok") is True or (answer.get("ok") is False and answer["error"] and
                                        all(isinstance(line, str) for line in answer["error"]))


@pytest.mark.parametrize("verb,body", [
    ("submit", {"spec": {**spec(), "mem_per_node": -87948}}),
    ("submit", {"spec": {**spec(), "time_limit": 9_999_999_999_999_999_999}}),
    ("submit", {"spec": {**spec(), "name": "evil\u001b]0;pwned\u0007"}}),
    ("submit", {"spec": {**spec(), "script": "#!/bin/sh\n" + "x" * (8 << 20)}}),
    ("update_job", {"job_id": 1, "nice": -1_000_000}),
    ("cancel", {"job_id": 10**30}),
    ("squeue", {"format": "%999999999i"}),
])
async def test_hostile_values_are_refused_with_a_clear_line(verb, body):
    c, replies = await controller()
    await c.handle("submit", {"spec": spec(hold=True)})
    await ask(c, verb, body)
    answer = replies[-1][1]
    assert answer["ok"] is False and answer["code"] in ("invalid", "bad_request", "permission"), answer
    assert len(c.state.jobs) == 1


async def test_private_data_shows_users_only_their_own_jobs():
    cfg = make_cluster(nodes=2, gpus=4)
    cfg = cfg.model_copy(update={"auth": ev.AuthConfig(private_data=("jobs",), operators=("olga",))})
    c = Controller(MemoryLog(), config=cfg, clock=Clock(), keyring=KEYRING)
    await c.start()
    mine = (await c.handle("submit", {"spec": spec(name="mine", hold=True)}, ALICE))["job_id"]
    root = (await c.handle("submit", {"spec": spec(name="roots", hold=True)}))["job_id"]
    rows = (await c.handle("squeue", {"format": "%i %j", "noheader": True}, ALICE))["text"]
    assert rows == f"{mine} mine\n"
    assert (await c.handle("job", {"job_id": root}, ALICE))["error"] == ["Invalid job id specified"]
    assert [j["job_id"] for j in (await c.handle("queue", {}, ALICE))["jobs"]] == [mine]
    olga = Caller(1003, 1003, "olga", 1)
    assert (await c.handle("squeue", {"format": "%i", "noheader": True}, olga))["text"].split() == \
        [str(mine), str(root)]


async def test_the_front_door_counts_what_it_answers_in_the_loop_for_background_work_to_give_way(monkeypatch):
    from dataclasses import replace

    c, *_ = await controller()
    seen = {}

    def counting(name):
        async def handler(ctl, caller, request, rid):
            seen[name] = (c.frontdoor.answering, c.frontdoor.reading)
            return {"ok": True}
        return handler

    for name in ("ping", "cancel", "timetravel"):
        monkeypatch.setitem(VERBS, name, replace(VERBS[name], handler=counting(name)))
    await c.handle("ping", {})
    await c.handle("cancel", {"rid": "c1", "job_id": 1})
    await c.handle("timetravel", {"command": "why", "argv": ["1"]})
    assert seen == {"ping": (1, 1), "cancel": (1, 0), "timetravel": (0, 0)}
    assert (c.frontdoor.answering, c.frontdoor.reading) == (0, 0)
