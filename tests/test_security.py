"""Attacks on a shared machine, tried as a second local user against `rota up` run by root.

Each test is one attack from the trust issue: a forged identity, a file the job's user may not touch,
another user's job, a node change, the broker's wiring (who may publish, subscribe, read the log),
forged records on the log, private files. The second user (`nobody`) is real to the kernel.
"""
import asyncio
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from rota.cli import sbatch, scancel, scontrol
from rota.controller.eventlog import JetStreamLog
from rota.wire import keys, natsauth

from helpers import run_as, tls_files, wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a second local user needs root to become (CI runs as root)")

BIN = Path(sys.executable).parent
CONF = """GresTypes=gpu
NodeName=gpu[01-02] CPUs=8 RealMemory=16000 Gres=gpu:a100:4
PartitionName=short Nodes=gpu[01-02] Default=YES MaxTime=1:00:00
"""
NOBODY = pwd.getpwnam("nobody")


class Up:
    def __init__(self, base: Path, env: dict, proc: subprocess.Popen) -> None:
        self.base, self.env, self.proc = base, env, proc
        self.state = base / "state"
        self.home = base / "home"            # nobody's own directory

    def run(self, *cmd: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / cmd[0]), *cmd[1:]], env=self.env, capture_output=True, text=True,
                              timeout=60, **kw)

    def nobody(self, main, *argv: str, env: dict | None = None) -> tuple[int, str, str]:
        return run_as("nobody", main, list(argv), str(self.home), env={**self.env, **(env or {})})

    def keyring(self):
        return keys.load_keyring(str(self.state / "cluster.key"))

    def url(self) -> str:
        return json.loads((self.state / "cluster.json").read_text())["nats"]

    def wait(self, check, timeout: float = 20, what: str = "condition"):
        return wait_for(check, timeout, what)

    def job_state(self, jid: str) -> str:
        r = self.run("sacct", "-X", "-n", "-P", "-j", jid, "--format=State")
        return r.stdout.strip().split(" ")[0]

    def events(self) -> list:
        async def read():
            urls, options = [self.url()], natsauth.connect_options(self.keyring(), None)
            lg = await JetStreamLog.connect(urls, keyring=self.keyring(), **options)
            try:
                return [e async for e in lg.read(1)]
            finally:
                await lg.close()
        return asyncio.run(read())


@pytest.fixture
def up(tmp_path):
    base = Path(tempfile.mkdtemp(prefix="rota-sec-"))
    base.chmod(0o755)
    conf = base / "slurm.conf"
    conf.write_text(CONF)
    home = base / "home"
    home.mkdir()
    os.chown(home, NOBODY.pw_uid, NOBODY.pw_gid)
    env = dict(os.environ, ROTA_STATE_DIR=str(base / "state"))
    log = tmp_path / "up.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen([str(BIN / "rota"), "up", "--config", str(conf), "--fake-gpus", "a100:4",
                                 "--kill-wait", "1"], env=dict(env, ROTA_LOGLEVEL="INFO"), stdout=fh,
                                stderr=subprocess.STDOUT)
    u = Up(base, env, proc)
    try:
        u.wait(lambda: (base / "state" / "cluster.json").exists(), what="rota up")
        yield u
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        for f in (base / "state" / "agent").glob("*/jobs/*.json"):
            try:
                os.killpg(json.loads(f.read_text())["pid"], signal.SIGKILL)
            except (ProcessLookupError, ValueError, KeyError):
                pass
        shutil.rmtree(base, ignore_errors=True)


def test_a_second_user_runs_as_itself_whatever_it_claims(up):
    code, out, err = up.nobody(sbatch.main, "--parsable", "-o", str(up.home / "o-%j.txt"), "--wrap", "id -u",
                               env={"LOGNAME": "root", "USER": "root"})
    assert code == 0, err
    jid = out.strip()
    up.wait(lambda: (up.home / f"o-{jid}.txt").exists() and up.job_state(jid) == "COMPLETED", what="the job")
    assert (up.home / f"o-{jid}.txt").read_text() == f"{NOBODY.pw_uid}\n"
    r = up.run("squeue", "-h", "-t", "all", "-j", jid, "-o", "%u %U")
    row = up.run("sacct", "-X", "-n", "-P", "-j", jid, "--format=User").stdout.strip()
    assert row == "nobody", (row, r.stdout)
    submitted = [e for e in up.events() if e.event is not None and e.event.type == "job.submitted"]
    assert submitted[-1].event.spec.uid == NOBODY.pw_uid and submitted[-1].actor.startswith("nobody(65534)@")


