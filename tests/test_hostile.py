"""Hostile neighbours: a second local user (``nobody``, real to the kernel) against root's `rota up`.

Each test is an attack: a ``rota`` package planted where root's command runs, or on its PYTHONPATH; a flood
of silent connections to the signer and to the command server; a flood of submits. The attack fails when
the planted code never runs, and root's own commands keep being served (through the thin path: the client
used here cannot fall back to Python, so a command that was not served fails).
"""
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from helpers import run_as, stop, wait_for
from rota.bench.hostile_bench import become as _become_nobody, flood

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a second local user needs root to become (CI runs as root)")

BIN = Path(sys.executable).parent
NOBODY = pwd.getpwnam("nobody")
CONF = """MaxJobCount=600
NodeName=n1 CPUs=4 RealMemory=8000
PartitionName=p Nodes=n1 Default=YES MaxTime=1:00:00
"""
PLANTED = """import os
with open(os.path.join({marks!r}, "ran-%d-%d" % (os.getuid(), os.getpid())), "w") as fh:
    fh.write(__file__)
"""


def _plant(where: Path, marks: Path) -> None:
    """A `rota` package whose every module leaves a mark when imported."""
    for sub in ("rota", "rota/cli", "rota/agents", "rota/wire", "rota/core"):
        (where / sub).mkdir(parents=True)
        (where / sub / "__init__.py").write_text(PLANTED.format(marks=str(marks)))
    for name in ("squeue", "sbatch", "main", "commandserver", "sinfo"):
        (where / "rota" / "cli" / f"{name}.py").write_text(PLANTED.format(marks=str(marks)))


class Site:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.state = base / "state"
        self.plant = base / "plant"          # a folder anyone may write to, with a `rota` package in it
        self.marks = base / "marks"
        self.env = dict(os.environ, ROTA_STATE_DIR=str(self.state), PYTHONPATH=str(self.plant))
        self.native = base / "native"        # the thin client as installed (falls back to this Python)
        self.served = base / "served"        # a thin client that cannot fall back: what it does, a server did

    def marked(self) -> list[str]:
        return sorted(p.read_text() for p in self.marks.iterdir())

    def run(self, client: Path, *cmd: str, env: dict | None = None, cwd: Path | None = None,
            as_nobody: bool = False) -> subprocess.CompletedProcess:
        return subprocess.run([str(client / cmd[0]), *cmd[1:]], env={**self.env, **(env or {})},
                              cwd=str(cwd or self.plant), capture_output=True, text=True, timeout=120,
                              preexec_fn=_become_nobody if as_nobody else None)


def _build(d: Path, python: str) -> None:
    from rota.programs.native_build import NoCompiler, compile_client

    d.mkdir(mode=0o755)
    try:
        compile_client(d / "rota-command", python)
    except NoCompiler:
        pytest.skip("no C compiler: the native client is not built here")
    for name in ("squeue", "sbatch", "sinfo", "scontrol", "scancel"):
        (d / name).symlink_to("rota-command")


@pytest.fixture(scope="module")
def site():
    base = Path(tempfile.mkdtemp(prefix="rota-hostile-"))
    base.chmod(0o755)
    s = Site(base)
    s.marks.mkdir(mode=0o777)
    s.marks.chmod(0o1777)
    _plant(s.plant, s.marks)
    for p in [s.plant, *s.plant.rglob("*")]:
        p.chmod(0o777 if p.is_dir() else 0o666)
    _build(s.native, sys.executable)
    _build(s.served, "/nonexistent/python")
    (base / "slurm.conf").write_text(CONF)
    log = open(base / "up.log", "w")
    # root starts rota up in the planted folder, with it on PYTHONPATH
    proc = subprocess.Popen([str(BIN / "rota"), "up", "--config", str(base / "slurm.conf"), "--kill-wait", "1"],
                            env=s.env, cwd=str(s.plant), stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: (s.state / "run" / "commands.sock").exists() and (s.state / "cluster.json").exists(),
                 what="rota up")
        wait_for(lambda: s.run(s.served, "sinfo", "-h").returncode == 0, what="the command server")
        yield s
    finally:
        stop(proc)
        log.close()
        shutil.rmtree(base, ignore_errors=True)


