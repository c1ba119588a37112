"""The thin commands: the native client and the Python one hand the command to the warm command server,
which runs it as the caller (uid, groups, working directory, environment, umask, terminal or pipes); the
result is what the command run in its own process gives."""
import os
import re
import pwd
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
COMMANDS = ("sbatch", "squeue", "sacct", "sinfo", "scancel", "scontrol", "srun")


def build(python: str) -> Path:
    """The native client compiled into a directory every user can read, linked under each command's name."""
    from rota.programs.native_build import NoCompiler, compile_client, install

    d = Path(tempfile.mkdtemp(prefix="rota-native-"))
    d.chmod(0o755)
    try:
        if python == sys.executable:
            install(d, COMMANDS)
        else:
            compile_client(d / "rota-command", python)
            for c in COMMANDS:
                (d / c).symlink_to("rota-command")
    except NoCompiler:
        shutil.rmtree(d)
        pytest.skip("no C compiler: the commands use the Python thin client (tested below)")
    return d


@pytest.fixture
def native():
    d = build(sys.executable)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def native_only():
    """A native client that cannot fall back to Python: whatever it does, the command server did."""
    d = build("/nonexistent/python")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def python_thin(cmd: str, *args: str) -> list[str]:
    return [sys.executable, "-c", f"from rota.cli.thin import {cmd}; {cmd}()", *args]


def three_ways(env, native_dir: Path, cmd: str, *args: str, cwd: str = "/tmp") -> list[tuple[int, str, str]]:
    """The command through the native client, the Python thin client, and run in its own process."""
    out = []
    for argv, extra in (([str(native_dir / cmd), *args], {}), (python_thin(cmd, *args), {}),
                        (python_thin(cmd, *args), {"ROTA_THIN": "0"})):
        r = subprocess.run(argv, env={**env, **extra}, capture_output=True, text=True, timeout=60, cwd=cwd)
        out.append((r.returncode, re.sub(r"LastSchedEval=\S+", "", r.stdout), r.stderr))   # moves with each cycle
    return out


