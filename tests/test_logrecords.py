"""A log nobody can forge, and one bad record never takes rota down: records without the controller's
MAC, malformed ones and ones the reducer cannot apply are named by sequence and set aside, on load
and live, in the controller and the projector."""
import json
from pathlib import Path

import pytest

from rota.controller.eventlog import (
    ACTOR_HEADER, STREAM, TS_HEADER, encode_body, record_headers, subject_for,
)
from rota.controller.service import Controller
from rota.core import events as ev
from rota.core.auth import Caller
from harness import make_cluster
from rota.projections.projector import Projector
from rota.wire.keys import Keyring

pytestmark = pytest.mark.fast    # make test-fast: the core and the front door, no process started

KEYRING = Keyring(cluster_key=b"L" * 64)
CFG = make_cluster(nodes=2, gpus=4)
ALICE = Caller(1001, 1001, "alice")


class Clock:
    def __call__(self):
        return 1_800_000_000


@pytest.fixture
def server(jetstream):
    """Logs on one server, holding the cluster key unless told otherwise (``keyring=None``: a stranger)."""
    async def connect(keyring=KEYRING):
        return await jetstream(keyring)
    return connect


def body(**kw):
    kw.setdefault("time_limit", 60)
    return {"spec": ev.JobSpec(**kw).model_dump(mode="json", exclude={"user", "uid", "gid"})}


async def forge(lg, event_or_bytes, mac_key=None, seq=None):
    """Publish straight onto the event stream (as a broker without rota's permissions would let anyone)."""
    data = event_or_bytes if isinstance(event_or_bytes, bytes) else encode_body(event_or_bytes)
    subject = subject_for(event_or_bytes) if not isinstance(event_or_bytes, bytes) else "rota.ev.job.submitted"
    headers = {TS_HEADER: "1800000000", ACTOR_HEADER: "mallory"}
    if mac_key is not None:   # the controller's own key: a record that is authentic but malformed
        headers = record_headers(mac_key, seq, 1_800_000_000, "mallory", "", data)
    await lg.js.publish(subject, data, stream=STREAM, headers=headers)


async def test_a_forged_event_is_set_aside_live_and_on_load(server):
    lg = await server()
    c = Controller(lg, config=CFG, clock=Clock(), keyring=KEYRING)
    await c.start()
    assert (await c.handle("submit", body(name="real"), ALICE))["ok"]
    mallory = await server(keyring=None)
    await forge(mallory, ev.JobSubmitted(job_id=2, spec=ev.JobSpec(user="root", uid=0, script="#!/bin/sh\nid\n")))
    r = await c.handle("submit", body(name="after"), ALICE)    # the fence notices the stranger, the state is rebuilt
    assert r["ok"] and c.leader, r
    assert sorted(j.spec.name for j in c.state.jobs.values()) == ["after", "real"]
    assert all(j.spec.uid == 1001 for j in c.state.jobs.values())
    assert [seq for seq, _why in lg.set_aside] == [4]
    fresh = Controller(await server(), clock=Clock(), keyring=KEYRING)
    await fresh.load()
    assert fresh.state == c.state and [s for s, _ in fresh.log.set_aside] == [4]


async def test_malformed_and_inapplicable_records_never_stop_a_load(server):
    lg = await server()
    c = Controller(lg, config=CFG, clock=Clock(), keyring=KEYRING)
    await c.start()
    await c.handle("submit", body(name="good", hold=True), ALICE)
    key = lg.mac_key
    bad = [b"\xff\xfe not json", b'{"type":"no.such.event"}', b'{"type":"job.submitted","job_id":"x"}',
           b"[" * 5000 + b"]" * 5000]
    for raw in bad:
        await forge(lg, raw, key, await lg.last_seq() + 1)
    start = ev.Start(job_id=1, partition="short", time_limit=60,
                     alloc=(ev.NodeAlloc(node="nowhere", cpus=1, mem=1, gpus=(7,)),))
    await forge(lg, ev.JobsStarted(cycle=9, now=1, policy="fifo", starts=(start,)), key, await lg.last_seq() + 1)
    await forge(lg, ev.JobSubmitted(job_id=50, spec=ev.JobSpec(user="x", array="not-an-array")), key,
                await lg.last_seq() + 1)
    fresh = Controller(await server(), clock=Clock(), keyring=KEYRING)
    await fresh.load()                                     # no traceback: every bad record named and skipped
    assert [s for s, _ in fresh.log.set_aside] == [4, 5, 6, 7]
    assert [s for s, _ in fresh.state.set_aside] == [8, 9]
    assert "nowhere" in fresh.state.set_aside[0][1]
    assert list(fresh.state.jobs) == [1] and fresh.state.jobs[1].state == "PENDING"
    assert fresh.state.seq == 9                            # the next append is fenced after the last record
    await fresh.start()
    assert (await fresh.handle("submit", body(name="next"), ALICE))["ok"]


