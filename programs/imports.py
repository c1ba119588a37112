"""What a ``rota`` process imports before anything else.

nats-py imports aiohttp, for a WebSocket transport rota never uses (its servers are ``nats://`` and
``tls://``): one of the costliest imports of every command that reads the log. :func:`nats_without_websockets`
makes nats-py's transport module see aiohttp as missing, as on an install without it; aiohttp itself
stays importable (``rota web`` serves with it)."""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Any, Sequence

_TRANSPORT = "nats.aio.transport"


class _WithoutAiohttp(importlib.abc.Loader):
    """Runs nats-py's transport module with ``import aiohttp`` failing, then lets aiohttp be imported again."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        if "aiohttp" in sys.modules:     # already imported (the web server): nothing to save
            self.inner.exec_module(module)
            return
        sys.modules["aiohttp"] = None    # type: ignore[assignment]  # import system: "not installed"
        try:
            self.inner.exec_module(module)
        finally:
            if sys.modules.get("aiohttp", 0) is None:
                del sys.modules["aiohttp"]


class _TransportFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) \
            -> importlib.machinery.ModuleSpec | None:
        if name != _TRANSPORT:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _WithoutAiohttp(spec.loader)
        return spec


def nats_without_websockets() -> None:
    """Install the finder (once; nothing changes where nats-py's transport is already imported)."""
    if _TRANSPORT not in sys.modules and not any(isinstance(f, _TransportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _TransportFinder())
