"""Steps end to end: ``srun``/``salloc`` and the client libraries people drive Slurm with, against a real
``rota up`` whose second node is served by a second agent process (rota's commands first on PATH)."""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from helpers import wait_for

BIN = Path(sys.executable).parent
CONF = """GresTypes=gpu
NodeName=n[1-2] CPUs=4 RealMemory=2000 Gres=gpu:a100:2
PartitionName=main Nodes=n[1-2] Default=YES MaxTime=1:00:00
"""


class Up:
    def __init__(self, base: Path, env: dict) -> None:
        self.base, self.env = base, env

    def run(self, *cmd, input: str | None = None, timeout: float = 60, cwd: Path | None = None):
        return subprocess.run(list(cmd), env=self.env, capture_output=True, text=True, timeout=timeout, input=input,
                              cwd=cwd or self.base)

    def sbatch(self, script: str, *opts: str) -> int:
        path = self.base / f"job-{time.monotonic_ns()}.sh"
        path.write_text(script)
        r = self.run("sbatch", "--parsable", *opts, str(path))
        assert r.returncode == 0, r.stderr
        return int(r.stdout.strip())

    def state(self, jid: int) -> str:
        r = self.run("sacct", "-n", "-X", "-P", "-o", "State", "-j", str(jid))
        return r.stdout.strip()

    def ended(self, jid: int, timeout: float = 60) -> str:
        return wait_for(lambda: (s := self.state(jid)) not in ("", "PENDING", "RUNNING") and s, timeout,
                        f"job {jid} to end")

    def sacct(self, jid: int, fmt: str) -> list[list[str]]:
        r = self.run("sacct", "-n", "-P", "-o", fmt, "-j", str(jid))
        return [line.split("|") for line in r.stdout.splitlines()]


@pytest.fixture(scope="module")
def up():
    """``rota up`` serving n1, and a second agent serving n2, on this host; PATH starts with rota's commands."""
    base = Path(tempfile.mkdtemp(prefix="rota-srun-"))
    base.chmod(0o755)
    (base / "slurm.conf").write_text(CONF)
    env = dict(os.environ, ROTA_STATE_DIR=str(base / "state"), PATH=f"{BIN}:{os.environ.get('PATH', '')}")
    env.pop("SLURM_JOB_ID", None)
    procs = []
    with open(base / "up.log", "w") as fh:
        procs.append(subprocess.Popen([str(BIN / "rota"), "up", "--config", str(base / "slurm.conf"), "--fake-gpus",
                                       "a100:2"], env=dict(env, ROTA_LOGLEVEL="INFO"), stdout=fh,
                                      stderr=subprocess.STDOUT))
    try:
        wait_for(lambda: (base / "state" / "cluster.json").exists(), what="rota up")
        import json

        url = json.loads((base / "state" / "cluster.json").read_text())["nats"]
        subprocess.run([str(BIN / "rota"), "keygen", "--host", "n2", "--out", str(base / "n2.key")], env=env,
                       check=True, capture_output=True)
        with open(base / "agent-n2.log", "w") as fh:
            procs.append(subprocess.Popen(
                [str(BIN / "rota"), "agent", "--node", "n2", "--nats", url, "--key", str(base / "n2.key"),
                 "--state-dir", str(base / "state"), "--fake-gpus", "a100:2", "--cpus", "4", "--memory", "2000",
                 "--socket", str(base / "n2.sock"), "--heartbeat", "1"], env=env, stdout=fh, stderr=subprocess.STDOUT))
        u = Up(base, env)
        wait_for(lambda: u.run("sinfo", "-h", "-o", "%T %D").stdout.split() == ["idle", "2"], what="both nodes idle")
        yield u
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGINT if p is procs[0] else signal.SIGTERM)
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(base, ignore_errors=True)


