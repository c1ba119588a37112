"""Starting a job's processes (``rota.agents.launch.spawn``): through the ``rota-exec`` helper and by
forking the agent, the same process in the same place with the same rights, and what cannot be done
refused with a reason."""
import os
import pwd
import subprocess
import uuid
from pathlib import Path

import pytest

from rota.agents import launch

ROOT = os.geteuid() == 0
CGROUP_V1 = Path("/sys/fs/cgroup/pids")


@pytest.fixture(params=["rota-exec", "fork"])
def way(request, monkeypatch):
    """Each test runs both ways: through the installed helper (skipped where no C compiler built it) and
    by forking this process."""
    monkeypatch.setenv("ROTA_EXEC", "1" if request.param == "rota-exec" else "0")
    launch.exec_helper.cache_clear()
    if request.param == "rota-exec" and launch.exec_helper() is None:
        pytest.skip("rota-exec is not built here (no C compiler): jobs are started by forking")
    yield request.param
    launch.exec_helper.cache_clear()


@pytest.fixture
def shared():
    """A folder the job's user may enter (pytest's own are root's alone)."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="rota-spawn-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run(argv, **kw) -> tuple[str, int]:
    proc = launch.spawn(argv, stdout=subprocess.PIPE, **kw)
    out = proc.stdout.read().decode()
    proc.stdout.close()
    return out, proc.wait()


@pytest.mark.skipif(not ROOT, reason="becoming another user needs root")
def test_the_command_runs_as_the_user_with_its_umask_and_directory_and_opens_its_files_as_that_user(way, shared):
    nobody = pwd.getpwnam("nobody")
    tmp_path = shared
    mine = tmp_path / "nobody"
    mine.mkdir()
    os.chown(mine, nobody.pw_uid, nobody.pw_gid)
    given = tmp_path / "input.txt"
    given.write_text("hello\n")
    given.chmod(0o644)
    out_file = mine / "out.txt"
    out, status = run(["sh", "-c", "id -u; id -g; id -G; umask; pwd; cat; echo to-file >&2"],
                      cg_procs=[], user=(nobody.pw_uid, nobody.pw_gid, [nobody.pw_gid]), umask=0o027,
                      workdir=str(tmp_path / "gone"),
                      files={0: (str(given), os.O_RDONLY), 2: (str(out_file), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)})
    assert status == 0
    assert out.split() == [str(nobody.pw_uid), str(nobody.pw_gid), str(nobody.pw_gid), "0027", "/tmp", "hello"]
    assert out_file.read_text() == "to-file\n"
    assert out_file.stat().st_uid == nobody.pw_uid and out_file.stat().st_mode & 0o777 == 0o640


@pytest.mark.skipif(not ROOT, reason="becoming another user needs root")
def test_what_cannot_be_done_is_refused_with_a_reason_and_nothing_runs(way, tmp_path):
    nobody = pwd.getpwnam("nobody")
    user = (nobody.pw_uid, nobody.pw_gid, [])
    secret = tmp_path / "secret"
    secret.write_text("root's\n")
    secret.chmod(0o600)
    marker = tmp_path / "ran"
    touch = ["sh", "-c", f"touch {marker}"]
    cases = [
        (dict(cg_procs=[str(tmp_path / "no-cgroup" / "cgroup.procs")], user=None),
         "cannot join the job's cgroup " + str(tmp_path / "no-cgroup" / "cgroup.procs")),
        (dict(cg_procs=[], user=user, files={0: (str(secret), os.O_RDONLY)}),
         f"cannot open {secret}: Permission denied"),
    ]
    for kw, helper_says in cases:
        with pytest.raises(launch.LaunchError) as refused:
            launch.spawn(touch, **kw)
        if way == "rota-exec":
            assert str(refused.value).startswith(helper_says)
        else:
            assert "cgroup" in str(refused.value)
        assert not marker.exists()
    with pytest.raises(launch.LaunchError, match="cannot run no-such-command-here"):
        launch.spawn(["no-such-command-here"], cg_procs=[], user=None, env={"PATH": "/usr/bin:/bin"})


def test_the_environment_reaches_the_command_whole_and_nothing_before_it(way):
    """The job's environment is the user's to choose: it is the command's (however large), and no process
    running as the agent (the helper) ever runs with it: a library named in LD_PRELOAD is tried by the
    command alone (the loader's complaint comes once)."""
    env = {"PATH": "/usr/bin:/bin", "LD_PRELOAD": "/nonexistent/rota-test.so"}
    env.update({f"BIG{i}": "x" * 100_000 for i in range(3)})   # more than a pipe holds
    proc = launch.spawn(["sh", "-c", "echo $(( ${#BIG0} + ${#BIG1} + ${#BIG2} ))"], cg_procs=[], user=None, env=env,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and out.split() == [b"300000"]
    assert err.count(b"rota-test.so") == 1, err   # the shell's loader, and no one's before it
    with pytest.raises(launch.LaunchError, match="cannot be passed"):
        launch.spawn(["true"], cg_procs=[], user=None, env={"A": "a\0b"})


def test_nothing_of_the_agent_leaks_into_the_command(way):
    """Only the descriptors the command is given are open in it (not the helper's report pipe)."""
    out, status = run(["sh", "-c", "ls /proc/$$/fd"], cg_procs=[], user=None, stdin=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL)
    assert status == 0 and sorted(out.split()) == ["0", "1", "2"]


@pytest.mark.skipif(not (ROOT and CGROUP_V1.is_dir()), reason="needs root and cgroup v1's pids controller")
def test_the_command_is_in_the_jobs_cgroup_from_its_first_instruction(way):
    group = CGROUP_V1 / f"rota-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        out, status = run(["cat", "/proc/self/cgroup"], cg_procs=[str(group / "cgroup.procs")], user=None)
        assert status == 0
        assert any(line.split(":")[1] == "pids" and line.split(":")[2] == "/" + group.name
                   for line in out.splitlines()), out
    finally:
        group.rmdir()


def test_rota_exec_names_the_helper_or_says_to_fork(tmp_path, monkeypatch):
    helper = tmp_path / "bin" / launch.EXEC_HELPER
    helper.parent.mkdir()
    helper.write_text("#!/bin/sh\n")
    helper.chmod(0o755)
    for value, expected in ((str(helper), str(helper)), ("0", None), (str(tmp_path / "missing"), None)):
        monkeypatch.setenv("ROTA_EXEC", value)
        launch.exec_helper.cache_clear()
        assert launch.exec_helper() == expected, value
    launch.exec_helper.cache_clear()


def test_a_helper_another_user_may_change_is_not_used(tmp_path):
    helper = tmp_path / "bin" / launch.EXEC_HELPER
    helper.parent.mkdir()
    helper.write_text("#!/bin/sh\n")
    helper.chmod(0o755)
    tmp_path.joinpath("bin").chmod(0o755)
    assert launch.trusted_helper(helper) == str(helper)
    helper.chmod(0o757)
    assert launch.trusted_helper(helper) is None
    helper.chmod(0o755)
    tmp_path.joinpath("bin").chmod(0o777)
    assert launch.trusted_helper(helper) is None
    tmp_path.joinpath("bin").chmod(0o755)
    helper.chmod(0o644)
    assert launch.trusted_helper(helper) is None
    assert launch.trusted_helper(tmp_path / "missing") is None
