"""The package's shape, checked: a folder for each layer, imports point down, pure modules stay pure, one counting seam.

wmdist/ holds folders and its two entry modules (`__init__.py`, `__main__.py`), nothing else. Each folder is
one layer, and the layers come from the folders, bottom to top:
- BELOW, the shared floors under the chapters, in order (each folder its own floor);
- the chapters: every folder holding a `chapter.py` (what the registry reads), one floor together;
- the capstones, one floor above them: `mesh/` (chapter 09), `yours/` (your own model) and `planner/`
  (chapter 11), which compose the chapters' techniques through their public functions;
- ABOVE, what serves the course and the application, in order.
A module may import its own folder and the floors below it; a chapter may not import another chapter
(what two chapters share moves down a floor). A new folder fails
`test_every_folder_is_placed_and_no_module_is_loose` until it is given a chapter.py or a place in BELOW, ABOVE or
CAPSTONES.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "wmdist"
BELOW = ("base", "costs", "comm", "runtime", "models", "course", "ui")   # pure bases and closed forms first
CAPSTONES = ("mesh", "yours", "planner")        # chapter 09, "your own model", chapter 11: build on the chapters
ABOVE = ("registry", "kernel", "session", "bench", "app")   # every demo by name, what serves the course, the app
ENTRY = ("__init__", "__main__")                # the package face and `python -m wmdist`: the only loose modules
PURE = ["base", "costs", "comm/mesh.py", "memory/footprint.py", "memory/remedies.py",
        "data_parallel/scaling.py", "pipeline/schedules.py", "pipeline/simulate.py", "pipeline/plan.py",
        "pipeline/bubble.py", "ring_attention/layout.py", "ring_attention/traffic.py",
        "mesh/spec.py", "mesh/patterns.py", "memory/transient.py", "memory/presets.py", "experts/tradeoff.py",
        "planner"]
NOT_IN_PURE = {"torch", "ipywidgets", "matplotlib", "IPython"}
ALLOWED_TORCH_DISTRIBUTED = ("torch.distributed.checkpoint", "torch.distributed.optim",
                             "torch.distributed.pipelining", "torch.distributed.tensor",
                             "torch.distributed.device_mesh", "torch.distributed.algorithms",
                             "torch.distributed.fsdp")


def _modules(root: Path = ROOT) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def _unit(path: Path, root: Path = ROOT) -> str:
    """The layer unit a file belongs to: its top folder under wmdist/, or its module name (the entry modules)."""
    rel = path.relative_to(root)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def folders(root: Path = ROOT) -> set[str]:
    """Every folder of the package that holds a module."""
    return {p.name for p in root.iterdir() if p.is_dir() and p.name != "__pycache__" and any(p.rglob("*.py"))}


def chapters(root: Path = ROOT) -> set[str]:
    """The chapter folders: those holding a chapter.py, the capstones aside."""
    return {p.parent.name for p in root.glob("*/chapter.py")} - set(CAPSTONES)


def floors(root: Path = ROOT) -> dict[str, int]:
    """Each placed unit's floor, bottom 0: BELOW in order, the chapters, the capstones, ABOVE in order, ENTRY."""
    order = [{name} for name in BELOW] + [chapters(root), set(CAPSTONES)] + [{name} for name in ABOVE] + [set(ENTRY)]
    return {name: floor for floor, names in enumerate(order) for name in names}


def placement_problems(root: Path = ROOT) -> list[str]:
    """What breaks "a folder for each layer": loose modules, folders in no layer, layers with no folder."""
    out = [f"wmdist/{p.name} is a loose module: move it into the folder of its layer"
           for p in sorted(root.glob("*.py")) if p.stem not in ENTRY]
    on_disk, chapter_folders, shared = folders(root), chapters(root), set(BELOW) | set(ABOVE)
    out += [f"wmdist/{name}/ is in no layer: give it a chapter.py, or a place in BELOW, ABOVE or CAPSTONES"
            for name in sorted(on_disk - shared - set(CAPSTONES) - chapter_folders)]
    out += [f"wmdist/{name}/ holds a chapter.py but sits in a shared layer"
            for name in sorted(chapter_folders & shared)]
    out += [f"tests/test_layers.py names the layer {name}/, which is no folder of wmdist/"
            for name in BELOW + ABOVE if name not in on_disk]
    return out


