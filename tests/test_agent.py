"""Node agents as real processes against a real nats-server and controller: launch, confinement,
ends of jobs, health and auto-drain, silent agents, restarts."""
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rota.controller import natsserver
from rota.controller.agentlink import AgentLink
from rota.controller.outbox import Outbox
from rota.core import effects
from rota.controller.eventlog import JetStreamLog
from rota.controller.service import Controller
from rota.core import events as ev
from rota.core.auth import Caller
from rota.core.slurmconf import parse_config
from rota.wire import keys

BIN = Path(sys.executable).parent
CONF = """GresTypes=gpu
NodeName=n[1-3] CPUs=4 RealMemory=2000 Gres=gpu:a100:2
PartitionName=main Nodes=n[1-3] Default=YES MaxTime=1:00:00
"""
CGROUPS = os.geteuid() == 0 and Path("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists() or \
    Path("/sys/fs/cgroup/cgroup.controllers").exists() and os.geteuid() == 0


class Cluster:
    def __init__(self, tmp: Path, url: str, controller: Controller, keyring) -> None:
        self.tmp, self.url, self.c, self.keyring = tmp, url, controller, keyring
        self.agents: dict[str, subprocess.Popen] = {}
        self.link: AgentLink | None = None
        self.env: dict[str, str] | None = None   # the agents' environment (None: this process's)

    def host_key(self, node: str) -> Path:
        """The node's own key file (derived from the cluster key), as an admin installs it on the node."""
        path = self.tmp / f"{node}.key"
        if not path.exists():
            keys.write_host_key(str(path), self.keyring.cluster_key, node)
        return path

    def start_agent(self, node: str, gpus: str = "a100:2", *extra: str) -> subprocess.Popen:
        cmd = [str(BIN / "rota"), "agent", "--node", node, "--nats", self.url, "--state-dir", str(self.tmp / "state"),
               "--key", str(self.host_key(node)),
               "--fake-gpus", gpus, "--cpus", "4", "--memory", "2000", "--heartbeat", "0.3",
               "--health-interval", "0.3", "--kill-wait", "1", *extra]
        log = open(self.tmp / f"agent-{node}.log", "a")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        log.close()
        self.agents[node] = proc
        return proc

    def faults(self, node: str, **faults) -> None:
        path = self.tmp / "state" / "agent" / node / "fake-nvml.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(faults))

    async def until(self, check, timeout: float = 20.0, what: str = "condition"):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = check(self.c.state)
            if value:
                return value
            await asyncio.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}")

    async def registered(self, *nodes: str) -> None:
        await self.until(lambda s: all(s.nodes[n].registered for n in nodes), what=f"{nodes} registered")

    async def submit(self, script: str, *, uid: int = 0, gid: int = 0, user: str = "root", **spec) -> int:
        spec.setdefault("time_limit", 600)
        spec.setdefault("workdir", str(self.tmp))
        spec.setdefault("output", str(self.tmp / "out-%j.txt"))
        body = ev.JobSpec(script="#!/bin/sh\n" + script, **spec).model_dump(mode="json", exclude={"user", "uid", "gid"})
        r = await self.c.handle("submit", {"spec": body}, caller=Caller(uid, gid, user))
        assert r["ok"], r
        return r["job_id"]

    async def ended(self, jid: int, timeout: float = 20.0):
        return await self.until(lambda s: s.jobs[jid] if s.jobs[jid].state not in ("PENDING", "RUNNING") else None,
                                timeout, f"job {jid} to end")

    def output(self, jid: int) -> str:
        return (self.tmp / f"out-{jid}.txt").read_text()


@pytest.fixture
async def cluster(tmp_path, request):
    (tmp_path / "state").mkdir()
    keys.generate(str(tmp_path / "state" / "cluster.key"))
    keyring = keys.load_keyring(str(tmp_path / "state" / "cluster.key"))
    srv = natsserver.start(tmp_path / "nats")
    lg = await JetStreamLog.connect(srv.url, keyring=keyring)
    marker = request.node.get_closest_marker("slurm_conf")
    config = parse_config(marker.args[0] if marker else CONF, "slurm.conf").model_copy(update={"agents": True})
    c = Controller(lg, config=config, debounce=0.01, cycle_interval=0.5, keyring=keyring, outbox=Outbox())
    await c.start()
    await c.serve(lg.nc)
    link = AgentLink(c, lg.nc, node_timeout=3.0, keyring=keyring)
    await link.start()
    cl = Cluster(tmp_path, srv.url, c, keyring)
    cl.link = link
    yield cl
    for p in cl.agents.values():
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
    for f in (tmp_path / "state" / "agent").glob("*/jobs/*.json"):   # never leave a job behind
        pid = json.loads(f.read_text())["pid"]
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    await cl.link.stop()
    await c.stop()
    await lg.close()
    srv.stop()


