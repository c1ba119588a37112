"""The commands' own pages as Slurm 22.05 lays them out: ``--usage``, ``--help``, ``-V``, and scontrol's
record layouts (``-o``), so that scripts and test harnesses written for Slurm read them."""
import re
import subprocess
import sys
from pathlib import Path

import pytest


BIN = Path(sys.executable).parent
COMMANDS = ["sbatch", "srun", "salloc", "scancel", "squeue", "sinfo", "sprio", "sacct", "sshare", "scontrol",
            "sacctmgr"]
TAILS = {"sbatch": r"executable \[args\.\.\.\]", "srun": r"executable \[args\.\.\.\]",
         "salloc": r"\[command \[args\.\.\.\]\]", "scancel": r"\[job_id\[_array_id\]\[\.step_id\]\]"}


def page(command: str, *argv: str) -> str:
    r = subprocess.run([str(BIN / command), *argv], capture_output=True, text=True, timeout=30, cwd="/")
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_version_is_a_three_part_release(command):
    assert page(command, "--version") == "slurm 22.05.9\n"
    assert page(command, "-V") == "slurm 22.05.9\n"


@pytest.mark.parametrize("command", ["sbatch", "srun", "salloc", "scancel", "squeue", "sinfo", "sprio", "sacct"])
def test_usage_is_every_option_bracketed_then_the_operands(command):
    text = page(command, "--usage")
    assert text.startswith(f"Usage: {command} [-")
    items = re.findall(r"\[[^\[\]]*(?:\[[^\]]*\][^\[\]]*)*\]", text[len(f"Usage: {command} "):])
    assert len(items) > 5 and all(re.fullmatch(r"\[--?[A-Za-z].*\]", i) for i in items[:-1])
    assert re.search(TAILS.get(command, r"\]") + "$", text.rstrip("\n"))
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "--usage" not in text and "--help" not in text


@pytest.mark.parametrize("command", ["sbatch", "srun", "scancel", "squeue", "sinfo", "sprio"])
def test_help_lists_each_option_with_its_value_and_what_rota_does_with_it(command):
    text = page(command, "--help")
    assert text.startswith(f"Usage: {command} [OPTIONS]") and "\nHelp options:\n" in text
    if command == "srun":
        for item in ("-b, --begin=time", "-N, --nodes=N", "-q, --qos=qos", "-G, --gpus=n"):
            assert item in text
        assert re.search(r"--pty +not supported by rota \(refused\)", text)


def test_the_accounting_pages_have_their_option_layout():
    text = page("sacct", "--help")
    assert text.startswith("sacct [<OPTION>]\n    Valid <OPTION> values are:\n")
    for item in ("-j, --jobs:", "-S, --starttime:", "-s, --state:", "valid start/end time formats are..."):
        assert item in text
    text = page("sacctmgr", "--usage")
    for item in ("sacctmgr [<OPTION>] [<COMMAND>]", "Valid <COMMAND> values are:", "<ENTITY> may be",
                 "<SPECS> are different for each command entity pair", "add account", "list associations"):
        assert item in text
    text = page("scontrol", "--help")
    for item in ("Valid <COMMAND> values are:", "reconfigure", "show <ENTITY> [<ID>]", "version"):
        assert item in text


def test_one_line_each_joins_a_record_s_fields():
    from rota.cli.scontrol import one_line_each

    record = ["JobId=1 JobName=a", "   UserId=x(1) GroupId=x(1)", "   Power=", "   ", "", "JobId=2 JobName=b", "   ", ""]
    assert one_line_each(record) == ["JobId=1 JobName=a UserId=x(1) GroupId=x(1) Power=", "JobId=2 JobName=b"]
    assert one_line_each(["No jobs in the system"]) == ["No jobs in the system"]


def test_export_gives_a_job_what_slurm_would():
    from rota.cli.environment import ExportError, exported

    env = {"PATH": "/opt/bin", "HOME": "/h", "A": "1", "B": "2", "SLURM_CONF": "/x", "SECRET": "s"}
    assert exported(None, env) == env and exported("ALL", env) == env
    assert exported("ALL,A=9,C=3", env) == {**env, "A": "9", "C": "3"}
    only = exported("A,B", env)
    assert only["A"] == "1" and only["B"] == "2" and only["SLURM_CONF"] == "/x" and "SECRET" not in only
    assert only["PATH"].startswith("/usr/local/sbin")      # a login base for what the list leaves out
    assert exported("A,PATH", env)["PATH"] == "/opt/bin"
    none = exported("NONE", env)
    assert none["SLURM_CONF"] == "/x" and "A" not in none and "SECRET" not in none and "HOME" in none
    assert exported("NONE,A=5", env)["A"] == "5"
    with pytest.raises(ExportError, match="'1X' is not a variable name"):
        exported("A,1X", env)