def test_a_planted_rota_package_never_runs_for_root_or_a_user(site):
    no_server = {"ROTA_STATE_DIR": str(site.base / "nowhere")}
    for extra in ({}, {"ROTA_THIN": "0"}, no_server):          # thin, fallback on request, no server at all
        r = site.run(site.native, "squeue", "-h", env=extra)
        assert "Traceback" not in r.stderr, r
        assert (r.returncode == 0) == (extra is not no_server), r
    # the launchers `rota install-commands` writes where it cannot compile the client
    from rota.programs.native_build import isolate_scripts

    scripts = site.base / "scripts"
    scripts.mkdir()
    isolate_scripts(scripts, ("squeue", "rota"))
    for extra in ({}, {"ROTA_THIN": "0"}, no_server):
        r = site.run(scripts, "squeue", "-h", env=extra)
        assert "Traceback" not in r.stderr and (r.returncode == 0) == (extra is not no_server), r
    assert site.run(scripts, "rota", "--help").returncode == 0
    # a user's own command: the client falls back to a Python the user may run (this one may not be), and
    # that Python finds no rota at all, not the planted one
    if os.access("/usr/bin/python3", os.X_OK):
        user = site.base / "user-native"
        _build(user, "/usr/bin/python3")
        r = site.run(user, "squeue", "-h", env={"ROTA_THIN": "0"}, as_nobody=True)
        assert "No module named 'rota'" in r.stderr, r
    # through the thin path as that user: the command server (started by root's rota up in that folder) runs it
    r = site.run(site.served, "squeue", "-h", as_nobody=True)
    assert r.returncode == 0, r
    # time travel for a user who cannot read the log: a child of the controller
    code, out, err = run_as("nobody", _why, [], str(site.plant), env=site.env)
    assert code == 0 and out.startswith("OK: all"), (code, out, err)
    assert site.marked() == [], site.marked()


def _why(argv: list[str]) -> int:
    from rota.cli.main import app

    return app(["verify", *argv], standalone_mode=False) or 0


def _timed(site: Site, *cmd: str) -> tuple[float, subprocess.CompletedProcess]:
    t = time.perf_counter()
    r = site.run(site.served, *cmd, cwd=site.base)
    return time.perf_counter() - t, r


@pytest.mark.parametrize("target", ["commands.sock", "rota.sock", "both"])
def test_a_connection_flood_by_one_user_leaves_everyone_else_served(site, target):
    socks = ["commands.sock", "rota.sock"] if target == "both" else [target]
    flooders = [flood(site.state / "run" / name, 60.0, 800) for name in socks for _ in range(2)]
    try:
        time.sleep(1.0)                                   # the flood is under way
        times = []
        for _ in range(8):
            took, r = _timed(site, "sbatch", "-H", "--parsable", "--wrap", "true")
            assert r.returncode == 0 and r.stdout.strip().isdigit(), r
            times.append(took)
            took, r = _timed(site, "squeue", "-h", "-j", r.stdout.strip(), "-o", "%i %T")
            assert r.returncode == 0 and r.stdout.split()[1] == "PENDING", r
            times.append(took)
        # beyond its share the flooding user is told why, in one line
        if target != "commands.sock":
            answer = _nobody_call(site.state / "run" / "rota.sock")
            assert answer.startswith("refused: uid") and "requests in flight" in answer, answer
    finally:
        for pid in flooders:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    times.sort()
    print(f"{target}: median {times[len(times) // 2]:.3f} s, slowest {times[-1]:.3f} s")
    assert times[-1] < 5.0, times      # the client's own wait: a command past it would have failed


def _nobody_call(path: Path) -> str:
    """What a request of nobody's own gets through the signer while its flood holds its share."""
    from rota.wire import localsock

    def ask(_argv: list[str]) -> int:
        for _ in range(50):
            try:
                localsock.call(str(path), "queue", "probe-1", b"{}", 5.0)
            except localsock.SignerError as exc:
                if "requests in flight" in str(exc):
                    print(f"refused: {exc}")
                    return 0
            except localsock.SignerUnavailable as exc:
                print(f"unavailable: {exc}")
                return 0
            time.sleep(0.1)
        print("served every time")
        return 0
    _code, out, err = run_as("nobody", ask, [], "/", env=None)
    return out.strip() or err.strip()


def test_a_submit_flood_by_one_user_is_refused_past_its_share_and_others_still_submit(site):
    # MaxJobCount=600: one user holds at most 300 (rota's default share), job by job in a bulk submit
    code, out, err = run_as("nobody", _submit_many, ["400"], str(site.base), env=site.env)
    assert code == 0, err
    accepted, refused, why = out.split("|")
    assert (int(accepted), int(refused)) == (300, 100), out
    assert "Job violates accounting/QOS policy" in why, why
    code, out, err = run_as("nobody", _submit_many, ["50"], str(site.base), env=site.env)   # refused at once, whole
    assert code == 0 and out.split("|")[:2] == ["0", "50"], (out, err)
    # (through the command server's worker, which imports nothing more once it serves: every option must be warm)
    r = site.run(site.served, "sbatch", "-H", "--mail-type=END", "--nice=5", "--wrap", "true", cwd=site.base,
                 as_nobody=True)
    assert r.returncode == 1 and "MaxSubmitJobsPerUser: you have 300 jobs pending or running, at most 300" \
        in r.stderr and "Job violates accounting/QOS policy" in r.stderr, r
    r = site.run(site.served, "sbatch", "-H", "--parsable", "--wrap", "true", cwd=site.base)
    assert r.returncode == 0, r
    mine = site.run(site.served, "squeue", "-h", "-u", "nobody", "-o", "%i", cwd=site.base)
    assert len(mine.stdout.split()) == 300, mine
    site.run(site.served, "scancel", "-u", "nobody", cwd=site.base)


