"""Meta-tests that keep the plugin surface honest: every hook is documented and tested."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from areal.core import hookspecs

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "plugins.md"


def hookspec_functions() -> dict[str, object]:
    marker = f"{hookspecs.PROJECT_NAME}_spec"
    return {
        name: fn
        for name, fn in vars(hookspecs).items()
        if inspect.isfunction(fn) and hasattr(fn, marker)
    }


def signature_of(fn: object) -> str:
    """``areal_register_losses(register)``: the form docs/plugins.md shows."""
    params = inspect.signature(fn).parameters  # type: ignore[arg-type]
    return f"{fn.__name__}({', '.join(params)})"  # type: ignore[attr-defined]


HOOKS = hookspec_functions()


def test_hookspecs_are_found_and_named_areal() -> None:
    assert len(HOOKS) >= 11
    assert all(name.startswith("areal_") for name in HOOKS)


@pytest.mark.parametrize("name", sorted(HOOKS))
def test_hook_is_documented_with_its_exact_signature(name: str) -> None:
    assert signature_of(HOOKS[name]) in DOCS.read_text()


def test_docs_describe_no_hook_that_does_not_exist() -> None:
    documented = set(re.findall(r"\b(areal_[a-z_]+)\(", DOCS.read_text()))
    assert documented - set(HOOKS) == set()


@pytest.mark.parametrize("name", sorted(HOOKS))
def test_hook_has_a_test(name: str) -> None:
    here = Path(__file__).resolve()
    tests = [p for p in (ROOT / "tests").rglob("test_*.py") if p.resolve() != here]
    assert any(name in p.read_text() for p in tests), f"no test under tests/ mentions {name}"
