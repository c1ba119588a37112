"""The fault drill (ops/fault_drill.py): 3 NATS servers, 2 controllers, 4 agents and submitters while the
leader is killed, a NATS server is killed and restarted, and an agent is stopped and continued."""
import subprocess
import sys
from pathlib import Path

import pytest

DRILL = Path(__file__).resolve().parent.parent / "ops" / "fault_drill.py"


def drill(tmp_path, jobs: int, submitters: int, timeout: int) -> str:
    r = subprocess.run([sys.executable, str(DRILL), "--jobs", str(jobs), "--submitters", str(submitters),
                        "--dir", str(tmp_path / "drill")], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_the_short_drill_loses_nothing_and_starts_nothing_twice(tmp_path):
    out = drill(tmp_path, 160, 4, 600)
    assert "acknowledged submits lost: 0   duplicate starts of a run: 0   jobs that never ended: 0" in out, out
    assert "how the acknowledged jobs ended: COMPLETED 160" in out, out


@pytest.mark.slow
def test_the_full_drill(tmp_path):
    out = drill(tmp_path, 10_000, 8, 3600)
    print(out)
    assert "acknowledged submits lost: 0   duplicate starts of a run: 0   jobs that never ended: 0" in out, out