def test_a_job_cannot_write_or_read_what_its_user_may_not(up):
    secret = up.base / "root-only"
    secret.mkdir(mode=0o700)
    (secret / "file").write_text("root's\n")
    code, out, _ = up.nobody(sbatch.main, "--parsable", "-o", str(secret / "file"), "--wrap", "echo pwned")
    writes = out.strip()

    def hand_made(argv):   # sbatch has no --input: the request a user could make by hand
        from rota.cli.client import request

        reply = request("submit", {"spec": {"script": "#!/bin/sh\ncat\n", "input": str(secret / "file"),
                                            "output": str(up.home / "stolen.txt"), "workdir": str(up.home)}})
        print(reply.get("job_id", reply))
        return 0

    code, out, err = up.nobody(hand_made)
    reads = out.strip()
    assert code == 0 and reads.isdigit(), (out, err)
    up.wait(lambda: up.job_state(writes) == "FAILED" and up.job_state(reads) == "FAILED", what="both to fail")
    assert (secret / "file").read_text() == "root's\n" and (secret / "file").stat().st_uid == 0
    assert not any(f.stat().st_uid == NOBODY.pw_uid for f in secret.iterdir())
    assert (up.home / "stolen.txt").read_text() == ""          # made (empty) before the input was refused
    exited = {e.event.job_id: e.event.reason for e in up.events() if e.event is not None and e.event.type == "job.exited"}
    assert exited[int(writes)] == f"cannot open the output file {secret / 'file'}"
    assert exited[int(reads)] == f"cannot read the input file {secret / 'file'}"


def test_another_users_jobs_and_the_nodes_are_out_of_reach(up):
    r = up.run("sbatch", "--parsable", "-o", "/dev/null", "--wrap", "sleep 60")
    running = r.stdout.strip()
    held = up.run("sbatch", "--parsable", "-H", "-o", "/dev/null", "--wrap", "true").stdout.strip()
    up.wait(lambda: up.run("squeue", "-h", "-j", running, "-o", "%T").stdout.strip() == "RUNNING", what="running")
    attempts = [
        (scancel.run, ["-u", "root"]), (scancel.run, [running]), (scancel.run, ["--signal=KILL", running]),
        (scontrol.run, ["requeue", running]), (scontrol.run, ["update", f"JobId={running}", "TimeLimit=1"]),
        (scontrol.run, ["update", f"JobId={held}", "Priority=100000"]), (scontrol.run, ["release", held]),
        (scontrol.run, ["hold", running]), (scontrol.run, ["update", "NodeName=gpu01", "State=DRAIN", "Reason=mine"]),
        (scontrol.run, ["update", "NodeName=gpu02", "State=DOWN", "Reason=mine"]),
    ]
    for main, argv in attempts:
        code, out, err = up.nobody(main, *argv)
        assert code == 1 and ("Access/permission denied" in err or "Invalid user id" in err), (argv, code, err)
    view = up.run("squeue", "-h", "-o", "%i %T %l %r").stdout
    assert f"{running} RUNNING 1:00:00 None" in view and f"{held} PENDING NOT_SET JobHeldUser" in view, view
    assert "idle" in up.run("sinfo", "-h", "-o", "%t").stdout or "mix" in up.run("sinfo", "-h", "-o", "%t").stdout
    denied = [(e.event.verb, e.event.uid) for e in up.events() if e.event is not None and e.event.type == "request.denied"]
    # one refusal per attempt, and one more: `scancel -u root` tried both of root's jobs
    assert len(denied) == len(attempts) + 1 and {uid for _, uid in denied} == {NOBODY.pw_uid}
    assert up.run("scancel", running).returncode == 0      # its owner may


async def _connect(url, **options):
    import nats

    errors = []

    async def on_error(exc):
        errors.append(str(exc))

    nc = await nats.connect(url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=3,
                            error_cb=on_error, **options)
    return nc, errors