@pytest.fixture(params=["rota-exec", "fork"])
def launcher(request, cluster):
    """The agents start jobs through the rota-exec helper (skipped where no C compiler built it) or by
    forking themselves: the same jobs, the same confinement."""
    from rota.agents import launch

    if request.param == "rota-exec":
        if launch.exec_helper() is None:
            pytest.skip("rota-exec is not built here (no C compiler): the agents fork")
    else:
        cluster.env = dict(os.environ, ROTA_EXEC="0")
    return request.param


async def test_three_agents_run_concurrent_jobs_each_seeing_only_its_gpus(cluster):
    for n in ("n1", "n2", "n3"):
        cluster.start_agent(n)
    await cluster.registered("n1", "n2", "n3")
    jobs = [await cluster.submit('echo "$SLURMD_NODENAME $CUDA_VISIBLE_DEVICES $SLURM_JOB_GPUS"; sleep 1',
                                 gpus_per_node=1) for _ in range(6)]
    ends = [await cluster.ended(j) for j in jobs]
    seen = set()
    for j, job in zip(jobs, ends):
        assert job.state == "COMPLETED" and job.exit_code == 0
        node, visible, slurm_gpus = cluster.output(j).split()
        (alloc,) = job.alloc
        assert node == alloc.node and visible == slurm_gpus == ",".join(map(str, alloc.gpus))
        seen.add((node, visible))
    assert len(seen) == 6, "two concurrent jobs were given the same GPU"
    assert {n for n, _ in seen} == {"n1", "n2", "n3"}


async def test_exit_code_timeout_and_environment(cluster, launcher):
    cluster.start_agent("n1")
    await cluster.registered("n1")
    failed = await cluster.submit("env | sort; exit 3", name="fails", cpus_per_task=2, cpus_per_task_given=True)
    slow = await cluster.submit("trap '' TERM; sleep 30", name="slow", time_limit=1)
    job = await cluster.ended(failed)
    assert (job.state, job.exit_code) == ("FAILED", 3)
    env = dict(line.split("=", 1) for line in cluster.output(failed).splitlines() if "=" in line)
    assert env["SLURM_JOB_ID"] == str(failed) and env["SLURM_JOB_NAME"] == "fails"
    assert env["SLURM_CPUS_PER_TASK"] == "2" and env["SLURM_JOB_NODELIST"] == "n1"
    assert env["SLURM_SUBMIT_DIR"] == str(cluster.tmp) and env["SLURM_JOB_PARTITION"] == "main"
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["SLURM_NTASKS"] == "1"
    t0 = time.monotonic()
    job = await cluster.ended(slow, timeout=15)
    assert job.state == "TIMEOUT"          # SIGTERM ignored: SIGKILL after KillWait
    assert f"*** JOB {slow} ON n1 CANCELLED AT " in cluster.output(slow)
    assert cluster.output(slow).rstrip().endswith("DUE TO TIME LIMIT ***")
    assert time.monotonic() - t0 < 10


@pytest.mark.skipif(not CGROUPS, reason="needs root and a cgroup memory controller to confine jobs")
async def test_allocating_past_mem_is_out_of_memory_with_maxrss_near_the_limit(cluster, launcher):
    cluster.start_agent("n1")
    await cluster.registered("n1")
    jid = await cluster.submit(f"{sys.executable} -c 'b = bytearray(400 * 1024 * 1024); b[::4096] = b\"x\" * len(b[::4096])'",
                               mem_per_node=100)
    job = await cluster.ended(jid)
    assert job.state == "OUT_OF_MEMORY"
    assert f"Detected 1 oom-kill event(s) in StepId={jid}.batch" in cluster.output(jid)
    assert 80 * 1024 <= job.max_rss <= 101 * 1024, job.max_rss


