"""GPU inventory and health through NVML, or through a fake NVML with the same functions.

:class:`Gpus` talks to an NVML *module*: ``pynvml`` on a GPU machine, :class:`FakeNvml` elsewhere.
Both expose the subset of pynvml's functions rota uses, so the inventory and health code below runs
unchanged on either. Faults are injected into the fake through a JSON file (see :class:`FakeNvml`).
"""
from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rota.core.events import GpuInfo

# XIDs that mean the GPU needs attention (NVIDIA's XID catalogue); the text goes into drain reasons.
XID_TEXT = {
    13: "graphics engine exception", 31: "GPU memory page fault", 43: "GPU stopped processing",
    45: "preemptive cleanup", 48: "double bit ECC error", 61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt", 63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure", 74: "NVLink error",
    79: "fell off the bus", 92: "high single-bit ECC error rate", 94: "contained ECC error",
    95: "uncontained ECC error", 119: "GSP RPC timeout", 120: "GSP error",
}
# XIDs caused by the application (a bad kernel), not the hardware: reported, never drained for.
APPLICATION_XIDS = frozenset({13, 31, 43, 45})


@dataclass(frozen=True)
class Fault:
    gpu_index: int | None
    code: str        # "xid:79", "ecc", "lost"
    reason: str      # "gpu 2: xid 79 (fell off the bus)"


class NVMLError(Exception):
    """Raised by :class:`FakeNvml` like pynvml's ``NVMLError``."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_NOT_SUPPORTED = 3


class _Mem:
    def __init__(self, total: int) -> None:
        self.total, self.free, self.used = total, total, 0


class _EventData:
    def __init__(self, device: Any, xid: int) -> None:
        self.device, self.eventData, self.eventType = device, xid, FakeNvml.nvmlEventTypeXidCriticalError


class FakeNvml:
    """A fake NVML module: ``count`` GPUs of one model, faults read from ``faults_file`` on each call.

    The faults file (JSON, any key optional)::

        {"xid": [[2, 79]], "lost": [1], "retired_pending": [3], "count": 3}

    ``xid``: (index, code) events delivered once each; ``lost``: indices whose queries fail with
    GPU_IS_LOST; ``retired_pending``: indices with ECC pages pending retirement; ``count``: how many GPUs
    the driver reports (fewer than installed = a GPU that vanished).
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

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        self._check(handle)
        return f"GPU-{zlib.crc32(f'{self.node}/{handle}'.encode()):08x}-fake-{self.node}-{handle}"

    def nvmlDeviceGetName(self, handle: int) -> str:
        self._check(handle)
        return self.MODELS.get(self.gpu_type, (f"Fake {self.gpu_type.upper()}", 16384))[0]

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> _Mem:
        self._check(handle)
        return _Mem(self.MODELS.get(self.gpu_type, ("", 16384))[1] * 1024 * 1024)

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

    def __init__(self, nvml: Any, gpu_type: str | None = None) -> None:
        self.nvml = nvml
        self.gpu_type = gpu_type
        nvml.nvmlInit()
        self.installed = nvml.nvmlDeviceGetCount()
        self._events = None
        self._xids: dict[int, int] = {}      # GPU index -> last critical XID seen (sticky)
        try:
            self._events = nvml.nvmlEventSetCreate()
            for i in range(self.installed):
                nvml.nvmlDeviceRegisterEvents(nvml.nvmlDeviceGetHandleByIndex(i),
                                              nvml.nvmlEventTypeXidCriticalError, self._events)
        except Exception:  # noqa: BLE001 - event sets are not supported on every GPU/driver
            self._events = None

    def inventory(self) -> list[GpuInfo]:
        """The GPUs the driver reports now (a lost GPU is left out)."""
        out = []
        nvml = self.nvml
        for i in range(nvml.nvmlDeviceGetCount()):
            try:
                h = nvml.nvmlDeviceGetHandleByIndex(i)
                name = _text(nvml.nvmlDeviceGetName(h))
                out.append(GpuInfo(index=i, uuid=_text(nvml.nvmlDeviceGetUUID(h)), model=name,
                                   type=self.gpu_type or model_type(name),
                                   memory=nvml.nvmlDeviceGetMemoryInfo(h).total // (1024 * 1024)))
            except Exception:  # noqa: BLE001 - lost or failing GPU: not part of the inventory
                continue
        return out

    def faults(self) -> list[Fault]:
        """Current hardware faults: critical XIDs seen, GPUs lost or gone, ECC pages pending retirement."""
        nvml = self.nvml
        found: list[Fault] = []
        if self._events is not None:
            while True:
                try:
                    data = nvml.nvmlEventSetWait(self._events, 0)
                except Exception:  # noqa: BLE001 - timeout: no more events
                    break
                xid = int(data.eventData)
                if xid not in APPLICATION_XIDS:
                    self._xids[_index_of(nvml, data.device)] = xid
        for index, xid in sorted(self._xids.items()):
            found.append(Fault(index, f"xid:{xid}", f"gpu {index}: xid {xid} ({XID_TEXT.get(xid, 'critical error')})"))
        count = nvml.nvmlDeviceGetCount()
        if count < self.installed:
            found.append(Fault(None, "lost", f"gpu count dropped from {self.installed} to {count}"))
        for i in range(count):
            if i in self._xids:
                continue
            try:
                h = nvml.nvmlDeviceGetHandleByIndex(i)
                nvml.nvmlDeviceGetUUID(h)
            except Exception:  # noqa: BLE001
                found.append(Fault(i, "lost", f"gpu {i}: lost (not answering the driver)"))
                continue
            try:
                if nvml.nvmlDeviceGetRetiredPagesPendingStatus(h):
                    found.append(Fault(i, "ecc", f"gpu {i}: ECC pages pending retirement (reset needed)"))
            except Exception:  # noqa: BLE001 - not supported on consumer GPUs
                pass
        return found


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
