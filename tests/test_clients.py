"""Tools people drive Slurm with, from the package index and unmodified, against a real ``rota up``: Snakemake
with its Slurm executor, JupyterHub's batchspawner (submit, poll, cancel, without a hub), Parsl's SlurmProvider;
and the command lines they send, byte for byte, for when a package is not installed."""
import asyncio
import re
import subprocess
import sys

import pytest

from helpers import wait_for
import test_srun
from test_srun import BIN

up = test_srun.up     # the fixture: rota up with two nodes, rota's commands first on PATH


def test_batchspawner_s_submit_poll_and_cancel_work_as_it_sends_them(up):
    """JupyterHub's SlurmSpawner pipes its script to ``sbatch --parsable``, keeps only the variables it names
    (``--export=A,B``), polls with ``squeue -h -j ID -o '%T %B'`` and reads the host off the end."""
    out = up.base / "spawner"
    out.mkdir(exist_ok=True)
    script = ("#!/bin/bash\n#SBATCH --output=" + str(out) + "/jupyterhub_slurmspawner_%j.log\n"
              "#SBATCH --job-name=spawner-jupyterhub\n#SBATCH --chdir=" + str(out) + "\n"
              "#SBATCH --export=PATH,LANG,JUPYTERHUB_API_TOKEN\n#SBATCH --get-user-env=L\n#SBATCH --time=5\n\n"
              "set -euo pipefail\necho token=$JUPYTERHUB_API_TOKEN secret=${NOT_EXPORTED:-unset}\nsleep 60\n")
    env = dict(up.env, JUPYTERHUB_API_TOKEN="t0k", NOT_EXPORTED="leak")
    r = subprocess.run(["sbatch", "--parsable"], input=script, env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    jid = r.stdout.strip()
    assert jid.isdigit()

    def poll() -> str:
        return up.run("squeue", "-h", "-j", jid, "-o", "%T %B").stdout.strip()

    status = wait_for(lambda: (s := poll()).startswith("RUNNING") and s, 30, "the spawner's job to run")
    host = re.search(r"\s+((?:[\w_-]+\.?)+)$", status)
    assert host is not None and host.group(1) in ("n1", "n2")
    log = out / f"jupyterhub_slurmspawner_{jid}.log"
    wait_for(lambda: log.exists() and "token=" in log.read_text(), 30, "the job's first line")
    assert log.read_text().splitlines()[0] == "token=t0k secret=unset"
    assert up.run("scancel", jid).returncode == 0
    wait_for(lambda: poll() == "", 30, "the job to leave the queue")


def test_snakemake_s_status_query_names_every_cluster_and_reads_each_job_s_state(up):
    """Snakemake's Slurm executor asks sacct for its run's jobs by name, over ``--clusters all``."""
    name = "c0ffee-run"
    jid = up.sbatch("#!/bin/sh\ntrue\n", "-J", name)
    up.ended(jid)
    r = up.run("sacct", "-X", "--parsable2", "--clusters", "all", "--noheader", "--format=JobIdRaw,State",
               "--starttime", "now-2days", "--endtime", "now", "--name", name)
    assert r.returncode == 0, r.stderr
    assert f"{jid}|COMPLETED" in r.stdout.splitlines()
    other = up.run("sacct", "-X", "-P", "-n", "-M", "elsewhere", "-o", "JobID", "-j", str(jid))
    assert other.returncode == 0 and other.stdout == ""
    heading = up.run("squeue", "-M", "all").stdout.splitlines()
    assert heading[0].startswith("CLUSTER: ") and heading[1].split()[0] == "JOBID"
    refused = up.run("squeue", "-M", "elsewhere")
    assert refused.returncode == 1 and "'elsewhere' can't be reached now" in refused.stderr


def test_snakemake_s_slurm_executor_runs_a_workflow_to_its_end(up, tmp_path):
    pytest.importorskip("snakemake_executor_plugin_slurm")
    (tmp_path / "Snakefile").write_text(
        'rule all:\n    input: "b.txt"\n\n'
        'rule a:\n    output: "a.txt"\n    shell: "hostname > {output}"\n\n'
        'rule b:\n    input: "a.txt"\n    output: "b.txt"\n    shell: "cat {input} > {output}; echo done >> {output}"\n')
    r = subprocess.run([str(BIN / "snakemake"), "--executor", "slurm", "--jobs", "2", "--latency-wait", "5",
                        "--slurm-init-seconds-before-status-checks", "1", "--seconds-between-status-checks", "1",
                        "--default-resources", "runtime=5", "mem_mb=1000"],
                       cwd=tmp_path, env=up.env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = (tmp_path / "b.txt").read_text().splitlines()
    assert lines[-1] == "done" and len(lines) == 2
    run_id = re.search(r"SLURM run ID: (\S+)", r.stdout + r.stderr)
    assert run_id is not None
    rows = up.run("sacct", "-X", "-n", "-P", "--name", run_id.group(1), "-o", "State").stdout.split()
    assert rows == ["COMPLETED", "COMPLETED"]


def test_batchspawner_submits_polls_and_cancels_without_a_hub(up, monkeypatch):
    batchspawner = pytest.importorskip("batchspawner")
    home = up.base / "spawner-home"
    home.mkdir(exist_ok=True)

    class User:
        name = escaped_name = "root"
        server = None
        url = "/user/root/"

    class Hub:
        public_host = host = ""
        url, api_url, base_url = "http://127.0.0.1:8081/hub/", "http://127.0.0.1:8081/hub/api", "/hub/"

    async def spawn() -> tuple[str, str, str]:
        sp = batchspawner.SlurmSpawner(user=User(), hub=Hub(), cmd=["sleep", "60"])
        sp.exec_prefix = ""                  # root submits for itself: no sudo
        sp.env_keep = [*sp.env_keep, "PATH", "ROTA_STATE_DIR"]
        sp.batchspawner_singleuser_cmd = "env"
        sp.req_homedir, sp.req_runtime = str(home), "00:05:00"
        job = await sp.submit_batch_script()
        for _ in range(120):
            await sp.query_job_status()
            if sp.state_isrunning():
                break
            await asyncio.sleep(0.25)
        host = sp.state_gethost()
        await sp.cancel_batch_job()
        return job, sp.job_status, host

    for key in ("PATH", "ROTA_STATE_DIR"):      # what the spawner keeps of the hub's environment
        monkeypatch.setenv(key, up.env[key])
    job, status, host = asyncio.run(spawn())
    assert job.isdigit() and status.startswith("RUNNING") and host in ("n1", "n2")
    assert up.ended(int(job)).startswith("CANCELLED")


def test_parsl_s_slurm_provider_submits_reads_states_and_cancels(up):
    pytest.importorskip("parsl.providers")
    script = f"""
import sys, time
from parsl.providers import SlurmProvider
from parsl.launchers import SingleNodeLauncher
p = SlurmProvider(partition="main", nodes_per_block=1, init_blocks=0, walltime="00:05:00",
                  launcher=SingleNodeLauncher(), cmd_timeout=30)
p.script_dir = {str(up.base)!r}
jid = p.submit("sleep 30", 1, job_name="parsl-test")
for _ in range(120):
    if p.status([jid])[0].state.name == "RUNNING":
        break
    time.sleep(0.25)
print("running", p.status([jid])[0].state.name)
print("cancel", p.cancel([jid]))
time.sleep(1)
print("after", p.status([jid])[0].state.name)
"""
    r = subprocess.run([sys.executable, "-c", script], env=up.env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == ["running RUNNING", "cancel [True]", "after CANCELLED"]