def test_srun_inside_a_batch_job_runs_a_step_per_call_with_slurms_variables(up):
    out = up.base / "inside.out"
    jid = up.sbatch(f"""#!/bin/sh
#SBATCH -n 2 --gres=gpu:2 -o {out}
srun -l sh -c 'echo "$SLURM_STEP_ID $SLURM_PROCID/$SLURM_NTASKS local=$SLURM_LOCALID node=$SLURM_NODEID" \
  "gpus=$CUDA_VISIBLE_DEVICES nodes=$SLURM_STEP_NODELIST"'
srun -n 1 --gpus-per-task=1 sh -c 'echo one sees $CUDA_VISIBLE_DEVICES; exit 3'
echo "srun exit $?"
printf 'a\\nb\\n' | srun -n 2 sort -r
env -i PATH="$PATH" ROTA_STATE_DIR="$ROTA_STATE_DIR" SLURM_JOB_ID=$SLURM_JOB_ID \
  srun -n 1 sh -c 'echo alone $SLURM_JOB_NODELIST $SLURM_STEP_ID'
srun -n 2 -o {up.base}/task-%J-%t.txt sh -c 'echo file $SLURM_PROCID'
srun -n 9 true
echo "too big $?"
""")
    assert up.ended(jid) == "COMPLETED"
    text = out.read_text()
    lines = text.splitlines()
    assert "0: 0 0/2 local=0 node=0 gpus=0,1 nodes=n1" in lines
    assert "1: 0 1/2 local=1 node=0 gpus=0,1 nodes=n1" in lines
    assert "one sees 0" in lines and "srun: error: n1: task 0: Exited with exit code 3" in lines
    assert "srun exit 3" in lines
    assert lines.count("b") == 2 and lines.count("a") == 2          # stdin went to every task
    assert "alone n1 3" in lines                                     # only SLURM_JOB_ID was left
    assert (up.base / f"task-{jid}.4-0.txt").read_text() == "file 0\n"
    assert (up.base / f"task-{jid}.4-1.txt").read_text() == "file 1\n"
    assert f"srun: error: Unable to create step for job {jid}: More processors requested than permitted" in lines
    assert "too big 1" in lines
    rows = up.sacct(jid, "JobID,JobName,State,ExitCode,NTasks,NodeList")
    assert [r[0] for r in rows] == [str(jid), f"{jid}.batch", f"{jid}.0", f"{jid}.1", f"{jid}.2", f"{jid}.3",
                                    f"{jid}.4"]
    by_id = {r[0]: r for r in rows}
    assert by_id[f"{jid}.0"][1:] == ["sh", "COMPLETED", "0:0", "2", "n1"]
    assert by_id[f"{jid}.1"][2:4] == ["FAILED", "3:0"]
    assert by_id[f"{jid}.2"][1:3] == ["sort", "COMPLETED"]


def test_a_pytorch_style_launch_over_two_nodes_gives_every_task_its_rank_and_only_its_gpu(up):
    out = up.base / "torch.out"
    jid = up.sbatch(f"""#!/bin/sh
#SBATCH -N 2 --ntasks-per-node=2 --gres=gpu:2 -o {out}
export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun --gpus-per-task=1 sh -c 'echo "rank=$SLURM_PROCID world=$SLURM_NTASKS node=$SLURM_NODEID" \
  "local=$SLURM_LOCALID host=$SLURMD_NODENAME gpu=$CUDA_VISIBLE_DEVICES master=$MASTER_ADDR"'
""")
    assert up.ended(jid) == "COMPLETED"
    got = sorted(out.read_text().splitlines())
    assert got == [f"rank={r} world=4 node={r // 2} local={r % 2} host=n{r // 2 + 1} gpu={r % 2} master=n1"
                   for r in range(4)]
    rows = {r[0]: r for r in up.sacct(jid, "JobID,State,NTasks,NodeList")}
    assert rows[f"{jid}.0"][1:] == ["COMPLETED", "4", "n[1-2]"]


