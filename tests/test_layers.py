"""The package's shape, checked: imports point down, pure modules stay pure, one counting seam.

Layers, bottom to top. A module may import its own layer and those below it;
a chapter folder may not import another chapter (what two chapters share
moves down a layer). The one exception is the capstone, `mesh/` (chapter 09),
which composes the other chapters' techniques through their public functions.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "wmdist"
LAYERS = [("costs", "base"), ("comm",), ("runtime",), ("models",), ("course",),
          ("ui",)]
TOP = ("registry", "bench", "app", "__main__", "__init__", "kernel")   # kernel: the Jupyter entry point
CAPSTONES = ("mesh", "yours")   # chapter 09 and "your own model" build on the chapters before them
PURE = ["costs", "base", "comm/mesh.py", "memory/footprint.py", "memory/remedies.py",
        "data_parallel/scaling.py", "pipeline/schedules.py", "pipeline/simulate.py", "pipeline/plan.py",
        "pipeline/bubble.py", "ring_attention/layout.py", "ring_attention/traffic.py",
        "mesh/spec.py", "mesh/patterns.py", "memory/transient.py", "memory/presets.py", "experts/tradeoff.py"]
NOT_IN_PURE = {"torch", "ipywidgets", "matplotlib", "IPython"}
ALLOWED_TORCH_DISTRIBUTED = ("torch.distributed.checkpoint", "torch.distributed.optim",
                             "torch.distributed.pipelining", "torch.distributed.tensor",
                             "torch.distributed.device_mesh", "torch.distributed.algorithms",
                             "torch.distributed.fsdp")


def _modules() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts)


def _unit(path: Path) -> str:
    """The layer unit a file belongs to: its top folder under wmdist/, or its module name."""
    rel = path.relative_to(ROOT)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _rank(unit: str) -> int:
    for i, names in enumerate(LAYERS):
        if unit in names:
            return i
    return len(LAYERS) + (1 if unit in TOP else 0)      # chapters, then the entry points


def _imports(path: Path) -> list[str]:
    """Every imported module name, including imports inside functions."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module == "wmdist":
            out += [f"wmdist.{a.name}" for a in node.names]          # from wmdist import costs
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append(node.module)
    return out


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_down(path):
    unit = _unit(path)
    for name in _imports(path):
        if not name.startswith("wmdist.") and name != "wmdist":
            continue
        parts = name.split(".")
        target = parts[1] if len(parts) > 1 else "__init__"
        if target == unit:
            continue
        is_chapter = _rank(unit) == len(LAYERS) and unit not in TOP and unit not in CAPSTONES
        assert not (is_chapter and _rank(target) == len(LAYERS) and target not in TOP), \
            f"chapter {unit} imports chapter {target} ({name}): move what they share down a layer"
        assert _rank(target) <= _rank(unit), f"{unit} imports {name}, which sits above it"


def _pure_files() -> list[Path]:
    out = []
    for entry in PURE:
        p = ROOT / entry
        out += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    return out


@pytest.mark.parametrize("path", _pure_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_pure_modules_import_no_torch_widgets_or_plots(path):
    bad = {n for n in _imports(path) if n.split(".")[0] in NOT_IN_PURE}
    bad |= {n for n in _imports(path) if n.startswith(("wmdist.runtime", "wmdist.ui", "wmdist.course.exercises"))}
    assert not bad, f"{path.name} is meant to be pure but imports {sorted(bad)}"


@pytest.mark.parametrize("path", [p for p in _modules() if _rank(_unit(p)) == len(LAYERS) and _unit(p) not in TOP],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_chapters_count_through_comm_only(path):
    """No chapter writes a ledger record by hand or talks to torch.distributed past the counted wrappers."""
    names = _imports(path)
    direct = [n for n in names if n == "torch.distributed" or (n.startswith("torch.distributed.")
                                                             and not n.startswith(ALLOWED_TORCH_DISTRIBUTED))]
    assert not direct, f"{path.name} imports {direct}; use wmdist.comm"
    tree = ast.parse(path.read_text())
    imported = {a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for a in node.names}
    assert "Record" not in imported, f"{path.name} builds ledger records itself; use comm.counted"
    assert ".ledger.add(" not in path.read_text() and ".ledger.enter(" not in path.read_text()


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_file_reads_in_one_sitting(path):
    assert len(path.read_text().splitlines()) <= 300


def _module_path(name: str) -> Path | None:
    """The file of wmdist module `name` (a package's __init__.py), or None outside wmdist."""
    if not name.startswith("wmdist"):
        return None
    base = ROOT.parent.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.exists():
            return path
    return None


def _reaches(path: Path) -> set[Path]:
    """Every wmdist file importing `path` loads (imports inside functions included, and each package's __init__)."""
    seen, todo = set(), [path]
    while todo:
        here = todo.pop()
        if here in seen:
            continue
        seen.add(here)
        for name in _imports(here):
            parts = name.split(".")
            todo += [p for i in range(1, len(parts) + 1) if (p := _module_path(".".join(parts[:i])))]
    return seen


def _registers(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    return any(isinstance(n, (ast.Assign, ast.AnnAssign)) and any(
        getattr(t, "id", None) in ("DEMOS", "EXERCISES") for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))
        for n in tree.body)


@pytest.mark.parametrize("path", sorted(p for p in ROOT.rglob("*.py") if p.name in ("figures.py", "tables.py")),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_figures_read_results_and_never_load_a_runner(path):
    """A chapter's figures and tables take records (results.py, spec.py, the pure models) and reach no module
    that registers demos or exercises (the runners that hold rank functions), so drawing a stored result loads
    no chapter's demo code. The package itself (wmdist/__init__, the runtime) is loaded by any import."""
    runners = sorted(str(p.relative_to(ROOT)) for p in _reaches(path) if _registers(p))
    assert not runners, f"{path.relative_to(ROOT)} loads {runners}"
