"""Mutation testing of the parts of the library whose bugs are quiet: selection, the scoring reduction,
the core types, the server's guards and the request-to-pipeline wiring.

Each mutant is one small, realistic change to one site of the source (a comparison flipped, a
constant off by one, ``and``/``or`` swapped, a condition negated, ``min``/``max`` or ``mean``/``sum``
exchanged, a returned value replaced by ``None``); the tests mapped to its module run against it, and
it is *killed* when they fail (or time out). Survivors are listed with their site and change, to be
judged: an equivalent change (nothing can observe it) or a missing test.

The source tree is copied once into a scratch folder and mutated there, one site at a time; the
heavy imports (torch, transformers, fastapi) are loaded once and every mutant's test run is a forked
child of this process, so a mutant costs its tests' run time, not an interpreter start.

    nice -n 19 python tools/mutation.py                    # every group, mutants sampled per group
    python tools/mutation.py --groups selection --all      # every mutant of one group
    python tools/mutation.py --list                        # the mutants, without running them
    python tools/mutation.py --rerun-survivors             # after adding tests: only the last survivors
    python tools/mutation.py --report-only                 # mutation.md again, with the verdicts in
                                                           # benchmarks/results/mutation_notes.json

Writes ``benchmarks/results/mutation.json`` and ``mutation.md`` (shown in the docs as results/).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


@dataclass(frozen=True)
class Group:
    """Modules mutated together and the tests that must kill their mutants."""

    name: str
    #: module path -> functions to mutate (empty: the whole module)
    targets: dict[str, tuple[str, ...]]
    tests: tuple[str, ...]
    #: mutants run when sampling (None: all of them)
    sample: int | None
    timeout_s: float


# In the order they run: a run that reaches its time budget skips the rest, so the groups whose
# bugs hide best come first. The samples keep one run within about 25 minutes on two shared cores.
GROUPS: tuple[Group, ...] = (
    Group(
        "reduction",
        {
            "specprefill_sdk/scoring/draft_attention/hook.py": (
                "pool_rows",
                "ScoreCollector.__init__",
                "ScoreCollector.begin_step",
                "ScoreCollector.observe",
                "ScoreCollector.observe_stacked",
            )
        },
        ("tests/test_scoring_by_hand.py",),
        sample=20,
        timeout_s=60,
    ),
    Group(
        "limits",
        {
            "specprefill_sdk/server/limits.py": (
                "Admission.acquire",
                "Admission.release",
                "Admission.retry_after",
                "GuardMiddleware.__init__",
                "GuardMiddleware._auth_problem",
                "GuardMiddleware.__call__",
            )
        },
        ("tests/test_server_guards.py",),
        sample=15,
        timeout_s=60,
    ),
    Group(
        "wiring",
        {
            "specprefill_sdk/policies.py": ("with_overrides", "build_selector", "scorer_for", "build_pipeline"),
            "specprefill_sdk/server/engine.py": ("pipeline_for", "_precompressed"),
        },
        (
            "tests/test_policies.py",
            # the one test there that generates with a real model: minutes per mutant, and not about wiring
            "--deselect=tests/test_policies.py::test_load_pipeline_shares_the_target_as_draft_and_generates",
            "tests/test_server_wiring.py",
        ),
        sample=6,
        timeout_s=180,
    ),
    Group(
        "types",
        {"specprefill_sdk/types.py": ()},
        ("tests/test_types.py", "tests/test_selection.py"),
        sample=10,
        timeout_s=60,
    ),
    Group(
        "selection",
        {
            "specprefill_sdk/selection/base.py": (),
            "specprefill_sdk/selection/keep_rate.py": (),
            "specprefill_sdk/selection/token_budget.py": (),
            "specprefill_sdk/selection/chunked.py": (),
            "specprefill_sdk/selection/adaptive.py": (),
            "specprefill_sdk/selection/protect.py": (),
            "specprefill_sdk/selection/dense_below.py": (),
        },
        ("tests/test_selection.py", "tests/test_selection_boundaries.py"),
        sample=30,
        timeout_s=60,
    ),
)

PRELOAD = ("torch", "transformers", "numpy", "pydantic", "fastapi", "starlette", "httpx", "uvicorn", "pytest")


# ----------------------------------------------------------------------------- mutants
@dataclass(frozen=True)
class Mutant:
    group: str
    path: str
    line: int
    function: str
    kind: str
    before: str
    after: str
    #: character span in the file and its replacement
    start: int = field(repr=False, default=0)
    end: int = field(repr=False, default=0)

    @property
    def id(self) -> str:
        return f"{self.path}:{self.start}:{self.kind}:{self.after}"


_COMPARE_SWAPS: dict[type[ast.cmpop], tuple[type[ast.cmpop], ...]] = {
    ast.Lt: (ast.LtE,),
    ast.LtE: (ast.Lt,),
    ast.Gt: (ast.GtE,),
    ast.GtE: (ast.Gt,),
    ast.Eq: (ast.NotEq,),
    ast.NotEq: (ast.Eq,),
    ast.Is: (ast.IsNot,),
    ast.IsNot: (ast.Is,),
    ast.In: (ast.NotIn,),
    ast.NotIn: (ast.In,),
}
_BINOP_SWAPS: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Div,
    ast.BitOr: ast.BitAnd,
    ast.BitAnd: ast.BitOr,
}
_NAME_SWAPS = {"min": "max", "max": "min"}
_METHOD_SWAPS = {
    "mean": "sum",
    "sum": "mean",
    "amax": "amin",
    "maximum": "minimum",
    "clamp_min": "clamp_max",
    "any": "all",
    "all": "any",
}


def _line_offsets(text: str) -> list[int]:
    offsets, total = [], 0
    for line in text.splitlines(keepends=True):
        offsets.append(total)
        total += len(line)
    return offsets


class _Finder(ast.NodeVisitor):
    """Collects the mutation sites of one module (inside ``functions``, when given)."""

    def __init__(self, text: str, functions: Sequence[str]) -> None:
        self.text = text
        self.lines = _line_offsets(text)
        self.functions = set(functions)
        self.stack: list[str] = []
        self.sites: list[tuple[ast.expr, str, str, str]] = []  # node, kind, before, after

    def _span(self, node: ast.expr) -> tuple[int, int]:
        start = self.lines[node.lineno - 1] + node.col_offset
        assert node.end_lineno is not None and node.end_col_offset is not None  # parsed, not built
        end = self.lines[node.end_lineno - 1] + node.end_col_offset
        return start, end

    def _inside(self) -> bool:
        """Inside a function, and inside one of ``functions`` (``name`` or ``Class.name``) when given."""
        if not any(not name[0].isupper() for name in self.stack):
            return False
        if not self.functions:
            return True
        names = set(self.stack) | {".".join(self.stack[i : i + 2]) for i in range(len(self.stack) - 1)}
        return bool(self.functions & names)

    def _add(self, node: ast.expr, kind: str, replacement: str) -> None:
        start, end = self._span(node)
        self.sites.append((node, kind, self.text[start:end], replacement))

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.stack.append(node.name)
        for child in node.body:  # not the decorators or the annotations
            self.visit(child)
        self.stack.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.stack.append(node.name)
        for child in node.body:
            self.visit(child)
        self.stack.pop()

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        return None  # messages: a change there is a change of wording

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in ("debug", "info", "warning", "error", "exception"):
            return None  # logging
        if self._inside():
            if isinstance(func, ast.Name) and func.id in _NAME_SWAPS:
                self._add(func, "swap-call", _NAME_SWAPS[func.id])
            if isinstance(func, ast.Attribute) and func.attr in _METHOD_SWAPS:
                start, end = self._span(func)
                source = self.text[start:end]
                self.sites.append((func, "swap-method", source, source[: -len(func.attr)] + _METHOD_SWAPS[func.attr]))
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        if self._inside() and len(node.ops) == 1:
            for swap in _COMPARE_SWAPS.get(type(node.ops[0]), ()):
                mutated = ast.Compare(left=node.left, ops=[swap()], comparators=node.comparators)
                self._add(node, "compare", f"({ast.unparse(mutated)})")
        self.generic_visit(node)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        if self._inside():
            other = ast.Or() if isinstance(node.op, ast.And) else ast.And()
            self._add(node, "and-or", f"({ast.unparse(ast.BoolOp(op=other, values=node.values))})")
        self.generic_visit(node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> None:
        if self._inside() and isinstance(node.op, ast.Not):
            self._add(node, "drop-not", f"({ast.unparse(node.operand)})")
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        swap = _BINOP_SWAPS.get(type(node.op))
        if self._inside() and swap is not None:
            self._add(node, "binop", f"({ast.unparse(ast.BinOp(left=node.left, op=swap(), right=node.right))})")
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        value = node.value
        if self._inside() and isinstance(value, int) and not isinstance(value, bool):
            self._add(node, "constant", repr(value + 1))
            if value != 0:
                self._add(node, "constant", repr(value - 1))

    def visit_If(self, node: ast.If) -> None:
        if self._inside() and not isinstance(node.test, ast.UnaryOp):
            self._add(node.test, "negate-if", f"not ({ast.unparse(node.test)})")
        self.generic_visit(node)

    def visit_Return(self, node: ast.Return) -> None:
        if (
            self._inside()
            and node.value is not None
            and not (isinstance(node.value, ast.Constant) and node.value.value is None)
        ):
            self._add(node.value, "return-none", "None")
        self.generic_visit(node)


def find_mutants(group: Group, root: Path = ROOT) -> list[Mutant]:
    out: list[Mutant] = []
    for path, functions in group.targets.items():
        text = (root / path).read_text()
        finder = _Finder(text, functions)
        finder.visit(ast.parse(text))
        for node, kind, before, after in finder.sites:
            start, end = finder._span(node)
            out.append(
                Mutant(
                    group=group.name,
                    path=path,
                    line=node.lineno,
                    function=_enclosing(text, node.lineno),
                    kind=kind,
                    before=before,
                    after=after,
                    start=start,
                    end=end,
                )
            )
    return out


def _enclosing(text: str, line: int) -> str:
    name = ""
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.lineno <= line <= (node.end_lineno or 0):
            name = node.name  # ast.walk is breadth-first: the innermost match comes last
    return name


# ----------------------------------------------------------------------------- running
def _scratch_copy() -> Path:
    scratch = Path(tempfile.mkdtemp(prefix="specprefill-mutation-"))
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".venv", ".git", "site", "dist", "results")
    for name in ("specprefill_sdk", "adapters", "tests", "policies"):
        shutil.copytree(ROOT / name, scratch / name, ignore=ignore, symlinks=True)
    for name in ("pyproject.toml",):
        shutil.copy2(ROOT / name, scratch / name)
    return scratch


def _run_tests(scratch: Path, tests: Sequence[str], timeout_s: float) -> tuple[str, float]:
    """``passed``, ``failed`` or ``timeout`` for the tests run in a forked child on ``scratch``."""
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: fresh imports of the (mutated) project, then pytest
        code = 3
        try:
            os.setpgid(0, 0)
            os.chdir(scratch)
            sys.dont_write_bytecode = True
            sys.path[:0] = [str(scratch), str(scratch / "adapters"), str(scratch / "tests")]
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            import pytest

            code = int(pytest.main(["-x", "-q", "-p", "no:cacheprovider", "-o", "addopts=", *tests]))
        finally:
            os._exit(code)
    deadline = started + timeout_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            return ("passed" if code == 0 else "failed"), time.monotonic() - started
        if time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "timeout", time.monotonic() - started
        time.sleep(0.05)


def run(
    groups: Sequence[Group], *, sample: bool, seed: int, budget_s: float, only: set[str] | None = None
) -> dict[str, Any]:
    """Run the mutants of ``groups`` (sampled, or those whose id is in ``only``) and report what the tests did."""
    for module in PRELOAD:
        __import__(module)
    scratch = _scratch_copy()
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_NO_ADVISORY_WARNINGS="1", PYTHONDONTWRITEBYTECODE="1")
    started = time.monotonic()
    report: dict[str, Any] = {"seed": seed, "sampled": sample, "groups": {}, "mutants": []}
    rows: list[dict[str, Any]] = report["mutants"]
    try:
        for group in groups:
            mutants = find_mutants(group)
            chosen = mutants
            if only is not None:
                chosen = [m for m in mutants if m.id in only]
                if not chosen:
                    continue
            elif sample and group.sample is not None and len(mutants) > group.sample:
                chosen = sorted(random.Random(seed).sample(mutants, group.sample), key=lambda m: (m.path, m.start))
            baseline, took = _run_tests(scratch, group.tests, group.timeout_s * 2)
            print(f"[{group.name}] {len(chosen)}/{len(mutants)} mutants; tests unmutated: {baseline} ({took:.0f}s)")
            if baseline != "passed":
                raise SystemExit(f"the tests of {group.name} fail without any mutation: fix them first")
            group_started = time.monotonic()
            counts = {"found": len(mutants), "run": 0, "killed": 0, "survived": 0, "timeout": 0, "skipped": 0}
            for mutant in chosen:
                if time.monotonic() - started > budget_s:
                    counts["skipped"] += 1
                    continue
                target = scratch / mutant.path
                original = target.read_text()
                mutated = original[: mutant.start] + mutant.after + original[mutant.end :]
                try:
                    compile(mutated, str(target), "exec")
                except SyntaxError:
                    counts["skipped"] += 1
                    continue
                target.write_text(mutated)
                try:
                    outcome, took = _run_tests(scratch, group.tests, group.timeout_s)
                finally:
                    target.write_text(original)
                status = {"failed": "killed", "timeout": "timeout", "passed": "survived"}[outcome]
                counts["run"] += 1
                counts["killed" if status != "survived" else "survived"] += 1
                counts["timeout"] += status == "timeout"
                rows.append({**asdict(mutant), "status": status, "seconds": round(took, 1)})
                mark = "." if status != "survived" else "S"
                print(
                    f"  {mark} {mutant.path}:{mutant.line} {mutant.kind}: {mutant.before!r} -> {mutant.after!r}",
                    flush=True,
                )
            report["groups"][group.name] = {
                **counts,
                "tests": list(group.tests),
                "seconds": round(time.monotonic() - group_started, 1),
            }
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    run_total = sum(g["run"] for g in report["groups"].values())
    killed = sum(g["killed"] for g in report["groups"].values())
    report["run"], report["killed"] = run_total, killed
    report["killed_share"] = round(killed / run_total, 4) if run_total else None
    report["seconds"] = round(time.monotonic() - started, 1)
    return report


def _totals(report: dict[str, Any]) -> dict[str, Any]:
    rows = report["mutants"]
    killed = sum(m["status"] != "survived" for m in rows)
    first = sum(m.get("first_run", m["status"]) != "survived" for m in rows)
    out = {**report, "run": len(rows), "killed": killed, "killed_share": round(killed / len(rows), 4) if rows else None}
    if any("first_run" in m for m in rows):
        out["first_run_killed"] = first
    return out


def combine(previous: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    """``current`` plus the groups of ``previous`` that ``current`` did not run (runs split by ``--groups``)."""
    ran = set(current["groups"])
    kept = {name: g for name, g in previous["groups"].items() if name not in ran}
    rows = [m for m in previous["mutants"] if m["group"] not in ran] + current["mutants"]
    seconds = float(current["seconds"]) + sum(float(g.get("seconds", 0)) for g in kept.values())
    return _totals({**current, "groups": {**kept, **current["groups"]}, "mutants": rows, "seconds": seconds})


def merge(previous: dict[str, Any], rerun: dict[str, Any]) -> dict[str, Any]:
    """``previous`` with its survivors' outcomes replaced by those of ``rerun`` (after new tests)."""
    again = {_key(m): m for m in rerun["mutants"]}
    rows = []
    for m in previous["mutants"]:
        if _key(m) in again:
            m = {**again[_key(m)], "first_run": m.get("first_run", m["status"])}
        rows.append(m)
    groups: dict[str, Any] = {}
    for name, g in previous["groups"].items():
        mine = [m for m in rows if m["group"] == name]
        killed = sum(m["status"] != "survived" for m in mine)
        groups[name] = {**g, "killed": killed, "survived": len(mine) - killed}
    seconds = float(previous.get("rerun_seconds", 0)) + float(rerun["seconds"])
    return _totals({**previous, "groups": groups, "mutants": rows, "rerun_seconds": round(seconds, 1)})


