"""The layering rules of DESIGN.md §1, checked on the import graph of src/areal.

- ``areal.core`` imports nothing from plugins, gateway, adapters or cli;
- ``areal.gateway`` and ``areal.adapters`` import only ``areal.core`` (and themselves);
- a plugin ``areal.plugins.X`` imports only ``areal.core``, ``areal.plugins.models`` and ``X``;
- the light modules (``areal/__init__``, core, cli, gateway, plugins' ``register.py``) never
  import torch, transformers or xgrammar at module level, so ``import areal`` and
  ``areal --help`` stay fast.

Imports inside functions count for layering (they are still dependencies) but not for weight.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
HEAVY = {"torch", "transformers", "xgrammar"}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # what it imports, resolved to a module where possible
    line: int
    top_level: bool  # runs when the module is imported


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

    def visit(node: ast.AST, top: bool) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            top = False
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.body:
                visit(child, False)
            for child in node.orelse:
                visit(child, top)
            return
        if isinstance(node, ast.Import):
            found.extend(Import(module, a.name, node.lineno, top) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append(Import(module, sub if sub in known else base, node.lineno, top))
        for child in ast.iter_child_nodes(node):
            visit(child, top)

    visit(ast.parse(path.read_text(), filename=str(path)), True)
    return found


def within(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def layering_problem(imp: Import) -> str | None:
    """Why this import breaks a layering rule, or None."""
    src, target = imp.module, imp.target
    if not within(target, "areal") or target == "areal":
        return None
    if within(src, "areal.core") and within(
        target, "areal.plugins", "areal.gateway", "areal.adapters", "areal.cli"
    ):
        return "areal.core must not import plugins, gateway, adapters or cli"
    for layer in ("areal.gateway", "areal.adapters"):
        if within(src, layer) and not within(target, "areal.core", layer):
            return f"{layer} may import only areal.core and itself"
    if within(src, "areal.plugins") and src.count(".") >= 2:
        own = ".".join(src.split(".")[:3])
        if target != "areal.plugins" and not within(
            target, "areal.core", "areal.plugins.models", own
        ):
            return f"{own} may import only areal.core, areal.plugins.models and itself"
    return None


def must_stay_light(module: str) -> bool:
    return (
        module == "areal"
        or within(module, "areal.core", "areal.cli", "areal.gateway")
        or (within(module, "areal.plugins") and module.endswith(".register"))
    )


def violations(src: Path) -> list[str]:
    files = sorted((src / "areal").rglob("*.py"))
    known = {module_name(f, src) for f in files}
    problems = []
    for path in files:
        for imp in imports_of(path, src, known):
            where = f"{path.relative_to(src)}:{imp.line} imports {imp.target}"
            reason = layering_problem(imp)
            if reason:
                problems.append(f"{where}: {reason}")
            root = imp.target.split(".")[0]
            if imp.top_level and root in HEAVY and must_stay_light(imp.module):
                problems.append(f"{where} at module level: {imp.module} must not import {root}")
    return problems


def test_src_areal_follows_the_layering_rules() -> None:
    assert (SRC / "areal" / "__init__.py").exists()
    problems = violations(SRC)
    assert not problems, "\n".join(problems)


# --- the checker itself, on a small tree that breaks every rule once -----------------------

BAD_TREE = {
    "areal/__init__.py": "import torch\n",
    "areal/core/__init__.py": "",
    "areal/core/kernel.py": "def f():\n    from areal.cli import main\n",
    "areal/core/light.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n",
    "areal/cli/__init__.py": "",
    "areal/cli/main.py": "def run():\n    import torch\n",
    "areal/gateway/__init__.py": "from ..plugins.models import llama\n",
    "areal/adapters/__init__.py": "from areal.core import kernel\nfrom areal import gateway\n",
    "areal/plugins/__init__.py": "",
    "areal/plugins/models/__init__.py": "",
    "areal/plugins/models/llama.py": "import torch\n",
    "areal/plugins/losses/__init__.py": "",
    "areal/plugins/losses/register.py": "from areal.plugins.models import llama\nimport xgrammar\n",
    "areal/plugins/losses/ppo.py": "import torch\nfrom .register import x\nfrom ..rewards import y\n",
    "areal/plugins/rewards/__init__.py": "",
}


def test_the_checker_finds_each_kind_of_violation(tmp_path: Path) -> None:
    for name, code in BAD_TREE.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(code)
    found = sorted(p.split(" imports ")[0] + " " + p.split(": ")[-1] for p in violations(tmp_path))
    assert found == sorted(
        [
            "areal/__init__.py:1 areal must not import torch",
            "areal/adapters/__init__.py:2 areal.adapters may import only areal.core and itself",
            "areal/core/kernel.py:2 areal.core must not import plugins, gateway, adapters or cli",
            "areal/gateway/__init__.py:1 areal.gateway may import only areal.core and itself",
            "areal/plugins/losses/ppo.py:3 "
            "areal.plugins.losses may import only areal.core, areal.plugins.models and itself",
            "areal/plugins/losses/register.py:2 areal.plugins.losses.register must not import xgrammar",
        ]
    )


@pytest.mark.parametrize(
    ("module", "light"),
    [
        ("areal", True),
        ("areal.cli.main", True),
        ("areal.plugins.models.register", True),
        ("areal.plugins.models.llama", False),
        ("areal.train", False),
    ],
)
def test_which_modules_must_stay_light(module: str, light: bool) -> None:
    assert must_stay_light(module) is light