PIDS = os.geteuid() == 0 and (Path("/sys/fs/cgroup/pids/cgroup.procs").exists()
                              or "pids" in (Path("/sys/fs/cgroup/cgroup.controllers").read_text()
                                            if Path("/sys/fs/cgroup/cgroup.controllers").exists() else ""))
# forks as fast as it can, each child an exec'd sleep: bounded (2,000), so a missing limit cannot take the host
FORK_BOMB = ("/usr/bin/python3 -c 'import os, time\nfor i in range(2000):\n    try:\n        pid = os.fork()\n"
             "    except OSError:\n        continue\n    if pid == 0:\n        os.execv(\"/bin/sleep\", [\"sleep\", \"60\"])\n"
             "time.sleep(60)'")


@pytest.mark.skipif(not PIDS or not os.access("/usr/bin/python3", os.X_OK),
                    reason="needs root, a cgroup pids controller and a Python every user may run")
async def test_a_fork_bomb_ends_its_job_with_the_reason_and_the_node_stays_up(cluster, launcher):
    import pwd
    import shutil
    import tempfile

    nobody = pwd.getpwnam("nobody")
    shared = Path(tempfile.mkdtemp(prefix="rota-bomb-"))     # traversable by the job's user
    shared.chmod(0o755)
    home = shared / "nobody"
    home.mkdir()
    os.chown(home, nobody.pw_uid, nobody.pw_gid)
    try:
        cluster.agents["n1"] = subprocess.Popen(
            [str(BIN / "rota"), "agent", "--node", "n1", "--nats", cluster.url, "--state-dir", str(shared / "state"),
             "--key", str(cluster.host_key("n1")), "--fake-gpus", "a100:2", "--cpus", "4", "--memory", "2000",
             "--heartbeat", "0.3", "--kill-wait", "1", "--max-tasks", "64"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=cluster.env)
        await cluster.registered("n1")
        jid = await cluster.submit(FORK_BOMB, uid=nobody.pw_uid, gid=nobody.pw_gid, user="nobody", workdir=str(home),
                                   output=str(home / "bomb.txt"))     # a second local user's job
        job = await cluster.ended(jid, timeout=30)
        assert job.state == "FAILED"
        said = (home / "bomb.txt").read_text()
        assert f"*** JOB {jid} ON n1 CANCELLED AT " in said and said.rstrip().endswith("DUE TO TASK LIMIT (64) ***"), said
        after = await cluster.submit("echo still-here", uid=nobody.pw_uid, gid=nobody.pw_gid, user="nobody",
                                     workdir=str(home), output=str(home / "after.txt"))
        job = await cluster.ended(after)
        assert job.state == "COMPLETED" and (home / "after.txt").read_text().strip() == "still-here"
        assert cluster.c.state.nodes["n1"].drain is False and cluster.c.state.nodes["n1"].down is False
    finally:
        shutil.rmtree(shared, ignore_errors=True)


async def test_cancel_kills_the_whole_process_tree(cluster, launcher):
    cluster.start_agent("n1")
    await cluster.registered("n1")
    pids = cluster.tmp / "pids"
    jid = await cluster.submit(f"sleep 300 & echo $! >> {pids}; (sleep 300 & echo $! >> {pids}; wait) & "
                               f"echo $$ >> {pids}; wait")
    await cluster.until(lambda s: pids.exists() and len(pids.read_text().split()) == 3, what="job processes")
    r = await cluster.c.handle("cancel", {"job_id": jid})
    assert r["ok"]
    procs = [int(p) for p in pids.read_text().split()]
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in procs) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not any(_alive(p) for p in procs), "a cancelled job's process survived"
    await cluster.until(lambda s: s.jobs[jid].state == "CANCELLED", what="the cancel reported")


