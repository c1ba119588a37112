"""slurm.conf / gres.conf reading: a good file parses, every broken one gets a precise diagnosis."""
from pathlib import Path

import pytest

from rota.core.slurmconf import ConfigError, check_config, parse_config

pytestmark = pytest.mark.fast    # make test-fast: the core and the front door, no process started

OPS = Path(__file__).resolve().parents[1] / "ops"
GOOD = """
GresTypes=gpu
NodeName=gpu[01-02] CPUs=64 RealMemory=257000 Gres=gpu:a100:8 Feature=a100,ib
PartitionName=short Nodes=gpu[01-02] Default=YES MaxTime=1:00:00
"""


def test_the_shipped_example_parses():
    text = (OPS / "slurm.conf.example").read_text()
    gres = (OPS / "gres.conf.example").read_text()
    cfg = parse_config(text, "slurm.conf.example", gres, "gres.conf.example")
    assert [n.name for n in cfg.nodes] == [f"gpu0{i}" for i in range(1, 7)]
    assert cfg.nodes[0].cpus == 64 and cfg.nodes[0].gpus[0].type == "a100" and cfg.nodes[0].gpus[0].count == 8
    assert cfg.nodes[4].cpus == 32 and cfg.nodes[4].features == ("l40s",)
    short, long_ = cfg.partitions
    assert short.default and short.max_time == 4 * 3600 and short.default_time == 3600
    assert long_.max_time == 7 * 86400 and long_.nodes == ("gpu01", "gpu02", "gpu03", "gpu04")
    assert cfg.scheduler.policy == "conservative" and cfg.scheduler.bf_window == 2880 * 60
    assert cfg.priority.max_age == 7 * 86400 and cfg.cluster_name == "homelab"


def diagnose(text, gres=None):
    cfg, diags = check_config(text, "t.conf", gres, "g.conf")
    errors = [d for d in diags if d.severity == "error"]
    assert cfg is None and errors
    return [str(d) for d in errors]


@pytest.mark.parametrize("text,expected", [
    (GOOD + "SchedulerTyp=sched/backfill\n", "t.conf:5: error: unknown key 'SchedulerTyp' (did you mean schedulertype?)"),
    (GOOD.replace("gpu[01-02] CPUs", "gpu[01-02 CPUs"), "t.conf:3: error: bad hostlist NodeName=gpu[01-02"),
    (GOOD.replace("GresTypes=gpu", "GresTypes=mps"), "gres type 'gpu' is not listed in GresTypes"),
    (GOOD.replace("Nodes=gpu[01-02]", "Nodes=gpu[01-03]"), "t.conf:4: error: partition short names unknown node(s) gpu03"),
    (GOOD.replace("MaxTime=1:00:00", "MaxTime=1:2:3:4"), "t.conf:4: error: MaxTime=1:2:3:4 is not a time"),
    (GOOD + "NodeName=gpu02 CPUs=8 RealMemory=1000\n", "t.conf:5: error: node gpu02 is defined twice (first on line 3)"),
    (GOOD.replace("CPUs=64", "CPUs=0"), "t.conf:3: error: CPUs=0 must be at least 1"),
    (GOOD.replace("RealMemory=257000", "RealMemory=lots"), "t.conf:3: error: RealMemory=lots is not a whole number"),
    (GOOD.replace("Feature=", "Featurez="), "unknown node key 'Featurez'"),
    (GOOD.replace("Default=YES", "Default=YES DefaultTime=2:00:00"), "DefaultTime of partition short exceeds its MaxTime"),
    (GOOD + "PartitionName=b Nodes=gpu01 Default=YES\n", "partition b is Default=YES but so is the one on line 4"),
    (GOOD.replace("Gres=gpu:a100:8", "Gres=gpu:a100:x:8"), "is not gpu[:type]:count"),
    (GOOD + "PartitionName=c\n", "partition c has no Nodes="),
    (GOOD.replace("State", "State") + "PartitionName=d Nodes=gpu01 State=OPEN\n", "State=OPEN is not a partition state"),
    ("GresTypes=gpu\n", "no nodes are defined"),
    ("NodeName=a CPUs=1 RealMemory=1\n", "no partitions are defined"),
    (GOOD + 'ClusterName="unclosed\n', "cannot split the line"),
])
def test_each_broken_file_gets_a_precise_diagnosis(text, expected):
    errors = diagnose(text)
    assert any(expected in e for e in errors), errors


def test_gres_conf_count_must_match():
    errors = diagnose(GOOD, "NodeName=gpu[01-02] Name=gpu Type=a100 File=/dev/nvidia[0-3]\n")
    assert any("g.conf:1: error: node gpu01: gres.conf lists 4 GPUs but slurm.conf Gres says 8" in e for e in errors)


def test_parse_config_raises_with_all_errors():
    with pytest.raises(ConfigError) as info:
        parse_config(GOOD.replace("CPUs=64", "CPUs=0") + "Bogus=1\n", "t.conf")
    assert len(info.value.diagnostics) == 2


def test_real_slurm_keys_rota_ignores_are_accepted():
    cfg = parse_config("SlurmctldHost=ctl\nAuthType=auth/munge\n" + GOOD)
    assert cfg.nodes[0].name == "gpu01"


def test_a_slurm_22_05_site_configuration_loads_as_it_is_and_the_unused_keys_are_listed():
    import subprocess
    import sys

    path = Path(__file__).parent / "fixtures" / "slurm-conf" / "slurm-22.05-site.conf"
    cfg, diags = check_config(path.read_text(), str(path))
    assert cfg is not None and [n.name for n in cfg.nodes] == ["gpu01", "gpu02"]
    assert [p.name for p in cfg.partitions] == ["short", "long"]
    ignored = {d.message.split()[0] for d in diags if d.severity == "ignored"}
    assert {"SlurmdUser", "MailProg", "AccountingStoragePort", "AccountingStorageTRES", "JobCompLoc"} <= ignored
    assert not [d for d in diags if d.severity == "error"]
    r = subprocess.run([sys.executable, "-m", "rota.cli.main", "config", "check", str(path)], capture_output=True,
                       text=True)
    assert r.returncode == 0 and "OK: 2 nodes" in r.stdout and "SlurmdUser (line 7)" in r.stderr, r.stderr
    _cfg, diags = check_config(path.read_text() + "SlurmdUserr=root\n", str(path))   # a typo is still an error
    assert any(d.severity == "error" and "SlurmdUserr" in d.message for d in diags)


def test_slurmctldhost_lines_name_the_controllers_in_order():
    cfg = parse_config("SlurmctldHost=ctl1(10.0.0.1)\nSlurmctldHost=ctl2\nControlMachine=ctl1\n"
                       "NodeName=n1 CPUs=4 RealMemory=1000\nPartitionName=p Nodes=n1 Default=YES\n")
    assert cfg.controllers == ("ctl1", "ctl2")


def test_a_cycle_tests_as_many_jobs_as_slurms_would():
    """bf_max_job_test is 500 unless SchedulerParameters says otherwise (0: every pending job)."""
    assert parse_config(GOOD).scheduler.bf_max_job_test == 500
    assert parse_config(GOOD + "SchedulerParameters=bf_max_job_test=40\n").scheduler.bf_max_job_test == 40
    assert parse_config(GOOD + "SchedulerParameters=bf_window=60,bf_max_job_test=0\n").scheduler.bf_max_job_test == 0
