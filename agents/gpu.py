"""GPU inventory and health through NVML, or through a fake NVML with the same functions.

:class:`Gpus` talks to an NVML *module*: ``pynvml`` on a GPU machine, :class:`FakeNvml` elsewhere.
Both expose the subset of pynvml's functions rota uses, so the inventory and health code below runs
unchanged on either. Faults are injected into the fake through a JSON file (see :class:`FakeNvml`).
"""
from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import Any

from rota.core import gpuhealth
from rota.core.events import GpuInfo
from rota.core.gpuhealth import Finding

class NVMLError(Exception):
    """Raised by :class:`FakeNvml` like pynvml's ``NVMLError``."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6


class _Mem:
    def __init__(self, total: int) -> None:
        self.total, self.free, self.used = total, total, 0


class _Util:
    def __init__(self, gpu: int) -> None:
        self.gpu, self.memory = gpu, 0


class _EventData:
    def __init__(self, device: Any, xid: int) -> None:
        self.device, self.eventData, self.eventType = device, xid, FakeNvml.nvmlEventTypeXidCriticalError


class FakeNvml:
    """A fake NVML module: ``count`` GPUs of one model, faults read from ``faults_file`` on each call.

    The faults file (JSON, any key optional; GPU indices as strings where they are keys)::

        {"xid": [[2, 79]], "lost": [1], "retired_pending": [3], "count": 3,
         "remap": {"0": "pending", "1": "failed", "2": "corrected"}, "throttle": {"0": 64},
         "pcie": {"1": [3, 8]}, "temp": {"2": 91}, "util": {"0": 0}, "mem_used": {"0": 512},
         "mig": {"0": ["3g.40gb", "1g.10gb"]}}

    ``xid``: (index, code) events delivered once each; ``lost``: indices whose queries fail with
    GPU_IS_LOST; ``retired_pending``: indices with ECC pages pending retirement; ``count``: how many GPUs
    the driver reports (fewer than installed = a GPU that vanished); ``remap``: a row remap pending, failed
    or done; ``throttle``: NVML's clock event reasons bitmask; ``pcie``: the link's current generation and
    width (the maximum is gen4 x16); ``temp``: degrees C (40 otherwise); ``util`` and ``mem_used``: the GPU's
    utilisation in percent (100 otherwise) and memory in use in MiB; ``mig``: GPUs in MIG mode and the profiles
    of their instances.
    """

    NVMLError = NVMLError
    NVML_ERROR_GPU_IS_LOST = NVML_ERROR_GPU_IS_LOST
    NVML_ERROR_TIMEOUT = NVML_ERROR_TIMEOUT
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    nvmlEventTypeXidCriticalError = 8

    MODELS = {"a100": ("NVIDIA A100-SXM4-80GB", 81920), "h100": ("NVIDIA H100 80GB HBM3", 81559),
              "v100": ("Tesla V100-SXM2-32GB", 32768), "l4": ("NVIDIA L4", 23034)}

    def __init__(self, gpu_type: str, count: int, faults_file: str | os.PathLike | None = None,
                 node: str = "fake") -> None:
        self.gpu_type, self.count, self.node = gpu_type, count, node
        self.faults_file = Path(faults_file) if faults_file else None
        self._delivered: set[tuple[int, int]] = set()

    def _faults(self) -> dict:
        if self.faults_file is None:
            return {}
        try:
            data = json.loads(self.faults_file.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    # --- the pynvml functions rota uses
    def nvmlInit(self) -> None:
        return None

    def nvmlShutdown(self) -> None:
        return None

    def nvmlSystemGetDriverVersion(self) -> str:
        return "fake-550.0"

    def nvmlDeviceGetCount(self) -> int:
        return int(self._faults().get("count", self.count))

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index >= self.nvmlDeviceGetCount():
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return index

    def _check(self, handle: int) -> None:
        if handle in self._faults().get("lost", []):
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        if isinstance(handle, tuple):          # a MIG instance: (its GPU, its index)
            return f"MIG-{zlib.crc32(f'{self.node}/{handle[0]}/{handle[1]}'.encode()):08x}-fake-{handle[0]}-{handle[1]}"
        self._check(handle)
        return f"GPU-{zlib.crc32(f'{self.node}/{handle}'.encode()):08x}-fake-{self.node}-{handle}"

    def nvmlDeviceGetName(self, handle: Any) -> str:
        if isinstance(handle, tuple):
            return f"{self.nvmlDeviceGetName(handle[0])} MIG {self._migs(handle[0])[handle[1]]}"
        self._check(handle)
        return self.MODELS.get(self.gpu_type, (f"Fake {self.gpu_type.upper()}", 16384))[0]

    def _migs(self, handle: int) -> list[str]:
        return list(self._knob("mig", handle, []))

    def nvmlDeviceGetMigMode(self, handle: int) -> list[int]:
        self._check(handle)
        on = int(bool(self._migs(handle)))
        return [on, on]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: int) -> int:
        return 7 if self._migs(handle) else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: int, index: int) -> tuple[int, int]:
        if index >= len(self._migs(handle)):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return (handle, index)

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> _Mem:
        if isinstance(handle, tuple):
            gb = self._migs(handle[0])[handle[1]].split(".")[-1].rstrip("gb")
            return _Mem(int(gb) * 1024 * 1024 * 1024 if gb.isdecimal() else 0)
        self._check(handle)
        mem = _Mem(self.MODELS.get(self.gpu_type, ("", 16384))[1] * 1024 * 1024)
        mem.used = int(self._knob("mem_used", handle, 0)) * 1024 * 1024
        mem.free = mem.total - mem.used
        return mem

    def _knob(self, name: str, handle: int, default: Any) -> Any:
        value = self._faults().get(name, {})
        return value.get(str(handle), default) if isinstance(value, dict) else default

    def nvmlDeviceGetRemappedRows(self, handle: int) -> tuple[int, int, int, int]:
        self._check(handle)
        kind = self._knob("remap", handle, "")
        return (1 if kind == "corrected" else 0, 1 if kind in ("pending", "failed") else 0, int(kind == "pending"),
                int(kind == "failed"))

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: int) -> int:
        self._check(handle)
        return int(self._knob("throttle", handle, 0))

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: int) -> int:
        return int(self._knob("pcie", handle, [4, 16])[0])

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: int) -> int:
        return int(self._knob("pcie", handle, [4, 16])[1])

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: int) -> int:
        return 4

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: int) -> int:
        return 16

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        self._check(handle)
        return int(self._knob("temp", handle, 40))

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> _Util:
        self._check(handle)
        return _Util(int(self._knob("util", handle, 100)))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: int) -> int:
        self._check(handle)
        return 1 if handle in self._faults().get("retired_pending", []) else 0

    def nvmlEventSetCreate(self) -> list:
        return []

    def nvmlDeviceRegisterEvents(self, handle: int, types: int, event_set: list) -> None:
        event_set.append(handle)

    def nvmlEventSetWait(self, event_set: list, timeout_ms: int) -> _EventData:
        for index, code in self._faults().get("xid", []):
            if (index, code) not in self._delivered and index in event_set:
                self._delivered.add((index, code))
                return _EventData(index, code)
        raise NVMLError(NVML_ERROR_TIMEOUT)


class Gpus:
    """Inventory and health checks over an NVML module (pynvml or :class:`FakeNvml`)."""

    def __init__(self, nvml: Any, gpu_type: str | None = None, max_temp: int = 90,
                 drain_on: frozenset[str] = frozenset()) -> None:
        """``max_temp``: degrees C at which a GPU is reported; ``drain_on``: the warnings that drain instead
        ("throttle", "pcie", "temp")."""
        self.nvml = nvml
        self.gpu_type = gpu_type
        self.max_temp, self.drain_on = max_temp, drain_on
        nvml.nvmlInit()
        self.installed = nvml.nvmlDeviceGetCount()
        self._events = None
        self._xids: dict[int, int] = {}      # GPU index -> last XID seen that drains (sticky)
        try:
            self._events = nvml.nvmlEventSetCreate()
            for i in range(self.installed):
                nvml.nvmlDeviceRegisterEvents(nvml.nvmlDeviceGetHandleByIndex(i),
                                              nvml.nvmlEventTypeXidCriticalError, self._events)
        except Exception:  # noqa: BLE001 - event sets are not supported on every GPU/driver
            self._events = None

    def inventory(self) -> list[GpuInfo]:
        """The GPUs the driver reports now (a lost GPU is left out), a GPU in MIG mode as its instances, each a GPU
        slot typed by its profile ("1g.10gb"), as a node's ``Gres=gpu:1g.10gb:N`` names them."""
        out: list[GpuInfo] = []
        nvml = self.nvml
        for i in range(nvml.nvmlDeviceGetCount()):
            try:
                h = nvml.nvmlDeviceGetHandleByIndex(i)
                migs = _mig_instances(nvml, h)
                for d in migs or [h]:
                    name = _text(nvml.nvmlDeviceGetName(d))
                    kind = name.rsplit(" MIG ", 1)[1] if migs else self.gpu_type or model_type(name)
                    out.append(GpuInfo(index=len(out), uuid=_text(nvml.nvmlDeviceGetUUID(d)), model=name, type=kind,
                                       memory=nvml.nvmlDeviceGetMemoryInfo(d).total // (1024 * 1024)))
            except Exception:  # noqa: BLE001 - lost or failing GPU: not part of the inventory
                continue
        return out

    def faults(self) -> list[Finding]:
        """What NVML says now, by NVIDIA's resolution buckets (rota.core.gpuhealth): critical XIDs (sticky: they
        stay until the node is resumed and the agent restarted), GPUs lost or gone, row remaps, and warnings
        (throttling, PCIe link, temperature). An application's XID is returned once."""
        nvml = self.nvml
        found: list[Finding] = []
        for index, code in self._new_xids():
            finding = gpuhealth.xid(index, code)
            if finding.drains:
                self._xids[index] = code
            else:
                found.append(finding)
        found.extend(gpuhealth.xid(index, code) for index, code in sorted(self._xids.items()))
        count = nvml.nvmlDeviceGetCount()
        if count < self.installed:
            found.append(gpuhealth.lost(None, f"gpu count dropped from {self.installed} to {count}"))
        for i in range(count):
            if i in self._xids:
                continue
            try:
                h = nvml.nvmlDeviceGetHandleByIndex(i)
                nvml.nvmlDeviceGetUUID(h)
            except Exception:  # noqa: BLE001
                found.append(gpuhealth.lost(i, f"gpu {i}: lost (not answering the driver)"))
                continue
            found.extend(self._memory(i, h))
            found.extend(gpuhealth.warnings(i, _optional(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", h) or 0,
                                            _link(nvml, h), _optional(nvml, "nvmlDeviceGetTemperature", h, 0),
                                            self.max_temp, self.drain_on))
        return found

    def _new_xids(self) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        if self._events is None:
            return out
        while True:
            try:
                data = self.nvml.nvmlEventSetWait(self._events, 0)
            except Exception:  # noqa: BLE001 - timeout: no more events
                return out
            out.append((_index_of(self.nvml, data.device), int(data.eventData)))

    def _memory(self, i: int, h: Any) -> list[Finding]:
        """Row remapping (Ampere and later), else ECC pages pending retirement (older GPUs)."""
        rows = _optional(self.nvml, "nvmlDeviceGetRemappedRows", h)
        if rows is not None:
            finding = gpuhealth.remapped_rows(i, bool(rows[2]), bool(rows[3]))
            return [finding] if finding is not None else []
        if _optional(self.nvml, "nvmlDeviceGetRetiredPagesPendingStatus", h):
            return [Finding(i, "ecc", f"gpu {i}: ECC pages pending retirement: {gpuhealth.RESET_GPU}",
                            gpuhealth.RESET_GPU, True)]
        return []

    def utilisation(self, index: int) -> tuple[int, int] | None:
        """GPU ``index``'s utilisation (percent) and memory in use (MiB); None when NVML cannot say."""
        try:
            h = self.nvml.nvmlDeviceGetHandleByIndex(index)
            return (int(self.nvml.nvmlDeviceGetUtilizationRates(h).gpu),
                    int(self.nvml.nvmlDeviceGetMemoryInfo(h).used) // (1024 * 1024))
        except Exception:  # noqa: BLE001 - lost, or not supported
            return None


def _mig_instances(nvml: Any, h: Any) -> list[Any]:
    """The MIG instances of a GPU in MIG mode (none otherwise, or where the driver has no MIG)."""
    mode = _optional(nvml, "nvmlDeviceGetMigMode", h)
    if not mode or not mode[0]:
        return []
    out = []
    for k in range(_optional(nvml, "nvmlDeviceGetMaxMigDeviceCount", h) or 0):
        d = _optional(nvml, "nvmlDeviceGetMigDeviceHandleByIndex", h, k)
        if d is not None:
            out.append(d)
    return out


def _optional(nvml: Any, name: str, *args: Any) -> Any:
    """An NVML query that a GPU or driver may not support: None then."""
    try:
        return getattr(nvml, name)(*args)
    except Exception:  # noqa: BLE001
        return None


def _link(nvml: Any, h: Any) -> tuple[int, int, int, int] | None:
    values = [_optional(nvml, f"nvmlDevice{name}", h) for name in ("GetCurrPcieLinkGeneration", "GetCurrPcieLinkWidth",
                                                                   "GetMaxPcieLinkGeneration", "GetMaxPcieLinkWidth")]
    return None if None in values else (values[0], values[1], values[2], values[3])


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _index_of(nvml: Any, device: Any) -> int:
    if isinstance(device, int):
        return device
    try:
        return int(nvml.nvmlDeviceGetIndex(device))
    except Exception:  # noqa: BLE001
        return -1


def model_type(name: str) -> str:
    """A Gres type from an NVML model name: "NVIDIA A100-SXM4-80GB" -> "a100"."""
    for word in name.lower().replace("-", " ").split():
        if word in ("nvidia", "tesla", "geforce", "rtx", "quadro"):
            continue
        return word
    return "gpu"


def open_gpus(fake: str | None = None, faults_file: str | os.PathLike | None = None,
              node: str = "fake") -> tuple[Gpus | None, str]:
    """GPUs from ``--fake-gpus TYPE:N``, else from pynvml; returns (gpus or None, how they were found)."""
    if fake:
        gtype, _, n = fake.partition(":")
        if not gtype or not n.isdecimal():
            raise ValueError(f"--fake-gpus {fake!r}: expected TYPE:COUNT, e.g. a100:4")
        return Gpus(FakeNvml(gtype, int(n), faults_file, node), gtype), f"fake NVML: {n} x {gtype}"
    try:
        import pynvml

        gpus = Gpus(pynvml)
        return gpus, f"NVML: {gpus.installed} GPU(s)"
    except Exception as exc:  # noqa: BLE001 - no driver / no GPU
        return None, f"no GPUs (NVML unavailable: {type(exc).__name__})"
