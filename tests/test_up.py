"""End to end through real processes: `rota up`, sbatch, squeue; kill -9 during a submit burst."""
import asyncio
import re
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from rota.controller import natsserver
from rota.controller.eventlog import JetStreamLog
from rota.core.apply import fold
from rota.wire import keys

from helpers import run_as, signed_headers
from helpers import wait_for as wait_until

BIN = Path(sys.executable).parent
CONF = """GresTypes=gpu
NodeName=gpu[01-04] CPUs=64 RealMemory=257000 Gres=gpu:a100:8
PartitionName=short Nodes=gpu[01-04] Default=YES MaxTime=1:00:00
PreemptType=preempt/qos
PreemptMode=REQUEUE
"""


def wait_for(path: Path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear")
        time.sleep(0.05)


@pytest.fixture
def up(tmp_path):
    """``rota up`` as root, its state where other local users can reach its socket (as in /var/lib/rota)."""
    import shutil
    import tempfile

    conf = tmp_path / "slurm.conf"
    conf.write_text(CONF)
    base = Path(tempfile.mkdtemp(prefix="rota-up-"))
    base.chmod(0o755)
    env = dict(os.environ, ROTA_STATE_DIR=str(base / "state"))
    log = tmp_path / "up.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen([str(BIN / "rota"), "up", "--config", str(conf), "--fake-gpus", "a100:8"],
                                env=dict(env, ROTA_LOGLEVEL="INFO"), stdout=fh, stderr=subprocess.STDOUT)
    try:
        wait_for(base / "state" / "cluster.json")
        yield env
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
            shutil.rmtree(base, ignore_errors=True)
    assert "rota up: stopped" in log.read_text(), log.read_text()


def run(env, *cmd):
    return subprocess.run([str(BIN / cmd[0]), *cmd[1:]], env=env, capture_output=True, text=True, timeout=30)


def test_rota_up_sbatch_squeue(up):
    r = run(up, "sbatch", "--wrap", "echo $CUDA_VISIBLE_DEVICES; sleep 3", "--gres=gpu:a100:2", "-t", "10",
            "-o", str(up["ROTA_STATE_DIR"]) + "/out-%j.txt")
    assert r.returncode == 0 and r.stdout == "Submitted batch job 1\n"
    r = run(up, "sbatch", "--parsable", "--hold", "--wrap", "true", "-J", "held")
    assert r.stdout == "2\n"
    r = run(up, "sbatch", "--wrap", "true", "--gres=gpu:9")
    assert r.returncode == 1
    assert r.stderr == "sbatch: error: Batch job submission failed: Requested node configuration is not available\n"
    time.sleep(0.3)
    r = run(up, "squeue")
    lines = r.stdout.splitlines()
    assert lines[0] == "             JOBID PARTITION     NAME     USER ST       TIME  NODES NODELIST(REASON)"
    import pwd

    me = pwd.getpwuid(os.getuid()).pw_name[:8]
    assert lines[1].split()[:5] == ["2", "short", "held", me, "PD"]
    assert lines[1].endswith("(JobHeldUser)")
    assert lines[2].split()[4] == "R" and lines[2].endswith("gpu01")
    r = run(up, "squeue", "-h", "-j", "1", "-o", "%i %T")
    assert r.stdout == "1 RUNNING\n"
    r = run(up, "squeue", "-j", "77")
    assert r.returncode == 1 and r.stderr == "slurm_load_jobs error: Invalid job id specified\n"
    out = Path(up["ROTA_STATE_DIR"]) / "out-1.txt"
    wait_for(out)
    time.sleep(0.2)
    assert out.read_text() == "0,1\n"      # the local agent ran it on exactly its two GPUs


def test_commands_say_clearly_when_no_cluster_runs(tmp_path):
    env = dict(os.environ, ROTA_STATE_DIR=str(tmp_path / "none"))
    env.pop("ROTA_NATS_URL", None)
    r = run(env, "squeue")
    assert r.returncode == 1 and "no rota runs on this host" in r.stderr and "rota up" in r.stderr
    assert "Traceback" not in r.stderr


