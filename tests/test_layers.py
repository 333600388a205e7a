"""The import rule of docs/architecture.md, checked on the source: imports point down the layers, no
module imports another room's private module, and no import cycle.

Every module of ``specprefill_sdk`` (and the adapters' packages) is parsed with `ast`; module-level
and function-level imports count, ``if TYPE_CHECKING:`` imports do not (they never run). A lazy
import inside a function that points up is allowed only when it is listed in `ALLOWED_LAZY`, with
its reason.

To move a module, edit `LAYERS` (a prefix that matches no module yet is fine); to add one, give it a
layer there. `KNOWN_VIOLATIONS` lists what the tree breaks today; each entry is an expected failure
that fails the suite once it is fixed, so that the entry is removed with the fix.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "specprefill_sdk"
ADAPTERS = tuple(sorted(p.name for p in (ROOT / "adapters").glob("specprefill_*") if (p / "__init__.py").exists()))

#: The layers, top first. A module may import modules of its own layer and of the layers below it.
LAYER_ORDER = ("entry", "drivers", "pipeline", "stages", "runtime", "floor")

#: Module prefix (relative to ``specprefill_sdk``; the adapters by their package names) -> layer.
#: The longest prefix that matches a module's dotted name (whole components) decides. The package
#: ``specprefill_sdk`` itself re-exports the public names: it is an entry point.
LAYERS: dict[str, str] = {
    # entry points: know the pipeline, never each other's insides
    "__main__": "entry",
    "cli": "entry",
    "server": "entry",
    "eval": "entry",
    **dict.fromkeys(ADAPTERS, "entry"),
    # drivers: build or drive pipelines
    "components": "drivers",
    "conversation": "drivers",
    "policies": "drivers",
    "textmode": "drivers",
    # the chain of the three stages
    "pipeline": "pipeline",
    # stages: implement the interfaces
    "scoring": "stages",
    "selection": "stages",
    "backends": "stages",
    # fast forward passes shared by the draft scorer and the transformers backend
    "runtime": "runtime",
    # the floor
    "interfaces": "floor",
    "prompt": "floor",
    "models": "floor",
    "types": "floor",
    "errors": "floor",
    "validation": "floor",
    "rendering": "floor",
    "tracing": "floor",
    "_lazy": "floor",
    "_aio": "floor",
    "_timing": "floor",
    "_parallel_encode": "floor",
    "cost": "floor",
    "_cancel": "floor",
}

#: Rooms of one layer that must not know each other: (importer prefix, imported prefix).
FORBIDDEN: dict[tuple[str, str], str] = {
    ("scoring", "backends"): "a scorer never imports a backend",
    ("backends", "selection"): "a backend never imports a selector",
    ("scoring", "pipeline"): "stages never import the pipeline",
    ("selection", "pipeline"): "stages never import the pipeline",
    ("backends", "pipeline"): "stages never import the pipeline",
    ("server", "selection.base"): "validators are the floor's (validation.py), not a selector's",
}

#: Upward imports inside a function, allowed: (importer prefix, imported prefix) -> why.
ALLOWED_LAZY: dict[tuple[str, str], str] = {
    ("pipeline", "policies"): "Pipeline.from_policy is a convenience that delegates to policy loading",
    ("pipeline", "conversation"): "Pipeline.conversation is a convenience that starts a Conversation",
}

#: What the tree breaks and is known to: empty, and to stay so. An entry is ``("edge", importer,
#: imported)`` for an import that breaks a rule or ``("cycle", module, ...)`` for an import cycle (its
#: modules, sorted); each is an expected failure that fails the suite once it is mended.
KNOWN_VIOLATIONS: list[tuple[str, ...]] = []


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int
    lazy: bool  # inside a function: runs on the call, not on import


def _module_files() -> Iterator[tuple[str, Path]]:
    roots = [(PACKAGE, ROOT / PACKAGE)] + [(a, ROOT / "adapters" / a) for a in ADAPTERS]
    for name, root in roots:
        for path in sorted(root.rglob("*.py")):
            parts = [name, *path.relative_to(root).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            yield ".".join(parts), path


@cache
def _modules() -> dict[str, Path]:
    return dict(_module_files())


def _is_package(module: str) -> bool:
    return _modules()[module].name == "__init__.py"


def _resolve(importer: str, node: ast.ImportFrom) -> list[str]:
    """The project modules a ``from X import a, b`` loads: X itself, and each of a, b that is a module."""
    if node.level:
        base = importer.split(".") if _is_package(importer) else importer.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join([*base, node.module] if node.module else base)
    else:
        target = node.module or ""
    found = [target] if target in _modules() else []
    found += [f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in _modules()]
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports_of(module: str, tree: ast.Module) -> Iterator[Import]:
    def visit(node: ast.AST, lazy: bool) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                yield from (i for stmt in child.orelse for i in visit_one(stmt, lazy))
                continue
            yield from visit_one(child, lazy)

    def visit_one(node: ast.AST, lazy: bool) -> Iterator[Import]:
        if isinstance(node, ast.Import):
            for alias in node.names:
                # ``import a.b.c`` loads a, a.b and a.b.c
                parts = alias.name.split(".")
                for i in range(1, len(parts) + 1):
                    if ".".join(parts[:i]) in _modules():
                        yield Import(module, ".".join(parts[:i]), node.lineno, lazy)
        elif isinstance(node, ast.ImportFrom):
            for target in _resolve(module, node):
                yield Import(module, target, node.lineno, lazy)
        else:
            inner = lazy or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            yield from visit(node, inner)

    yield from visit(tree, False)


@cache
def _graph() -> tuple[Import, ...]:
    edges = []
    for module, path in _modules().items():
        for imp in _imports_of(module, ast.parse(path.read_text(), str(path))):
            # a package's modules import their own package's __init__ implicitly; an explicit
            # ``from . import x`` of the parent is no edge of its own
            if imp.imported != imp.importer and not imp.importer.startswith(imp.imported + "."):
                edges.append(imp)
    return tuple(edges)


def _relative(module: str) -> str:
    return module[len(PACKAGE) + 1 :] if module.startswith(PACKAGE + ".") else module


def _under(module: str, prefix: str) -> bool:
    rel = _relative(module)
    return rel == prefix or rel.startswith(prefix + ".")


def layer(module: str) -> str:
    if module == PACKAGE:
        return "entry"
    prefixes = [p for p in LAYERS if _under(module, p)]
    if not prefixes:
        raise AssertionError(f"{module} has no layer: add it to LAYERS in {Path(__file__).name}")
    return LAYERS[max(prefixes, key=len)]


def _room_rule(imp: Import) -> str | None:
    for (a, b), why in FORBIDDEN.items():
        if _under(imp.importer, a) and _under(imp.imported, b):
            return why
    return None


def _private_rule(imp: Import) -> str | None:
    """A module whose name starts with ``_`` belongs to its package: only that package imports it."""
    parts = imp.imported.split(".")
    for i, part in enumerate(parts[1:], start=1):
        if part.startswith("_") and not part.startswith("__"):
            owner = ".".join(parts[:i])
            if owner != PACKAGE and not imp.importer.startswith(owner + "."):
                return f"{imp.imported} is private to {owner}"
    return None


def _allowed_lazy(imp: Import) -> bool:
    return imp.lazy and any(_under(imp.importer, a) and _under(imp.imported, b) for a, b in ALLOWED_LAZY)


def why_not(imp: Import) -> str | None:
    """The rule an import breaks, or None."""
    rank = {name: i for i, name in enumerate(LAYER_ORDER)}
    src, dst = layer(imp.importer), layer(imp.imported)
    if rank[dst] < rank[src] and not _allowed_lazy(imp):
        return f"{'lazy ' if imp.lazy else ''}upward import ({src} -> {dst}) at line {imp.line}"
    return _room_rule(imp) or _private_rule(imp)


def rule_breaks() -> dict[tuple[str, str], str]:
    """(importer, imported) -> the rule it breaks, for every import of the tree."""
    breaks: dict[tuple[str, str], str] = {}
    for imp in _graph():
        why = why_not(imp)
        if why:
            breaks.setdefault((imp.importer, imp.imported), why)
    return breaks


def _runtime_edges(graph: tuple[Import, ...]) -> dict[tuple[str, str], int]:
    """(importer, imported) -> line, for the imports that run (allowed lazy inversions left out)."""
    edges: dict[tuple[str, str], int] = {}
    for imp in graph:
        if not _allowed_lazy(imp):
            edges.setdefault((imp.importer, imp.imported), imp.line)
    return edges


def strongly_connected(edges: dict[tuple[str, str], int]) -> list[tuple[str, ...]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    succ: dict[str, list[str]] = {}
    for a, b in sorted(edges):
        succ.setdefault(a, []).append(b)
        succ.setdefault(b, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[tuple[str, ...]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in succ[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(tuple(sorted(component)))

    for v in sorted(succ):
        if v not in index:
            connect(v)
    return sorted(found)


def cycle_path(component: tuple[str, ...], edges: dict[tuple[str, str], int]) -> str:
    """One cycle through a component, as ``a (line 3) -> b (line 9) -> a``."""
    members = set(component)
    succ = {m: sorted(b for (a, b) in edges if a == m and b in members) for m in component}
    path = [component[0]]
    while path[-1] not in path[:-1]:
        path.append(succ[path[-1]][0])
    loop = path[path.index(path[-1]) :]
    return " -> ".join(f"{a} (line {edges[(a, b)]})" for a, b in itertools.pairwise(loop)) + f" -> {loop[-1]}"


def cycles() -> list[tuple[str, ...]]:
    return strongly_connected(_runtime_edges(_graph()))


def _found() -> set[tuple[str, ...]]:
    return {("edge", *edge) for edge in rule_breaks()} | {("cycle", *c) for c in cycles()}


def test_every_module_has_a_layer() -> None:
    missing = []
    for module in _modules():
        try:
            layer(module)
        except AssertionError as exc:
            missing.append(str(exc))
    assert not missing, "\n".join(missing)


def test_imports_point_down_and_keep_to_their_rooms() -> None:
    known = set(KNOWN_VIOLATIONS)
    new = {edge: why for edge, why in rule_breaks().items() if ("edge", *edge) not in known}
    assert not new, "\n".join(f"{a} imports {b}: {why}" for (a, b), why in sorted(new.items()))


def test_no_import_cycle() -> None:
    known = set(KNOWN_VIOLATIONS)
    new = [c for c in cycles() if ("cycle", *c) not in known]
    edges = _runtime_edges(_graph())
    assert not new, "import cycles:\n" + "\n".join(cycle_path(c, edges) for c in new)


@pytest.mark.parametrize("violation", KNOWN_VIOLATIONS, ids=lambda v: " ".join(v))
@pytest.mark.xfail(strict=True, reason="known violation of the import rule; remove it from KNOWN_VIOLATIONS when fixed")
def test_known_violation_is_fixed(violation: tuple[str, ...]) -> None:
    assert violation not in _found()


def test_the_check_sees_what_it_must() -> None:
    """The parser finds function-level imports and skips TYPE_CHECKING ones; the rules fire."""
    # a stage's private module that exists in the tree, whatever the layout of the day
    hook = next(m for m in sorted(_modules()) if m.startswith(f"{PACKAGE}.backends._"))
    owner, name = hook.rsplit(".", 1)
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "from .types import Prompt\n"
        "if TYPE_CHECKING:\n"
        "    from .pipeline import Pipeline\n"
        "def f():\n"
        f"    from .backends import {name}\n"
    )
    found = {(i.imported, i.lazy) for i in _imports_of("specprefill_sdk.prompt", tree)}
    assert ("specprefill_sdk.types", False) in found
    assert (hook, True) in found
    assert not any(m == "specprefill_sdk.pipeline" for m, _ in found)
    assert _private_rule(Import("specprefill_sdk.models", hook, 1, False)) == f"{hook} is private to {owner}"
    assert _private_rule(Import(f"{owner}.x", hook, 1, False)) is None
    assert layer("specprefill_sdk.backends.vllm.plugin") == "stages" and layer("specprefill_sdk") == "entry"
    assert _room_rule(Import("specprefill_sdk.scoring.x", "specprefill_sdk.backends.transformers", 1, True))
    up = Import("specprefill_sdk.types", "specprefill_sdk.pipeline", 7, False)
    assert why_not(up) == "upward import (floor -> pipeline) at line 7"
    assert why_not(Import("specprefill_sdk.pipeline", "specprefill_sdk.policies", 9, True)) is None  # allowed
    assert why_not(Import("specprefill_sdk.pipeline", "specprefill_sdk.policies", 9, False))  # not lazy
    edges = {("a", "b"): 1, ("b", "c"): 2, ("c", "a"): 3, ("c", "d"): 4, ("d", "e"): 5, ("e", "d"): 6}
    assert strongly_connected(edges) == [("a", "b", "c"), ("d", "e")]
    assert cycle_path(("a", "b", "c"), edges) == "a (line 1) -> b (line 2) -> c (line 3) -> a"
