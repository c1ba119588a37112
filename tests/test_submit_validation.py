"""Requests no node can ever satisfy are rejected at submit, with Slurm's messages."""
import pytest

from rota.core import commands
from rota.core import events as ev
from harness import Harness, make_cluster

pytestmark = pytest.mark.fast    # make test-fast: the core and the front door, no process started


def rejected(h, **spec):
    spec.setdefault("user", "alice")
    with pytest.raises(commands.Rejected) as info:
        commands.submit(h.state, ev.JobSpec(**spec), 1)
    return info.value.lines


@pytest.mark.parametrize("spec,lines", [
    (dict(gpus_per_node=1, gpu_type="h100"), ("Requested node configuration is not available",)),
    (dict(gpus_per_node=9), ("Requested node configuration is not available",)),
    (dict(mem_per_node=300 * 1024 * 1024), ("Memory specification can not be satisfied",
                                              "Requested node configuration is not available")),
    (dict(cpus_per_task=65), ("CPU count per node can not be satisfied",
                              "Requested node configuration is not available")),
    (dict(partitions=("nosuch",)), ("invalid partition specified: nosuch",
                                    "Invalid partition name specified")),
    (dict(array="0-20000"), ("Invalid job array specification",)),
    (dict(constraint="nvlink"), ("Invalid feature specification",)),
])
def test_impossible_requests_are_rejected(h, spec, lines):
    assert rejected(h, **spec) == lines


def test_enforce_part_limits_no_accepts_and_all_rejects():
    lax = Harness(make_cluster())
    assert lax.submit(time_limit=7200) == 1
    assert lax.submit(nodes=5) == 2
    strict = Harness(make_cluster(enforce_part_limits="ALL"))
    assert rejected(strict, time_limit=7200) == ("Requested time limit is invalid (missing or exceeds some limit)",)
    assert rejected(strict, nodes=5, nodes_given=True) == ("Node count specification invalid",)


def test_the_partitions_node_limits_are_one_rule_at_submit_and_while_waiting():
    """MinNodes and MaxNodes: refused at submit under EnforcePartLimits, PartitionNodeLimit under NO."""
    wide = ev.PartitionConfig(name="wide", nodes=("gpu01", "gpu02", "gpu03", "gpu04"), min_nodes=2, max_nodes=3)
    strict = Harness(make_cluster(enforce_part_limits="ALL", extra_partitions=(wide,)))
    for n in (1, 4):
        assert rejected(strict, nodes=n, nodes_given=True, partitions=("wide",)) == ("Node count specification invalid",)
    lax = Harness(make_cluster(extra_partitions=(wide,)))
    job = lax.submit(nodes=1, partitions=("wide",))
    assert lax.cycle().pending_of(job).reason == "PartitionNodeLimit"


def test_drain_without_reason_is_refused(h):
    with pytest.raises(commands.Rejected, match="You must specify a reason"):
        commands.drain(h.state, "gpu01", "  ")
    with pytest.raises(commands.Rejected, match="Invalid node name"):
        commands.drain(h.state, "nosuch", "r")


def test_unknown_job(h):
    with pytest.raises(commands.Rejected, match="Invalid job id specified"):
        commands.cancel(h.state, 42)