def _imports(path: Path) -> list[str]:
    """Every imported module name, including imports inside functions.

    `from wmdist.X import y` names wmdist.X, and also wmdist.X.y where y is a module of X, so what it loads
    is followed to the file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module == "wmdist":
            out += [f"wmdist.{a.name}" for a in node.names]          # from wmdist import costs
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append(node.module)
            if node.module.startswith("wmdist."):                   # from wmdist.course import report
                out += [f"{node.module}.{a.name}" for a in node.names if _module_path(f"{node.module}.{a.name}")]
    return out


def import_problem(unit: str, name: str, floor: dict[str, int], chapter_folders: set[str]) -> str | None:
    """Why `unit` may not import the wmdist module `name` (None if it may)."""
    parts = name.split(".")
    target = parts[1] if len(parts) > 1 else "__init__"
    if target == unit:
        return None
    if target not in floor:
        return f"{unit} imports {name}, whose folder is in no layer"
    if unit in chapter_folders and target in chapter_folders:
        return f"chapter {unit} imports chapter {target} ({name}): move what they share down a layer"
    if floor[target] > floor[unit]:
        return f"{unit} imports {name}, which sits above it"
    return None


def test_every_folder_is_placed_and_no_module_is_loose():
    found = placement_problems()
    assert found == [], "\n".join(found)


def test_the_chapter_folders_are_the_ones_the_registry_reads():
    """A folder holding chapter.py is a chapter (or a capstone) because the registry reads that file: the two agree."""
    tree = ast.parse((ROOT / "registry" / "demos.py").read_text())
    read = {node.module.split(".")[1] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            and node.module and node.module.startswith("wmdist.") and any(a.name == "chapter" for a in node.names)}
    holding = {p.parent.name for p in ROOT.glob("*/chapter.py")}
    assert read == holding, f"the registry reads {sorted(read - holding)}, with no chapter.py, " \
                            f"and misses {sorted(holding - read)}"
    assert {"data_parallel", "pipeline", "experts"} <= chapters() and "mesh" not in chapters()


def test_the_layer_checks_can_fail(tmp_path):
    """A loose module, an unplaced folder, a chapter importing a chapter and an import upward are each caught."""
    for folder in BELOW + ABOVE + ("ch_a", "ch_b", "stray"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    for chapter in ("ch_a", "ch_b"):
        (tmp_path / chapter / "chapter.py").write_text("DEMOS = []\n")
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "helpers.py").write_text("")
    assert placement_problems(tmp_path) == [
        "wmdist/helpers.py is a loose module: move it into the folder of its layer",
        "wmdist/stray/ is in no layer: give it a chapter.py, or a place in BELOW, ABOVE or CAPSTONES"]
    floor, chapter_folders = floors(tmp_path), chapters(tmp_path)
    assert chapter_folders == {"ch_a", "ch_b"}
    assert "chapter ch_a imports chapter ch_b" in import_problem("ch_a", "wmdist.ch_b.x", floor, chapter_folders)
    assert "sits above it" in import_problem("costs", "wmdist.course.report", floor, chapter_folders)
    assert "sits above it" in import_problem("ch_a", "wmdist.mesh.step", floor, chapter_folders)
    assert "in no layer" in import_problem("ch_a", "wmdist.stray", floor, chapter_folders)
    assert import_problem("mesh", "wmdist.ch_a.x", floor, chapter_folders) is None     # a capstone builds on chapters
    assert import_problem("ch_a", "wmdist.course.report", floor, chapter_folders) is None


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_down(path):
    unit, floor, chapter_folders = _unit(path), floors(), chapters()
    assert unit in floor, f"{path.relative_to(ROOT)} is in no layer: place its folder"
    found = [problem for name in _imports(path) if name == "wmdist" or name.startswith("wmdist.")
             if (problem := import_problem(unit, name, floor, chapter_folders))]
    assert not found, "\n".join(found)


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


@pytest.mark.parametrize("path", [p for p in _modules() if _unit(p) in chapters() | set(CAPSTONES)],
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