def test_kill_9_during_a_submit_burst_loses_nothing_and_starts_nothing_twice(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text(CONF)
    srv = natsserver.start(tmp_path / "nats")
    env = dict(os.environ, ROTA_STATE_DIR=str(tmp_path / "state"))

    def controller():
        with open(tmp_path / "up.log", "a") as log:
            return subprocess.Popen([str(BIN / "rota"), "up", "--nats", srv.url, "--config", str(conf)],
                                    env=dict(env, ROTA_LOGLEVEL="INFO"), stdout=log, stderr=subprocess.STDOUT)

    first = controller()
    wait_for(tmp_path / "state" / "cluster.json")
    keyring = keys.load_keyring(str(tmp_path / "state" / "cluster.key"))
    total, clients = 5000, 4
    acked: dict[str, int] = {}

    async def client(k: int):
        import nats
        nc = await nats.connect(srv.url)
        try:
            for i in range(total // clients):
                rid = f"c{k}-{i}-{uuid.uuid4().hex[:6]}"
                body = json.dumps({"spec": {"name": f"j{k}-{i}", "time_limit": 60, "gpus_per_node": 1}}).encode()
                while True:
                    try:   # as a node's signer sends it: a fresh credential each try, the same request id
                        msg = await nc.request("rota.api.submit", body, timeout=2,
                                               headers=signed_headers(keyring, "gpu01", "rota.api.submit", rid, body))
                    except Exception:  # noqa: BLE001 - a controller killed mid-request: retry
                        continue          # with the same request id until acknowledged
                    reply = json.loads(msg.data)
                    if reply.get("ok"):
                        acked[rid] = reply["job_id"]
                        break
                    await asyncio.sleep(0.05)
        finally:
            await nc.close()

    async def burst():
        tasks = [asyncio.create_task(client(k)) for k in range(clients)]
        while len(acked) < total // 3:
            await asyncio.sleep(0.01)
        first.kill()                      # kill -9 the controller mid-burst
        first.wait()
        (tmp_path / "state" / "cluster.json").unlink(missing_ok=True)
        second = controller()
        try:
            await asyncio.wait_for(asyncio.gather(*tasks), timeout=240)
        finally:
            second.send_signal(signal.SIGINT)
            try:
                second.wait(timeout=40)
            except subprocess.TimeoutExpired:
                second.kill()
                raise AssertionError("rota up did not stop:\n" + (tmp_path / "up.log").read_text()[-3000:]) from None

    asyncio.run(burst())

    async def read_log():
        lg = await JetStreamLog.connect(srv.url, keyring=keyring)
        try:
            return [e async for e in lg.read(1)]
        finally:
            await lg.close()

    entries = asyncio.run(read_log())
    srv.stop()
    submitted = [e for e in entries if e.event.type == "job.submitted"]
    by_idem = {}
    for e in submitted:
        assert e.idem not in by_idem, f"request {e.idem} stored twice"
        by_idem[e.idem.removeprefix("0:")] = e.event.job_id   # idempotency ids are per caller (uid 0 here)
    assert len(acked) == total
    for rid, job_id in acked.items():
        assert by_idem.get(rid) == job_id, f"acknowledged submit {rid} -> {job_id} missing or different"
    starts = [s.job_id for e in entries if e.event.type == "jobs.started" for s in e.event.starts]
    assert len(starts) == len(set(starts)), "a job was started twice"
    state = fold(entries)
    assert len(state.jobs) == total


def test_the_embedded_server_does_not_outlive_a_killed_rota_up(tmp_path):
    env = dict(os.environ, ROTA_STATE_DIR=str(tmp_path / "state"))
    proc = subprocess.Popen([str(BIN / "rota"), "up"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(tmp_path / "state" / "cluster.json")
    conf = str(tmp_path / "state" / "nats" / "nats-server.conf")
    server_pids = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
                   and conf.encode() in _cmdline(p)]
    assert len(server_pids) == 1
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{server_pids[0]}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{server_pids[0]}").exists() or b"Z" in _stat(server_pids[0]), "nats-server orphaned"


def _cmdline(p: Path) -> bytes:
    try:
        return (p / "cmdline").read_bytes()
    except OSError:
        return b""


def _stat(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().split(b") ", 1)[1][:1]
    except (OSError, IndexError):
        return b"Z"


def test_the_slurm_commands_work_end_to_end(up):
    out = Path(up["ROTA_STATE_DIR"])
    r = run(up, "sbatch", "--parsable", "-J", "quick", "-o", str(out / "q-%j.txt"), "--wrap", "exit 3")
    quick = r.stdout.strip()
    r = run(up, "sbatch", "--parsable", "-J", "long", "-o", str(out / "l-%j.txt"), "--wrap", "sleep 60")
    long = r.stdout.strip()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        r = run(up, "sacct", "-X", "-j", quick, "-n", "-P", "--format=JobID,State,ExitCode")
        if r.stdout.strip() and "PENDING" not in r.stdout and "RUNNING" not in r.stdout:
            break
        time.sleep(0.2)
    assert r.stdout == f"{quick}|FAILED|3:0\n", r.stderr
    r = run(up, "scancel", long)
    assert r.returncode == 0 and r.stderr == ""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        r = run(up, "sacct", "-j", long, "-n", "-P", "--format=JobID,State")
        if "CANCELLED" in r.stdout:
            break
        time.sleep(0.2)
    assert r.stdout.splitlines()[0].startswith(f"{long}|CANCELLED by ")
    assert r.stdout.splitlines()[1] == f"{long}.batch|CANCELLED"
    # a user who cannot read the projection (it is the administrator's) gets the controller's answer
    from rota.cli import sacct, sinfo

    for main, argv in ((sacct.run, ["-j", f"{quick},{long}"]), (sacct.run, ["--bogus"]), (sinfo.run, []),
                       (sinfo.run, ["-N", "-R"])):
        here = run(up, main.__module__.rsplit(".", 1)[-1], *argv)
        there = run_as("nobody", main, argv, "/tmp", env=up)
        assert there == (here.returncode, here.stdout, here.stderr), (argv, there, here)
    assert run_as("nobody", sacct.run, ["-j", quick, "-n", "-X", "-P", "--format=JobID,State"], "/tmp",
                  env=up)[1] == f"{quick}|FAILED\n"
    r = run(up, "scontrol", "update", "NodeName=gpu02", "State=DRAIN")
    assert r.returncode == 1 and "You must specify a reason" in r.stderr
    assert run(up, "scontrol", "update", "NodeName=gpu02", "State=DRAIN", "Reason=bad fan").returncode == 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        r = run(up, "sinfo", "-R", "-h", "-o", "%E|%u|%N")
        if r.stdout.strip():
            break
        time.sleep(0.2)
    assert r.stdout == "bad fan|root|gpu02\n"
    r = run(up, "scontrol", "show", "node", "gpu02")
    assert "State=UNKNOWN+DRAIN" in r.stdout and "Reason=bad fan [root@" in r.stdout
    assert run(up, "scontrol", "update", "NodeName=gpu02", "State=RESUME").returncode == 0
    r = run(up, "scontrol", "show", "hostnames", "gpu[01-03]")
    assert r.stdout == "gpu01\ngpu02\ngpu03\n"


def test_export_parquet_and_projection_rebuild(up, tmp_path):
    import pyarrow.parquet as pq

    r = run(up, "sbatch", "--parsable", "-o", "/dev/null", "--wrap", "true")
    jid = int(r.stdout)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and "COMPLETED" not in run(up, "sacct", "-j", str(jid), "-n", "-X").stdout:
        time.sleep(0.2)
    rebuilt = tmp_path / "rebuilt.sqlite"
    r = run(up, "rota", "projections", "rebuild", "--db", str(rebuilt))
    assert r.returncode == 0 and "projected" in r.stdout, r.stderr
    fresh = run(dict(up, ROTA_PROJECTIONS=str(rebuilt)), "sacct", "-j", str(jid), "-P", "-n")
    assert fresh.stdout == run(up, "sacct", "-j", str(jid), "-P", "-n").stdout != ""
    r = run(up, "rota", "export", "--parquet", str(tmp_path / "pq"))
    assert r.returncode == 0, r.stderr
    events = pq.read_table(tmp_path / "pq" / "events.parquet").to_pydict()
    assert events["seq"] == list(range(1, len(events["seq"]) + 1))
    assert "jobs.started" in events["type"] and "job.exited" in events["type"]
    jobs = pq.read_table(tmp_path / "pq" / "jobs.parquet").to_pydict()
    assert dict(zip(jobs["job_id"], jobs["state"]))[jid] == "COMPLETED"


def test_why_and_replay_against_the_running_cluster(up):
    first = run(up, "sbatch", "--parsable", "-o", "/dev/null", "--gres=gpu:8", "--wrap", "sleep 2").stdout.strip()
    second = run(up, "sbatch", "--parsable", "-o", "/dev/null", "--gres=gpu:8", "--wrap", "true").stdout.strip()
    time.sleep(0.3)
    small = run(up, "sbatch", "--parsable", "-o", "/dev/null", "-t", "1", "--wrap", "true").stdout.strip()  # a cycle
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and "COMPLETED" not in run(up, "sacct", "-X", "-n", "-j", second).stdout:
        time.sleep(0.2)
    r = run(up, "rota", "why", second)
    assert r.returncode == 0, r.stderr
    assert "[Resources]" in r.stdout and f"job {first}" in r.stdout and "started" in r.stdout, r.stdout
    assert f"Job {small} (root) started ahead of it by backfill" in r.stdout
    r = run(up, "rota", "replay", "--at", "4")
    assert r.returncode == 0 and "log sequence 4" in r.stdout, r.stderr
    r = run(up, "rota", "verify")
    assert r.returncode == 0 and r.stdout.startswith("OK: all"), r.stdout + r.stderr


def test_why_explains_a_wait_no_recorded_cycle_saw(up):
    """Job A holds all 8 GPUs; B (8 GPUs) is submitted once A runs, and waits: the cycles that evaluated
    B started nothing, so none is on the log. `rota why B` still says why, who held it, and when A ended."""
    a = run(up, "sbatch", "--parsable", "-o", "/dev/null", "--gres=gpu:8", "--wrap", "sleep 3").stdout.strip()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and "RUNNING" not in run(up, "squeue", "-h", "-j", a, "-o", "%T").stdout:
        time.sleep(0.1)
    b = run(up, "sbatch", "--parsable", "-o", "/dev/null", "--gres=gpu:8", "--wrap", "true").stdout.strip()
    while time.monotonic() < deadline and "COMPLETED" not in run(up, "sacct", "-X", "-n", "-j", b).stdout:
        time.sleep(0.2)
    r = run(up, "rota", "why", b)
    assert r.returncode == 0, r.stderr
    assert "[Resources]" in r.stdout and f"It waited for job {a} (root), which in fact ended" in r.stdout, r.stdout
    assert "no evaluation" not in r.stdout and "change of the state between cycles" in r.stdout
    def ended_wait(out: str) -> bool:
        return "Resources" in out and "(still)" not in out

    deadline = time.monotonic() + 10      # the reason history follows the log: until it has B's start
    while time.monotonic() < deadline and not ended_wait(run(up, "rota", "history", b).stdout):
        time.sleep(0.3)
    r = run(up, "rota", "history", b)
    assert r.returncode == 0 and ended_wait(r.stdout), r.stdout + r.stderr


def test_scontrol_show_job_has_slurms_layout(up):
    import re
    import sys as _sys

    _sys.path.insert(0, str(Path(__file__).parent))
    from golden import blocks

    jid = run(up, "sbatch", "--parsable", "-o", "/dev/null", "-J", "fails", "--wrap", "exit 3").stdout.strip()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and "JobState=FAILED" not in run(up, "scontrol", "show", "job", jid).stdout:
        time.sleep(0.2)
    ours = run(up, "scontrol", "show", "job", jid).stdout.splitlines()
    golden = next(b for b in blocks("scontrol_show_job_completed.txt") if b.exit == 0).output

    def keys(lines):
        return [re.findall(r"([A-Za-z/:]+)=", line) for line in lines]

    assert keys(ours) == keys(golden[:len(ours)]), "\n".join(ours)
    assert ours[0] == f"JobId={jid} JobName=fails"
    assert "JobState=FAILED Reason=NonZeroExitCode" in ours[3] and "ExitCode=3:0" in ours[4]
    r = run(up, "scontrol", "show", "job", "999999")
    assert r.returncode == 1 and r.stderr == "slurm_load_jobs error: Invalid job id specified\n"


def test_squeue_start_and_named_format(up):
    hog = run(up, "sbatch", "--parsable", "-o", "/dev/null", "--gres=gpu:8", "-t", "10", "--wrap", "sleep 30").stdout.strip()
    wait = run(up, "sbatch", "--parsable", "-o", "/dev/null", "--gres=gpu:8", "-t", "10", "--wrap", "true").stdout.strip()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and " R " not in run(up, "squeue", "-j", hog).stdout:
        time.sleep(0.2)
    r = run(up, "squeue", "--start")
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["JOBID", "PARTITION", "NAME", "USER", "ST", "START_TIME", "NODES", "SCHEDNODES",
                                "NODELIST(REASON)"]
    assert lines[1].split()[0] == wait and lines[1].split()[7] == "gpu01" and len(lines) == 2
    r = run(up, "squeue", "-h", "-O", "JobID:8,State:.10,Name")
    assert f"{hog:<8}   RUNNING" in r.stdout
    r = run(up, "squeue", "-O", "Nonsense")
    assert r.returncode == 1 and r.stderr == "squeue: error: Invalid job format specification: Nonsense\n"
    assert run(up, "squeue", "-h", "-o", "%i", "-w", "gpu[01-02]").stdout.split() == [hog]   # -w: on these nodes
    assert run(up, "squeue", "-h", "-o", "%i", "-w", "gpu03").stdout == ""
    assert sorted(run(up, "squeue", "-h", "-o", "%i", "-n", "wrap,other").stdout.split()) == sorted([hog, wait])   # -n
    assert run(up, "squeue", "-h", "-n", "nothing").stdout == ""
    r = run(up, "squeue", "-w", "gpu[0")
    assert r.returncode == 1 and "Invalid node name" in r.stderr and "Traceback" not in r.stderr
    run(up, "scancel", hog)


def test_sbatch_test_only_says_when_and_where_without_submitting(up):
    r = run(up, "sbatch", "--test-only", "--gres=gpu:2", "-t", "10", "--wrap", "true")
    assert r.returncode == 0 and r.stdout == ""
    assert re.fullmatch(r"sbatch: Job 1 to start at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d using 1 processors on nodes "
                        r"gpu01 in partition short\n", r.stderr), r.stderr
    assert run(up, "sbatch", "--parsable", "--wrap", "true", "-o", "/dev/null").stdout == "1\n"   # nothing was used
    r = run(up, "sbatch", "--test-only", "--gres=gpu:9", "--wrap", "true")
    assert r.returncode == 1 and "Requested node configuration is not available" in r.stderr


def test_rota_up_refuses_a_key_others_can_read_and_says_how_to_fix_it(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    key = state / "cluster.key"
    key.write_bytes(os.urandom(64))
    key.chmod(0o644)
    r = subprocess.run([str(BIN / "rota"), "up", "--no-agent"], env=dict(os.environ, ROTA_STATE_DIR=str(state)),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f'Keyfile is insecure: "{key}" should not be readable or writable by group or others (perms=0644)' \
        in r.stdout
    assert f"fix it with: chmod 600 {key}" in r.stdout and "Traceback" not in r.stdout + r.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="job cgroups need root")
def test_two_clusters_with_the_same_node_name_on_one_host_leave_each_other_alone(tmp_path):
    """A second rota (another cluster, a test run) on the same host, with a node of the same name,
    runs its own job 1 beside the first cluster's job 1, and never touches it."""
    conf = tmp_path / "slurm.conf"
    conf.write_text(CONF)
    procs, envs = [], []
    try:
        for name in ("a", "b"):
            env = dict(os.environ, ROTA_STATE_DIR=str(tmp_path / name))
            with open(tmp_path / f"{name}.log", "w") as fh:
                procs.append(subprocess.Popen([str(BIN / "rota"), "up", "--config", str(conf), "--fake-gpus",
                                               "a100:8"], env=env, stdout=fh, stderr=subprocess.STDOUT))
            envs.append(env)
            wait_for(tmp_path / name / "cluster.json")
        first = run(envs[0], "sbatch", "--parsable", "-o", "/dev/null", "--wrap", "sleep 60").stdout.strip()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and run(envs[0], "squeue", "-h", "-o", "%T").stdout.strip() != "RUNNING":
            time.sleep(0.2)
        second = run(envs[1], "sbatch", "--parsable", "-o", "/dev/null", "--wrap", "true").stdout.strip()
        assert first == second == "1"
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and "COMPLETED" not in run(envs[1], "sacct", "-X", "-n", "-j", "1").stdout:
            time.sleep(0.2)
        time.sleep(1)
        assert run(envs[0], "squeue", "-h", "-o", "%i %T").stdout == "1 RUNNING\n"
        run(envs[0], "scancel", "1")
    finally:
        for p in procs:
            p.send_signal(signal.SIGINT)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def test_whatif_on_a_real_clusters_log_reproduces_its_history(up):
    """Six GPU jobs of 1-3 s submitted at once on the running cluster; `rota whatif` replays its log's
    inputs (with the launch delays and the cycle latency it measures there) and reproduces the history
    under the recorded settings."""
    ids = [run(up, "sbatch", "--parsable", "-o", "/dev/null", f"--gres=gpu:{4 + i % 2 * 4}", "-t", "1",
               "--wrap", f"sleep {1 + i % 3}").stdout.strip() for i in range(6)]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and run(up, "squeue", "-h", "-j", ",".join(ids)).stdout.strip():
        time.sleep(0.3)      # until all six have ended
    r = run(up, "rota", "whatif", "--set", "policy=easy", "--json")
    assert r.returncode == 0, r.stderr
    import json

    res = json.loads(r.stdout)
    assert res["replayed"] >= 6 and res["baseline_matches_history"] >= res["replayed"] - 1, json.dumps(res)
    assert res["baseline"]["jobs"] >= 6 and "avg_wait" in res["changed"]
    r = run(up, "rota", "whatif", "--set", "policy=easy")
    assert "avg_wait" in r.stdout and "start exactly when they did" in r.stdout, r.stdout
    r = run(up, "scancel", ids[0])       # already ended: Slurm 22.05 says nothing and exits 0
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    r = run(up, "squeue", "-j", ids[0])  # just ended: the header alone, exit 0
    assert r.returncode == 0 and r.stdout.split() == ["JOBID", "PARTITION", "NAME", "USER", "ST", "TIME", "NODES",
                                                      "NODELIST(REASON)"], r.stdout + r.stderr
    r = run(up, "squeue", "-j", "999999")
    assert r.returncode == 1 and "Invalid job id specified" in r.stderr


def test_sacctmgr_manages_accounts_users_and_qos_and_only_admins_change_them(up):
    from rota.cli import sacctmgr

    assert run(up, "sacctmgr", "-i", "add", "account", "physics", "Description=Physics").returncode == 0
    r = run(up, "sacctmgr", "-i", "add", "qos", "gpu", "Priority=10", "MaxJobsPerUser=2", "MaxTRESPerUser=gres/gpu=4")
    assert r.returncode == 0 and r.stdout == " Adding QOS(s)\n  gpu\n"
    assert run(up, "sacctmgr", "-i", "add", "user", "root", "Account=physics", "QOS=normal,gpu").returncode == 0
    assert run(up, "sacctmgr", "-P", "show", "qos", "gpu", "format=name,priority,maxjobspu,maxtrespu").stdout == \
        "Name|Priority|MaxJobsPU|MaxTRESPU\ngpu|10|2|gres/gpu=4\n"
    assert run(up, "sacctmgr", "-P", "-n", "show", "assoc", "format=account,user,qos").stdout == \
        "physics|root|normal,gpu\n"
    r = run(up, "sacctmgr", "-i", "delete", "account", "physics")
    assert r.returncode == 1 and "account physics still has users (root)" in r.stderr
    code, out, err = run_as("nobody", sacctmgr.main, ["-i", "add", "qos", "mine"], "/", dict(up))
    assert code == 1 and "Access/permission denied" in err
    code, out, err = run_as("nobody", sacctmgr.main, ["-n", "-P", "show", "qos", "format=name"], "/", dict(up))
    assert code == 0 and out.split() == ["normal", "gpu"]
    r = run(up, "sshare", "-a", "-P")
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and lines[0] == "Account|User|RawShares|NormShares|RawUsage|EffectvUsage|FairShare", r.stdout
    # root's own root user, as Slurm's database makes it, shares root's level with physics
    assert lines[1].startswith("root||") and lines[2].startswith(" root|root|1|0.500000|")
    assert lines[3].startswith(" physics||1|0.500000|"), lines     # among its siblings, as Slurm's Fair Tree shows
    assert lines[4].startswith("  physics|root|1|1.000000|") and lines[4].endswith("|1.000000"), lines
    r = run(up, "sshare")          # the caller's own associations and the accounts
    assert r.returncode == 0 and r.stdout.splitlines()[0].split() == ["Account", "User", "RawShares", "NormShares",
                                                                      "RawUsage", "EffectvUsage", "FairShare"]
    r = run(up, "sprio", "-w")
    assert r.returncode == 0 and r.stdout.splitlines()[1].split()[:2] == ["Weights", "1"], r.stdout
    job = run(up, "sbatch", "--parsable", "-H", "-A", "physics", "--wrap", "true").stdout.strip()
    r = run(up, "sprio", "-l", "-j", job)
    assert r.returncode == 0 and r.stdout.splitlines()[1].split()[:4] == [job, "short", "root", "0"], r.stdout
    assert r.stdout.splitlines()[0].split() == ["JOBID", "PARTITION", "USER", "PRIORITY", "SITE", "AGE", "ASSOC",
                                                "FAIRSHARE", "JOBSIZE", "PARTITION", "QOS", "NICE", "TRES"]
    run(up, "scancel", job)


def test_a_preempted_job_is_requeued_keeps_its_id_and_sacct_why_and_report_tell_it(up):
    def state_of(job):
        return run(up, "squeue", "-h", "-j", job, "-o", "%T|%r").stdout.strip()

    assert run(up, "sacctmgr", "-i", "add", "qos", "scav", "PreemptMode=requeue").returncode == 0
    assert run(up, "sacctmgr", "-i", "add", "qos", "urgent", "Priority=100", "Preempt=scav").returncode == 0
    victim = run(up, "sbatch", "--parsable", "-q", "scav", "--gres=gpu:8", "-t", "30", "--wrap", "sleep 300").stdout.strip()
    wait_until(lambda: state_of(victim).startswith("RUNNING"), 20, f"job {victim} to run")
    urgent = run(up, "sbatch", "--parsable", "-q", "urgent", "--gres=gpu:8", "-t", "30", "--wrap", "sleep 300").stdout.strip()
    wait_until(lambda: state_of(urgent).startswith("RUNNING"), 30, f"job {urgent} to run")
    assert state_of(victim) == "PENDING|BeginTime"        # requeued, eligible again after the requeue delay
    r = run(up, "sacct", "-D", "-X", "-n", "-P", "-j", victim, "-o", "JobID,State,Restarts")
    assert r.stdout.splitlines() == [f"{victim}|PREEMPTED|0", f"{victim}|PENDING|1"], r.stdout + r.stderr
    r = run(up, "rota", "why", victim)
    assert r.returncode == 0 and f"job {urgent} (root, QOS urgent) preempted it" in r.stdout, r.stdout + r.stderr
    r = run(up, "rota", "report", "usage", "-P")
    assert r.returncode == 0 and r.stdout.splitlines()[0] == "Account|User|CPU hours|GPU hours|Jobs", r.stdout + r.stderr
    wait_until(lambda: any(line.split("|")[1] == "root" for line in
                           run(up, "rota", "report", "usage", "-P").stdout.splitlines()[1:]), 20,
               "the running job's first second of use in the report")
    run(up, "scancel", victim, urgent)


def test_the_time_accuracy_report_and_the_idle_list_through_the_commands(up):
    job = run(up, "sbatch", "--parsable", "-t", "30", "--wrap", "true").stdout.strip()
    wait_until(lambda: run(up, "sacct", "-n", "-X", "-P", "-j", job, "-o", "State").stdout.strip() == "COMPLETED", 30,
               f"job {job} to complete")
    r = run(up, "rota", "report", "time-accuracy", "-P")
    assert r.returncode == 0, r.stderr
    header, *rows = r.stdout.splitlines()
    assert header == "Account|User|Jobs|Asked hours|Used hours|Used|Median job|Under half|Suggested"
    root = next(row.split("|") for row in rows if row.split("|")[1] == "root")
    assert int(root[2]) >= 1 and root[7] != "0%" and root[8].count(":") == 2, r.stdout     # asked 30 min, used ~0
    r = run(up, "rota", "idle")
    assert r.returncode == 0 and r.stdout.splitlines()[0] == "policy: off (RotaIdleGpu)", r.stdout + r.stderr


def _nats_server_pid(state_dir: str) -> int:
    conf = f"{state_dir}/nats/nats-server.conf"
    for proc in Path("/proc").iterdir():
        if proc.name.isdecimal():
            try:
                if conf in (proc / "cmdline").read_bytes().decode(errors="replace"):
                    return int(proc.name)
            except OSError:
                continue
    raise AssertionError(f"no nats-server runs with {conf}")


def test_rota_up_restarts_its_nats_server_after_kill_9_and_jobs_go_on(up):
    job = run(up, "sbatch", "--parsable", "--wrap", "sleep 4; exit 3").stdout.strip()
    wait_until(lambda: run(up, "squeue", "-h", "-j", job, "-o", "%T").stdout.strip() == "RUNNING", 20, "the job to run")
    first = _nats_server_pid(up["ROTA_STATE_DIR"])
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: run(up, "sbatch", "--parsable", "-H", "--wrap", "true").returncode == 0, 30,
               "a submit to succeed again")
    assert _nats_server_pid(up["ROTA_STATE_DIR"]) != first
    done = wait_until(lambda: (lambda r: r if r.split("|")[0] in ("FAILED", "COMPLETED", "NODE_FAIL") else None)(
        run(up, "sacct", "-n", "-X", "-P", "-j", job, "-o", "State,ExitCode").stdout.strip()), 30, "the job's end")
    assert done == "FAILED|3:0"                  # the agent's report reached the restarted server


def _fill(disk: Path, leave_mib: int) -> None:
    """Fill ``disk`` until about ``leave_mib`` MiB are free."""
    import shutil as _shutil

    free = _shutil.disk_usage(disk).free
    with open(disk / "fill", "ab") as fh:
        fh.write(b"\0" * max(0, free - leave_mib * (1 << 20)))


def test_a_full_disk_refuses_submits_clearly_keeps_what_was_acknowledged_and_recovers(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=80m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (not root, or no mount rights) to fill a disk")
    proc = None
    try:
        disk.chmod(0o755)
        conf = tmp_path / "slurm.conf"
        conf.write_text(CONF)
        env = dict(os.environ, ROTA_STATE_DIR=str(disk / "state"))

        def start():
            p = subprocess.Popen([str(BIN / "rota"), "up", "--config", str(conf), "--fake-gpus", "a100:8"], env=env,
                                 stdout=open(tmp_path / "up.log", "a"), stderr=subprocess.STDOUT)
            wait_for(disk / "state" / "cluster.json", 30)
            return p

        proc = start()
        first = run(env, "sbatch", "--parsable", "-H", "--wrap", "true")
        assert first.returncode == 0, first.stderr
        _fill(disk, 8)                       # below rota's reserve (16 MiB on this disk), not yet at zero
        time.sleep(1.2)                      # (free space is read at most once a second)
        t0 = time.monotonic()
        refused = run(env, "sbatch", "--parsable", "-H", "--wrap", "true")
        assert refused.returncode == 1 and "no space left for the event log at" in refused.stderr, refused.stderr
        assert time.monotonic() - t0 < 10
        (disk / "fill").unlink()             # room again: it goes on by itself
        wait_until(lambda: run(env, "sbatch", "--parsable", "-H", "--wrap", "true").returncode == 0, 20,
                   "a submit to succeed once there is room")
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        _fill(disk, 20)                      # a restart on a nearly full disk
        proc = start()
        r = run(env, "squeue", "-h", "-o", "%i")
        assert r.returncode == 0 and first.stdout.strip() in r.stdout.split(), r.stdout + r.stderr
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def test_time_auto_and_the_hint_come_from_the_users_own_completed_runs(up):
    ids = []
    for _ in range(3):
        r = run(up, "sbatch", "--parsable", "-J", "prep", "-t", "60", "-o", "/dev/null", "--wrap", "sleep 1")
        assert r.returncode == 0, r.stderr
        ids.append(r.stdout.strip())
    wait_until(lambda: run(up, "squeue", "-h", "-j", ",".join(ids)).stdout == "", timeout=30, what="the runs")
    hinted = run(dict(up, ROTA_HINTS="1"), "sbatch", "--hold", "-J", "prep", "-t", "60", "--wrap", "true")
    assert hinted.returncode == 0 and hinted.stdout.startswith("Submitted batch job ")
    assert hinted.stderr.startswith("sbatch: hint: your last 3 runs of 'prep' suggest --time=00:05:00 (asked 01:00:00)")
    assert run(up, "sbatch", "--hold", "-J", "prep", "-t", "60", "--wrap", "true").stderr == ""   # not a terminal
    auto = run(up, "sbatch", "--parsable", "--hold", "-J", "prep", "--time=auto", "--wrap", "true")
    assert auto.returncode == 0, auto.stderr
    assert run(up, "squeue", "-h", "-j", auto.stdout.strip(), "-o", "%l").stdout.strip() == "5:00"
