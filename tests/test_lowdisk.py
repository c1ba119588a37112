"""Low disk: a drill fills the filesystem that holds the state, frees a little, restarts `rota up`, and checks
that it leads again and keeps every job whose submission was acknowledged; with almost nothing free it refuses
to start, naming the bytes it needs."""
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from helpers import stop, wait_for

BIN = Path(sys.executable).parent
SCRIPT = "#!/bin/sh\n# " + "x" * (512 * 1024) + "\ntrue\n"


@pytest.fixture
def small_disk():
    """A 64 MiB filesystem of its own (tmpfs), as a state directory's disk."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    where = Path(tempfile.mkdtemp(prefix="rota-lowdisk-"))
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(where)], capture_output=True, text=True)
    if r.returncode != 0:
        where.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)
        where.rmdir()


def _up(state: Path, log: Path) -> subprocess.Popen:
    fh = open(log, "a")
    proc = subprocess.Popen([str(BIN / "rota"), "up", "--fake-gpus", "a100:1", "--kill-wait", "1"],
                            env=dict(os.environ, ROTA_STATE_DIR=str(state)), stdout=fh, stderr=subprocess.STDOUT)
    fh.close()
    return proc


def _run(state: Path, *cmd: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / cmd[0]), *cmd[1:]], env=dict(os.environ, ROTA_STATE_DIR=str(state)),
                          capture_output=True, text=True, timeout=60, **kw)


def _fill(where: Path, leave: int) -> None:
    """Fill the filesystem with a file of its own, leaving ``leave`` bytes free."""
    free = os.statvfs(where).f_bavail * os.statvfs(where).f_frsize
    with open(where / f"fill-{time.monotonic_ns()}", "wb") as fh:
        try:
            fh.truncate(0)
            chunk = b"\0" * (1 << 20)
            left = max(0, free - leave)
            while left > 0:
                left -= fh.write(chunk[:min(len(chunk), left)])
                fh.flush()
        except OSError:
            pass


def test_a_full_disk_then_a_little_room_and_rota_leads_again_with_every_acknowledged_job(small_disk, tmp_path):
    state = small_disk / "state"
    script = tmp_path / "big.sh"
    script.write_text(SCRIPT)
    ballast = small_disk / "ballast"
    ballast.write_bytes(b"\0" * (8 << 20))        # what the drill frees later
    proc = _up(state, tmp_path / "up.log")
    try:
        wait_for(lambda: _run(state, "squeue").returncode == 0, what="rota up")
        acknowledged, refused = [], None
        for _ in range(200):
            r = _run(state, "sbatch", "-H", "--parsable", "-o", "/dev/null", str(script))
            if r.returncode != 0:
                refused = r.stderr
                break
            acknowledged.append(r.stdout.strip())
        assert refused is not None and "no space left for the event log" in refused and "Traceback" not in refused
        assert len(acknowledged) > 10, acknowledged
        free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
        assert free >= 8 << 20, free                # refused while the reserve was left (not once the disk was full)
        _fill(small_disk, 0)                        # and then something else fills the disk to the last byte
        r = _run(state, "sbatch", "-H", "--wrap", "true")
        assert r.returncode == 1 and "Traceback" not in r.stderr, r
    finally:
        stop(proc)
    ballast.unlink()                                # a little room: 8 MiB, less than rota's reserve
    proc = _up(state, tmp_path / "up.log")
    try:
        wait_for(lambda: _run(state, "squeue").returncode == 0, timeout=60, what="rota up to lead again")
        listed = _run(state, "squeue", "-h", "-o", "%i").stdout.split()
        assert set(acknowledged) <= set(listed), (sorted(set(acknowledged) - set(listed)), listed)
        r = _run(state, "sbatch", "-H", "--wrap", "true")     # the reserve is kept for the running jobs' ends
        assert r.returncode == 1 and "no space left for the event log" in r.stderr, r
    finally:
        stop(proc)
    _fill(small_disk, 200 * 1024)                   # almost nothing: a clear refusal, naming the bytes
    r = subprocess.run([str(BIN / "rota"), "up", "--fake-gpus", "a100:1"], env=dict(os.environ, ROTA_STATE_DIR=str(state)),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "bytes free; the event log needs at least 1,048,576" in r.stdout + r.stderr, r
    assert "Traceback" not in r.stdout + r.stderr
