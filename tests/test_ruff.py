"""The code base stays lint-clean: `ruff check` (rules from pyproject's [tool.ruff.lint]) over the package,
the tests and the tools. It runs ruff as a module of this interpreter so the test extra's ruff is used."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Lines over pyproject's 120 characters still in the tree when ruff joined the suite (issue 32 §4): the
# number may fall, never rise. Lower it as lines are wrapped; at 0, drop E501 from the ignore below.
LONG_LINES_LEFT = 210


def _ruff(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """Run `python -m ruff check` with `args` from the repository root, with pyproject's settings."""
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *map(str, args)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_is_installed() -> None:
    """Without ruff the check below could not run: say how to get it rather than pass silently."""
    proc = subprocess.run([sys.executable, "-m", "ruff", "--version"], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        pytest.fail(f"ruff is not installed for {sys.executable}: pip install -e '.[test]'\n{proc.stderr}")


def test_ruff_clean() -> None:
    """wmdist, tests and tools pass `ruff check` on every selected rule but the line length (counted next);
    the failure message is ruff's own report."""
    proc = _ruff("--extend-ignore", "E501", "wmdist", "tests", "tools")
    assert proc.returncode == 0, f"ruff check failed:\n{proc.stdout}\n{proc.stderr}"


def test_long_lines_only_fall() -> None:
    """No new line over 120 characters: the tree's count of them is at most LONG_LINES_LEFT."""
    proc = _ruff("--select", "E501", "--output-format", "concise", "wmdist", "tests", "tools")
    long_lines = [line for line in proc.stdout.splitlines() if " E501 " in line]
    assert proc.returncode in (0, 1) and (proc.returncode == 0) == (not long_lines), proc.stdout + proc.stderr
    assert len(long_lines) <= LONG_LINES_LEFT, \
        f"{len(long_lines)} lines over 120 characters (at most {LONG_LINES_LEFT}); the newest:\n" + \
        "\n".join(long_lines[-20:])


def test_ruff_catches_a_long_line(tmp_path: Path) -> None:
    """The check has teeth: a planted 121-character line (limit 120) under the project's settings fails."""
    bad = tmp_path / "bad.py"
    bad.write_text("x = '" + "a" * 115 + "'\n")
    assert len(bad.read_text().rstrip("\n")) == 121
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--config",
                           str(ROOT / "pyproject.toml"), str(bad)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "E501" in proc.stdout, proc.stdout + proc.stderr
