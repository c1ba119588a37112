"""Building the native thin client (``cli/native/rota_command.c``) and linking it under the hot commands'
names, and the agents' launch helper (``agents/native/rota_exec.c``), where a C compiler is present:
``rota install-commands`` (``make`` runs it)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

from rota.agents import launch

from rota.cli import thin
from rota.cli.thin import COMMANDS as THIN_COMMANDS

SOURCE = Path(thin.__file__).resolve().parent / "native" / "rota_command.c"
EXEC_SOURCE = Path(launch.__file__).resolve().parent / "native" / "rota_exec.c"


class NoCompiler(Exception):
    """No C compiler here: the commands stay the Python entry points (the same thin path, slower to start)."""


def compile_client(out: Path, python: str = sys.executable) -> Path:
    """Compile the client to ``out``; when no server runs it falls back to ``python -m rota.cli.NAME``."""
    return compile_native(SOURCE, out, f'-DROTA_PYTHON="{python}"')


def compile_native(source: Path, out: Path, *defines: str) -> Path:
    """Compile one C file with no dependencies to the program ``out`` (replaced in one rename)."""
    cc = shutil.which(os.environ.get("CC") or "cc")
    if cc is None:
        raise NoCompiler("no C compiler (cc) found: the commands stay the Python entry points")
    def build(tmp: Path) -> None:
        subprocess.run([cc, "-O2", "-Wall", "-Werror", *defines, "-o", str(tmp), str(source)],
                       check=True, capture_output=True, text=True)
        tmp.chmod(0o755)
    _swap_in(out, build)
    return out


# the Python entry points install-commands rewrites as isolated launchers: (module, function)
ENTRY_POINTS = {"rota": ("rota.programs.entry", "main"), **{name: ("rota.cli.thin", name) for name in THIN_COMMANDS}}


def isolate_scripts(bin_dir: Path, names: tuple[str, ...], python: str = sys.executable) -> list[str]:
    """Write the entry points ``names`` into ``bin_dir`` as launchers run by ``python -I`` (absolute): pip's own
    honour PYTHONPATH and the user's site folder, which must never choose what a root's command imports."""
    for name in names:
        module, function = ENTRY_POINTS[name]

        def write(tmp: Path, module: str = module, function: str = function) -> None:
            tmp.write_text(f"#!{os.path.abspath(python)} -I\nfrom {module} import {function}\n\n{function}()\n")
            tmp.chmod(0o755)
        _swap_in(bin_dir / name, write)
    return list(names)


def _swap_in(path: Path, make: Callable[[Path], None]) -> None:
    """Replace ``path`` in one rename with what ``make`` puts at a temporary name beside it."""
    tmp = path.with_name(f".{path.name}.new")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    make(tmp)
    os.replace(tmp, path)


def install(bin_dir: Path, names: tuple[str, ...] = THIN_COMMANDS) -> list[str]:
    """Compile the client into ``bin_dir`` and link each command name to it (replacing what is there,
    one atomic rename each), and compile the agents' launch helper beside it; returns the names linked."""
    client = compile_client(bin_dir / "rota-command")
    compile_native(EXEC_SOURCE, bin_dir / launch.EXEC_HELPER)
    for name in names:
        _swap_in(bin_dir / name, lambda tmp: tmp.symlink_to(client.name))
    return list(names)
