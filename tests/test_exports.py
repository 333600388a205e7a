"""Package exports: one lazy-export helper everywhere, each public name listed once, and the names that
static type checkers see (the ``if TYPE_CHECKING:`` imports) equal to those the helper exports."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from specprefill_sdk._lazy import lazy_exports

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_ROOTS = [ROOT / "specprefill_sdk", *sorted((ROOT / "adapters").glob("specprefill_*"))]

#: The packages whose public names load on first use (importing them must not import torch & co).
LAZY_PACKAGES = (
    "specprefill_sdk",
    "specprefill_sdk.backends",
    "specprefill_sdk.server",
    "specprefill_langchain",
    "specprefill_llamaindex",
    "specprefill_litellm",
)


def _inits() -> list[tuple[str, Path]]:
    found = []
    for root in PACKAGE_ROOTS:
        for init in sorted(root.rglob("__init__.py")):
            parts = init.parent.relative_to(root.parent).parts
            found.append((".".join(parts), init))
    return found


def _uses_lazy_exports(tree: ast.Module) -> bool:
    return any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "lazy_exports" for n in ast.walk(tree))


def _type_checking_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for stmt in ast.walk(node):
                if isinstance(stmt, ast.ImportFrom):
                    names.update(alias.asname or alias.name for alias in stmt.names)
    return names


def _defined_eagerly(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def test_every_package_that_defines_getattr_does_it_through_the_one_helper() -> None:
    hand_written = []
    for package, init in _inits():
        tree = ast.parse(init.read_text())
        if any(isinstance(n, ast.FunctionDef) and n.name in {"__getattr__", "__dir__"} for n in tree.body):
            hand_written.append(package)
    assert hand_written == [], (
        f"use specprefill_sdk._lazy.lazy_exports instead of a hand-written __getattr__: {hand_written}"
    )
    lazy = {package for package, init in _inits() if _uses_lazy_exports(ast.parse(init.read_text()))}
    assert lazy == set(LAZY_PACKAGES)


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_lazy_names_are_those_the_type_checker_sees_and_all_resolve(package: str) -> None:
    init = dict(_inits())[package]
    tree = ast.parse(init.read_text())
    module = importlib.import_module(package)
    lazy = set(module.__all__) - _defined_eagerly(tree)
    assert _type_checking_names(tree) == lazy, package
    assert module.__all__ == sorted(set(module.__all__)), "each public name once"
    assert dir(module) == module.__all__
    for name in module.__all__:
        assert getattr(module, name) is not None, (package, name)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = module.nope


def test_a_name_listed_twice_is_an_error() -> None:
    with pytest.raises(ValueError, match="'A' is exported twice"):
        lazy_exports("pkg", {"one": ("A",), "two": ("A", "B")})
    with pytest.raises(ValueError, match="'V' is exported twice"):
        lazy_exports("pkg", {"one": ("V",)}, eager=("V",))


def test_importing_the_lazy_packages_stays_cheap() -> None:
    # backends imports its BackendBase eagerly, and with it types (torch)
    cheap = [p for p in LAZY_PACKAGES if p != "specprefill_sdk.backends"]
    code = (
        "import sys\n"
        f"for name in {cheap!r}:\n"
        "    __import__(name)\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'fastapi', 'httpx') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == ""
