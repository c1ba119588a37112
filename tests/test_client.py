"""Bulk paths: rota.client.Client (one request for many jobs, status, wait, cancel) and `rota submit --file`;
`submit_many` in the controller: each job checked on its own, a retried request landing once."""
import subprocess
import sys
from pathlib import Path

import pytest

from rota.client import Client, JobError
from rota.controller.service import Controller
from rota.controller.eventlog import MemoryLog
from rota.core import events as ev
from harness import make_cluster

BIN = Path(sys.executable).parent


def spec(**kw):
    kw.setdefault("time_limit", 10)
    return ev.JobSpec(**kw).model_dump(mode="json", exclude={"user", "uid", "gid"})


async def test_submit_many_checks_each_job_and_a_retry_lands_once():
    c = Controller(MemoryLog(), config=make_cluster(nodes=1, gpus=8))
    await c.start()
    specs = [spec(name="a"), spec(name="too-big", gpus_per_node=64), spec(name="b")]
    first = await c.handle("submit_many", {"rid": "batch-1", "specs": specs})
    assert first["ok"] and first["job_ids"][0] and first["job_ids"][1] is None and first["job_ids"][2], first
    assert [i for i, _ in first["errors"]] == [1], first
    events = len(c.log.entries)
    again = await c.handle("submit_many", {"rid": "batch-1", "specs": specs})
    assert again["job_ids"] == first["job_ids"] and len(c.log.entries) == events   # nothing new on the log
    states = await c.handle("job_states", {"job_ids": [first["job_ids"][0], 999]})
    assert states["jobs"] == {str(first["job_ids"][0]): {"state": "PENDING", "exit_code": 0},
                              "999": {"state": "UNKNOWN", "exit_code": None}}, states
    refused = await c.handle("submit_many", {"rid": "batch-2", "specs": []})
    assert not refused["ok"]


def test_the_client_submits_many_in_one_request_and_waits_for_them(up, tmp_path):
    client = Client(socket=str(Path(up["ROTA_STATE_DIR"]) / "run" / "rota.sock"))
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)
    jobs = client.submit_many([f"echo {i}" for i in range(50)], options=["-t", "1", "-o", f"{out}/%j.out"])
    assert len(jobs) == 50 and jobs == sorted(jobs)
    one = client.submit(wrap="exit 3", options=["-t", "1", "-o", "/dev/null"])
    script = client.submit("#!/bin/sh\n#SBATCH -J from-script\necho hi\n", options=["-o", "/dev/null"])
    held = client.submit(wrap="true", options=["-H"])
    final = client.wait(jobs + [one, script], timeout=120, poll=0.2)
    assert set(final[j] for j in jobs) == {"COMPLETED"} and final[one] == "FAILED" and final[script] == "COMPLETED"
    assert (out / f"{jobs[7]}.out").read_text() == "7\n"
    assert client.status(held) == {held: "PENDING"}
    client.cancel(held)
    assert client.wait(held, timeout=30, poll=0.1) == {held: "CANCELLED"}
    with pytest.raises(JobError, match="Invalid generic resource"):
        client.submit(wrap="true", options=["--gres=gpu:nope:x"])
    with pytest.raises(JobError, match="not both"):
        client.spec("#!/bin/sh\n", wrap="true")


def test_rota_submit_file(up, tmp_path):
    jobs = tmp_path / "jobs.txt"
    jobs.write_text("# a comment\ntrue\n\nsleep 0\necho three\n")
    r = subprocess.run([str(BIN / "rota"), "submit", "--file", str(jobs), "-H", "-o", "/dev/null"], env=up,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    ids = [int(x) for x in r.stdout.split()]
    assert len(ids) == 3
    q = subprocess.run([str(BIN / "squeue"), "-h", "-o", "%i %j %T"], env=up, capture_output=True, text=True, timeout=60)
    assert q.stdout.split("\n")[:3] == [f"{i} wrap PENDING" for i in ids], q.stdout
    bad = subprocess.run([str(BIN / "rota"), "submit", "--file", str(tmp_path / "none.txt")], env=up,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "cannot read" in bad.stderr and "Traceback" not in bad.stderr, bad


def test_submit_many_splits_into_requests_the_controller_takes():
    """At most 10,000 jobs (the controller's limit) and 3 MiB to a request, each with its first index."""
    from rota.client.api import REQUEST_BYTES, _batches
    from rota.wire.subjects import MAX_BATCH

    small = [{"name": "j"}] * 25_000
    assert [(first, len(b)) for first, b in _batches(small)] == [(0, MAX_BATCH), (MAX_BATCH, MAX_BATCH),
                                                                 (2 * MAX_BATCH, 5_000)]
    big = [{"script": "x" * (REQUEST_BYTES // 3)}] * 7        # a third of the limit and a little more each
    sizes = [len(b) for _first, b in _batches(big)]
    assert sum(sizes) == 7 and max(sizes) == 2
