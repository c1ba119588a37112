"""Events: exact JSON round trip for every type, schema versions and upcasting."""
from pathlib import Path

import pytest
from pydantic import ValidationError

from rota.core import events as ev
from harness import make_cluster

pytestmark = pytest.mark.fast    # make test-fast: the core and the front door, no process started

SPEC = ev.JobSpec(name="train", user="alice", uid=1001, partitions=("short",), nodes=2, nodes_given=True,
                  gpus_per_node=4, gpu_type="a100", time_limit=3600, env={"A": "1"}, array="0-3%2",
                  dependency="afterok:1", script="#!/bin/sh\necho hi\n")
ALLOC = (ev.NodeAlloc(node="gpu01", cpus=8, mem=1024, gpus=(0, 3)),)

EXAMPLES = [
    ev.ClusterConfigured(config=make_cluster(), source="slurm.conf"),
    ev.ControllerStarted(version="0.1.0", policy="conservative", host="h"),
    ev.JobSubmitted(job_id=7, spec=SPEC),
    ev.JobCancelled(job_id=7, tasks=(1, 2), by_uid=1001),
    ev.JobHeld(job_id=7, admin=True),
    ev.JobReleased(job_id=7),
    ev.JobUpdated(job_id=7, time_limit=120, priority=5),
    ev.JobRequeued(job_id=7, hold=True),
    ev.JobsStarted(cycle=3, now=99, policy="easy",
                   starts=(ev.Start(job_id=9, array_job_id=7, array_task_id=0, partition="short",
                                    alloc=ALLOC, time_limit=600, backfilled=True),)),
    ev.JobExited(job_id=9, state="OUT_OF_MEMORY", exit_code=0, signal=9, max_rss=1048576, elapsed=61, node="gpu01"),
    ev.NodeRegistered(node="gpu01", cpus=64, memory=257000,
                      gpus=(ev.GpuInfo(index=0, uuid="GPU-1", model="NVIDIA A100", type="a100", memory=81920),),
                      running=(9,)),
    ev.NodeDrained(node="gpu01", reason="fan", by="root"),
    ev.NodeResumed(node="gpu01", by="root"),
    ev.NodeDown(node="gpu01", reason="dead", by="root"),
    ev.NodeNotResponding(node="gpu01"),
    ev.HealthFault(node="gpu01", reason="gpu 2: xid 79 (fell off the bus)", gpu_index=2, code="xid:79"),
    ev.GpuIdle(node="gpu01", job_id=9, since=100, samples=(ev.GpuSample(t=100, gpu=0, util=0, mem=512),)),
    ev.GpuBusy(node="gpu01", job_id=9),
    ev.RequestDenied(verb="cancel", uid=65534, user="nobody", host="gpu01", target="job 7",
                     reason="Access/permission denied"),
    ev.StepStarted(job_id=9, step_id=0, name="python", ntasks=2, cpus_per_task=2,
                   alloc=(ev.StepAlloc(node="gpu01", tasks=(0, 1), cpus=4, gpus=(0, 3), gpus_per_task=1),),
                   argv=("python", "train.py"), workdir="/home/alice", env={"A": "1"}, io="login1:40123",
                   io_key="k" * 32, label=True),
    ev.StepEnded(job_id=9, step_id=0, node="gpu01", state="FAILED", exit_code=3, max_rss=2048, elapsed=5),
    ev.AccountingChanged(accounts=(ev.AccountRecord(name="physics", description="Physics", fairshare=2),),
                         associations=(ev.Association(user="alice", account="physics", qos=("normal", "gpu")),),
                         default_accounts={"alice": "physics"},
                         qos=(ev.QosRecord(name="gpu", priority=10, max_jobs_per_user=2,
                                           max_tres_per_user={"gres/gpu": 4}, max_wall=7200),),
                         deleted_qos=("old",), by="root"),
]


