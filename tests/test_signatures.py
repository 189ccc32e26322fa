"""Signatures a reader can trust: read from the source (ast), module by module.

Rules, for every public function and method of the library (name without a leading underscore,
dunders aside):
- an option comes after a `*`: no parameter with a default may be given by position, so
  `ring_forward(ctx, q, k, v, seq_len, "contiguous", True, block_size)` cannot be written;
- a flag is always named: no positional parameter annotated `bool`, default or not;
- a choice is a `Literal`: a parameter whose default is a string is annotated with the choices
  (`Literal["gpipe", "1f1b"]`), not a bare `str`, unless it is free text (FREE_TEXT);
- a configuration (a dataclass whose name ends in one of CONFIG_SUFFIXES) is `kw_only`, so
  `ZeroConfig(stage=2, steps=4)` is the only way to write one.

Each module is its own test case, so `-k pipeline` checks one chapter.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "wmdist"
MODULES = sorted(p for p in PACKAGE.rglob("*.py"))
CONFIG_SUFFIXES = ("Config", "Spec", "Shape", "Params", "Work", "Options")
# Data that may be left out, so it has a default, and stays positional: (module, function, parameter), each
# the one thing its function works on.
POSITIONAL_DATA = {
    ("app/cli.py", "main", "argv"),            # main(["verify", "-n", "2"]): the command line, as every CLI takes it
    ("registry/demos.py", "verify", "names"),       # verify(["ring-allreduce"], world_size=4): which demos
    ("registry/demos.py", "plan", "names"),
    ("registry/demos.py", "prepare", "names"),
    ("bench/suite.py", "tree_pss_mb", "pid"),    # tree_pss_mb(pid): whose memory (default: this process)
    ("course/report.py", "exact_check", "reason"),  # exact_check(name, got, expected, reason): like close_check's, the
}                                          # check's own statement (it has a default only for "same ops, same order")
# Parameters whose string default is free text (a label, a title, a path), not one of a few choices.
FREE_TEXT = {"label", "title", "name", "prefix", "text", "reason", "phase", "case", "description", "unit", "tag",
             "root", "path", "style", "sep", "suffix", "what", "note", "op", "kind_label", "fmt", "question",
             "formula_text", "why", "row_label", "unused"}


def _public_functions(tree: ast.Module) -> list[ast.FunctionDef]:
    """Module-level functions and methods of module-level classes whose names are public."""
    out = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append(node)
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            out += [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return [f for f in out if not f.name.startswith("_")]


def _positional(f: ast.FunctionDef) -> list[ast.arg]:
    return [*f.args.posonlyargs, *f.args.args]


def _annotation(arg: ast.arg) -> str:
    return ast.unparse(arg.annotation) if arg.annotation is not None else ""


def violations(source: str, module: str = "") -> list[str]:
    """Every broken rule in one module's source (`module`: its path under wmdist/), as 'line: what'."""
    tree = ast.parse(source)
    out = []
    for f in _public_functions(tree):
        positional = _positional(f)
        defaulted = positional[len(positional) - len(f.args.defaults):] if f.args.defaults else []
        out += [f"{f.lineno}: {f.name}({a.arg}=...) is an option given by position; put it after a `*`"
                for a in defaulted if (module, f.name, a.arg) not in POSITIONAL_DATA]
        out += [f"{f.lineno}: {f.name}({a.arg}: bool) is a positional flag; put it after a `*`"
                for a in positional if _annotation(a) == "bool" and a not in defaulted]
        pairs = list(zip(defaulted, f.args.defaults)) + list(zip(f.args.kwonlyargs, f.args.kw_defaults))
        out += [f"{f.lineno}: {f.name}({a.arg}: str = {d.value!r}) is a choice; annotate it with its Literal"
                for a, d in pairs
                if isinstance(d, ast.Constant) and isinstance(d.value, str) and _annotation(a) == "str"
                and a.arg not in FREE_TEXT]
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name.endswith(CONFIG_SUFFIXES):
            for dec in node.decorator_list:
                if isinstance(dec, ast.Name) and dec.id == "dataclass" or \
                        isinstance(dec, ast.Call) and getattr(dec.func, "id", "") == "dataclass" and \
                        not any(k.arg == "kw_only" and getattr(k.value, "value", False) for k in dec.keywords):
                    out.append(f"{node.lineno}: dataclass {node.name} is a configuration; make it kw_only")
    return out


def test_the_rules_catch_what_they_name() -> None:
    """Each rule fires on its own example and stays quiet on the written-out form."""
    bad = '''
from dataclasses import dataclass
def ring(ctx, q, layout: str = "contiguous", causal: bool = True): ...
def flag(x, exact: bool): ...
@dataclass(frozen=True)
class RingConfig:
    n: int = 2
'''
    good = '''
from dataclasses import dataclass
from typing import Literal
def ring(ctx, q, *, layout: Literal["contiguous", "zigzag"] = "contiguous", causal: bool = True,
         label: str = "ring"): ...
def _private(x, y=1): ...
@dataclass(frozen=True, kw_only=True)
class RingConfig:
    n: int = 2
'''
    found = violations(bad)
    assert any("layout=..." in v for v in found) and any("causal=..." in v for v in found)
    assert any("flag(exact: bool)" in v for v in found)
    assert any("layout: str = 'contiguous'" in v for v in found)
    assert any("RingConfig" in v for v in found)
    assert violations(good) == []


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(PACKAGE)) for p in MODULES])
def test_public_signatures(path: Path) -> None:
    found = violations(path.read_text(), str(path.relative_to(PACKAGE)))
    assert not found, f"{path.relative_to(PACKAGE.parent)}:\n  " + "\n  ".join(found)


def test_no_public_class_name_means_two_things():
    """One name, one meaning: a public class is defined in one module of the library only."""
    where: dict[str, list[str]] = {}
    for path in MODULES:
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                where.setdefault(node.name, []).append(str(path.relative_to(PACKAGE)))
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}


def test_records_of_five_or_more_fields_are_built_by_keyword():
    """A record with five or more fields cannot be built positionally (`Report("x", 2, [...], [...], 1.0)`):
    every dataclass of the library with five or more init fields is `kw_only`."""
    positional = []
    for path in MODULES:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            decorators = [ast.unparse(d) for d in node.decorator_list if ast.unparse(d).startswith("dataclass")]
            if not decorators or "kw_only=True" in decorators[0]:
                continue
            fields = [s for s in node.body if isinstance(s, ast.AnnAssign) and "ClassVar" not in ast.unparse(s.annotation)
                      and not (s.value is not None and "init=False" in ast.unparse(s.value))]
            if len(fields) >= 5:
                positional.append(f"{path.relative_to(PACKAGE)}: {node.name} ({len(fields)} fields)")
    assert positional == []
