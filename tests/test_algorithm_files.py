"""Each chapter names the one or two files that hold its algorithm, and those files import nothing of the harness.

A learner who opens a chapter to read the algorithm should find it in the files its package docstring names
("The algorithm is in X and Y; ... The rest checks it"), without following names into the checking
machinery: reports, experiments, comparisons and tolerances, specs, demos, exercises, figures, widgets.
The imports are read with `ast` (nothing is imported) and followed through every wmdist module they load,
imports inside functions included, so a harness module reached through a helper counts too. Only an
`if TYPE_CHECKING:` block is skipped: it names a record for annotations and loads nothing at run time.
"""
from __future__ import annotations

import ast
import re
import sys
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WMDIST = ROOT / "wmdist"
CHAPTERS = sorted(p.parent.name for p in WMDIST.glob("*/chapter.py"))      # every folder that registers a chapter
HARNESS_TOP = {"course", "registry", "ui", "bench", "app", "kernel", "session", "__main__"}
HARNESS_STEMS = {"spec", "demos", "chapter", "results", "figures", "panel", "tolerance", "tables", "exercises",
                 "reference", "compare", "measure", "cli", "command"}
HARNESS_ENDINGS = ("_demos", "_demo", "_reference", "_tolerance")
HARNESS_PACKAGES = {"ipywidgets", "matplotlib", "IPython"}
SENTENCE = re.compile(r"The algorithm is in (.+?)(?:;|\. |\.$)")     # up to its first ';' or full stop


def _without_glosses(text: str) -> str:
    """`text` on one line with every parenthesised gloss removed, nested ones included."""
    text, before = " ".join(text.split()), None
    while before != text:
        before, text = text, re.sub(r"\([^()]*\)", "", text)
    return text


def algorithm_files(chapter: str) -> list[Path]:
    """The files a chapter's docstring names in 'The algorithm is in X (...) and Y (...); ... The rest checks it'.

    A bare name is a file in the chapter's folder; a path from wmdist/ ("wmdist/comm/ring.py") is taken as it is.
    """
    doc = ast.get_docstring(ast.parse((WMDIST / chapter / "__init__.py").read_text())) or ""
    found = SENTENCE.search(_without_glosses(doc))
    assert found, f"wmdist/{chapter}/__init__.py does not say 'The algorithm is in X and Y; ... The rest checks it'"
    assert "The rest checks it" in doc, f"wmdist/{chapter}/__init__.py does not say what the rest is for"
    names = re.findall(r"[\w/]+\.py", found.group(1))
    assert 1 <= len(names) <= 2, f"{chapter}: the algorithm should stand in one or two files, not {names}"
    return [ROOT / n if n.startswith("wmdist/") else WMDIST / chapter / n for n in names]


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (getattr(test, "id", None) == "TYPE_CHECKING"
                                         or getattr(test, "attr", None) == "TYPE_CHECKING")


def _walk(tree: ast.AST):
    """ast.walk, except the body of `if TYPE_CHECKING:` (its `else:` is still walked)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        todo += node.orelse if _is_type_checking(node) else list(ast.iter_child_nodes(node))


def _imports(path: Path) -> list[str]:
    """Every module name `path` imports, inside functions too; relative imports resolved against its package."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    out = []
    for node in _walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            out.append(base)
            out += [f"{base}.{a.name}" for a in node.names]        # from wmdist import report
    return out


def _module_file(name: str) -> Path | None:
    base = ROOT.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.exists():
            return path
    return None


def _is_harness(name: str, path: Path | None) -> bool:
    parts = name.split(".")
    if parts[0] in HARNESS_PACKAGES:
        return True
    if parts[0] != "wmdist" or path is None:
        return False
    rel = path.relative_to(WMDIST).with_suffix("").parts
    if rel[0] in HARNESS_TOP:
        return True
    stem = rel[-1] if rel[-1] != "__init__" else ""
    return len(rel) > 1 and (stem in HARNESS_STEMS or stem.endswith(HARNESS_ENDINGS) or stem.startswith("versus_")
                             or _registers(path))