def _submit_many(argv: list[str]) -> int:
    from rota.client.api import Client, JobError

    client = Client()
    accepted = refused = 0
    why = ""
    try:
        accepted = len(client.submit_many(["true"] * int(argv[0]), options=["-H", "-o", "/dev/null"]))
    except JobError as exc:
        import re

        why = str(exc)
        accepted = int(re.search(r"\((\d+) submitted", why).group(1))
        refused = int(argv[0]) - accepted
    print(f"{accepted}|{refused}|{why}")
    return 0


def test_srun_meets_its_nodes_whatever_else_connects_first():
    """Silent connections and connections with the wrong proof, made before the node's, are dropped and
    delay nothing; the node's agent (speaking as the agent does) is met at once."""
    from rota.cli import srun
    from rota.wire import stepio

    step = srun.Step(1, {}, sys.stdout, sys.stderr, {})
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    "127.0.0.1".encode("idna")              # the codec loaded here: the child cannot read Python's files
    squatter = os.fork()
    if squatter == 0:                        # another local user's silent connections, made first
        try:
            _become_nobody()
            held = [socket.create_connection(("127.0.0.1", port)) for _ in range(40)]
            time.sleep(10)
            del held
        finally:
            os._exit(0)
    wait_for(lambda: sum(1 for line in open("/proc/net/tcp").readlines()[1:]
                         if line.split()[2].endswith(f":{port:04X}") and line.split()[3] == "01") >= 40,
             what="the squatter's connections")
    liar = socket.create_connection(("127.0.0.1", port))
    liar.sendall(b'{"node": "n1", "proof": "00"}\n')

    def agent() -> None:
        time.sleep(0.3)
        s = socket.create_connection(("127.0.0.1", port))
        f = s.makefile("rb")
        nonce = stepio.greeted(f.readline(), step.key)
        assert nonce is not None
        s.sendall(b'{"node": "n1", "tasks": [0], "proof": "%s"}\n' % stepio.proof(step.key, nonce, "n1").encode())
        assert f.readline() == b"ok\n"
        s.close()

    import threading

    t = threading.Thread(target=agent)
    t.start()
    began = time.monotonic()
    step._meet(listener, 1)
    took = time.monotonic() - began
    t.join()
    assert took < 3.0, took                   # before: one connection at a time, 10 s each
    liar.settimeout(5)
    heard = b""
    while chunk := liar.recv(4096):
        heard += chunk
    assert heard.startswith(b"rota-srun1 ") and heard.count(b"\n") == 1, heard   # greeted, then dropped
    liar.close()
    os.kill(squatter, signal.SIGKILL)
    os.waitpid(squatter, 0)


def test_a_user_cannot_aim_the_agents_at_a_port_that_is_not_their_own(site):
    """step_create names where the nodes' agents connect (as root): the signer takes only a port the caller
    itself listens on, at this host."""
    theirs = socket.create_server(("127.0.0.1", 0))         # root's: another user's srun, or a service
    port = theirs.getsockname()[1]

    def ask(_argv: list[str]) -> int:
        from rota.cli.client import request
        from rota.wire import localsock

        try:
            print(request("step_create", {"job_id": 1, "argv": ["true"], "io": f"127.0.0.1:{port}", "io_key": "ab" * 16}))
        except (localsock.SignerError, SystemExit) as exc:
            print(f"refused: {exc}")
        return 0
    def wildcard(_argv: list[str]) -> int:
        """Their own listener on every interface, named by a host name or by another host's address."""
        from rota.cli.client import request

        mine = socket.create_server(("0.0.0.0", 0))
        for host in ("localhost", "10.99.99.99"):
            try:
                request("step_create", {"job_id": 1, "argv": ["true"], "io": f"{host}:{mine.getsockname()[1]}",
                                        "io_key": "ab" * 16})
            except Exception as exc:  # noqa: BLE001 - the command's error, whichever class carries it
                print(f"refused: {exc}")
        return 0
    "localhost".encode("idna")
    try:
        _code, out, err = run_as("nobody", ask, [], "/", env=site.env)
        _code, out2, err2 = run_as("nobody", wildcard, [], "/", env=site.env)
    finally:
        theirs.close()
    assert f"127.0.0.1:{port} is not a port uid {NOBODY.pw_uid} listens on at this host" in out + err, (out, err)
    assert (out2 + err2).count("is not an IPv4 address of this host") == 2, (out2, err2)
