"""GPU health by NVIDIA's resolution buckets (pure): what an XID or an NVML reading means for the node.

NVIDIA's Xid catalogue gives each XID an immediate action ("resolution bucket"): ``RESTART_APP`` (the
application's own fault, or one it can recover from by restarting: the GPU is fine), ``IGNORE``,
``RESET_GPU``, ``RESTART_BM`` (reboot the machine), ``CHECK_MECHANICALS`` and ``CONTACT_SUPPORT``. rota
drains a node for the buckets that need an administrator, with the bucket in the reason, and only reports the
others. Memory: a row remap pending (the GPU must be reset to use the spare row) drains for ``RESET_GPU``, a
failed remap for ``CONTACT_SUPPORT``; rows already remapped are the fix working, not a fault. Throttling,
a PCIe link below its maximum and temperature are warnings unless a site asks them to drain.
"""
from __future__ import annotations

from dataclasses import dataclass

RESTART_APP, IGNORE, RESET_GPU = "RESTART_APP", "IGNORE", "RESET_GPU"
RESTART_BM, CHECK_MECHANICALS, CONTACT_SUPPORT = "RESTART_BM", "CHECK_MECHANICALS", "CONTACT_SUPPORT"
DRAINING_ACTIONS = frozenset({RESET_GPU, RESTART_BM, CHECK_MECHANICALS, CONTACT_SUPPORT})

# XID -> (what it is, the catalogue's immediate action), for the XIDs seen on data-centre GPUs
XIDS: dict[int, tuple[str, str]] = {
    8: ("GPU stopped processing", RESTART_APP),
    13: ("graphics engine exception", RESTART_APP),
    31: ("GPU memory page fault", RESTART_APP),
    32: ("invalid or corrupted push buffer stream", RESTART_APP),
    38: ("driver firmware error", RESET_GPU),
    43: ("GPU stopped processing", RESTART_APP),
    45: ("preemptive cleanup, due to previous errors", IGNORE),
    48: ("double bit ECC error", RESET_GPU),
    54: ("auxiliary power is not connected", CHECK_MECHANICALS),
    61: ("internal micro-controller breakpoint", RESET_GPU),
    62: ("internal micro-controller halt", RESET_GPU),
    63: ("ECC page retirement or row remapping recording event", IGNORE),
    64: ("ECC page retirement or row remapper recording failure", RESET_GPU),
    68: ("NVDEC0 exception", RESTART_APP),
    69: ("graphics engine class error", RESTART_APP),
    74: ("NVLink error", RESET_GPU),
    79: ("fell off the bus", RESTART_BM),
    92: ("high single-bit ECC error rate", RESET_GPU),
    94: ("contained ECC error", RESET_GPU),
    95: ("uncontained ECC error", RESET_GPU),
    109: ("context switch timeout", RESTART_APP),
    119: ("GSP RPC timeout", RESET_GPU),
    120: ("GSP error", RESET_GPU),
    121: ("C2C link corrected error", IGNORE),
    140: ("unrecovered ECC error", RESET_GPU),
}
# the XIDs after which the GPU is gone from under its job: the job is ended (requeued where it allows)
GPU_GONE = frozenset({79})


@dataclass(frozen=True, slots=True)
class Finding:
    """What one reading means: its code ("xid:79", "remap:pending", "throttle", "pcie", "temp"), the reason an
    administrator reads, the bucket's action, and whether the node drains for it."""

    gpu_index: int | None
    code: str
    reason: str
    action: str
    drains: bool


def xid(index: int, code: int) -> Finding:
    """An XID seen on GPU ``index``; one the catalogue here does not name is for NVIDIA's support."""
    text, action = XIDS.get(code, ("critical error", CONTACT_SUPPORT))
    return Finding(index, f"xid:{code}", f"gpu {index}: xid {code} ({text}): {action}", action,
                   action in DRAINING_ACTIONS)


def remapped_rows(index: int, pending: bool, failed: bool) -> Finding | None:
    """Row remapping: a remap that failed, or one pending a GPU reset, drains; rows already remapped do not."""
    if failed:
        return Finding(index, "remap:failed", f"gpu {index}: row remapping failed: {CONTACT_SUPPORT}",
                       CONTACT_SUPPORT, True)
    if pending:
        return Finding(index, "remap:pending", f"gpu {index}: row remap pending (an ECC error): {RESET_GPU}",
                       RESET_GPU, True)
    return None


# NVML's clock event reasons that mean the hardware is slowing the GPU (not the application's own clocks)
THROTTLES = {0x8: "hardware slowdown", 0x20: "software thermal slowdown", 0x40: "hardware thermal slowdown",
             0x80: "power brake slowdown"}


def warnings(index: int, throttle: int, link: tuple[int, int, int, int] | None, temp: int | None,
             max_temp: int, drain: frozenset[str] = frozenset()) -> list[Finding]:
    """Throttling (NVML's reasons bitmask), a PCIe link (generation, width, max generation, max width) below its
    maximum, a temperature at or over ``max_temp``: warnings, or drains for the kinds named in ``drain``
    ("throttle", "pcie", "temp")."""
    out = []
    slow = [text for bit, text in THROTTLES.items() if throttle & bit]
    if slow:
        out.append(("throttle", f"gpu {index}: throttled ({', '.join(slow)})"))
    if link is not None and (link[0] < link[2] or link[1] < link[3]):
        out.append(("pcie", f"gpu {index}: PCIe link gen{link[0]} x{link[1]}, below its gen{link[2]} x{link[3]}"))
    if temp is not None and temp >= max_temp:
        out.append(("temp", f"gpu {index}: temperature {temp} C (limit {max_temp} C)"))
    return [Finding(index, code, f"{text}: {CHECK_MECHANICALS}", CHECK_MECHANICALS, code in drain)
            for code, text in out]


def gpu_gone(code: str) -> bool:
    """Whether a fault of ``code`` took the GPU from under its job (it fell off the bus, the driver lost it)."""
    return code == "lost" or code in {f"xid:{x}" for x in GPU_GONE}


def lost(index: int | None, text: str) -> Finding:
    """A GPU the driver no longer answers for (or fewer GPUs than installed): the machine needs a restart."""
    return Finding(index, "lost", f"{text}: {RESTART_BM}", RESTART_BM, True)
