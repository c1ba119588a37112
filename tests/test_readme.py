"""The README is run, as the eventsourcing library runs its docs: its first session against a fresh
``rota up``, line by line at a person's pace, each line's exit status and what it shows checked; and every
make target, page and path it names exists."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from helpers import stop, wait_for

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BIN = Path(sys.executable).parent
MARK = "@@rota-readme-line@@"
# what the lines that start so must show (the README's comments say it in words)
SHOWS = {
    "squeue": "(JobHeldUser)",
    "srun": "{host}\n{host}\n",
    "sacct": "COMPLETED",
    "cat first-": "GPUs 0,1\n",
    "rota why": "[JobHeldUser]",
    "scontrol show job": "JobState=COMPLETED",
    "sinfo": "PARTITION AVAIL",
}


def first_session() -> list[str]:
    """The command lines of the README's first session, in order."""
    text = README.read_text()
    block = re.search(r"## A first session\n.*?```sh\n(.*?)```", text, re.S)
    assert block is not None, "the README has no first session"
    return [line.split("  #")[0].rstrip() for line in block.group(1).splitlines() if line.strip()]


def test_the_first_session_runs_as_the_readme_says(tmp_path):
    lines = first_session()
    for start in SHOWS:
        assert any(line.startswith(start) for line in lines), f"no line starts with {start!r}: update SHOWS"
    base = Path(tempfile.mkdtemp(prefix="rota-readme-"))
    base.chmod(0o755)
    env = dict(os.environ, ROTA_STATE_DIR=str(base / "state"), PATH=f"{BIN}:{os.environ['PATH']}")
    env.pop("ROTA_NATS_URL", None)
    with open(tmp_path / "up.log", "w") as log:
        up = subprocess.Popen([str(BIN / "rota"), "up", "--fake-gpus", "a100:4"], env=env, stdout=log,
                              stderr=subprocess.STDOUT, cwd="/")
    try:
        wait_for(lambda: (base / "state" / "cluster.json").exists() and (base / "state" / "run" / "rota.sock").exists(),
                 what="rota up")
        # one shell, as a person's: each line marked, then its exit status, half a second between lines
        script = "".join(f"echo {MARK}{i}\n{line}\necho {MARK}status $?\nsleep 0.5\n" for i, line in enumerate(lines))
        done = subprocess.run(["bash", "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True,
                              timeout=240)
    finally:
        stop(up)
        shutil.rmtree(base, ignore_errors=True)
    outputs = re.split(rf"{MARK}\d+\n", done.stdout)[1:]
    assert len(outputs) == len(lines), done.stdout + done.stderr
    host = subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip()
    for line, out in zip(lines, outputs):
        shown, _, status = out.rpartition(f"{MARK}status ")
        assert status.strip() == "0", f"{line!r} exited {status.strip()}:\n{shown}\n{done.stderr}"
        for start, expected in SHOWS.items():
            if line.startswith(start):
                assert expected.format(host=host) in shown, f"{line!r} showed:\n{shown}\n{done.stderr}"


def test_every_make_target_page_and_path_the_readme_names_exists():
    text = README.read_text()
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    named = set(re.findall(r"`make ([\w-]+)`", text)) | set(re.findall(r"^make ([\w-]+)", text, re.M))
    assert {"up", "test", "test-fast"} <= named
    assert named <= targets, named - targets
    links = re.findall(r"\]\(([^)#]+)\)", text)
    assert links and all((ROOT / link).exists() for link in links), [x for x in links if not (ROOT / x).exists()]
    folders = re.findall(r"^\| `(\w+)/` \|", text, re.M)
    assert set(folders) >= {"core", "wire", "controller", "agents", "projections", "cli", "client", "programs"}
    assert all((ROOT / f).is_dir() for f in folders), folders


@pytest.mark.fast
def test_architecture_names_only_modules_that_exist():
    text = (ROOT / "ARCHITECTURE.md").read_text()
    paths = set(re.findall(r"`((?:core|wire|controller|agents|projections|cli|client|programs)/[\w/]+\.(?:py|c))`", text))
    assert len(paths) > 30
    assert all((ROOT / p).exists() for p in paths), sorted(p for p in paths if not (ROOT / p).exists())


@pytest.mark.fast
def test_the_python_example_of_the_features_page_runs():
    text = (ROOT / "docs" / "features.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks
    done = subprocess.run([sys.executable, "-c", blocks[0]], capture_output=True, text=True, timeout=60, cwd="/")
    assert done.returncode == 0 and "NodeAlloc(node='gpu01'" in done.stdout, done.stderr
