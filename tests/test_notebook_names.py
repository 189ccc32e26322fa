"""No notebook rebinds a name it imports from wmdist.

Cells run in any order: a learner re-runs an early cell after a later one.
If cell 13 binds `check` as a loop variable and cell 31 imports `check` from
wmdist.course.exercises, re-running cell 13 and then the checker cell gives
"'Check' object is not callable". So every name a notebook imports from
wmdist is bound by that import alone, in every code cell (the same import
again is fine). Pure parsing: no kernel, no process.
"""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def code_cells(path: Path) -> list[tuple[int, str]]:
    """(index, source) of every code cell, IPython magics and shell lines blanked so `ast` can parse the rest."""
    cells = json.loads(path.read_text())["cells"]
    out = []
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()]
        out.append((i, "\n".join(lines)))
    return out


class Bindings(ast.NodeVisitor):
    """Names a cell binds at notebook (module) level: what a function, class or comprehension binds stays inside it.

    `imports` maps a name bound by `from wmdist... import x [as y]` or
    `import wmdist... as y` to what it refers to; `others` lists every other
    binding as (name, line, how).
    """

    def __init__(self) -> None:
        self.imports: list[tuple[str, str, int]] = []          # (name, "module:attribute", line)
        self.others: list[tuple[str, int, str]] = []

    def _bind(self, target: ast.AST, how: str) -> None:
        for node in ast.walk(target):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):     # not x.attr = or x[i] =
                self.others.append((node.id, node.lineno, how))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            name = alias.asname or alias.name.split(".")[0]
            if alias.name == "wmdist" or alias.name.startswith("wmdist."):
                self.imports.append((name, alias.name if alias.asname else "wmdist", node.lineno))
            else:
                self.others.append((name, node.lineno, f"import {alias.name}"))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = "." * node.level + (node.module or "")
        for alias in node.names:
            name = alias.asname or alias.name
            if module == "wmdist" or module.startswith("wmdist."):
                self.imports.append((name, f"{module}:{alias.name}", node.lineno))
            else:
                self.others.append((name, node.lineno, f"from {module} import {alias.name}"))

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._bind(target, "assignment")
        self.visit(node.value)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._bind(node.target, "augmented assignment")
        self.visit(node.value)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._bind(node.target, "annotated assignment")
        if node.value is not None:
            self.visit(node.value)

    def visit_For(self, node: ast.For) -> None:
        self._bind(node.target, "for-loop variable")
        for child in (node.iter, *node.body, *node.orelse):
            self.visit(child)

    visit_AsyncFor = visit_For

    def visit_With(self, node: ast.With) -> None:
        for item in node.items:
            self.visit(item.context_expr)
            if item.optional_vars is not None:
                self._bind(item.optional_vars, "with ... as")
        for child in node.body:
            self.visit(child)

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.name:
            self.others.append((node.name, node.lineno, "except ... as"))
        for child in node.body:
            self.visit(child)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self._bind(node.target, ":=")
        self.visit(node.value)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.others.append((node.name, node.lineno, "def"))               # its body is its own scope

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.others.append((node.name, node.lineno, "class"))

    def visit_Lambda(self, node: ast.Lambda) -> None:
        pass

    def _comprehension(self, node: ast.AST) -> None:           # its loop variables are its own; := is not
        for inner in ast.walk(node):
            if isinstance(inner, ast.NamedExpr):
                self._bind(inner.target, ":=")

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension


def rebinds(path: Path) -> list[str]:
    """Every binding, in any code cell of `path`, of a name the notebook imports from wmdist."""
    cells = []
    for index, source in code_cells(path):
        found = Bindings()
        found.visit(ast.parse(source))
        cells.append((index, found))
    imported: dict[str, set[str]] = {}
    for _, found in cells:
        for name, what, _ in found.imports:
            imported.setdefault(name, set()).add(what)
    problems = [f"{name!r} is imported from {sorted(whats)}: two different things under one name"
                for name, whats in imported.items() if len(whats) > 1]
    for index, found in cells:
        problems += [f"cell {index} line {line}: {how} rebinds {name!r}, which the notebook imports from "
                     f"{sorted(imported[name])[0]}" for name, line, how in found.others if name in imported]
    return problems


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_cell_rebinds_a_name_imported_from_wmdist(path):
    assert rebinds(path) == []


def test_the_check_finds_every_kind_of_rebinding(tmp_path):
    sources = ["from wmdist.course.exercises import check, solution\nimport wmdist.costs as costs",
               "for check in []:\n    pass",
               "solution = 3\nwith open('x') as costs:\n    pass",
               "def f(check):\n    check = 1\n    return [solution for solution in ()]",   # inner scopes: fine
               "from wmdist.course.exercises import check\n[y := 1 for _ in ()]",               # the same import: fine
               "from wmdist.pipeline import demos\nfrom wmdist.scan import demos",
               "%time x = 1\n!ls"]
    notebook = {"cells": [{"cell_type": "code", "source": s, "metadata": {}, "outputs": []} for s in sources],
                "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "n.ipynb"
    path.write_text(json.dumps(notebook))
    found = rebinds(path)
    assert found == ["'demos' is imported from ['wmdist.pipeline:demos', 'wmdist.scan:demos']: two different things "
                     "under one name",
                     "cell 1 line 1: for-loop variable rebinds 'check', which the notebook imports from "
                     "wmdist.course.exercises:check",
                     "cell 2 line 1: assignment rebinds 'solution', which the notebook imports from "
                     "wmdist.course.exercises:solution",
                     "cell 2 line 2: with ... as rebinds 'costs', which the notebook imports from wmdist.costs"]
