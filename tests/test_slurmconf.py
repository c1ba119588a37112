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


def test_include_lines_are_read_beside_the_file_that_names_them_and_cycles_are_named(tmp_path):
    from rota.core.slurmconf import check_config
    from rota.wire.paths import read_slurm_conf

    (tmp_path / "site").mkdir()
    (tmp_path / "slurm.conf").write_text("ClusterName=site\nCryptoType=crypto/munge\ninclude site/nodes.conf\n"
                                         "PartitionName=p Nodes=n[1-2] Default=YES\n")
    (tmp_path / "site" / "nodes.conf").write_text("NodeName=n[1-2] CPUs=4 RealMemory=8000\ninclude more.conf\n")
    (tmp_path / "site" / "more.conf").write_text("DownNodes=n2 State=DOWN\nBogus=1\n")
    text, origin = read_slurm_conf(str(tmp_path / "slurm.conf"))
    cfg, diags = check_config(text, "slurm.conf", origin=origin)
    assert cfg is None
    [error] = [d for d in diags if d.severity == "error"]
    assert (error.file, error.line) == (str(tmp_path / "site" / "more.conf"), 2) and "Bogus" in error.message
    ignored = {(d.message.split()[0], d.line) for d in diags if d.severity == "ignored"}
    assert ignored == {("CryptoType", 2), ("DownNodes", 1)}
    (tmp_path / "site" / "more.conf").write_text("include ../slurm.conf\n")
    with pytest.raises(ValueError, match=r"include cycle: .*slurm.conf -> .*nodes.conf -> .*more.conf -> .*slurm.conf"):
        read_slurm_conf(str(tmp_path / "slurm.conf"))
    (tmp_path / "site" / "more.conf").write_text("")
    text, origin = read_slurm_conf(str(tmp_path / "slurm.conf"))
    cfg, _ = check_config(text, "slurm.conf", origin=origin)
    assert cfg is not None and cfg.cluster_name == "site" and [n.name for n in cfg.nodes] == ["n1", "n2"]


def test_every_slurm_22_05_key_is_known():
    from rota.core import slurmconf as s

    known = s.GLOBAL_KEYS | s.IGNORED_KEYS | set(s.SHELL_KEYS) | s.LINE_KINDS_IGNORED | set(s.NOT_APPLIED)
    for key in KEYS_22_05.split():
        assert key in known or key in ("nodename", "partitionname", "slurmctldhost", "controlmachine"), key