def test_srun_outside_a_job_gets_an_allocation_runs_and_gives_it_back(up):
    r = up.run("srun", "-N", "2", "-l", "sh", "-c", "echo $SLURM_NODEID on $SLURMD_NODENAME; exit $SLURM_NODEID")
    assert r.returncode == 1
    assert sorted(r.stdout.splitlines()) == ["0: 0 on n1", "1: 1 on n2"]
    assert "srun: error: n2: task 1: Exited with exit code 1" in r.stderr
    jid = int(up.run("sacct", "-n", "-X", "-P", "-o", "JobID", "--name", "sh").stdout.split()[-1])
    assert up.ended(jid) == "FAILED"
    rows = up.sacct(jid, "JobID,State,ExitCode")
    assert rows == [[str(jid), "FAILED", "1:0"], [f"{jid}.0", "FAILED", "1:0"]]


def test_srun_says_it_waits_and_why(up):
    hog = up.sbatch("#!/bin/sh\n#SBATCH -N 2 --exclusive\nsleep 60\n")
    wait_for(lambda: up.state(hog) == "RUNNING", what="the hog to run")
    proc = subprocess.Popen(["srun", "true"], env=up.env, stderr=subprocess.PIPE, text=True, cwd=up.base)
    try:
        time.sleep(3)
        up.run("scancel", str(hog))
        _out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "queued and waiting for resources" in err and "is pending: Resources" in err
    assert "has been allocated resources" in err


def test_salloc_gives_an_allocation_runs_the_command_and_releases_it(up):
    r = up.run("salloc", "-N", "1", "sh", "-c", "echo $SLURM_JOB_ID $SLURM_JOB_NUM_NODES; srun hostname >/dev/null; "
               "exit 4")
    assert r.returncode == 4, r.stderr
    jid, nodes = r.stdout.split()
    assert nodes == "1"
    assert f"salloc: Granted job allocation {jid}" in r.stderr
    assert f"salloc: Relinquishing job allocation {jid}" in r.stderr
    assert up.ended(int(jid)) == "FAILED"
    assert [row[0] for row in up.sacct(int(jid), "JobID")] == [jid, f"{jid}.0"]


def test_a_step_never_outlives_its_job_and_scancel_reaches_every_task(up):
    marker = up.base / "outlived"
    jid = up.sbatch(f"#!/bin/sh\n#SBATCH -N 2 -t 1\nsrun -N 2 sh -c 'sleep 30; touch {marker}'\n")
    wait_for(lambda: [r for r in up.sacct(jid, "JobID,State") if r == [f"{jid}.0", "RUNNING"]], what="the step")
    time.sleep(0.5)
    assert up.run("scancel", str(jid)).returncode == 0
    assert up.ended(jid).startswith("CANCELLED")
    wait_for(lambda: not subprocess.run(["pgrep", "-f", f"touch {marker}"], capture_output=True).stdout,
             timeout=15, what="every task gone")
    rows = {r[0]: r[1] for r in up.sacct(jid, "JobID,State")}
    assert rows[f"{jid}.0"] == "CANCELLED"
    assert not marker.exists()


def test_ctrl_c_twice_stops_the_step(up):
    proc = subprocess.Popen(["srun", "-n", "2", "sleep", "30"], env=up.env, stderr=subprocess.PIPE, text=True,
                            cwd=up.base)
    jid = wait_for(lambda: [r[0] for r in [line.split("|") for line in up.run(
        "squeue", "-h", "-o", "%i|%j").stdout.splitlines()] if r[1:] == ["sleep"]], what="the allocation")[0]
    wait_for(lambda: [r for r in up.sacct(int(jid), "JobID,State") if r == [f"{jid}.0", "RUNNING"]],
             what="the step")
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=20)
    assert "srun: interrupt (one more within 1 sec to abort)" in err
    assert f"srun: sending Ctrl-C to StepId={jid}.0" in err
    assert proc.returncode == 128 + signal.SIGINT
    assert up.ended(int(jid)) == "FAILED"


# ---------------------------------------------------------------- the client libraries