def test_the_thin_paths_give_what_the_command_gives_in_its_own_process(up, native):
    for i in range(3):
        r = subprocess.run([str(native / "sbatch"), "-H", "-J", f"t{i}", "--wrap", "true"], env=up, cwd="/tmp",
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and r.stdout.startswith("Submitted batch job "), r
    for args in (("squeue", "-h", "-o", "%i %j %u %T %R"), ("scontrol", "show", "job", "2"), ("sinfo",),
                 ("sacct", "-X", "-n", "-P", "-o", "JobID,JobName,State"), ("sbatch", "--bogus"),
                 ("scontrol", "show", "job", "999"), ("squeue", "--format")):
        ways = three_ways(up, native, *args)
        assert ways[0] == ways[1] == ways[2], (args, ways)
    assert three_ways(up, native, "squeue", "-h", "-o", "%i")[0][1].split() == ["1", "2", "3"]


def test_a_script_on_stdin_and_the_working_directory_reach_the_command(up, native_only, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    r = subprocess.run([str(native_only / "sbatch"), "-H", "--parsable"], input="#!/bin/sh\necho from-stdin\n",
                       env=up, capture_output=True, text=True, timeout=60, cwd=work)
    assert r.returncode == 0 and r.stdout.strip().isdigit(), r
    shown = subprocess.run([str(native_only / "scontrol"), "show", "job", r.stdout.strip()], env=up,
                           capture_output=True, text=True, timeout=60).stdout
    assert f"WorkDir={work}" in shown and f"StdOut={work}/slurm-{r.stdout.strip()}.out" in shown, shown


def test_the_command_runs_as_its_caller_and_cannot_read_what_the_caller_cannot(up, native_only):
    nobody = pwd.getpwnam("nobody")
    home = Path(tempfile.mkdtemp(prefix="rota-nobody-"))
    os.chown(home, nobody.pw_uid, nobody.pw_gid)
    secret = Path(tempfile.mkdtemp(prefix="rota-secret-")) / "script.sh"
    secret.write_text("#!/bin/sh\necho root only\n")
    secret.chmod(0o600)

    def as_nobody():
        os.setgroups([])
        os.setresgid(nobody.pw_gid, nobody.pw_gid, nobody.pw_gid)
        os.setresuid(nobody.pw_uid, nobody.pw_uid, nobody.pw_uid)
        os.umask(0o077)

    try:
        env = {**up, "HOME": str(home), "ROTA_MARK": "given-by-the-caller"}
        r = subprocess.run([str(native_only / "sbatch"), "-H", "--parsable", "--wrap", "true"], env=env, cwd=home,
                           capture_output=True, text=True, timeout=60, preexec_fn=as_nobody)
        assert r.returncode == 0, r
        shown = subprocess.run([str(native_only / "scontrol"), "show", "job", r.stdout.strip()], env=up,
                               capture_output=True, text=True, timeout=60).stdout
        assert f"UserId=nobody({nobody.pw_uid})" in shown and f"WorkDir={home}" in shown, shown
        refused = subprocess.run([str(native_only / "sbatch"), "-H", str(secret)], env=env, cwd=home,
                                 capture_output=True, text=True, timeout=60, preexec_fn=as_nobody)
        assert refused.returncode == 1 and f"Unable to open file {secret}" in refused.stderr, refused
        mine = subprocess.run([str(native_only / "squeue"), "-h", "-u", "nobody", "-o", "%i"], env=env, cwd=home,
                              capture_output=True, text=True, timeout=60, preexec_fn=as_nobody)
        assert mine.stdout.split() == [r.stdout.strip()], mine
    finally:
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(secret.parent, ignore_errors=True)


def test_signals_reach_the_command_and_its_status_comes_back(up, native_only):
    p = subprocess.Popen([str(native_only / "srun"), "sleep", "60"], env=up, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            q = subprocess.run([str(native_only / "squeue"), "-h", "-t", "R", "-o", "%i"], env=up,
                               capture_output=True, text=True, timeout=60)
            if q.stdout.strip():
                break
            time.sleep(0.2)
        else:
            pytest.fail("the srun job never ran")
        time.sleep(1)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
        assert p.returncode != 0, (out, err)
        assert "command server stopped" not in err, err
    finally:
        if p.poll() is None:
            p.kill()


def test_without_a_command_server_the_native_client_runs_the_command_itself(tmp_path, native):
    env = dict(os.environ, ROTA_STATE_DIR=str(tmp_path / "none"))
    r = subprocess.run([str(native / "sinfo")], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "no rota runs on this host" in r.stderr, r


def test_an_answer_larger_than_nats_carries_plain_comes_whole(up, native):
    """squeue's rows for a long queue outgrow what one NATS message carries (8 MiB: 4,700 rows of 1,800
    columns here): the answer travels compressed and the command prints every row, through each path."""
    from rota.client import Client
    from rota.wire.subjects import PACK_OVER

    ids = Client(socket=os.path.join(up["ROTA_STATE_DIR"], "run", "rota.sock")).submit_many(
        ["true"] * 4700, options=["--hold", "-o", "/dev/null"])
    assert len(ids) == 4700
    for rc, out, err in three_ways(up, native, "squeue", "-h", "-o", "%.1800j|%i"):
        assert rc == 0, err
        rows = out.splitlines()
        assert len(rows) == 4700 and len(out) > 8 * PACK_OVER and rows[0].endswith(f"wrap|{ids[0]}"), (len(rows), err)


def _worker_of(env, *command: str, become=None) -> tuple[int, int]:
    """(the pid of the process that ran ``command``, its exit status), through the command server by its
    protocol; ``become``: called first, in a child of this process that then speaks for its new self."""
    import socket
    import struct

    path = os.path.join(env["ROTA_STATE_DIR"], "run", "commands.sock")
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            if become is not None:
                become()
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(path)
            _request(sock, command[0], command[1:], env)
            answer = sock.recv(5)
            sock.sendall(b"G")
            end = sock.recv(5)
            os.write(w, answer[1:] + end[1:])
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        data = fh.read()
    os.waitpid(child, 0)
    assert len(data) == 8, data
    return struct.unpack("!I", data[:4])[0], struct.unpack("!i", data[4:])[0]


def test_a_worker_takes_its_users_next_commands_and_nothing_of_one_reaches_the_next(up, native_only, tmp_path):
    nobody = pwd.getpwnam("nobody")

    def as_nobody():
        os.setgroups([])
        os.setresgid(nobody.pw_gid, nobody.pw_gid, nobody.pw_gid)
        os.setresuid(nobody.pw_uid, nobody.pw_uid, nobody.pw_uid)

    mine = [_worker_of(up, "sinfo", "--version") for _ in range(3)]
    assert len({pid for pid, _ in mine}) == 1 and {code for _, code in mine} == {0}, mine
    theirs = _worker_of(up, "sinfo", "--version", become=as_nobody)
    assert theirs[0] != mine[0][0] and _worker_of(up, "sinfo", "--version", become=as_nobody) == theirs
    with open(f"/proc/{theirs[0]}/status") as fh:
        uids = next(line for line in fh if line.startswith("Uid:")).split()[1:]
    assert uids == [str(nobody.pw_uid)] * 4, uids
    # srun may leave signal handlers and threads: its worker runs nothing after it
    srun = _worker_of(up, "srun", "--version")
    assert srun[0] == mine[0][0] and _worker_of(up, "sinfo", "--version")[0] != srun[0]

    # the same worker runs both submits: each job has its own caller's environment and directory
    outs = []
    for i, extra in enumerate(({"ROTA_MARK": "first"}, {})):
        work = tmp_path / f"w{i}"
        work.mkdir()
        out = tmp_path / f"out{i}"
        r = subprocess.run([str(native_only / "sbatch"), "--parsable", "-o", str(out), "--wrap",
                            'echo "${ROTA_MARK:-unset} $PWD"'], env={**up, **extra}, cwd=work,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r
        outs.append((out, f"{extra.get('ROTA_MARK', 'unset')} {work}"))
    for out, expected in outs:
        assert wait_for(lambda o=out: o.exists() and o.read_text().strip(), 30, f"{out}") == expected


def _request(sock, cmd: str, argv, env: dict) -> None:
    """Send a command server the request for ``cmd argv`` (in /, with ``env``), /dev/null as its three descriptors."""
    import array
    import json
    import socket
    import struct

    null = os.open(os.devnull, os.O_RDWR)
    try:
        req = json.dumps({"cmd": cmd, "argv": list(argv), "cwd": "/", "env": env, "umask": 0o22}).encode()
        sock.sendmsg([struct.pack("!I", len(req)) + req],
                     [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [null] * 3))])
    finally:
        os.close(null)


def _first_answer(path: str, cmd: str, *argv: str) -> bytes:
    """What a command server first answers a request for ``cmd argv`` (``A``: it runs it; ``F``: run it yourself)."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(path)
        _request(sock, cmd, argv, {})
        return sock.recv(1)


def test_the_logs_lookups_run_warm_in_rota_ups_command_server_and_say_what_they_say_here(up):
    """``rota why``, ``replay`` and ``history`` go to ``rota up``'s command server (rota's imports already loaded
    there): their output and status are what the command run in its own process gives. A ``rota`` whose own process
    cannot run them (rota.programs.main unimportable) still answers: the server ran them."""
    # the first still runs when the second is submitted, however long that submit takes
    first = subprocess.run([str(BIN / "sbatch"), "--parsable", "-o", "/dev/null", "--gres=gpu:8", "--wrap", "sleep 4"],
                           env=up, capture_output=True, text=True, timeout=60).stdout.strip()
    second = subprocess.run([str(BIN / "sbatch"), "--parsable", "-o", "/dev/null", "--gres=gpu:8", "--wrap", "true"],
                            env=up, capture_output=True, text=True, timeout=60).stdout.strip()
    wait_for(lambda: "COMPLETED" in subprocess.run([str(BIN / "sacct"), "-X", "-n", "-j", second], env=up,
                                                   capture_output=True, text=True, timeout=60).stdout, 30, "the jobs")
    not_here = [sys.executable, "-I", "-c", "import sys; sys.modules['rota.programs.main'] = None\n"
                "from rota.programs.entry import main; main()"]
    said = {}
    for args in (("why", second), ("replay", "--at", "4"), ("history", first), ("why", "999"), ("why", "--bogus")):
        served, thin, here = (subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, cwd="/tmp")
                              for argv, env in (([*not_here, *args], up), ([str(BIN / "rota"), *args], up),
                                                ([str(BIN / "rota"), *args], {**up, "ROTA_THIN": "0"})))
        assert (served.returncode, served.stdout, served.stderr) == (thin.returncode, thin.stdout, thin.stderr) \
            == (here.returncode, here.stdout, here.stderr), (args, served, here)
        said[args] = served
    assert said[("why", second)].returncode == 0 and f"job {first}" in said[("why", second)].stdout
    assert "log sequence 4" in said[("replay", "--at", "4")].stdout
    assert said[("why", "999")].returncode == 1 and "job 999 is not in the log" in said[("why", "999")].stderr
    # rota's other commands are not the server's to run, nor are the lookups a server without them runs
    path = os.path.join(up["ROTA_STATE_DIR"], "run", "commands.sock")
    assert [_first_answer(path, "rota", *a) for a in (("version",), ("up",), ())] == [b"F"] * 3
    assert _first_answer(path, "rota", "why", "1") == b"A"


def test_a_command_server_without_the_logs_lookups_leaves_them_to_the_caller(tmp_path):
    """An agent's command server (no ``--log-commands``) answers ``F`` to ``rota why``: its caller runs it."""
    path = str(tmp_path / "commands.sock")
    server = subprocess.Popen([sys.executable, "-I", "-m", "rota.programs.commandserver", path], cwd="/")
    try:
        wait_for(lambda: os.path.exists(path), 30, "the command server's socket")
        assert _first_answer(path, "rota", "why", "1") == b"F"
        assert _first_answer(path, "sinfo", "--version") == b"A"
    finally:
        server.kill()
        server.wait()


def test_a_time_travel_child_out_of_time_is_asked_to_stop_then_killed():
    """A child that runs the command through the command server stops with SIGTERM (its thin client passes it on to
    the worker; a SIGKILL would stop only the client): it gets SIGTERM first, SIGKILL only if it does not stop."""
    import asyncio

    from rota.wire.lifetime import stop_child

    async def stop_both() -> tuple[int | None, float, int | None, float]:
        polite = await asyncio.create_subprocess_exec(sys.executable, "-c", "import time; time.sleep(60)")
        deaf = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(60)", stdout=asyncio.subprocess.PIPE)
        await deaf.stdout.readline()
        t = time.monotonic()
        await stop_child(polite)
        quick = time.monotonic() - t
        t = time.monotonic()
        await stop_child(deaf)
        return polite.returncode, quick, deaf.returncode, time.monotonic() - t

    polite, quick, deaf, slow = asyncio.run(stop_both())
    assert polite == -signal.SIGTERM and quick < 2, (polite, quick)
    assert deaf == -signal.SIGKILL and 4 < slow < 10, (deaf, slow)
