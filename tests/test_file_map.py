"""The file maps cannot go stale: architecture.md names every module, runtime's docstring every file (issue 32 §1).

The map lists each `wmdist/**/*.py` except `__init__.py` (a folder's heading stands for it) under the
heading of its folder, one line each: "- `path` — what it is for", the path relative to wmdist/.
A failure prints the exact lines to add (with the module's docstring as a first draft of the
description) or to remove.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "wmdist"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
ENTRY = re.compile(r"^- `([\w/]+\.py)` — \S")


def modules(package: Path = PACKAGE) -> list[str]:
    """Every module the map must name: paths relative to the package, __init__.py left out."""
    return sorted(p.relative_to(package).as_posix() for p in package.rglob("*.py")
                  if p.name != "__init__.py" and "__pycache__" not in p.parts)


def heading(path: str) -> str:
    """The map's heading for a module's folder: "### `wmdist/runtime/`", or "### `wmdist/`" at the top."""
    folder = path.rpartition("/")[0]
    return f"### `wmdist/{folder + '/' if folder else ''}`"


def entries(text: str) -> tuple[dict[str, str], list[str]]:
    """The map's entries ({path: the heading it sits under}) and its malformed lines, read from the document."""
    section = text.split("\n## File map\n", 1)
    assert len(section) == 2, "docs/architecture.md has no '## File map' section"
    body = re.split(r"\n## ", section[1], maxsplit=1)[0]
    found, bad, under = {}, [], ""
    for line in body.splitlines():
        if line.startswith("### "):
            under = line
        elif line.startswith("- "):
            match = ENTRY.match(line)
            if match:
                found[match.group(1)] = under
            else:
                bad.append(line)
    return found, bad


def summary(path: Path) -> str:
    """The first sentence of a module's docstring, as a draft of its line in the map."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or "(no docstring: say what it is for)"
    return " ".join(doc.split("\n\n")[0].split()).split(". ")[0].rstrip(".")


def problems(text: str, package: Path = PACKAGE) -> list[str]:
    """What is wrong with the map against the files on disk, as instructions to fix it."""
    found, bad = entries(text)
    on_disk = modules(package)
    out = [f"malformed map line (expected '- `path.py` — what it is for'): {line!r}" for line in bad]
    missing: dict[str, list[str]] = {}
    for path in on_disk:
        if path not in found:
            missing.setdefault(heading(path), []).append(f"- `{path}` — {summary(package / path)}")
    out += [f"add under {head} in docs/architecture.md{'' if head in text.splitlines() else ' (a new heading)'}:\n"
            + "\n".join(lines) for head, lines in missing.items()]
    out += [f"remove the map line for `{path}` (no such file wmdist/{path})" for path in found if path not in on_disk]
    out += [f"move the map line for `{path}` from under {under or 'no heading'} to under {heading(path)}"
            for path, under in found.items() if path in on_disk and under != heading(path)]
    return out


def test_the_map_names_every_module_and_nothing_else():
    found = problems(ARCHITECTURE.read_text())
    assert found == [], "docs/architecture.md's file map is stale:\n" + "\n".join(found)


def test_the_check_finds_a_missing_a_stale_and_a_misplaced_entry(tmp_path):
    (tmp_path / "comm").mkdir()
    (tmp_path / "__init__.py").write_text('"""The package."""\n')
    (tmp_path / "cli.py").write_text('"""The command line. More here."""\n')
    (tmp_path / "comm" / "ring.py").write_text('"""Rings."""\n')
    (tmp_path / "comm" / "new.py").write_text('"""A new module, not yet mapped. Details."""\n')
    (tmp_path / "ui").mkdir()
    (tmp_path / "ui" / "choose.py").write_text("x = 1\n")
    text = ("# doc\n\n## File map\n\nintro\n\n### `wmdist/`\n- `cli.py` — the CLI\n- `comm/ring.py` — rings\n"
            "- `gone.py` — removed last week\n- `bad.py`: no dash\n\n### `wmdist/comm/`\n\n## Next section\n"
            "- `outside.py` — not in the map\n")
    assert problems(text, tmp_path) == [
        "malformed map line (expected '- `path.py` — what it is for'): '- `bad.py`: no dash'",
        "add under ### `wmdist/comm/` in docs/architecture.md:\n- `comm/new.py` — A new module, not yet mapped",
        "add under ### `wmdist/ui/` in docs/architecture.md (a new heading):\n"
        "- `ui/choose.py` — (no docstring: say what it is for)",
        "remove the map line for `gone.py` (no such file wmdist/gone.py)",
        "move the map line for `comm/ring.py` from under ### `wmdist/` to under ### `wmdist/comm/`"]


def test_runtime_docstring_names_every_runtime_module():
    doc = ast.get_docstring(ast.parse((PACKAGE / "runtime" / "__init__.py").read_text())) or ""
    files = sorted(p.name for p in (PACKAGE / "runtime").glob("*.py") if p.name != "__init__.py")
    unnamed = [name for name in files if not re.search(rf"(?<![\w/])(runtime/)?{re.escape(name)}\b", doc)]
    assert unnamed == [], f"wmdist/runtime/__init__.py's docstring does not name {unnamed}: add a line for each"
