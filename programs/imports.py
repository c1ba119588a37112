"""What a ``rota`` process imports before anything else.

nats-py imports aiohttp, for a WebSocket transport rota never uses (its servers are ``nats://`` and
``tls://``): one of the costliest imports of every command that reads the log. :func:`nats_without_websockets`
makes nats-py's transport module see aiohttp as missing, as on an install without it; aiohttp itself
stays importable (``rota web`` serves with it).

pydantic looks for plugins (packages naming a ``pydantic`` entry point) when it builds its first model,
importing ``importlib.metadata`` and reading every installed package's metadata to find them: a fifth of what
importing rota's events costs. rota uses no pydantic plugin, and its processes (root's among them) run no code
an installed package merely announces: :func:`pydantic_without_plugins` makes pydantic find none."""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Any, Sequence

_TRANSPORT = "nats.aio.transport"
_PLUGIN_LOADER = "pydantic.plugin._loader"


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


class _NoPlugins(importlib.abc.Loader):
    """pydantic's plugin loader, as it is with no plugin installed (its one name that pydantic imports)."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        module.get_plugins = _no_plugins    # type: ignore[attr-defined]


def _no_plugins() -> tuple[()]:
    return ()


class _PluginLoaderFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) \
            -> importlib.machinery.ModuleSpec | None:
        if name != _PLUGIN_LOADER or importlib.machinery.PathFinder.find_spec(name, path) is None:
            return None
        return importlib.machinery.ModuleSpec(name, _NoPlugins())


def pydantic_without_plugins() -> None:
    """Install the finder (once; nothing changes where pydantic has already loaded its plugins)."""
    if _PLUGIN_LOADER not in sys.modules and not any(isinstance(f, _PluginLoaderFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PluginLoaderFinder())


def nats_without_websockets() -> None:
    """Install the finder (once; nothing changes where nats-py's transport is already imported)."""
    if _TRANSPORT not in sys.modules and not any(isinstance(f, _TransportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _TransportFinder())