async def test_the_projector_sets_bad_records_aside_too(server, tmp_path):
    lg = await server()
    c = Controller(lg, config=CFG, clock=Clock(), keyring=KEYRING)
    await c.start()
    await c.handle("submit", body(name="good"), ALICE)
    await forge(await server(keyring=None), b'{"type":"job.submitted","job_id":7,"spec":{"uid":0}}')
    await forge(lg, b"garbage", lg.mac_key, await lg.last_seq() + 1)
    proj = Projector(tmp_path / "p.sqlite", await server())
    await proj.open()
    n = await proj.catch_up()
    assert n == await lg.last_seq() and proj.state.seq == n
    rows = await proj.db.execute_fetchall("SELECT job_id, user FROM jobs")
    assert rows == [(1, "alice")]
    assert [s for s, _ in proj.log.set_aside] == [4, 5]
    await proj.close()


async def test_a_log_written_before_records_were_signed_still_loads(server):
    """Records from an older rota (no MACs) are accepted until the first signed one; after it, never."""
    old = await server(keyring=None)
    c = Controller(old, config=CFG, clock=Clock())
    await c.start()
    await c.handle("submit", body(name="from-before"), ALICE)
    upgraded = Controller(await server(), config=CFG, clock=Clock(), keyring=KEYRING)
    await upgraded.start()
    assert [j.spec.name for j in upgraded.state.jobs.values()] == ["from-before"]
    await upgraded.handle("submit", body(name="signed"), ALICE)
    await forge(await server(keyring=None), ev.JobSubmitted(job_id=9, spec=ev.JobSpec(user="root")))
    again = Controller(await server(), clock=Clock(), keyring=KEYRING)
    await again.load()
    assert sorted(j.spec.name for j in again.state.jobs.values()) == ["from-before", "signed"]
    assert len(again.log.set_aside) == 1


def test_record_headers_carry_a_mac_only_with_the_key():
    h = record_headers(None, 1, 2, "a", "i", b"{}")
    assert h == {TS_HEADER: "2", ACTOR_HEADER: "a", "Nats-Msg-Id": "i"}
    assert "Rota-Mac" in record_headers(b"k" * 32, 1, 2, "a", "i", b"{}")
    assert json.loads(encode_body(ev.JobReleased(job_id=1)))["type"] == "job.released"


def _defaults() -> dict[str, dict]:
    from pydantic_core import PydanticUndefined, to_jsonable_python
    out: dict[str, dict] = {}
    for name, cls in sorted(vars(ev).items()):
        if isinstance(cls, type) and issubclass(cls, ev.Model) and cls is not ev.Model:
            fields = {}
            for field, info in cls.model_fields.items():
                if field in ("type", "v"):
                    continue      # always stored
                if info.default_factory is not None:
                    fields[field] = to_jsonable_python(info.default_factory())
                elif info.default is not PydanticUndefined:
                    fields[field] = to_jsonable_python(info.default)
            out[name] = fields
    return out


def test_no_field_of_a_stored_event_changes_its_default():
    """A stored event leaves out the fields at their defaults, so a default is part of what every stored
    record means: changing one would change the meaning of records already in the log."""
    pinned = json.loads((Path(__file__).parent / "fixtures" / "event_defaults.json").read_text())
    for model, fields in _defaults().items():
        for field, default in fields.items():
            assert model in pinned and field in pinned[model], (
                f"{model}.{field} is new: add its default ({default!r}) to tests/fixtures/event_defaults.json")
            assert pinned[model][field] == default, (
                f"{model}.{field}'s default changed from {pinned[model][field]!r} to {default!r}: stored records "
                "rely on it; keep it, and give the new meaning a new field or a new version with an upcaster")


@pytest.mark.parametrize("event", [
    ev.ControllerStarted(version="1", policy="easy"),
    ev.JobReleased(job_id=1),
    ev.JobSubmitted(job_id=3, spec=ev.JobSpec(user="alice", nodes=2, env={"A": "1"}, argv=("x", "y"),
                                              partitions=("gpu", "cpu"), time_limit=None)),
    ev.JobsStarted(cycle=4, now=5, policy="easy", shadow=(3, 9), starts=(
        ev.Start(job_id=3, partition="gpu", time_limit=60, alloc=(ev.NodeAlloc(node="n1", cpus=2, mem=10, gpus=(0, 1)),)),)),
    ev.AccountingChanged(deleted_associations=(("bob", "physics"),), default_accounts={"bob": "physics"}),
    CFG_EVENT := ev.ClusterConfigured(config=CFG),
])
def test_a_stored_event_holds_only_what_differs_from_its_defaults_and_reads_back_equal(event):
    from rota.controller.records import decode_bodies, decode_event_bytes
    stored = encode_body(event)
    raw = json.loads(stored)
    assert raw["type"] == event.type and raw["v"] == event.v
    defaults = _defaults()[type(event).__name__]
    assert all(raw[f] != defaults[f] for f in raw if f in defaults), raw
    assert decode_event_bytes(stored) == event
    assert decode_bodies([stored, encode_body(CFG_EVENT), stored]) == [event, CFG_EVENT, event]
    assert decode_bodies([stored, b'{"type":"job.released"}']) is None      # one bad: each on its own