def write_markdown(report: dict[str, Any], path: Path, notes: dict[str, str]) -> None:
    groups: dict[str, dict[str, Any]] = report["groups"]
    lines = [
        "# Mutation testing",
        "",
        "`tools/mutation.py` makes one small change at a time to the source (a comparison flipped, a",
        "constant off by one, `and`/`or` swapped, a condition negated, `min`/`max` or `mean`/`sum`",
        "exchanged, a returned value replaced by `None`) and runs the tests mapped to that module. A",
        "mutant is killed when they fail or time out.",
        "",
        f"Killed: **{report['killed']} of {report['run']}** ({100 * float(report['killed_share'] or 0):.1f}%), "
        f"in {float(report['seconds']) / 60:.0f} min"
        + (f"; mutants sampled per group (seed {report['seed']})." if report["sampled"] else "."),
        "",
        "| group | tests | mutants found | sampled, not run (time budget) | run | killed | survived |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, g in groups.items():
        tests = ", ".join(f"`{Path(str(t)).name}`" for t in g["tests"] if not str(t).startswith("-"))
        row = f"| {name} | {tests} | {g['found']} | {g['skipped']} | {g['run']} | {g['killed']} | {g['survived']} |"
        lines.append(row)
    if "first_run_killed" in report:
        lines += [
            "",
            f"The first pass killed {report['first_run_killed']} of {report['run']}; its survivors were judged, "
            "tests were added for those a test can observe, and the survivors were run again "
            f"(`--rerun-survivors`, {float(report['rerun_seconds']) / 60:.0f} min).",
        ]
    judged = [m for m in report["mutants"] if m["status"] == "survived" or m.get("first_run") == "survived"]
    lines += ["", "## Survivors of the first pass", ""]
    if not judged:
        lines.append("None.")
    else:
        lines += ["| site | change | now | verdict |", "|---|---|---|---|"]
        for m in judged:
            site = f"`{m['path']}:{m['line']}` ({m['function']})"
            change = f"`{m['before']}` → `{m['after']}`".replace("|", "\\|")
            lines.append(f"| {site} | {change} | {m['status']} | {notes.get(_key(m), 'not yet judged')} |")
    if "_context" in notes:  # what the numbers above do not show (earlier passes, sampling)
        lines += ["", "## Notes", "", notes["_context"]]
    path.write_text("\n".join(lines) + "\n")


def _key(m: dict[str, Any]) -> str:
    return f"{m['path']}:{m['start']}:{m['kind']}:{m['after']}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", nargs="*", default=[g.name for g in GROUPS], choices=[g.name for g in GROUPS])
    parser.add_argument("--all", action="store_true", help="run every mutant, not a sample per group")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget-min", type=float, default=25.0, help="stop starting mutants after this long")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument(
        "--report-only", action="store_true", help="write mutation.md again from mutation.json and the notes"
    )
    parser.add_argument("--notes", type=Path, default=RESULTS / "mutation_notes.json", help="verdicts on survivors")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--rerun-survivors",
        action="store_true",
        help="run again only the survivors of the report in --out (after adding tests) and merge the outcomes",
    )
    args = parser.parse_args(argv)
    groups = [g for g in GROUPS if g.name in args.groups]
    if args.list:
        for group in groups:
            for m in find_mutants(group):
                print(f"{m.group}\t{m.path}:{m.line}\t{m.kind}\t{m.before!r} -> {m.after!r}")
        return 0
    notes = json.loads(args.notes.read_text()) if args.notes.exists() else {}
    if args.report_only:
        write_markdown(json.loads((args.out / "mutation.json").read_text()), args.out / "mutation.md", notes)
        return 0
    if args.rerun_survivors:
        previous = json.loads((args.out / "mutation.json").read_text())
        survivors = {_key(m) for m in previous["mutants"] if m["status"] == "survived"}
        rerun = run(groups, sample=False, seed=args.seed, budget_s=args.budget_min * 60, only=survivors)
        report = merge(previous, rerun)
    else:
        report = run(groups, sample=not args.all, seed=args.seed, budget_s=args.budget_min * 60)
        if (args.out / "mutation.json").exists():  # keep the other groups' last results
            report = combine(json.loads((args.out / "mutation.json").read_text()), report)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "mutation.json").write_text(json.dumps(report, indent=1) + "\n")
    write_markdown(report, args.out / "mutation.md", notes)
    print(f"killed {report['killed']}/{report['run']} ({report['killed_share']}); report in {args.out}/mutation.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