def test_submitit_returns_values_and_exceptions_and_runs_arrays(up):
    pytest.importorskip("submitit")
    folder = up.base / "submitit"
    script = f"""
import submitit, sys
ex = submitit.SlurmExecutor(folder={str(folder)!r})
ex.update_parameters(time=5, partition="main")
print("value", ex.submit(pow, 2, 10).result())
def boom():
    raise ValueError("no good")
try:
    ex.submit(boom).result()
except Exception as exc:
    print("raised", type(exc).__name__, "ValueError: no good" in str(exc))
ex.update_parameters(array_parallelism=2)
jobs = ex.map_array(lambda x: x * x, range(5))
print("array", [j.result() for j in jobs], jobs[0].job_id.split("_")[0])
"""
    r = up.run(sys.executable, "-c", script, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert "value 1024" in lines
    assert "raised FailedJobError True" in lines
    array_line = next(line for line in lines if line.startswith("array"))
    assert array_line.startswith("array [0, 1, 4, 9, 16]")
    array_id = array_line.split()[-1]
    # submitit reads a task's result as soon as the task wrote it: its end reaches the log a moment later
    tasks = sorted(f"{array_id}_{i}|COMPLETED" for i in range(5))
    wait_for(lambda: sorted(up.run("sacct", "-j", array_id, "-X", "-P", "-n", "-o", "JobID,State").stdout.split())
             == tasks, what=f"sacct to show {tasks}")


def test_submitit_checkpoints_on_its_warning_signal_requeues_and_finishes(up):
    pytest.importorskip("submitit")
    folder = up.base / "ckpt"
    script = f"""
import os, time, submitit
from submitit.helpers import Checkpointable

class Work(Checkpointable):
    def __init__(self):
        self.seen = []
    def __call__(self):
        restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
        self.seen.append(restarts)
        if restarts == 0:
            time.sleep(120)      # the warning signal comes first: checkpoint, requeue
        return self.seen

ex = submitit.SlurmExecutor(folder={str(folder)!r}, max_num_timeout=3)
ex.update_parameters(time=1, partition="main", signal_delay_s=56)
job = ex.submit(Work())
print("result", job.result(), job.job_id)
"""
    r = up.run(sys.executable, "-c", script, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    line = next(x for x in r.stdout.splitlines() if x.startswith("result"))
    assert line.startswith("result [0, 1] ")
    jid = int(line.split()[-1])
    deadline = time.monotonic() + 15        # submitit reads the result file before the job's process has ended
    while (rows := up.sacct(jid, "JobID,State,Restarts"))[0][1] == "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert rows[0] == [str(jid), "COMPLETED", "1"]
    history = up.run("sacct", "-D", "-X", "-n", "-P", "-o", "JobID,State,Restarts", "-j", str(jid)).stdout.split()
    assert history == [f"{jid}|REQUEUED|0", f"{jid}|COMPLETED|1"]      # every run, as Slurm's -D lists them
    assert "Caught signal SIGUSR2" in next(folder.glob(f"{jid}_0_log.err")).read_text()


def test_dask_jobqueue_scales_to_two_workers_each_with_its_own_log(up):
    pytest.importorskip("dask_jobqueue")
    logs = up.base / "dask"
    script = f"""
from dask_jobqueue import SLURMCluster
from dask.distributed import Client
cluster = SLURMCluster(cores=1, memory="400MB", processes=1, walltime="00:05:00", queue="main",
                       log_directory={str(logs)!r}, scheduler_options={{"host": "127.0.0.1"}})
cluster.scale(2)
client = Client(cluster)
client.wait_for_workers(2, timeout=60)
print("workers", len(client.scheduler_info()["workers"]))
print("sum", sum(client.gather(client.map(lambda x: x * x, range(10)))))
client.close()
cluster.close()
"""
    r = up.run(sys.executable, "-c", script, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "workers 2" in r.stdout.splitlines() and "sum 285" in r.stdout.splitlines()
    errs = sorted(p.name for p in logs.glob("dask-worker-*.err"))
    assert len(errs) >= 2 and "dask-worker-%J.err" not in errs


# ---------------------------------------------------------------- daily use, as in Slurm 22.05


def test_squeue_lists_array_tasks_finished_jobs_and_sorts(up):
    hog = up.sbatch("#!/bin/sh\n#SBATCH -N 2 --exclusive -J hog\nsleep 60\n")
    wait_for(lambda: up.state(hog) == "RUNNING", what="the hog")
    arr = up.sbatch("#!/bin/sh\n#SBATCH -a 0-3 -J arr\ntrue\n")
    fmt = ["-h", "-o", "%i %T"]
    assert up.run("squeue", "-j", str(arr), *fmt).stdout.split("\n")[0] == f"{arr}_[0-3] PENDING"
    assert up.run("squeue", "-r", "-j", str(arr), *fmt).stdout.splitlines() == [f"{arr}_{i} PENDING" for i in range(4)]
    listed = up.run("squeue", "-S", "-i", "-j", f"{arr},{hog}", *fmt).stdout.splitlines()
    assert listed == [f"{arr}_[0-3] PENDING", f"{hog} RUNNING"]
    assert up.run("squeue", "-S", "x").stderr == "squeue: error: Invalid sort specification: x\n"
    up.run("scancel", str(hog))
    wait_for(lambda: up.state(hog).startswith("CANCELLED"), what="the hog to end")
    assert f"{hog} CANCELLED" in up.run("squeue", "-t", "all", *fmt).stdout.splitlines()
    assert f"{hog} CANCELLED" not in up.run("squeue", *fmt).stdout.splitlines()


def test_scontrol_show_job_details_requeue_default_and_config(up):
    jid = up.sbatch("#!/bin/sh\n#SBATCH -N 2 -c 2 --gres=gpu:2\nsleep 30\n")
    wait_for(lambda: up.state(jid) == "RUNNING", what="the job")
    shown = up.run("scontrol", "show", "job", "-d", str(jid)).stdout.splitlines()
    assert any(line.startswith("   Requeue=1 Restarts=0 BatchFlag=1") for line in shown)
    assert "   JOB_GRES=gpu:a100:4" in shown
    assert any(re.fullmatch(r"     Nodes=n\[1-2\] CPU_IDs=\d+-\d+ Mem=\d+ GRES=gpu:a100:2\(IDX:0-1\)", line)
               for line in shown), shown
    up.run("scancel", str(jid))
    config = up.run("scontrol", "show", "config").stdout.splitlines()
    assert config[0].startswith("Configuration data as of ")
    assert "ClusterName             = rota" in config and "JobRequeue              = 1" in config


def test_scontrol_reconfigure_refuses_a_broken_file_and_applies_a_good_one(up):
    conf = up.base / "slurm.conf"
    good = conf.read_text()
    try:
        conf.write_text(good + "NoSuchKey=1\n")
        r = up.run("scontrol", "reconfigure")
        assert r.returncode == 1
        assert f"{conf}:4: error: unknown key 'NoSuchKey'" in r.stderr
        assert "slurm_reconfigure error: the configuration has errors: nothing changed" in r.stderr
        conf.write_text(good + "PartitionName=debug Nodes=n1 MaxTime=10\n")
        assert up.run("scontrol", "reconfigure").returncode == 0
        wait_for(lambda: "debug" in up.run("sinfo", "-h", "-o", "%P").stdout.split(), what="the new partition")
        r = up.run("sinfo", "-h", "-o", "%P %l", "-p", "debug")
        assert r.stdout.split() == ["debug", "10:00"]
    finally:
        conf.write_text(good)
        up.run("scontrol", "reconfigure")


def test_an_agent_sends_nothing_of_a_step_to_a_port_that_is_not_its_srun(up):
    """A user who names another service of their own as their srun's address gets a failed step; that service
    gets nothing at all (the agent waits for srun's greeting first). A port the user does not listen on is
    refused by the signer."""
    import socket
    import threading

    jid = up.sbatch("#!/bin/sh\nsleep 60\n")
    wait_for(lambda: up.state(jid) == "RUNNING", what="the job")
    victim = socket.create_server(("127.0.0.1", 0))
    port = victim.getsockname()[1]
    got: list[bytes] = []

    def serve() -> None:
        victim.settimeout(20)
        conn, _ = victim.accept()
        conn.settimeout(5)
        conn.sendall(b"+OK\r\n")
        try:
            while data := conn.recv(65536):
                got.append(data)
        except OSError:
            pass
        conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    ask = ("from rota.cli.client import request; import sys; print(request('step_create', {'job_id': %d, "
           "'argv': ['sh', '-c', 'echo SECRET'], 'io': sys.argv[1], 'io_key': 'ab' * 16}))")
    r = up.run(sys.executable, "-c", ask % jid, f"127.0.0.1:{port}")
    assert "'ok': True" in r.stdout, r.stdout + r.stderr
    thread.join(15)
    assert b"".join(got) == b""
    wait_for(lambda: [row for row in up.sacct(jid, "JobID,State") if row == [f"{jid}.0", "FAILED"]],
             what="the step to fail")
    victim.close()
    r = up.run(sys.executable, "-c", ask % jid, f"127.0.0.1:{port}")
    assert f"the step's I/O address 127.0.0.1:{port} is not a port uid 0 listens on at this host" in r.stdout + r.stderr
    up.run("scancel", str(jid))


def test_back_to_back_steps_over_the_whole_allocation_do_not_wait(up):
    """srun a; srun b: each step takes every CPU of the job; the second is created as soon as the first's end
    is on the log, without srun's "busy" retry."""
    out = up.base / "back-to-back.out"
    jid = up.sbatch(f"#!/bin/sh\n#SBATCH -N 2 --ntasks-per-node=2 -o {out}\n"
                    "start=$(date +%s%N); for i in 1 2 3 4 5 6; do srun true; done\n"
                    "echo took $(( ($(date +%s%N) - start) / 1000000 ))\n")
    assert up.ended(jid) == "COMPLETED"
    text = out.read_text()
    assert "temporarily disabled" not in text, text
    assert int(text.split("took ")[1]) < 5000
    assert [r[0] for r in up.sacct(jid, "JobID")][2:] == [f"{jid}.{i}" for i in range(6)]


# ---------------------------------------------------------------- options scripts and harnesses rely on


def test_srun_and_sbatch_options_that_scripts_rely_on(up):
    r = up.run("srun", "-v", "-N1", "-n2", "true")
    assert r.returncode == 0 and "srun: ntasks              : 2\n" in r.stderr
    job = re.search(r"srun: jobid (\d+): nodes\(1\):`n[12]', cpu counts: 2\n", r.stderr)
    assert job is not None and re.search(rf"launching StepId={job.group(1)}\.0 on host n[12], 2 tasks: \[0-1\]", r.stderr)
    r = up.run("srun", "--immediate", "--hold", "true", timeout=30)
    assert r.returncode == 1 and r.stderr.endswith("srun: error: Unable to allocate resources: Requested nodes are busy\n")
    r = up.run("sbatch", "--wait", "--wrap", "exit 3", timeout=60)
    assert r.returncode == 3 and r.stdout.startswith("Submitted batch job ")
    r = up.run("srun", "-n5", "-N1", "-O", "sh", "-c", "echo $SLURM_PROCID", timeout=60)      # 5 tasks, 4 CPUs
    assert r.returncode == 0 and sorted(r.stdout.split()) == ["0", "1", "2", "3", "4"]
    r = subprocess.run(["srun", "-N1", "sh", "-c", "echo $SLURM_NTASKS; umask; test $SLURM_TASK_PID = $$ && echo pid"],
                       env={**up.env, "SLURM_NPROCS": "2", "SLURM_OVERCOMMIT": "1"}, capture_output=True, text=True,
                       timeout=60, preexec_fn=lambda: os.umask(0o027), cwd=up.base)
    assert r.returncode == 0 and r.stdout.split() == ["2", "0027", "pid"] * 2, r.stdout + r.stderr
    started = time.monotonic()
    r = up.run("srun", "-K", "-n2", "-N1", "sh", "-c", 'test "$SLURM_PROCID" = 1 && exit 4; sleep 30', timeout=60)
    assert time.monotonic() - started < 20 and "srun: Terminating StepId=" in r.stderr   # -K: one failed, all end
    assert re.search(r"srun: error: n[12]: task 1: Exited with exit code 4\n", r.stderr)
    assert r.returncode == 128 + 9         # the highest: task 0, killed (Slurm's rule: 128 + the signal)
    r = up.run("srun", "-n3", "-N1", "-W1", "sh", "-c", 'test "$SLURM_PROCID" = 1 && exit 0; sleep 30', timeout=60)
    assert "srun: First task exited 1s ago" in r.stderr and re.search(r"tasks 0,2: (running|Killed)", r.stderr)
    r = up.run("srun", "--output=none", "echo", "hidden")
    assert r.returncode == 0 and r.stdout == ""
    r = up.run("salloc", "--no-shell", "-N1", "-t", "5")
    held = re.search(r"Granted job allocation (\d+)", r.stderr)
    assert r.returncode == 0 and held is not None
    assert up.run("squeue", "-h", "-j", held.group(1), "-o", "%T").stdout == "RUNNING\n"
    up.run("scancel", held.group(1))


def test_multi_prog_runs_each_task_s_line_and_task_scripts_wrap_each_task(up):
    conf = up.base / "mpmd.conf"
    conf.write_text("# comment\n1-2   echo task:%t:offset:%o\n0,3   echo 'two words' \\\ntask:%t:offset:%o\n")
    r = up.run("srun", "-n4", "-N1", "-O", "-l", "--multi-prog", str(conf))
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == ["0: two words task:0:offset:0", "1: task:1:offset:0", "2: task:2:offset:1",
                                             "3: two words task:3:offset:1"]
    r = up.run("srun", "-n5", "-N1", "-O", "--multi-prog", str(conf))
    assert r.returncode == 1 and f"Configuration file {conf} invalid, no record for task id 4" in r.stderr
    prolog, epilog, marker = up.base / "prolog.sh", up.base / "epilog.sh", up.base / "epilog-ran"
    prolog.write_text("#!/bin/sh\necho 'export GREETING=hello there'\necho 'print from the prolog'\necho 'unset HOME'\n")
    epilog.write_text(f"#!/bin/sh\necho $SLURM_PROCID >> {marker}\n")
    for script in (prolog, epilog):
        script.chmod(0o755)
    r = up.run("srun", "-n2", "-N1", f"--task-prolog={prolog}", f"--task-epilog={epilog}", "sh", "-c",
               'echo "$GREETING/${HOME:-none}/${ROTA_TASK_SCRIPT:-gone}"; exit 5')
    assert r.returncode == 5
    assert sorted(r.stdout.splitlines()) == ["from the prolog"] * 2 + ["hello there/none/gone"] * 2
    wait_for(lambda: marker.exists() and sorted(marker.read_text().split()) == ["0", "1"], 10, "both epilogs")


def test_one_output_file_for_a_whole_step_gathers_every_node_s_tasks(up):
    """``-o FILE`` with no per-task pattern: srun writes it, so tasks on both nodes land in it (Slurm's srun);
    ``-i FILE`` goes to every task; ``%t`` still gives each task its own file."""
    source = up.base / "in.txt"
    source.write_text("".join(f"{i}\n" for i in range(500)))
    out = up.base / "all-%j.out"
    r = up.run("srun", "-N2", "-n4", f"--input={source}", f"--output={out}", "--error=/dev/null", "cat", "-")
    assert r.returncode == 0 and r.stdout == "", r.stderr
    [written] = list(up.base.glob("all-*.out"))
    assert written.read_text().count("\n") == 4 * 500
    r = up.run("srun", "-N2", "-n2", "-o", str(up.base / "each-%t.out"), "hostname")
    assert r.returncode == 0 and sorted(p.name for p in up.base.glob("each-*.out")) == ["each-0.out", "each-1.out"]
