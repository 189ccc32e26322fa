"""One name for one thing: few public function names are defined in more than one module.

A reader who meets `tolerance(...)` or `compare(...)` should not have to find out which of several
modules it came from. The count is over module-level functions without a leading underscore
(methods belong to their class and read as `obj.name`); `main` is every CLI module's entry point,
so it is left out. The limit is issue 32 §4's goal; the names left are listed when it fails.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "wmdist"
MOST_SHARED_NAMES = 15       # issue 32 §4: "at most 15, besides main"
ENTRY_POINTS = {"main"}


def public_functions(source: str) -> list[str]:
    """The public module-level function names a module's source defines (async ones too)."""
    return [node.name for node in ast.parse(source).body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_")]


def shared_names(files: dict[str, str]) -> dict[str, list[str]]:
    """Each public function name defined in two or more of `files` (path -> source), with those paths."""
    where: dict[str, set[str]] = defaultdict(set)
    for path, source in files.items():
        for name in public_functions(source):
            where[name].add(path)
    return {name: sorted(paths) for name, paths in sorted(where.items())
            if len(paths) > 1 and name not in ENTRY_POINTS}


def _tree() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in sorted(ROOT.rglob("*.py"))
            if "__pycache__" not in p.parts}


def test_the_counter_sees_functions_not_methods_nor_private_nor_main():
    files = {"a.py": "def tolerance(x): ...\nasync def fetch(): ...\ndef _helper(): ...\ndef main(): ...\n"
                     "class Box:\n    def tolerance(self): ...\n",
             "b.py": "def tolerance(y): ...\nasync def fetch(): ...\ndef _helper(): ...\ndef main(): ...\n",
             "c.py": "class Other:\n    def fetch(self): ...\ntolerance = 3\n"}
    assert shared_names(files) == {"fetch": ["a.py", "b.py"], "tolerance": ["a.py", "b.py"]}


def test_the_tree_is_read():
    files = _tree()
    assert len(files) > 100 and sum(len(public_functions(s)) for s in files.values()) > 500


def test_few_public_function_names_are_defined_in_two_modules():
    shared = shared_names(_tree())
    listing = "\n".join(f"  {name}: {', '.join(paths)}" for name, paths in shared.items())
    assert len(shared) <= MOST_SHARED_NAMES, (
        f"{len(shared)} public function names are defined in two or more wmdist modules (at most "
        f"{MOST_SHARED_NAMES}): where two are the same idea keep one and import it; where they differ, "
        f"name each for how it differs\n{listing}")