@lru_cache(maxsize=None)
def _registers(path: Path) -> bool:
    """Whether `path` registers demos or exercises (a top-level DEMOS = or EXERCISES =): a runner, whatever its name."""
    for node in ast.parse(path.read_text()).body:
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        if any(getattr(t, "id", None) in ("DEMOS", "EXERCISES") for t in targets):
            return True
    return False


def harness_reached(path: Path) -> dict[str, list[str]]:
    """The harness modules `path` loads, each with the chain of files that leads to it."""
    seen, todo, found = {path}, [(path, [path.relative_to(WMDIST).as_posix()])], {}
    while todo:
        here, chain = todo.pop()
        for name in _imports(here):
            parts = name.split(".")
            for i in range(1, len(parts) + 1):
                prefix = ".".join(parts[:i])
                target = _module_file(prefix) if prefix.startswith("wmdist") else None
                if _is_harness(prefix, target):
                    found.setdefault(prefix, chain)
                    continue
                if target is not None and target not in seen:
                    seen.add(target)
                    todo.append((target, chain + [target.relative_to(WMDIST).as_posix()]))
    return found


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_docstring_names_algorithm_files_that_exist(chapter):
    for path in algorithm_files(chapter):
        assert path.is_file(), f"{chapter}: the docstring names {path.relative_to(ROOT)}, which does not exist"
        assert not _is_harness(".".join(path.relative_to(ROOT).with_suffix("").parts), path), \
            f"{chapter}: {path.name} is a harness file by its name"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_algorithm_files_import_nothing_of_the_harness(chapter):
    for path in algorithm_files(chapter):
        reached = harness_reached(path)
        assert not reached, f"{chapter}: {path.name} reaches the harness: " + "; ".join(
            f"{name} via {' -> '.join(chain)}" for name, chain in sorted(reached.items()))


def test_every_course_chapter_is_checked():
    assert {"data_parallel", "latents", "memory", "tensor_parallel", "pipeline", "ring_attention", "scan", "diffusion",
            "mesh", "experts"} <= set(CHAPTERS)


def test_the_check_fails_on_a_harness_import(tmp_path, monkeypatch):
    """The rule can fail: an algorithm file importing wmdist.course.report is caught, directly and through a helper."""
    pkg = tmp_path / "wmdist" / "toy"
    pkg.mkdir(parents=True)
    (tmp_path / "wmdist" / "__init__.py").write_text("")
    (tmp_path / "wmdist" / "course").mkdir()
    (tmp_path / "wmdist" / "course" / "report.py").write_text("class Check: ...\n")
    (pkg / "__init__.py").write_text('"""Toy. The algorithm is in algo.py (the step) and helper.py; '
                                     'neither imports the harness. The rest checks it."""\n')
    (pkg / "helper.py").write_text("def f():\n    from wmdist.course.report import Check\n    return Check\n")
    (pkg / "algo.py").write_text("import torch\nfrom wmdist.toy.helper import f\n")
    (pkg / "runner.py").write_text("DEMOS = []\n")
    module = sys.modules[__name__]
    monkeypatch.setattr(module, "ROOT", tmp_path)
    monkeypatch.setattr(module, "WMDIST", tmp_path / "wmdist")
    files = algorithm_files("toy")
    assert [p.name for p in files] == ["algo.py", "helper.py"]
    assert "wmdist.course.report" in harness_reached(files[0])      # through helper.py
    assert "wmdist.course.report" in harness_reached(files[1])      # directly, inside a function
    (pkg / "helper.py").write_text("def f():\n    return 1\n")
    assert not harness_reached(files[0])
    (pkg / "helper.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                   "    from wmdist.course.report import Check\nelse:\n"
                                   "    import wmdist.course.experiment\n")
    (tmp_path / "wmdist" / "course" / "experiment.py").write_text("")
    assert list(harness_reached(files[0])) == ["wmdist.course.experiment"]     # the annotation-only import is skipped
    (pkg / "helper.py").write_text("from wmdist.toy import runner\n")
    assert "wmdist.toy.runner" in harness_reached(files[0])              # a module that registers DEMOS
