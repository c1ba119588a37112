"""The fault drill (ops/fault_drill.py): 3 NATS servers (TLS, rota's roles), 2 controllers, 4 agents and
submitters while pieces are killed, frozen and (where network namespaces can be made) cut off."""
import subprocess
import sys
from pathlib import Path

import pytest

DRILL = Path(__file__).resolve().parent.parent / "ops" / "fault_drill.py"
CLEAN = "acknowledged submits lost: 0   duplicate starts of a run: 0   jobs that never ended: 0   jobs wrongly failed: 0"


def drill(tmp_path, *args: str, timeout: int) -> str:
    r = subprocess.run([sys.executable, str(DRILL), *args, "--dir", str(tmp_path / "drill")], capture_output=True,
                       text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_the_short_drill_loses_nothing_and_starts_nothing_twice(tmp_path):
    out = drill(tmp_path, "--jobs", "160", "--submitters", "4", "--short", "--hold", "8", timeout=900)
    assert CLEAN in out, out
    assert "how the acknowledged jobs ended: COMPLETED 160" in out, out
    assert "takeover (the leader killed, frozen or cut off -> the other holds the lease): longest" in out, out
    longest = float(out.split("the other holds the lease): longest ")[1].split()[0])
    assert longest <= 10, out
    assert "scontrol ping: Slurmctld(primary) at" in out and out.count(" is UP") == 2, out


@pytest.mark.slow
def test_the_full_drill(tmp_path):
    """Every piece (each server, the leader, the standby, an agent) killed, frozen 30 s and cut off 30 s."""
    out = drill(tmp_path, "--jobs", "10000", "--submitters", "8", timeout=3600)
    print(out)
    assert CLEAN in out, out
