"""rota.core stays pure: no I/O, clock, randomness or service libraries (ARCHITECTURE.md, "The floors")."""
import ast
from pathlib import Path

import pkgutil

import rota.core
import pytest

pytestmark = pytest.mark.fast    # make test-fast: the core and the front door, no process started

CORE = Path(rota.core.__file__).parent
FORBIDDEN_MODULES = {"asyncio", "nats", "aiosqlite", "pyarrow", "typer", "time", "random", "os",
                     "socket", "subprocess", "threading", "datetime", "pathlib", "io", "sqlite3",
                     "pynvml", "rich", "uuid", "secrets", "shutil", "tempfile"}
FORBIDDEN_CALLS = {"open", "print", "input", "hash"}
# hash() differs from process to process; the spec pool keys by it only to find a candidate, which must then be
# equal (test_sharing: specs whose keys collide stay apart), so no result depends on its value
ALLOWED_CALLS = {"sharing.py": {"hash"}}


def core_files():
    return sorted(CORE.glob("*.py"))


def impurities(source: str, filename: str) -> list[str]:
    """Forbidden imports and calls in one module's source."""
    bad = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for n in names:
            if n.split(".")[0] in FORBIDDEN_MODULES:
                bad.append(f"{filename}:{node.lineno} imports {n}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FORBIDDEN_CALLS \
                and node.func.id not in ALLOWED_CALLS.get(filename, ()):
            bad.append(f"{filename}:{node.lineno} calls {node.func.id}()")
    return bad


def test_core_imports_nothing_impure():
    bad = [b for path in core_files() for b in impurities(path.read_text(), path.name)]
    assert not bad, "impure code in rota.core:\n" + "\n".join(bad)


def test_the_checker_catches_impure_code():
    sample = "import time\nfrom asyncio import sleep\nimport os.path\nopen('x')\n"
    assert len(impurities(sample, "x.py")) == 4
    assert impurities("from . import events\nimport json\n", "y.py") == []


def test_public_api_is_honest():
    for name in rota.core.__all__:
        assert hasattr(rota.core, name), name
    public = {n for n in dir(rota.core) if not n.startswith("_")}
    modules = {m.name for m in pkgutil.iter_modules(rota.core.__path__)}
    assert public - modules - {"annotations"} <= set(rota.core.__all__)