def test_every_event_type_has_an_example():
    import typing

    assert {type(e) for e in EXAMPLES} == set(ev.EVENT_TYPES)
    union = typing.get_args(typing.get_args(ev.Event)[0])
    assert set(union) == set(ev.EVENT_TYPES) and len(union) == len(ev.EVENT_TYPES)   # the two lists agree


@pytest.mark.parametrize("event", EXAMPLES, ids=lambda e: e.type)
def test_exact_json_round_trip(event):
    env = ev.Envelope(seq=12, ts=1700000000, actor="alice", idem="req-1", event=event)
    data = ev.encode_envelope(env)
    back = ev.decode_envelope(data)
    assert back == env and type(back.event) is type(event)
    assert ev.encode_envelope(back) == data
    assert back.event.v == 1


def test_unknown_type_and_forged_fields_are_rejected():
    with pytest.raises(ValidationError):
        ev.decode_envelope(b'{"seq":1,"ts":1,"event":{"type":"job.teleported","v":1}}')
    with pytest.raises(ValidationError):
        ev.decode_envelope(b'{"seq":1,"ts":1,"event":{"type":"job.held","v":1,"job_id":1,"evil":true}}')
    with pytest.raises(ValidationError):
        ev.decode_envelope(b'{"seq":1,"ts":1,"event":{"type":"job.held","v":1,"job_id":"x"}}')


def test_events_are_immutable():
    with pytest.raises(ValidationError):
        EXAMPLES[2].job_id = 8


def test_older_versions_are_upcast_on_read(monkeypatch):
    monkeypatch.setitem(ev.CURRENT_VERSIONS, "job.held", 2)

    @ev.register_upcaster("job.held", 1)
    def v1_to_v2(raw):
        raw["admin"] = raw.pop("by_admin", False)
        return raw

    try:
        back = ev.decode_envelope(b'{"seq":1,"ts":1,"event":{"type":"job.held","v":1,"job_id":4,"by_admin":true}}')
        assert back.event.admin is True
    finally:
        ev._UPCASTERS.pop(("job.held", 1))


RECORDED = sorted((Path(__file__).parent / "fixtures" / "logs").glob("*.jsonl"))


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.stem)
def test_logs_written_by_earlier_versions_fold_to_the_state_they_had(path):
    """Every recorded log decodes line by line and folds, with nothing set aside, to the jobs and nodes
    the version that wrote it had (tests/fixtures/logs/README.md)."""
    import json

    from rota.core.apply import fold
    from rota.core.changes import InvalidOnly

    envs = [ev.decode_envelope(line) for line in path.read_bytes().splitlines() if line.strip()]
    seen = InvalidOnly()
    state = fold(envs, None, seen)
    assert not state.set_aside and not seen.invalid
    later = {ev.RequestDenied, ev.StepStarted, ev.StepEnded, ev.AccountingChanged, ev.GpuIdle,   # added after
             ev.GpuBusy}                                                                             # these logs
    assert {type(e.event) for e in envs} >= set(ev.EVENT_TYPES) - later
    want = json.loads(path.with_suffix(".state.json").read_text())
    assert (state.seq, state.next_job_id) == (want["seq"], want["next_job_id"])
    jobs = {str(j.job_id): [j.state, j.exit_code, j.restarts, j.hold, j.partition, [a.node for a in j.alloc],
                            j.array_job_id, j.array_task_id] for j in state.jobs.values()}
    nodes = {n.name: [n.drain, n.down, n.not_responding, n.reason, n.alloc_cpus, list(n.gpu_owner)]
             for n in state.nodes.values()}
    assert jobs == want["jobs"] and nodes == want["nodes"]


def test_there_are_recorded_logs():
    assert len(RECORDED) >= 2


def test_every_event_class_says_what_fact_it_records():
    import inspect

    from pydantic import BaseModel

    for name, cls in vars(ev).items():
        if inspect.isclass(cls) and issubclass(cls, BaseModel) and cls.__module__ == ev.__name__:
            assert "__doc__" in cls.__dict__ and cls.__doc__ and len(cls.__doc__.split()) >= 4, name
