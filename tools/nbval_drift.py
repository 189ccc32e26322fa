"""A pytest plugin for the suite's nbval run: stored pictures must be what the code draws now.

nbval runs every notebook once (the README's test command). After each cell passes, this also
compares the pictures the notebook stores with those the current code just drew
(refresh_notebook.stale_pictures: how many, and each one's size as it would be stored), so a
stored output that the code no longer draws fails the suite instead of being shown to readers.
Checked text outputs (NBVAL_CHECK_OUTPUT) are compared by nbval itself.

A plugin registered by tests/conftest.py (`pytest_configure`), not a notebooks/conftest.py:
two files named conftest.py would both be the module `conftest`, and the tests' `from conftest
import ...` would find the wrong one. So it runs where tests/ is collected too (the README's
`python -m pytest`, which collects tests/ and notebooks/), not under `pytest notebooks/x.ipynb` alone.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from refresh_notebook import CHECK, stale_pictures  # noqa: E402  (a script in tools/, not a package)

# What a stored picture may differ by: the larger of 8 px and 3 % of its size. Panels are drawn on fixed
# canvases (exact), but a figure is cropped by the inline backend to what it draws (bbox_inches="tight"):
# a measured number one digit longer in a label at the figure's edge moves that edge by about one digit,
# ~8 px at 10 pt, and a legend of measured values by a few digits (chapter 01's fit figure: 728 vs 715 px
# wide in two runs, 1.8 %). A figure drawn at another size differs by far more (the 860 vs 700 px
# timelines of issue 25: 19 %).
TOLERANCE_PX = 8
TOLERANCE_SHARE = 0.03


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    result = yield                                   # nbval ran the cell; a failing cell has raised already
    fresh, cell = getattr(item, "test_outputs", None), getattr(item, "cell", None)
    if fresh is not None and cell is not None and cell.get("execution_count") is not None:
        problems = stale_pictures(cell.outputs, fresh, checked=CHECK in cell.source, tolerance_px=TOLERANCE_PX,
                                  tolerance_share=TOLERANCE_SHARE)
        if problems:
            pytest.fail("its stored outputs are not what the code draws now (run tools/refresh_notebook.py on it):\n  "
                        + "\n  ".join(problems), pytrace=False)
    return result
