"""Who calls `runtime.run` directly: the runner, and helpers that say they are helpers.

A demo's run goes through its Experiment (wmdist/experiment.py), which builds the spec, times the
call, compares and makes the Report. Outside `runtime/` and the runners, a function that calls
`runtime.run` itself is a helper for tests or notebooks, and its docstring says so (it names
`runtime.run` and says "helper for"); a new undocumented one fails here with its place (issue 32 §4).
The lister reads imports: `from wmdist.runtime import run`, `from wmdist.runtime.launch import run`,
`from wmdist import run`, and `runtime.run` / `wmdist.run` as attributes.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "wmdist"
RUN_HOMES = ("wmdist.runtime", "wmdist.runtime.launch", "wmdist")     # where `run` is runtime.run
# The runners, by path under wmdist/ and enclosing function: the Experiment runner; the exercise checker,
# which runs the learner's function and the reference; the benchmarks, which time runtime.run itself (warm
# pools against fresh processes, the ring against gloo).
RUNNERS = {("course/experiment.py", "*"), ("course/exercises.py", "_check_ranks"), ("bench/suite.py", "*")}


@dataclass(frozen=True)
class RunUse:
    path: str            # relative to wmdist/
    line: int
    function: str        # the enclosing top-level function or Class.method ("<module>" if none)
    documented: bool     # its docstring names runtime.run and says it is a helper


def _run_names(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(names bound to runtime.run, names bound to a module whose .run is runtime.run)."""
    funcs, modules = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for a in node.names:
                if node.module in RUN_HOMES and a.name == "run":
                    funcs.add(a.asname or a.name)
                elif f"{node.module}.{a.name}" in RUN_HOMES:
                    modules.add(a.asname or a.name)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in RUN_HOMES:
                    modules.add(a.asname or a.name)
    return funcs, modules


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return head and f"{head}.{node.attr}"
    return None


def run_uses(path: str, source: str) -> list[RunUse]:
    """Every reference to runtime.run in one module's source, with its enclosing function."""
    tree = ast.parse(source)
    funcs, modules = _run_names(tree)
    uses = []

    def visit(node: ast.AST, owner: str, doc: str, shadow: frozenset[str]) -> None:
        for child in ast.iter_child_nodes(node):
            o, d, sh = owner, doc, shadow
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                a = child.args
                sh = shadow | {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and owner == "<module>":
                o, d = child.name, ast.get_docstring(child) or ""
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and "." not in owner and \
                    isinstance(node, ast.ClassDef):
                o, d = f"{owner}.{child.name}", ast.get_docstring(child) or ""
            hit = (isinstance(child, ast.Name) and child.id in funcs and child.id not in sh
                   and isinstance(child.ctx, ast.Load)) or \
                  (isinstance(child, ast.Attribute) and child.attr == "run" and _dotted(child.value) in modules)
            if hit:
                uses.append(RunUse(path, child.lineno, o, "runtime.run" in d and "helper for" in d))
            visit(child, o, d, sh)

    visit(tree, "<module>", "", frozenset())
    return uses


def _exempt(use: RunUse) -> bool:
    if use.path.startswith("runtime/"):
        return True
    return (use.path, "*") in RUNNERS or (use.path, use.function.split(".")[-1]) in RUNNERS


def _tree_uses() -> list[RunUse]:
    out = []
    for p in sorted(ROOT.rglob("*.py")):
        if "__pycache__" not in p.parts:
            out += run_uses(p.relative_to(ROOT).as_posix(), p.read_text())
    return [u for u in out if not _exempt(u)]


def test_the_lister_finds_each_import_form_and_reads_the_docstring():
    source = '''
from wmdist.runtime import run
from wmdist import runtime as rt
import wmdist

def helper(n):
    """Run it. A helper for tests: it calls `runtime.run` itself."""
    return run(f, n)

def demo(n):
    """Run the demo."""
    return rt.run(f, n) + wmdist.run(f, n)

class Thing:
    def go(self):
        """Go."""
        return [run]

def unrelated(run):
    return run
'''
    uses = run_uses("x.py", source)
    assert [(u.function, u.documented) for u in uses] == [
        ("helper", True), ("demo", False), ("demo", False), ("Thing.go", False)]     # a parameter `run` is not it


def test_the_runner_and_the_runtime_are_exempt():
    assert _exempt(RunUse("course/experiment.py", 1, "Experiment.run_spec", False))
    assert _exempt(RunUse("runtime/pool.py", 1, "<module>", False))
    assert _exempt(RunUse("course/exercises.py", 1, "_check_ranks", False))
    assert not _exempt(RunUse("course/exercises.py", 1, "check", False))
    assert not _exempt(RunUse("memory/exercises.py", 1, "_check_ranks", False))     # a chapter's exercises.py
    assert not _exempt(RunUse("scan/boundaries.py", 1, "run_boundaries", False))


def test_direct_runtime_run_calls_outside_the_runner_say_they_are_helpers():
    uses = _tree_uses()
    assert len(uses) >= 7, uses          # the helpers of pipeline/, ring_attention/ and scan/ are seen
    undocumented = [u for u in uses if not u.documented]
    assert not undocumented, (
        "these call runtime.run directly: make a demo's run an Experiment (wmdist/experiment.py), or say in the "
        "function's docstring that it is a helper for tests or notebooks and calls `runtime.run` itself:\n"
        + "\n".join(f"  wmdist/{u.path}:{u.line} in {u.function}" for u in undocumented))
