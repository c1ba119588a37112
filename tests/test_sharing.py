"""Values many jobs repeat are kept once per process (rota.core.sharing); sharing them changes no result."""
import asyncio
import gc
import sys

import orjson
import pytest
from hypothesis import given, strategies as st

from harness import Harness, make_cluster
from rota.controller.eventlog import MemoryLog
from rota.controller.records import encode_body
from rota.core import events as ev
from rota.core.apply import fold

from rota.core import sharing
from rota.core.request import _node_request, node_request, partition_shape
from rota.core.sharing import shared_spec
from rota.core.state import State, dump_snapshot, load_snapshot
from rota.projections.notifier import Notifier

pytestmark = pytest.mark.fast    # make test-fast: the core and the front door, no process started

ENV = {"PATH": "/usr/bin:/bin", "HOME": "/home/ann", "LANG": "C.UTF-8"}


def _spec(**kw):
    return ev.JobSpec(**{"user": "ann", "script": "#!/bin/sh\ntrue\n", "env": dict(ENV), **kw})


def test_specs_whose_keys_collide_stay_apart_unless_equal(monkeypatch):
    monkeypatch.setattr(sharing, "hash", lambda _values: 7, raising=False)   # every spec has the same key
    a, b = _spec(name="collide-a"), _spec(name="collide-b")
    assert shared_spec(a) is a and shared_spec(b) is b          # the pool holds a; b is not taken for it
    assert shared_spec(_spec(name="collide-a")) is a             # an equal one is still shared


def test_equal_specs_decoded_apart_are_one_object_and_unequal_ones_stay_apart():
    a, b = _spec(name="x"), _spec(name="x")
    assert a.env is b.env and a.__pydantic_fields_set__ is b.__pydantic_fields_set__
    assert shared_spec(a) is shared_spec(b)
    c = _spec(name="y")
    assert shared_spec(c) is c and c.env is a.env and shared_spec(c) is not shared_spec(a)
    # a copy with a change neither changes nor shares the original's named fields
    named = set(a.__pydantic_fields_set__)
    d = a.model_copy(update={"comment": "changed"})
    assert a.__pydantic_fields_set__ == named and "comment" in d.__pydantic_fields_set__ and a.comment is None
    # the shared environment serializes as the plain dict it is
    assert orjson.loads(a.model_dump_json())["env"] == ENV


def test_specs_without_an_environment_share_too_and_leave_the_pool_with_their_last_job():
    a, b = ev.JobSpec(user="ann", gpus_per_node=1), ev.JobSpec(user="ann", gpus_per_node=1)
    assert a.env is b.env == {} and shared_spec(a) is shared_spec(b) is a
    assert orjson.loads(b.model_dump_json())["env"] == {}
    del a, b
    gc.collect()
    c = ev.JobSpec(user="ann", gpus_per_node=1)
    assert shared_spec(c) is c            # the pool let the first go with its last holder: this one is kept now


def test_a_jobs_strings_are_shared_while_held_and_leave_memory_with_their_jobs():
    a = _spec(script="#!/bin/sh\n" + "echo one\n" * 20)
    b = _spec(script="".join(["#!/bin/sh\n", "echo one\n" * 20]), name="other")
    assert a.script is b.script
    # not interned: interned strings never leave memory on Python 3.12 (the shared copy must stay mortal)
    assert sys.getrefcount(a.script) < 100
    del a, b
    specs = [_spec(script=f"#!/bin/sh\necho pooled-{i}\n", name=f"job{i}") for i in range(3 * 4096)]
    held = {s.script for s in specs[-10:]}
    del specs
    gc.collect()
    sharing._sweep_strs()
    left = {k for k in sharing._STRS if k.startswith("#!/bin/sh\necho pooled-")}
    assert left == held, f"{len(left)} scripts of gone jobs are still pooled"


def test_a_specs_request_is_made_again_for_another_shape_and_is_the_one_computed():
    h = Harness(make_cluster(nodes=2, gpus=4))
    small = partition_shape(list(h.state.nodes.values()))
    big = partition_shape(list(h.state.nodes.values())[:1], h.state.config.partitions[0].model_copy(
        update={"def_mem_per_node": 1000}))
    spec = shared_spec(ev.JobSpec(user="ann", ntasks=12, cpus_per_task=2, gpus_per_node=1))
    for shape in (small, big, small):
        assert node_request(spec, shape) == _node_request(spec, shape)
    assert node_request(spec, small) != node_request(spec, big)


