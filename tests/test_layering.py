"""The layering rules of docs/architecture.md ("The rooms"), checked on the import graph of src/areal.

- ``areal.host`` (the ground floor: processes, ports, event loops, ...) imports nothing of areal,
  and every room may import it;
- ``areal.core`` (the contracts) imports only ``areal.core`` and ``areal.host``;
- ``areal.run`` imports only ``areal.core``, ``areal.host``, itself and the gateway's torch-free contract
  (``areal.gateway.router_config``, ``areal.gateway.training_flags``): never a plugin (the engine
  and everything else come through the registries), an adapter or the cli; and never torch or
  transformers, not even inside a function (the run is torch-free; its engine brings torch);
- ``areal.gateway`` and ``areal.adapters`` import only ``areal.core``, ``areal.host`` (and
  themselves);
- ``areal.tools`` imports only ``areal.core``, ``areal.host``, ``areal.gateway`` and itself; the
  entry points ``areal.train`` and ``areal.demo`` only ``areal.core``, ``areal.host``,
  ``areal.run`` and ``areal.tools``;
- a plugin ``areal.plugins.X`` imports only ``areal.core``, ``areal.host``,
  ``areal.plugins.models`` and ``X``;
- the light modules (``areal/__init__``, host, core, cli, gateway, adapters, plugins'
  ``register.py``)
  never import torch, transformers or xgrammar at module level, so ``import areal`` and
  ``areal --help`` stay fast;
- no import cycle anywhere in ``areal``, counting imports inside functions and under
  ``if TYPE_CHECKING:`` (a cycle of type-only imports still ties the modules into one knot that
  no reader can take apart);
- a process started from ``areal.run`` (``python -m MODULE``) runs a module of ``areal.run``,
  ``areal.gateway``, an engine plugin (``areal.plugins.inference``, ``areal.plugins.trainer``) or
  ``torch.distributed.run``. (Inference backends name their server modules in their launchers,
  which live in the plugin: those are the plugin's own.)

Imports inside functions count for layering and cycles (they are still dependencies) but not for
weight; imports under ``if TYPE_CHECKING:`` never run: they count for layering and cycles, not
for weight.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
HEAVY = {"torch", "transformers", "xgrammar"}
TORCH_FREE_RUN = {"torch", "transformers"}  # never imported by areal.run, not even lazily
RUN_MAY_IMPORT = (
    "areal.core",
    "areal.host",
    "areal.run",
    "areal.gateway.router_config",
    "areal.gateway.training_flags",
)
NO_CYCLES_IN = ("areal",)
PROCESS_MODULES = ("areal.run", "areal.gateway", "areal.plugins.inference", "areal.plugins.trainer")
PROCESS_EXACT = ("torch.distributed.run",)
HOST = "areal.host imports nothing of areal (every room stands on it)"
CORE = "areal.core (the contracts) may import only areal.core and areal.host"
RUN_ONLY = (
    "areal.run may import only areal.core, areal.host, itself, areal.gateway.router_config and "
    "areal.gateway.training_flags (plugins come through the registries)"
)


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # what it imports, resolved to a module where possible
    line: int
    top_level: bool  # runs when the module is imported
    type_checking: bool = False  # under ``if TYPE_CHECKING:``: never runs


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(path: Path, src: Path, known: set[str]) -> list[Import]:
    """Every import in one file, with relative ones resolved and ``from pkg import mod`` seen."""
    module = module_name(path, src)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, top: bool, typing_only: bool = False) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            top = False
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.body:
                visit(child, False, True)
            for child in node.orelse:
                visit(child, top, typing_only)
            return
        if isinstance(node, ast.Import):
            found.extend(Import(module, a.name, node.lineno, top, typing_only) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                target = sub if sub in known else base
                found.append(Import(module, target, node.lineno, top, typing_only))
        for child in ast.iter_child_nodes(node):
            visit(child, top, typing_only)

    visit(ast.parse(path.read_text(), filename=str(path)), True)
    return found


def within(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def layering_problem(imp: Import) -> str | None:
    """Why this import breaks a layering rule, or None."""
    src, target = imp.module, imp.target
    if (
        within(src, "areal.run")
        and target.split(".")[0] in TORCH_FREE_RUN
        and not imp.type_checking
    ):
        return f"areal.run must never import {target.split('.')[0]} (its engine brings torch)"
    if not within(target, "areal") or target == "areal":
        return None
    if within(src, "areal.host") and not within(target, "areal.host"):
        return HOST
    if within(src, "areal.core") and not within(target, "areal.core", "areal.host"):
        return CORE
    if within(src, "areal.run") and not within(target, *RUN_MAY_IMPORT):
        return RUN_ONLY
    for layer in ("areal.gateway", "areal.adapters"):
        if within(src, layer) and not within(target, "areal.core", "areal.host", layer):
            return f"{layer} may import only areal.core, areal.host and itself"
    if within(src, "areal.tools") and not within(
        target, "areal.core", "areal.host", "areal.gateway", "areal.tools"
    ):
        return "areal.tools may import only areal.core, areal.host, areal.gateway and itself"
    for entry in ("areal.train", "areal.demo"):
        if src == entry and not within(
            target, "areal.core", "areal.host", "areal.run", "areal.tools"
        ):
            return f"{entry} may import only areal.core, areal.host, areal.run and areal.tools"
    if within(src, "areal.plugins") and src.count(".") >= 2:
        own = ".".join(src.split(".")[:3])
        if target != "areal.plugins" and not within(
            target, "areal.core", "areal.host", "areal.plugins.models", own
        ):
            return f"{own} may import only areal.core, areal.host, areal.plugins.models and itself"
    return None


def must_stay_light(module: str) -> bool:
    return (
        module == "areal"
        or within(
            module, "areal.host", "areal.core", "areal.cli", "areal.gateway", "areal.adapters"
        )
        or (within(module, "areal.plugins") and module.endswith(".register"))
    )


def import_cycles(imports: list[Import], package: str) -> list[tuple[Import, list[str]]]:
    """One cycle per strongly connected group of modules inside ``package``, as the import that
    closes it and the path ``[a, b, ..., a]``. Imports inside functions and under TYPE_CHECKING
    count: a module knot is a knot to its reader whether or not the interpreter walks it."""
    edges: dict[str, dict[str, Import]] = {}
    for imp in imports:
        if not within(imp.module, package) or not within(imp.target, package):
            continue
        if imp.module == imp.target:
            continue
        edges.setdefault(imp.module, {}).setdefault(imp.target, imp)
    cycles = []
    done: set[str] = set()
    for start in sorted(edges):
        if start in done:
            continue
        path = _path_back(start, edges)
        if path:
            cycles.append((edges[path[-2]][start], path))
            done.update(path)
    return cycles


def _path_back(start: str, edges: dict[str, dict[str, Import]]) -> list[str] | None:
    """The shortest path start → ... → start, if any (breadth first)."""
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(edges.get(node, {})):
                if target == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if target not in previous:
                    previous[target] = node
                    following.append(target)
        frontier = following
    return None


_MODULE = re.compile(r"^[A-Za-z_]\w*(\.\w+)+$")
_STARTERS = {
    "Child",
    "Popen",
    "run",
    "call",
    "check_call",
    "check_output",
    "create_subprocess_exec",
}


def started_modules(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of each ``python -m MODULE`` a file spells: a ``"-m"`` followed by a
    string in a list or tuple, and a module name given literally to a ``Child`` command (or to
    subprocess) even when a helper builds the command line."""
    found = []
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, (ast.List, ast.Tuple)):
            for flag, value in zip(node.elts, node.elts[1:], strict=False):
                if _const(flag) == "-m" and isinstance(_const(value), str):
                    found.append((value.lineno, str(_const(value))))
        elif isinstance(node, ast.Call) and _called(node) in _STARTERS:
            commands = [kw.value for kw in node.keywords if kw.arg in ("command", "args")]
            if _called(node) != "Child":
                commands += node.args[:1]
            for command in commands:
                for inner in ast.walk(command):
                    text = _const(inner)
                    if isinstance(text, str) and _MODULE.match(text) and _is_module_name(text):
                        found.append((inner.lineno, text))
    return sorted(set(found))