async def test_xid_drains_the_node_running_job_completes_and_resume_redrains(cluster):
    cluster.start_agent("n1")
    await cluster.registered("n1")
    jid = await cluster.submit("sleep 1.5", gpus_per_node=1)
    await cluster.until(lambda s: s.jobs[jid].state == "RUNNING", what="job running")
    cluster.faults("n1", xid=[[1, 79]])
    node = await cluster.until(lambda s: s.nodes["n1"] if s.nodes["n1"].drain else None, what="drain")
    # NVIDIA's bucket for it in the reason; the job's GPU (0) is not the one that fell: it runs on
    assert node.reason == "gpu 1: xid 79 (fell off the bus): RESTART_BM" and node.display_state() == "DRAINING"
    assert (await cluster.ended(jid)).state == "COMPLETED"
    assert cluster.c.state.nodes["n1"].display_state() == "DRAINED"
    later = await cluster.submit("true")
    await asyncio.sleep(0.5)
    assert cluster.c.state.jobs[later].state == "PENDING"      # no new work on a drained node
    assert (await cluster.c.handle("resume", {"node": "n1"}))["ok"]
    node = await cluster.until(lambda s: s.nodes["n1"] if s.nodes["n1"].drain else None, what="re-drain")
    assert "xid 79" in node.reason


async def test_an_applications_xid_is_recorded_and_a_gpu_off_the_bus_requeues_its_job(cluster):
    from rota.core import events as ev

    cluster.start_agent("n1")
    await cluster.registered("n1")
    jid = await cluster.submit("sleep 60", gpus_per_node=1, requeue=True)
    job = await cluster.until(lambda s: s.jobs[jid] if s.jobs[jid].state == "RUNNING" else None, what="job running")
    (gpu,) = job.alloc[0].gpus
    cluster.faults("n1", xid=[[gpu, 13]])           # the application's own fault: RESTART_APP, never a drain

    async def recorded(code: str) -> list[ev.HealthFault]:
        return [e.event async for e in cluster.c.log.read(1)
                if isinstance(e.event, ev.HealthFault) and e.event.code == code]
    deadline = time.monotonic() + 10
    while not await recorded("xid:13") and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    (fault,) = await recorded("xid:13")
    assert (fault.action, fault.drains) == ("RESTART_APP", False)
    await asyncio.sleep(1.0)                         # a few health intervals: reported once, never drained
    assert len(await recorded("xid:13")) == 1
    assert not cluster.c.state.nodes["n1"].drain and cluster.c.state.jobs[jid].state == "RUNNING"
    cluster.faults("n1", xid=[[gpu, 13], [gpu, 79]])
    node = await cluster.until(lambda s: s.nodes["n1"] if s.nodes["n1"].drain else None, what="drain")
    assert node.reason == f"gpu {gpu}: xid 79 (fell off the bus): RESTART_BM"
    job = cluster.c.state.jobs[jid]
    assert job.state == "PENDING" and job.restarts == 1        # requeued: it asked to be, its GPU is gone


async def test_fewer_gpus_than_configured_drains_and_resume_redrains(cluster):
    cluster.start_agent("n2", gpus="a100:1")
    node = await cluster.until(lambda s: s.nodes["n2"] if s.nodes["n2"].drain else None, what="drain")
    assert node.reason == "gres/gpu count reported lower than configured (1 < 2)"
    assert (await cluster.c.handle("resume", {"node": "n2"}))["ok"]
    assert not cluster.c.state.nodes["n2"].drain
    node = await cluster.until(lambda s: s.nodes["n2"] if s.nodes["n2"].drain else None, what="re-drain")
    assert "gres/gpu count reported lower" in node.reason


async def test_a_silent_agent_makes_its_node_down_and_its_job_node_fail(cluster):
    proc = cluster.start_agent("n3")
    await cluster.registered("n3")
    jid = await cluster.submit("sleep 60")
    requeue = await cluster.submit("sleep 60", requeue=True)
    await cluster.until(lambda s: s.jobs[jid].state == s.jobs[requeue].state == "RUNNING", what="jobs running")
    proc.kill()
    proc.wait()
    node = await cluster.until(lambda s: s.nodes["n3"] if s.nodes["n3"].down else None, timeout=10, what="DOWN")
    assert node.reason == "Not responding"
    assert cluster.c.state.jobs[jid].state == "NODE_FAIL"
    assert cluster.c.state.jobs[requeue].state == "PENDING" and cluster.c.state.jobs[requeue].restarts == 1