def test_the_broker_lets_no_one_in_without_a_role_and_each_role_only_where_it_belongs(up):
    import nats
    from nats.errors import NoServersError

    url = up.url()
    ring = up.keyring()

    async def attacks():
        with pytest.raises((NoServersError, OSError, nats.errors.Error)):
            await _connect(url)                                  # no credentials: refused at the door
        host = ring.key_of("gpu02")
        assert host is not None
        nc, errors = await _connect(url, **natsauth.connect_options(ring, "gpu02"))
        try:
            got = []

            async def keep(msg):
                got.append(msg)

            await nc.subscribe("rota.api.>", queue="rota-controller", cb=keep)   # join the controller's group
            await nc.subscribe("rota.ev.>", cb=keep)                                # read the event stream
            await nc.subscribe("rota.orders.gpu01", cb=keep)                        # another node's orders
            await nc.publish("rota.ev.job.submitted", b'{"type":"job.submitted","job_id":99,"spec":{"uid":0}}')
            await nc.publish("rota.inbox.gpu01", b"{}")                             # another node's inbox
            await nc.publish("$JS.API.STREAM.DELETE.ROTA_EVENTS", b"")              # delete the log
            # a consumer of another node's orders: under its own name, under that node's, with no filter
            await nc.publish("$JS.API.CONSUMER.CREATE.ROTA_ORDERS.agent-gpu02.rota.orders.gpu01", b"{}")
            await nc.publish("$JS.API.CONSUMER.CREATE.ROTA_ORDERS.agent-gpu01.rota.orders.gpu01", b"{}")
            await nc.publish("$JS.API.CONSUMER.CREATE.ROTA_ORDERS.agent-gpu02", b"{}")
            await nc.flush()
            await asyncio.sleep(1.0)
            assert sum("permissions violation" in e.lower() for e in errors) == 9, errors
            assert got == []
            # its own consumer's subject, asking for another node's orders: JetStream refuses the mismatch
            for config, code in (({"filter_subject": "rota.orders.gpu01"}, 10131),
                                 ({"filter_subjects": ["rota.orders.gpu01"]}, 10137)):
                ask = {"stream_name": "ROTA_ORDERS", "config": {"name": "agent-gpu02", "ack_policy": "explicit",
                                                                "deliver_policy": "all", **config}}
                reply = await nc.request("$JS.API.CONSUMER.CREATE.ROTA_ORDERS.agent-gpu02.rota.orders.gpu02",
                                         json.dumps(ask).encode(), timeout=5)
                assert json.loads(reply.data).get("error", {}).get("err_code") == code, reply.data
            # what it may do: ask (and without a user's credential, be refused)
            reply = await nc.request("rota.api.ping", b"{}", timeout=5, headers={"Rota-Rid": "x1"})
            assert json.loads(reply.data)["error"] == ["Protocol authentication error: Invalid credential format"]
        finally:
            await nc.close()

    asyncio.run(attacks())
    events = up.events()
    assert all(e.event is not None for e in events) and not any(
        e.event.type == "job.submitted" and e.event.job_id == 99 for e in events)


def test_private_files_and_folders(up):
    jid = up.run("sbatch", "--parsable", "-o", "/dev/null", "--wrap", "sleep 30").stdout.strip()
    state = up.state
    ledger = up.wait(lambda: list((state / "agent").glob(f"*/jobs/{jid}.json")), what="the ledger")[0]
    modes = {p: p.stat().st_mode & 0o777 for p in (state / "cluster.key", state / "nats", ledger.parent, ledger,
                                                   state / "projections.sqlite", state / "run" / "rota.sock",
                                                   state / "nats" / "nats-server.conf")}
    assert modes == {state / "cluster.key": 0o600, state / "nats": 0o700, ledger.parent: 0o700, ledger: 0o600,
                     state / "projections.sqlite": 0o600, state / "run" / "rota.sock": 0o666,
                     state / "nats" / "nats-server.conf": 0o600}
    job_dirs = list((state / "agent").glob(f"*/spool/job{int(jid):07d}.0"))
    assert job_dirs and job_dirs[0].stat().st_mode & 0o777 == 0o700
    up.run("scancel", jid)


def test_bad_values_get_one_clear_line(up):
    cases = [(["--mem=-5", "--wrap", "true"], "Invalid --mem specification"),
             (["-c", "0", "--wrap", "true"], "Invalid numeric value \"0\" for --cpus-per-task."),
             (["--time=9999999999999999999", "--wrap", "true"], "Invalid --time specification"),
             (["-J", "a\x1b[2Jb", "--wrap", "true"], "Invalid --job-name value")]
    for argv, words in cases:
        code, _, err = up.nobody(sbatch.main, *argv)
        assert code != 0 and words in err and "Traceback" not in err, (argv, err)
    big = up.home / "big.sh"
    big.write_text("#!/bin/sh\n" + "#" * (8 << 20) + "\n")
    code, _, err = up.nobody(sbatch.main, str(big))
    assert code == 1 and "Batch script is too large" in err
    bad = up.home / "bad.sh"
    bad.write_bytes(b"#!/bin/sh\n#SBATCH -J 'unbalanced\necho \xff\n")
    code, _, err = up.nobody(sbatch.main, str(bad))
    assert code != 0 and "Traceback" not in err and err.count("\n") == 1, err


