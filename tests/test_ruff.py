"""The code base stays lint-clean: `ruff check` (rules from pyproject's [tool.ruff.lint]) over the package,
the tests and the tools. It runs ruff as a module of this interpreter so the test extra's ruff is used."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# TEMPORARY: the lead removes this after merging planner/ and chapter 11
EXCLUDE = ["--extend-exclude", "wmdist/planner,tests/test_planner*.py,tests/test_published_runs.py,"
           "tests/test_browser.py,tests/test_panel_speed.py,tests/test_site.py,notebooks"]


def _ruff(*paths: str | Path) -> subprocess.CompletedProcess[str]:
    """Run `python -m ruff check` on `paths` from the repository root, with pyproject's settings."""
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *EXCLUDE, *map(str, paths)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_is_installed() -> None:
    """Without ruff the check below could not run: say how to get it rather than pass silently."""
    proc = subprocess.run([sys.executable, "-m", "ruff", "--version"], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        pytest.fail(f"ruff is not installed for {sys.executable}: pip install -e '.[test]'\n{proc.stderr}")


def test_ruff_clean() -> None:
    """wmdist, tests and tools pass `ruff check`; the failure message is ruff's own report."""
    proc = _ruff("wmdist", "tests", "tools")
    assert proc.returncode == 0, f"ruff check failed:\n{proc.stdout}\n{proc.stderr}"


def test_ruff_catches_a_long_line(tmp_path: Path) -> None:
    """The check has teeth: a planted 121-character line (limit 120) under the project's settings fails."""
    bad = tmp_path / "bad.py"
    bad.write_text("x = '" + "a" * 115 + "'\n")
    assert len(bad.read_text().rstrip("\n")) == 121
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--config",
                           str(ROOT / "pyproject.toml"), str(bad)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "E501" in proc.stdout, proc.stdout + proc.stderr