async def test_a_controller_leading_again_gives_every_agent_a_whole_timeout(cluster):
    """What a controller heard in an earlier spell as leader is old news when it leads again (leadership can
    move back and forth while NATS servers fail): its agents were heard by the other leader meanwhile."""
    import time

    proc = cluster.start_agent("n1")
    await cluster.registered("n1")
    await cluster.link.stop()                          # this controller stops leading ...
    cluster.c.agent_seen["n1"] = time.monotonic() - 3600     # ... having last heard n1 an hour ago
    proc.kill()                                        # (and n1 falls silent, so only that old hearing counts)
    proc.wait()
    led = time.monotonic()
    cluster.link = AgentLink(cluster.c, cluster.c.log.nc, node_timeout=3.0, keyring=cluster.keyring)
    await cluster.link.start()                         # it leads again
    await asyncio.sleep(1.0)
    node = cluster.c.state.nodes["n1"]
    assert not node.down and not node.not_responding, node.reason
    await cluster.until(lambda s: s.nodes["n1"].down, timeout=10, what="n1 DOWN")
    assert time.monotonic() - led >= 3.0               # silent for the whole timeout since it leads


async def test_a_restarted_agent_finds_its_running_jobs_again(cluster):
    proc = cluster.start_agent("n1")
    await cluster.registered("n1")
    jid = await cluster.submit("sleep 2; exit 4")
    await cluster.until(lambda s: s.jobs[jid].state == "RUNNING", what="job running")
    await asyncio.sleep(0.3)
    proc.kill()                              # the agent dies; its job does not
    proc.wait()
    cluster.start_agent("n1")
    job = await cluster.ended(jid)
    assert (job.state, job.exit_code) == ("FAILED", 4)   # the real exit status, found again


async def exit_7_with_its_agent_gone(cluster, node: str) -> int:
    """A job on ``node`` that exits 7 a second after its script started; its agent killed meanwhile."""
    proc = cluster.start_agent(node)
    await cluster.registered(node)
    started = cluster.tmp / f"{node}-started"
    jid = await cluster.submit(f"touch {started}; sleep 1; exit 7")
    await cluster.until(lambda s: started.exists(), what="the job's script to run")
    proc.kill()
    proc.wait()
    return jid


async def test_a_job_that_ended_while_its_agent_was_away_keeps_its_real_exit_status(cluster):
    jid = await exit_7_with_its_agent_gone(cluster, "n1")   # away for less than the node timeout
    await asyncio.sleep(1.5)
    cluster.start_agent("n1")
    job = await cluster.ended(jid)
    assert (job.state, job.exit_code) == ("FAILED", 7)
    assert not cluster.c.state.nodes["n1"].down


async def test_a_late_report_after_the_node_timeout_keeps_how_the_job_really_ended(cluster):
    jid = await exit_7_with_its_agent_gone(cluster, "n2")
    await cluster.until(lambda s: s.jobs[jid].state == "NODE_FAIL", timeout=10, what="NODE_FAIL")
    cluster.start_agent("n2")
    job = await cluster.until(lambda s: s.jobs[jid] if s.jobs[jid].exit_code == 7 else None, what="the late report")
    assert job.state == "NODE_FAIL"          # the log's verdict stands; the report is kept with it


async def test_a_controller_that_was_stopped_does_not_take_its_agents_for_dead(cluster):
    cluster.start_agent("n1")
    await cluster.registered("n1")
    time.sleep(4)                            # the controller's process does nothing for longer than the timeout
    await asyncio.sleep(1.5)
    node = cluster.c.state.nodes["n1"]
    assert not node.down and not node.not_responding


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


async def test_a_failing_health_program_drains_the_node(cluster):
    cluster.start_agent("n2", "a100:2", "--health-program", "echo 'disk /scratch full'; exit 1")
    node = await cluster.until(lambda s: s.nodes["n2"] if s.nodes["n2"].drain else None, what="drain")
    assert node.reason == "health check failed: disk /scratch full"