def test_states_folded_from_one_log_hold_one_spec_per_job_and_stay_equal():
    h = Harness(make_cluster(nodes=2, gpus=4))
    for i in range(6):
        h.submit(name=f"j{i % 2}", user="ann", env=dict(ENV), gpus_per_node=1)
    h.cycle()
    # each state decodes its own copy of every event, as the projection and the controller do
    decoded = [ev.Envelope.trusted(e.seq, e.ts, e.actor, e.idem,
                                   ev.EVENT_ADAPTER.validate_json(encode_body(e.event))) for e in h.log]
    one, two = State(), State()
    fold(decoded, one)
    fold([ev.Envelope.trusted(e.seq, e.ts, e.actor, e.idem, ev.EVENT_ADAPTER.validate_json(encode_body(e.event)))
          for e in h.log], two)
    assert one == two == h.state
    for jid, job in one.jobs.items():
        assert job.spec is two.jobs[jid].spec
    assert len({id(j.spec) for j in one.jobs.values()}) == 2          # two distinct specs among six jobs
    assert len({id(j.req) for j in one.jobs.values()}) == 1           # one per-node request


def test_a_snapshot_keeps_each_environment_once_and_reads_the_older_layout():
    h = Harness(make_cluster(nodes=2, gpus=4))
    for i in range(5):
        h.submit(name=f"j{i}", user="ann", env=dict(ENV), gpus_per_node=1)
    h.submit(name="bare", user="bob")
    h.cycle()
    data = dump_snapshot(h.state)
    doc = orjson.loads(data)
    assert doc["envs"] == [ENV, {}] and data.count(b"/home/ann") == 1
    loaded = load_snapshot(data)
    assert loaded == h.state and dump_snapshot(loaded) == data
    # version 6 held each spec's environment inline
    for spec, ei in zip(doc["specs"], doc.pop("spec_envs")):
        if doc["envs"][ei]:
            spec["env"] = doc["envs"][ei]
    del doc["envs"]
    doc["snapshot_version"] = 6
    assert load_snapshot(orjson.dumps(doc)) == h.state


class _Kept:
    name = "kept"

    def __init__(self) -> None:
        self.notices: list[dict] = []

    def send(self, notice: dict) -> None:
        self.notices.append(notice)


def test_the_notifier_checkpoints_at_its_cadence_and_a_restart_sends_nothing_twice(tmp_path):
    h = Harness(make_cluster(nodes=1, gpus=4))
    jid = h.submit(user="ann", name="ok", time_limit=600, mail_type=("BEGIN", "END"), mail_user="ann@example.org")
    h.cycle()
    h.advance(100)
    h.finish(jid)

    async def scenario() -> None:
        log = MemoryLog()
        for e in h.log:
            await log.append(e.event, actor=e.actor, idem=e.idem or f"i{e.seq}", ts=e.ts)
        kept = _Kept()
        first = Notifier(tmp_path / "n.sqlite", log, [kept], snapshot_every=1000)
        await first.open()
        await first.catch_up()
        assert await first.deliver() == 2
        assert first.cadence.seq == 0                    # fewer events than its cadence: no checkpoint yet
        await first.db.close()                           # it stops without one (a crash)
        again = Notifier(tmp_path / "n.sqlite", log, [kept], snapshot_every=1000)
        await again.open()
        assert again.state.seq == 0
        await again.catch_up()                           # the same notices made again ...
        assert await again.deliver() == 0                # ... and dropped: each was sent once
        await again.close()                              # a stop writes its checkpoint
        last = Notifier(tmp_path / "n.sqlite", log, [kept], snapshot_every=1000)
        await last.open()
        assert last.state.seq == len(h.log) and last.state == again.state
        await last.close()
        assert [n["key"] for n in kept.notices] == [f"{jid}.0.BEGIN", f"{jid}.0.END"]

    asyncio.run(scenario())


_GIVEN = st.fixed_dictionaries({}, optional={
    "name": st.sampled_from(["sbatch", "train", ""]), "nodes": st.integers(1, 3), "hold": st.booleans(),
    "gpus_per_node": st.integers(0, 2), "time_limit": st.none() | st.integers(0, 7200),
    "script": st.sampled_from(["", "#!/bin/sh\ntrue\n"]), "workdir": st.sampled_from(["/", "/home/ann"]),
    "partitions": st.sampled_from([(), ("gpu",)]), "env": st.sampled_from([{}, ENV]),
    "comment": st.none() | st.just("c"), "open_mode": st.sampled_from(["append", "truncate"])})


@given(_GIVEN)
def test_a_validated_spec_keeps_what_its_input_set_away_from_defaults_as_a_copy_does(given_fields):
    """Validation keeps a spec's named fields only (the quick way); a copy looks at every field. Both hold, in
    field order, the fields away from their defaults and the environment."""
    validated = ev.JobSpec.model_validate_json(orjson.dumps(given_fields))
    copied = ev.JobSpec().model_copy(update={k: validated.__dict__.get(k, v) for k, v in given_fields.items()})
    expected = [k for k in ev.JobSpec.model_fields
                if k == "env" or (k in given_fields and given_fields[k] != ev.JobSpec.model_fields[k].default)]
    assert list(validated.__dict__) == list(copied.__dict__) == expected
    assert validated.__dict__ == copied.__dict__ and validated == copied
    assert validated.model_dump_json(exclude_defaults=True) == copied.model_dump_json(exclude_defaults=True)