KEYS_22_05 = """
accountingstoragebackuphost accountingstorageenforce accountingstorageexternalhost accountingstoragehost
accountingstorageloc accountingstorageparameters accountingstoragepass accountingstorageport
accountingstoragetres accountingstoragetype accountingstorageuser accountingstoreflags
accountingstorejobcomment acctgatherenergytype acctgatherfilesystemtype acctgatherinfinibandtype
acctgatherinterconnecttype acctgathernodefreq acctgatherprofiletype allowspecresourcesusage authaltparameters
authalttypes authinfo authtype backupaddr backupcontroller batchstarttimeout bcastexclude bcastparameters
burstbufferparameters burstbuffertype clifilterplugins clustername communicationparameters completewait
controladdr controlmachine corespecplugin cpufreqdef cpufreqgovernors credtype cryptotype debugflags
defcpupergpu defmempercpu defmempergpu defmempernode dependencyparameters disablerootjobs downnodes
eiotimeout enforcepartlimits epilog epilogmsgtime epilogslurmctld extsensorsfreq extsensorstype
fairsharedampeningfactor fastschedule federationparameters firstjobid frontendname getenvtimeout gpufreqdef
grestypes groupupdateforce groupupdatetime healthcheckinterval healthchecknodestate healthcheckprogram
inactivelimit interactivestepoptions jobacctgatherfrequency jobacctgatherparams jobacctgathertype jobcomphost
jobcomploc jobcompparams jobcomppass jobcompport jobcomptype jobcompuser jobcontainertype
jobcredentialprivatekey jobcredentialpubliccertificate jobfileappend jobrequeue jobsubmitplugins
keepalivetime killonbadexit killwait launchparameters launchtype licenses logtimeformat maildomain mailprog
maxarraysize maxdbdmsgs maxjobcount maxjobid maxmempercpu maxmempernode maxnodecount maxstepcount
maxtaskspernode mcsparameters mcsplugin messagetimeout minjobage mpidefault mpiparams nodefeaturesplugins
nodename nodeset overtimelimit partitionname plugindir plugstackconfig powerparameters powerplugin
preemptexempttime preemptmode preempttype prepparameters prepplugins prioritycalcperiod prioritydecayhalflife
priorityfavorsmall priorityflags prioritymaxage priorityparameters prioritysitefactorparameters
prioritysitefactorplugin prioritytype priorityusageresetperiod priorityweightage priorityweightassoc
priorityweightfairshare priorityweightjobsize priorityweightpartition priorityweightqos priorityweighttres
privatedata proctracktype prolog prologepilogtimeout prologflags prologslurmctld propagateprioprocess
propagateresourcelimits propagateresourcelimitsexcept rebootprogram reconfigflags requeueexit requeueexithold
resumefailprogram resumeprogram resumerate resumetimeout resvepilog resvoverrun resvprolog returntoservice
routeplugin sallocdefaultcommand sbcastparameters schedulerauth schedulerparameters schedulertimeslice
schedulertype scronparameters selecttype selecttypeparameters slurmctldaddr slurmctlddebug slurmctldhost
slurmctldlogfile slurmctldparameters slurmctldpidfile slurmctldplugstack slurmctldport
slurmctldprimaryoffprog slurmctldprimaryonprog slurmctldsyslogdebug slurmctldtimeout slurmddebug
slurmdlogfile slurmdparameters slurmdpidfile slurmdport slurmdspooldir slurmdsyslogdebug slurmdtimeout
slurmduser slurmschedlogfile slurmschedloglevel slurmuser srunepilog srunportrange srunprolog
statesavelocation suspendexcnodes suspendexcparts suspendprogram suspendrate suspendtime suspendtimeout
switchparameters switchtype taskepilog taskplugin taskpluginparam taskprolog tcptimeout tmpfs topologyparam
topologyplugin trackwckey treewidth unkillablestepprogram unkillablesteptimeout usepam vsizefactor waittime """


def test_memory_defaults_are_what_a_job_that_asks_none_gets():
    from rota.core.events import JobSpec
    from rota.core.request import node_request, partition_shape
    from rota.core.state import State

    conf = ("DefMemPerCPU=1024\nNodeName=n[1-2] CPUs=8 RealMemory=32000\nPartitionName=a Nodes=n1 Default=YES\n"
            "PartitionName=b Nodes=n2 DefMemPerNode=5000\nPartitionName=c Nodes=n2 DefMemPerNode=UNLIMITED\n")
    cfg = parse_config(conf)
    parts = {p.name: p for p in cfg.partitions}
    assert (parts["a"].def_mem_per_cpu, parts["b"].def_mem_per_node, parts["c"].def_mem_per_node) == (1024, 5000, 0)
    state = State()
    from rota.core.apply import apply
    from rota.core import events as ev

    apply(state, ev.Envelope.trusted(1, 0, "t", "", ev.ClusterConfigured(config=cfg)))
    spec = JobSpec(cpus_per_task=2, script="#!/bin/sh\n")
    assert node_request(spec, state.part_shapes["a"]).mem == 2048
    assert node_request(spec, state.part_shapes["b"]).mem == 5000
    whole = node_request(spec, state.part_shapes["c"])
    assert whole.whole_mem
    assert node_request(spec.model_copy(update={"mem_per_cpu": 100}), state.part_shapes["a"]).mem == 200
    assert partition_shape([]).def_mem_per_node is None


def test_settings_rota_does_not_apply_are_warnings_that_name_the_difference():
    conf = ("MaxMemPerCPU=4000\nNodeName=n1 CPUs=8 Sockets=2 CoresPerSocket=4 ThreadsPerCore=1 RealMemory=32000\n"
            "PartitionName=p Nodes=n1 Default=YES OverSubscribe=FORCE:2\n")
    cfg, diags = check_config(conf)
    assert cfg is not None
    said = {d.message.split("=")[0]: d.message for d in diags if d.severity == "warning"}
    assert set(said) == {"MaxMemPerCPU", "Sockets", "CoresPerSocket", "OverSubscribe"}
    assert "more memory per CPU" in said["MaxMemPerCPU"] and "never shares a CPU" in said["OverSubscribe"]
