"""The folders depend on each other in one direction only (no cycles): core at the bottom, then wire
(what crosses processes and hosts), then the three parts (controller, agents, projections), each on its
own, then cli (the user's commands), client (the Python API) over it, and programs on top: the processes
rota runs as, each put together from the parts. bench measures anything.

An edge is an import, or a module named in a string (``python -m rota.x.y``, ``import_module``): a process
started by module name depends on that module as much as an import does."""
import ast
import re
from pathlib import Path

import rota.core
import pytest

pytestmark = pytest.mark.fast    # make test-fast: the core and the front door, no process started

ROOT = Path(rota.core.__file__).resolve().parent.parent
ALLOWED = {
    "core": set(),
    "wire": {"core"},
    "controller": {"core", "wire"},
    "agents": {"core", "wire"},
    "projections": {"core", "wire"},
    "cli": {"core", "wire", "controller", "agents", "projections"},
    "client": {"core", "wire", "cli"},
    "web": {"core", "wire", "controller", "projections", "cli"},
    "programs": {"core", "wire", "controller", "agents", "projections", "cli", "client", "web"},
    "bench": {"core", "wire", "controller", "agents", "projections", "cli", "client", "programs", "web"},
}
MODULE_NAME = re.compile(r"\brota\.([a-z_]+)\.")


def edges_in(source: str, folder: str) -> set[str]:
    """The other rota folders one module's source imports (at any depth) or names as a module in a string
    that is not a docstring."""
    tree = ast.parse(source)
    docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    found = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            names = [f"rota.{m}" for m in MODULE_NAME.findall(node.value)]
        for name in names:
            parts = name.split(".")
            if parts[0] == "rota" and len(parts) > 1 and parts[1] != folder and parts[1] in ALLOWED:
                found.add(parts[1])
    return found


def imports_of(folder: str) -> dict[str, set[str]]:
    """For each file of ``folder``, the other rota folders it depends on."""
    return {f"{folder}/{path.name}": edges_in(path.read_text(), folder) for path in sorted((ROOT / folder).glob("*.py"))}


def test_each_folder_imports_only_the_layers_below_it():
    bad = [f"{path} imports rota.{other}" for folder, allowed in ALLOWED.items()
           for path, found in imports_of(folder).items() for other in sorted(found - allowed)]
    assert not bad, "layering broken:\n" + "\n".join(bad)


def test_the_checker_sees_imports_inside_functions_and_programs_started_by_module_name():
    assert edges_in("def f():\n    from rota.cli import sbatch\n", "agents") == {"cli"}
    started = 'import subprocess\nsubprocess.Popen(["python", "-m", "rota.programs.commandserver", "x"])\n'
    assert edges_in(started, "agents") == {"programs"}
    assert edges_in('name = "x"\nf"rota.cli.{name}"\n', "wire") == {"cli"}
    assert edges_in('"""See rota.cli.main."""\nlog = "rota.agent.steps"\n', "core") == set()
    assert set(ALLOWED) == {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists() and p.name != "tests"}


def long_functions(folder: str, limit: int = 60) -> list[str]:
    """Functions of ``folder`` longer than ``limit`` lines, as 'folder/file.py:name (n lines)'."""
    out = []
    for path in sorted((ROOT / folder).glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > limit:
                    out.append(f"{folder}/{path.name}:{node.name} ({n} lines)")
    return out


# functions allowed past 60 lines, each with why ("folder/file.py:name" -> why); keep it short
LONG_ALLOWED: dict[str, str] = {}


def test_every_function_is_short_and_the_controller_made_of_small_files():
    long = [f for folder in ALLOWED for f in long_functions(folder) if f.split(" (")[0] not in LONG_ALLOWED]
    assert not long, long
    big = [p.name for p in (ROOT / "controller").glob("*.py") if len(p.read_text().splitlines()) > 400]
    assert not big, big
    assert long_functions("core", limit=20)    # the checker finds long functions where there are some


def test_the_controllers_parts_take_its_typed_port():
    """Every handler, view and loop that is handed the controller names its port's type, never Any."""
    untyped = []
    for path in sorted((ROOT / "controller").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for arg in node.args.args:
                    if arg.arg in ("c", "controller") and ast.unparse(arg.annotation or ast.Name("?")) != "ControllerPort":
                        untyped.append(f"controller/{path.name}:{node.lineno} {node.name}({arg.arg})")
    assert not untyped, untyped
