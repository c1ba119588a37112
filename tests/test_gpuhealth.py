"""GPU health by NVIDIA's resolution buckets, through the fake NVML's knobs (pynvml's functions and values)."""
import json

import pytest

from rota.agents.gpu import FakeNvml, Gpus
from rota.core import gpuhealth

pytestmark = pytest.mark.fast


@pytest.mark.parametrize("code", [13, 31, 43, 45, 68])
def test_an_applications_xid_never_drains(code):
    finding = gpuhealth.xid(0, code)
    assert not finding.drains and finding.action in ("RESTART_APP", "IGNORE")


@pytest.mark.parametrize("code,action", [(48, "RESET_GPU"), (64, "RESET_GPU"), (79, "RESTART_BM"), (92, "RESET_GPU"),
                                         (94, "RESET_GPU"), (95, "RESET_GPU"), (4242, "CONTACT_SUPPORT")])
def test_a_hardware_xid_drains_with_its_bucket_in_the_reason(code, action):
    finding = gpuhealth.xid(3, code)
    assert finding.drains and finding.action == action and finding.reason.endswith(f": {action}")
    assert finding.reason.startswith(f"gpu 3: xid {code} (")


def gpus(tmp_path, faults: dict, **kw) -> Gpus:
    path = tmp_path / "faults.json"
    path.write_text(json.dumps(faults))
    return Gpus(FakeNvml("a100", 4, path, "n1"), "a100", **kw)


def test_row_remaps_pending_or_failed_drain_and_one_already_done_does_not(tmp_path):
    found = {f.gpu_index: f for f in gpus(tmp_path, {"remap": {"0": "pending", "1": "failed", "2": "corrected"}}).faults()}
    assert (found[0].code, found[0].action, found[0].drains) == ("remap:pending", "RESET_GPU", True)
    assert (found[1].code, found[1].action, found[1].drains) == ("remap:failed", "CONTACT_SUPPORT", True)
    assert 2 not in found and 3 not in found


def test_throttling_a_slow_pcie_link_and_heat_are_warnings_unless_the_site_drains_for_them(tmp_path):
    faults = {"throttle": {"0": 0x40 | 0x80}, "pcie": {"1": [3, 8]}, "temp": {"2": 95}}
    found = {f.code: f for f in gpus(tmp_path, faults).faults()}
    assert set(found) == {"throttle", "pcie", "temp"} and not any(f.drains for f in found.values())
    assert found["throttle"].reason == ("gpu 0: throttled (hardware thermal slowdown, power brake slowdown): "
                                        "CHECK_MECHANICALS")
    assert "gen3 x8, below its gen4 x16" in found["pcie"].reason and "95 C (limit 90 C)" in found["temp"].reason
    strict = {f.code: f for f in gpus(tmp_path, faults, drain_on=frozenset({"temp"})).faults()}
    assert strict["temp"].drains and not strict["pcie"].drains


def test_an_xid_that_drains_stays_an_applications_is_told_once(tmp_path):
    g = gpus(tmp_path, {"xid": [[1, 13], [2, 79]]})
    first = {f.code for f in g.faults()}
    assert first == {"xid:13", "xid:79"}
    assert {f.code for f in g.faults()} == {"xid:79"}
    assert gpuhealth.gpu_gone("xid:79") and gpuhealth.gpu_gone("lost") and not gpuhealth.gpu_gone("xid:94")


def test_a_gpu_off_the_bus_ends_only_the_job_on_it_and_a_warning_changes_nothing():
    from harness import Harness, make_cluster
    from rota.core import events as ev

    h = Harness(make_cluster(nodes=1, gpus=4))
    a = h.submit(user="ann", gpus_per_node=1, time_limit=600)
    b = h.submit(user="bob", gpus_per_node=1, time_limit=600)
    h.cycle()
    (gpu,) = h.state.jobs[a].alloc[0].gpus
    h.put(ev.HealthFault(node="gpu01", reason="gpu: throttled", gpu_index=gpu, code="throttle", drains=False))
    assert not h.state.nodes["gpu01"].drain and h.state.jobs[a].state == "RUNNING"
    h.put(ev.HealthFault(node="gpu01", reason=f"gpu {gpu}: xid 79 (fell off the bus): RESTART_BM", gpu_index=gpu,
                         code="xid:79", action="RESTART_BM"))
    assert h.state.jobs[a].state == "NODE_FAIL" and h.state.jobs[b].state == "RUNNING"
    assert h.state.nodes["gpu01"].drain and h.state.nodes["gpu01"].reason.endswith("RESTART_BM")


def test_mig_instances_are_gpu_slots_typed_by_their_profile_and_cuda_sees_their_uuids(tmp_path):
    from rota.agents import launch

    g = gpus(tmp_path, {"mig": {"0": ["3g.40gb", "1g.10gb"]}})
    inv = g.inventory()
    assert [(i.index, i.type, i.memory) for i in inv] == [(0, "3g.40gb", 40960), (1, "1g.10gb", 10240), (2, "a100", 81920),
                                                          (3, "a100", 81920), (4, "a100", 81920)]
    assert inv[0].uuid.startswith("MIG-") and inv[0].model == "NVIDIA A100-SXM4-80GB MIG 3g.40gb"
    launch.DEVICES["n1"] = launch.device_names(inv)
    try:       # slots are not the physical order any more: CUDA is given UUIDs
        assert launch.cuda_devices("n1", (1, 2)) == f"{inv[1].uuid},{inv[2].uuid}"
        assert launch.cuda_devices("elsewhere", (1, 2)) == "1,2"
    finally:
        del launch.DEVICES["n1"]