def test_replies_match_requests_after_the_controller_was_stopped(up):
    """The SIGSTOP drill: submits wait while the controller is stopped; their signer (another process,
    as on a login host) times out and retries with the same request ids, so first tries and retries
    reach the controller together. Every sbatch must print its own job's id."""
    sock = up.base / "authd.sock"
    authd = subprocess.Popen([str(BIN / "rota"), "authd", "--host", "gpu02", "--socket", str(sock)], env=up.env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        up.wait(lambda: sock.exists(), what="rota authd")
        env = {**up.env, "ROTA_SOCKET": str(sock)}
        names = [f"drill{i}" for i in range(12)]
        procs = []
        up.proc.send_signal(signal.SIGSTOP)
        try:
            for name in names:
                procs.append(subprocess.Popen([str(BIN / "sbatch"), "--parsable", "-H", "-J", name, "--wrap", "true"],
                                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
            time.sleep(12)                   # longer than the signer's request timeout: retries happen
        finally:
            up.proc.send_signal(signal.SIGCONT)
        printed = {}
        for name, p in zip(names, procs):
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
            printed[name] = out.strip()
    finally:
        authd.terminate()
        authd.wait(10)
    rows = dict(line.split() for line in up.run("squeue", "-h", "-o", "%j %i").stdout.splitlines())
    assert rows == printed
    assert len(set(printed.values())) == len(names)


def test_tls_between_hosts(tmp_path):
    """The embedded server speaks TLS with a certificate from a private CA; rota's own clients check it."""
    made = tls_files(tmp_path)
    if made is None:
        pytest.skip("openssl is not installed")
    ca, cert, key = made
    conf = tmp_path / "slurm.conf"
    conf.write_text(CONF + f"RotaTLSCertFile={cert}\nRotaTLSKeyFile={key}\nRotaTLSCAFile={ca}\n")
    env = dict(os.environ, ROTA_STATE_DIR=str(tmp_path / "state"))
    with open(tmp_path / "up.log", "w") as fh:
        proc = subprocess.Popen([str(BIN / "rota"), "up", "--config", str(conf), "--fake-gpus", "a100:4"], env=env,
                                stdout=fh, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "state" / "cluster.json").exists():
            assert time.monotonic() < deadline and proc.poll() is None, (tmp_path / "up.log").read_text()
            time.sleep(0.1)
        url = json.loads((tmp_path / "state" / "cluster.json").read_text())["nats"]
        assert url.startswith("tls://")
        r = subprocess.run([str(BIN / "sbatch"), "--parsable", "-H", "--wrap", "true"], env=env, capture_output=True,
                           text=True, timeout=30)
        assert r.returncode == 0 and r.stdout.strip().isdigit(), r.stderr + (tmp_path / "up.log").read_text()

        async def plain():
            import nats

            from nats.errors import NoServersError

            refused = (NoServersError, OSError, nats.errors.Error)
            with pytest.raises(refused):
                await _connect(url.replace("tls://", "nats://"), **natsauth.connect_options(
                    keys.load_keyring(str(tmp_path / "state" / "cluster.key")), None))
            with pytest.raises(refused):   # TLS, but a certificate nobody vouched for
                await _connect(url, **natsauth.connect_options(None, None, None))

        asyncio.run(plain())
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_a_user_who_cannot_read_the_log_gets_time_travel_from_the_controller(up):
    from rota.cli.main import app

    def rota(argv):
        return app(argv, standalone_mode=False) or 0

    first = up.run("sbatch", "--parsable", "-o", "/dev/null", "--gres=gpu:4", "--wrap", "sleep 3").stdout.strip()
    up.wait(lambda: up.job_state(first) == "RUNNING", what="the first job")
    code, out, err = up.nobody(sbatch.main, "--parsable", "-o", "/dev/null", "--gres=gpu:4", "--wrap", "true")
    mine = out.strip()
    # a job that starts while mine waits: its cycle is on the log, and saw mine waiting
    up.run("sbatch", "-o", "/dev/null", "--wrap", "true")
    up.wait(lambda: up.job_state(mine) == "COMPLETED", what="the job")
    code, out, err = up.nobody(rota, "why", mine)
    assert code == 0 and f"job {first}" in out and "[Resources]" in out, (code, out, err)
    code, out, err = up.nobody(rota, "why", mine, "--log", "/etc/shadow")   # a file is read as the user, here
    assert code != 0 and "root:" not in out + err
    code, out, err = up.nobody(rota, "verify")
    assert code == 0 and out.startswith("OK: all"), (out, err)
    code, out, err = up.nobody(rota, "export", "--parquet", str(up.home / "pq"))
    assert code != 0 and "only the cluster's administrator" in out + err
