"""Read-your-writes: a change made through a command is seen by the next command that reads, on that host,
whoever runs it and whichever view it reads (the controller's or the projection's)."""
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from rota.cli import sacct, sinfo
from rota.wire.subjects import pack_reply, reply_prefix, reply_seq, unpack_reply

from helpers import run_as

BIN = Path(sys.executable).parent
ROUNDS = int(os.environ.get("ROTA_RYW_ROUNDS", "60"))


def run(env, *cmd):
    return subprocess.run([str(BIN / cmd[0]), *cmd[1:]], env=env, capture_output=True, text=True, timeout=30)


@pytest.mark.fast
def test_a_reply_carries_its_sequence_in_the_clear_even_packed():
    small = b'{"rid":"r1","seq":4711,"ok":true}'
    assert reply_seq("r1", small) == 4711
    assert reply_seq("r1", b'{"rid":"r1","ok":true}') is None
    assert reply_seq("r2", small) is None              # another request's reply says nothing
    big = reply_prefix("r1") + b'"seq":12,"rows":"' + b"x" * (2 << 20) + b'"}'
    packed = pack_reply("r1", big)
    assert len(packed) < len(big) and reply_seq("r1", packed) == 12
    assert unpack_reply("r1", packed) == big
    assert unpack_reply("r1", small) == small


def _drained(text: str, node: str, reason: str) -> bool:
    return any(line.split()[:1] == [reason] and line.split()[-1] == node for line in text.splitlines())


def test_every_drain_and_resume_is_seen_by_the_next_sinfo(up):
    node = "gpu01"
    stale = []
    for i in range(ROUNDS):
        reason = f"r{i}"
        assert run(up, "scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}").returncode == 0
        seen = run(up, "sinfo", "-R", "-h").stdout
        if not _drained(seen, node, reason):
            stale.append(("drain", i, seen))
        assert run(up, "scontrol", "update", f"NodeName={node}", "State=RESUME").returncode == 0
        seen = run(up, "sinfo", "-R", "-h").stdout
        if node in seen:
            stale.append(("resume", i, seen))
    assert stale == []


def test_every_submit_and_cancel_is_seen_by_the_next_sacct_and_squeue(up):
    stale = []
    for _ in range(ROUNDS // 2):
        job = run(up, "sbatch", "--parsable", "--hold", "--wrap", "true").stdout.strip()
        assert job.isdigit()
        row = run(up, "sacct", "-n", "-X", "-P", "-j", job, "--format=JobID,State").stdout
        if row != f"{job}|PENDING\n":
            stale.append(("sacct after submit", job, row))
        assert run(up, "scancel", job).returncode == 0
        row = run(up, "sacct", "-n", "-X", "-P", "-j", job, "--format=JobID,State").stdout
        if not row.startswith(f"{job}|CANCELLED"):
            stale.append(("sacct after cancel", job, row))
        listed = run(up, "squeue", "-h", "-j", job, "-o", "%i").stdout
        if listed:
            stale.append(("squeue after cancel", job, listed))
    assert stale == []


def test_a_change_by_root_is_seen_by_another_user_at_once(up):
    """``nobody`` cannot read the projection: the controller answers at a state that has the change."""
    for i in range(5):
        assert run(up, "scontrol", "update", "NodeName=gpu02", "State=DRAIN", f"Reason=n{i}").returncode == 0
        code, out, _ = run_as("nobody", sinfo.run, ["-R", "-h"], "/tmp", env=dict(up))
        assert code == 0 and _drained(out, "gpu02", f"n{i}"), out
        job = run(up, "sbatch", "--parsable", "--hold", "--wrap", "true").stdout.strip()
        code, out, _ = run_as("nobody", sacct.run, ["-n", "-X", "-P", "-a", "-j", job, "--format=JobID,State"],
                              "/tmp", env=dict(up))
        assert out == f"{job}|PENDING\n", out
        assert run(up, "scontrol", "update", "NodeName=gpu02", "State=RESUME").returncode == 0


def test_the_newest_sequence_is_kept_by_root_beside_the_socket(up):
    run(up, "sbatch", "--hold", "--wrap", "true")
    mark = Path(up["ROTA_STATE_DIR"]) / "run" / "seq"
    st = mark.lstat()
    assert stat.S_ISLNK(st.st_mode) and st.st_uid == 0      # a link's target, readable by every local user
    assert mark.parent.stat().st_uid == 0 and mark.parent.stat().st_mode & 0o022 == 0    # that only root replaces
    assert int(os.readlink(mark)) > 0


@pytest.mark.parametrize("target", ["\u00b2\u00b3", "12a", "9" * 25, None])
def test_a_mark_that_is_not_a_plain_sequence_reads_as_none(tmp_path, target):
    """Whatever is beside the socket (a link to other digits than ASCII's, or to too many of them; an older rota's
    file), a read takes it for no mark at all: it waits for nothing and never fails."""
    from rota.wire import seen

    socket = str(tmp_path / "rota.sock")
    if target is None:
        Path(seen.path_beside(socket)).write_text("7\n")
    else:
        os.symlink(target, seen.path_beside(socket))
    assert seen.newest(socket) == 0