def _const(node: ast.AST) -> object:
    return node.value if isinstance(node, ast.Constant) else None


def _called(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _is_module_name(text: str) -> bool:
    return text.split(".")[0] in {"areal", *HEAVY, "sglang"}


def process_problem(module: str) -> str | None:
    if module in PROCESS_EXACT or within(module, *PROCESS_MODULES):
        return None
    return (
        "a process started from areal.run may run only areal.run, areal.gateway, an engine "
        "plugin (areal.plugins.inference, areal.plugins.trainer) or torch.distributed.run"
    )


def violations(src: Path) -> list[str]:
    files = sorted((src / "areal").rglob("*.py"))
    known = {module_name(f, src) for f in files}
    path_of = {module_name(f, src): f for f in files}
    problems = []
    every: list[Import] = []
    for path in files:
        imports = imports_of(path, src, known)
        every += imports
        for imp in imports:
            where = f"{path.relative_to(src)}:{imp.line} imports {imp.target}"
            reason = layering_problem(imp)
            if reason:
                problems.append(f"{where}: {reason}")
            root = imp.target.split(".")[0]
            if imp.top_level and root in HEAVY and must_stay_light(imp.module):
                problems.append(f"{where} at module level: {imp.module} must not import {root}")
        if within(module_name(path, src), "areal.run"):
            for line, started in started_modules(path):
                reason = process_problem(started)
                if reason:
                    where = f"{path.relative_to(src)}:{line} starts python -m {started}"
                    problems.append(f"{where}: {reason}")
    for package in NO_CYCLES_IN:
        for imp, cycle in import_cycles(every, package):
            where = f"{path_of[imp.module].relative_to(src)}:{imp.line} imports {imp.target}"
            problems.append(f"{where}: import cycle in {package}: {' → '.join(cycle)}")
    return list(dict.fromkeys(problems))  # ``from m import a, b`` breaks a rule once


def test_src_areal_follows_the_layering_rules() -> None:
    assert (SRC / "areal" / "__init__.py").exists()
    problems = violations(SRC)
    assert not problems, "\n".join(problems)


# --- the checker itself, on a small tree that breaks every rule once -----------------------

BAD_TREE = {
    "areal/__init__.py": "import torch\n",
    "areal/core/__init__.py": "",
    "areal/core/kernel.py": "def f():\n    from areal.cli import main\n",
    "areal/core/light.py": (
        "from typing import TYPE_CHECKING\nfrom areal.host import ports\n"
        "if TYPE_CHECKING:\n    import torch\n"
    ),
    "areal/host/__init__.py": "",
    "areal/host/ports.py": "from areal.core import kernel\n",
    "areal/core/runs.py": "from areal.run import loop\nfrom areal.tools import plot\n",
    "areal/cli/__init__.py": "",
    "areal/cli/main.py": "def run():\n    import torch\n",
    "areal/gateway/__init__.py": "from ..plugins.models import llama\n",
    "areal/gateway/router_config.py": "",
    "areal/gateway/a.py": "from areal.gateway import b\n",
    "areal/gateway/b.py": "def f():\n    from areal.gateway.a import g\n",
    "areal/gateway/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import d\n",
    "areal/gateway/d.py": "from areal.gateway import c\n",
    "areal/adapters/__init__.py": "from areal.core import kernel\nfrom areal import gateway\n",
    "areal/adapters/sdk.py": "import torch\n",
    "areal/run/__init__.py": "",
    "areal/run/loop.py": (
        "from areal.core import kernel\nfrom areal.gateway import router_config\n"
        "from areal.plugins.models import llama\n"
    ),
    "areal/run/engine.py": "def f():\n    import torch\n",
    "areal/run/procs.py": (
        "import sys\n"
        'BAD = [sys.executable, "-m", "areal.plugins.models.llama"]\n'
        'OK = [sys.executable, "-m", "torch.distributed.run", "-m", "areal.run.loop"]\n'
        'CHILD = Child(command=lambda: python_module("areal.cli.main"), name="x.y")\n'
        'GATEWAY = Child(command=lambda: [sys.executable, "-m", "areal.gateway.a"])\n'
    ),
    "areal/tools/__init__.py": "",
    "areal/tools/plot.py": "from areal.gateway import a\nfrom areal.run import loop\n",
    "areal/train.py": "from areal.run import loop\nfrom areal.tools import plot\nimport areal.cli\n",
    "areal/plugins/__init__.py": "",
    "areal/plugins/models/__init__.py": "",
    "areal/plugins/models/llama.py": "import torch\n",
    "areal/plugins/losses/__init__.py": "",
    "areal/plugins/losses/register.py": "from areal.plugins.models import llama\nimport xgrammar\n",
    "areal/plugins/losses/ppo.py": "import torch\nfrom .register import x\nfrom ..rewards import y\n",
    "areal/plugins/rewards/__init__.py": "",
    "areal/plugins/trainer/__init__.py": "",
    "areal/plugins/trainer/step.py": "from .engine import build\n",
    "areal/plugins/trainer/engine.py": "from areal.plugins.trainer import step\n",
}

STARTS = (
    "a process started from areal.run may run only areal.run, areal.gateway, an engine plugin "
    "(areal.plugins.inference, areal.plugins.trainer) or torch.distributed.run"
)


def test_the_checker_finds_each_kind_of_violation(tmp_path: Path) -> None:
    for name, code in BAD_TREE.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(code)
    assert sorted(violations(tmp_path)) == sorted(
        [
            "areal/__init__.py:1 imports torch at module level: areal must not import torch",
            "areal/adapters/__init__.py:2 imports areal.gateway: "
            "areal.adapters may import only areal.core, areal.host and itself",
            "areal/adapters/sdk.py:1 imports torch at module level: "
            "areal.adapters.sdk must not import torch",
            f"areal/core/kernel.py:2 imports areal.cli.main: {CORE}",
            f"areal/core/runs.py:1 imports areal.run.loop: {CORE}",
            f"areal/core/runs.py:2 imports areal.tools.plot: {CORE}",
            "areal/gateway/__init__.py:1 imports areal.plugins.models.llama: "
            "areal.gateway may import only areal.core, areal.host and itself",
            "areal/gateway/b.py:2 imports areal.gateway.a: "
            "import cycle in areal: areal.gateway.a → areal.gateway.b → areal.gateway.a",
            "areal/gateway/d.py:1 imports areal.gateway.c: "
            "import cycle in areal: areal.gateway.c → areal.gateway.d → areal.gateway.c",
            f"areal/host/ports.py:1 imports areal.core.kernel: {HOST}",
            f"areal/run/loop.py:3 imports areal.plugins.models.llama: {RUN_ONLY}",
            "areal/run/engine.py:2 imports torch: "
            "areal.run must never import torch (its engine brings torch)",
            f"areal/run/procs.py:2 starts python -m areal.plugins.models.llama: {STARTS}",
            f"areal/run/procs.py:4 starts python -m areal.cli.main: {STARTS}",
            "areal/tools/plot.py:2 imports areal.run.loop: "
            "areal.tools may import only areal.core, areal.host, areal.gateway and itself",
            "areal/train.py:3 imports areal.cli: "
            "areal.train may import only areal.core, areal.host, areal.run and areal.tools",
            "areal/plugins/losses/ppo.py:3 imports areal.plugins.rewards: "
            "areal.plugins.losses may import only areal.core, areal.host, areal.plugins.models "
            "and itself",
            "areal/plugins/losses/register.py:2 imports xgrammar at module level: "
            "areal.plugins.losses.register must not import xgrammar",
            "areal/plugins/trainer/step.py:1 imports areal.plugins.trainer.engine: "
            "import cycle in areal: areal.plugins.trainer.engine → "
            "areal.plugins.trainer.step → areal.plugins.trainer.engine",
        ]
    )


@pytest.mark.parametrize(
    ("module", "light"),
    [
        ("areal", True),
        ("areal.cli.main", True),
        ("areal.plugins.models.register", True),
        ("areal.plugins.models.llama", False),
        ("areal.adapters.openai_sdk", True),
        ("areal.train", False),
    ],
)
def test_which_modules_must_stay_light(module: str, light: bool) -> None:
    assert must_stay_light(module) is light