@pytest.mark.skipif(os.geteuid() != 0, reason="running a job as another user needs root")
async def test_the_job_runs_as_the_submitting_user(cluster, launcher, tmp_path_factory):
    import pwd
    import tempfile

    nobody = pwd.getpwnam("nobody")
    shared = Path(tempfile.mkdtemp(prefix="rota-agent-"))   # traversable by the job's user
    shared.chmod(0o755)
    try:
        cmd_state = shared / "state"
        proc = subprocess.Popen([str(BIN / "rota"), "agent", "--node", "n3", "--nats", cluster.url,
                                 "--state-dir", str(cmd_state), "--key", str(cluster.host_key("n3")),
                                 "--fake-gpus", "a100:2", "--cpus", "4",
                                 "--memory", "2000", "--heartbeat", "0.3"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=cluster.env)
        cluster.agents["n3"] = proc
        await cluster.registered("n3")
        home = shared / "nobody"
        home.mkdir()
        os.chown(home, nobody.pw_uid, nobody.pw_gid)
        jid = await cluster.submit("id -u; id -g", uid=nobody.pw_uid, gid=nobody.pw_gid, user="nobody",
                                   workdir=str(home), output=str(home / "out-%j.txt"))
        job = await cluster.ended(jid)
        assert job.state == "COMPLETED"
        assert (home / f"out-{jid}.txt").read_text().split() == [str(nobody.pw_uid), str(nobody.pw_gid)]
        assert (home / f"out-{jid}.txt").stat().st_uid == nobody.pw_uid   # the job's own process made it
        # where the user may not write, the job does not run, and says why
        jid = await cluster.submit("id", uid=nobody.pw_uid, gid=nobody.pw_gid, user="nobody",
                                   workdir=str(home), output=str(shared / "not-yours.txt"))
        job = await cluster.ended(jid)
        assert job.state == "FAILED" and not (shared / "not-yours.txt").exists()
    finally:
        import shutil

        shutil.rmtree(shared, ignore_errors=True)


async def test_scancel_signal_reaches_the_job_without_cancelling_it(cluster):
    cluster.start_agent("n1")
    await cluster.registered("n1")
    jid = await cluster.submit("trap 'echo got USR1' USR1; i=0; while [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); "
                               "done; echo done")
    await cluster.until(lambda s: s.jobs[jid].state == "RUNNING", what="job running")
    await asyncio.sleep(0.3)
    r = await cluster.c.handle("signal", {"job_id": jid, "signal": 10})
    assert r == {"ok": True}
    await cluster.until(lambda s: "got USR1" in cluster.output(jid), what="the signal")
    assert cluster.c.state.jobs[jid].state == "RUNNING"
    r = await cluster.c.handle("signal", {"job_id": 999, "signal": 10})
    assert r["ok"] is False and r["error"] == ["Invalid job id specified"]


async def test_forged_reports_and_heartbeats_are_not_believed(cluster):
    """Reports on a node's inbox must carry that node's credential: a report from no one, or signed by
    another node, changes nothing; a silent agent is not kept alive by heartbeats it did not send."""
    from rota.core import credentials

    cluster.start_agent("n1")
    cluster.start_agent("n2")
    await cluster.registered("n1", "n2")
    jid = await cluster.submit("sleep 30")
    await cluster.until(lambda s: s.jobs[jid].state == "RUNNING", what="job running")
    node = cluster.c.state.jobs[jid].alloc[0].node
    other = "n2" if node == "n1" else "n1"
    js = cluster.c.log.nc.jetstream()
    subject = f"rota.inbox.{node}"
    for event in (ev.JobExited(job_id=jid, state="COMPLETED", node=node),
                  ev.HealthFault(node=node, reason="forged", code="xid:79")):
        body = ev.EVENT_ADAPTER.dump_json(event)
        wrong = credentials.issue(cluster.keyring.key_of(other), "node", 0, 0, other, int(time.time()), "ab" * 16,
                                  subject, body)
        for headers in ({}, {"Rota-Cred": wrong}):
            await js.publish(subject, body, stream="ROTA_INBOX", headers={"Nats-Msg-Id": os.urandom(8).hex(), **headers})
    await asyncio.sleep(1.5)
    st = cluster.c.state
    assert st.jobs[jid].state == "RUNNING" and not st.nodes[node].drain
    # stop the other node's agent and pretend to be it
    cluster.agents[other].send_signal(signal.SIGKILL)
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline and not cluster.c.state.nodes[other].down:
        await cluster.c.log.nc.publish(f"rota.hb.{other}", json.dumps({"running": []}).encode())
        await asyncio.sleep(0.2)
    assert cluster.c.state.nodes[other].down, "unsigned heartbeats kept a dead node alive"
    await cluster.c.handle("cancel", {"job_id": jid})


async def test_an_order_without_the_controllers_credential_is_ignored(cluster):
    cluster.start_agent("n1")
    await cluster.registered("n1")
    marker = cluster.tmp / "ran-as-root"
    order = {"op": "launch", "job_id": 424242, "restarts": 0, "name": "evil", "user": "root", "partition": "main",
             "nodes": ["n1"], "node_index": 0, "cpus": 1, "mem": 0, "gpus": [], "cpus_per_node": [1],
             "tasks_per_node": [1], "ntasks": 1, "time_limit": 0, "start_time": int(time.time()),
             "array_job_id": None, "array_task_id": None,
             "spec": {"uid": 0, "gid": 0, "script": f"#!/bin/sh\ntouch {marker}\n", "workdir": "/tmp",
                      "output": "/dev/null"}}
    js = cluster.c.log.nc.jetstream()
    await js.publish("rota.orders.n1", json.dumps(order).encode(), stream="ROTA_ORDERS")
    await asyncio.sleep(1.5)
    assert not marker.exists()
    # the same order, signed as the controller signs it, runs (the test is not vacuous)
    jid = await cluster.submit(f"touch {marker}")
    await cluster.ended(jid)
    assert marker.exists()


async def test_orders_an_agent_acted_on_leave_the_stream(cluster, monkeypatch):
    """The controller purges a node's orders up to the last its agent's heartbeats say it acted on (kept in
    the agent's state directory), so the order stream does not grow with every launch."""
    from rota.controller import agentlink

    monkeypatch.setattr(agentlink, "PURGE_WAIT", 0.3)
    cluster.start_agent("n1")
    await cluster.registered("n1")
    jobs = [await cluster.submit("true") for _ in range(3)]
    for jid in jobs:
        assert (await cluster.ended(jid)).state == "COMPLETED"
    js = cluster.c.log.nc.jetstream()
    info = await js.stream_info("ROTA_ORDERS")
    assert info.state.last_seq >= 3       # the launches went through it
    mark = cluster.tmp / "state" / "agent" / "n1" / "orders.json"
    deadline = time.monotonic() + 10
    while (await js.stream_info("ROTA_ORDERS")).state.messages and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert (await js.stream_info("ROTA_ORDERS")).state.messages == 0
    assert json.loads(mark.read_text())["seq"] == info.state.last_seq


async def test_a_mark_in_another_order_stream_purges_nothing(cluster, monkeypatch):
    """A heartbeat's mark counts in the stream its agent read: one from a stream made before this one (an agent
    not yet moved to a stream made anew) must not purge orders it has not read."""
    from rota.controller import agentlink
    from rota.core import credentials
    from rota.core.orders import Heartbeat

    monkeypatch.setattr(agentlink, "PURGE_WAIT", 0.0)
    nc = cluster.c.log.nc
    js = nc.jetstream()
    await js.publish("rota.orders.n2", b"{}", stream="ROTA_ORDERS")      # an order n2 has not read
    key = cluster.keyring.key_of("n2")

    async def beat(stream: str) -> None:
        body = Heartbeat(orders=10**6, order_stream=stream).model_dump_json().encode()
        cred = credentials.issue(key, "node", 0, 0, "n2", int(time.time()), os.urandom(16).hex(), "rota.hb.n2", body)
        await nc.publish("rota.hb.n2", body, headers={"Rota-Cred": cred})

    await beat("2001-01-01T00:00:00+00:00")
    await asyncio.sleep(1.0)
    assert (await js.stream_info("ROTA_ORDERS")).state.messages == 1
    await beat(cluster.link._order_stream)          # this stream's mark: purged
    deadline = time.monotonic() + 5
    while (await js.stream_info("ROTA_ORDERS")).state.messages and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert (await js.stream_info("ROTA_ORDERS")).state.messages == 0


async def test_an_order_that_cannot_be_delivered_is_set_aside_and_others_still_go(cluster):
    """An order too big for NATS is set aside with its reason (a launch: its job ends FAILED), and the
    node's next orders are not stuck behind it."""
    cluster.start_agent("n1")
    await cluster.registered("n1")
    jid = await cluster.submit("sleep 30")
    await cluster.until(lambda s: s.jobs[jid].state == "RUNNING", what="running")
    link = cluster.link
    job = cluster.c.state.jobs[jid]
    order = effects.launch(job).model_copy(update={"spec": job.spec.model_copy(update={"script": "x" * (9 << 20)})})
    link.send([("n1", order)])
    job = await cluster.ended(jid)
    assert job.state == "FAILED"
    assert link.set_aside and link.set_aside[-1][0] == "n1" and "more than NATS carries" in link.set_aside[-1][2]
    later = await cluster.submit("echo after")
    assert (await cluster.ended(later)).state == "COMPLETED"


def test_a_launch_that_came_late_still_gets_its_whole_time_limit():
    """An order redelivered long after its job's logged start (the NATS server that held it died) runs
    for its whole limit from its launch, not killed at once as TIMEOUT; an order on time counts from
    the logged start."""
    from rota.agents.agent import Run
    from rota.core.orders import Launch

    start = 1_000_000
    order = Launch.model_validate({
        "op": "launch", "job_id": 7, "restarts": 0, "name": "j", "user": "root", "partition": "main",
        "nodes": ["n1"], "node_index": 0, "cpus": 1, "mem": 0, "gpus": [], "cpus_per_node": [1],
        "tasks_per_node": [1], "ntasks": 1, "time_limit": 60, "start_time": start,
        "array_job_id": None, "array_task_id": None,
        "spec": {"uid": 0, "gid": 0, "script": "#!/bin/sh\n", "workdir": "/tmp", "output": "/dev/null"}})
    assert Run(order, 1, start + 0.2).deadline == start + 60.2
    assert Run(order, 1, start + 90.0).deadline == start + 150.0
    assert Run(order, 1, start - 5.0).deadline == start + 60          # a clock a little behind the log's


@pytest.mark.slurm_conf(CONF + "RotaIdleGpu=after=2s,action=cancel,grace=1s\n")
async def test_an_idle_gpu_job_is_warned_then_cancelled_with_the_samples_in_why(cluster):
    from rota.cli.timetravel import why_text
    from rota.core.notify import time_notices
    from rota.core.timetravel import why

    cluster.start_agent("n1", "a100:2", "--gpu-sample", "0.3", "--gpu-idle-report", "0.5")
    await cluster.registered("n1")
    busy = await cluster.submit("sleep 60", gpus_per_node=1)
    job = await cluster.until(lambda s: s.jobs[busy] if s.jobs[busy].state == "RUNNING" else None, what="running")
    (gpu,) = job.alloc[0].gpus
    cluster.faults("n1", util={str(gpu): 0}, mem_used={str(gpu): 1024})          # nothing runs on its GPU
    job = await cluster.until(lambda s: s.jobs[busy] if s.jobs[busy].idle_since else None, what="reported idle")
    since = job.idle_since
    assert cluster.c.state.config.idle_gpu.after == 2, cluster.c.state.config.idle_gpu
    assert [n.kind for n in time_notices(cluster.c.state, since + 2)] == [f"IDLE_GPU.{since}"]    # the warning
    ended = await cluster.ended(busy, timeout=30)
    assert ended.state == "CANCELLED"
    log = [e async for e in cluster.c.log.read(1)]
    cancel = next(e.event for e in log if isinstance(e.event, ev.JobCancelled) and e.event.job_id == busy)
    assert cancel.reason.startswith(f"its GPUs were idle from t={since} for 3s") and cancel.by_uid == 0
    text = "\n".join(why_text(why(log, busy), {}))
    assert "reported its GPUs idle since" in text and f"gpu {gpu} 0% 1024 MiB" in text, text
    assert "idle-gpu-policy cancelled the job" in text, text


@pytest.mark.slurm_conf("GresTypes=gpu,shard\nNodeName=n[1-3] CPUs=4 RealMemory=2000 Gres=gpu:a100:2,shard:8\n"
                        "PartitionName=main Nodes=n[1-3] Default=YES MaxTime=1:00:00\n")
async def test_shard_jobs_see_the_card_they_share(cluster):
    cluster.start_agent("n1")
    await cluster.registered("n1")
    script = "echo $CUDA_VISIBLE_DEVICES $SLURM_SHARDS_ON_NODE; sleep 1"
    jobs = [await cluster.submit(script, shards_per_node=n, nodelist=("n1",)) for n in (2, 2, 3)]
    for jid in jobs:
        assert (await cluster.ended(jid)).state == "COMPLETED"
    assert [cluster.output(j).split() for j in jobs] == [["0", "2"], ["0", "2"], ["1", "3"]]
