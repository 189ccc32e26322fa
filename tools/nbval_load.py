"""A pytest plugin for the suite's nbval run: every notebook runs on a "loaded" machine, so a checked
output that depends on timing fails the suite (issue 35 §3).

A checked cell (NBVAL_CHECK_OUTPUT) holds the output stored by tools/refresh_notebook.py, run on a
quiet machine; nbval compares the fresh output with it. This plugin makes that fresh run a loaded
one: each notebook's kernel starts with tools/nbval_load_site on its PYTHONPATH and
WMDIST_LATE_WAKEUPS set, so in the kernel and in every rank it starts each `time.sleep` wakes late
by an exponential delay of mean LATE_WAKEUPS times what it asked (see that folder's sitecustomize.py). A
cell that prints a verdict or a number taken from a measured time (chapter 05's "measured within
0.05 of it: True" did, and printed False at load 11 to 15) then differs from its stored output and
fails, on any machine, quiet or not, on every run of the suite.

Why late wake-ups and not CPU hogs beside the kernel: the course times ranks that sleep a fixed slot
(the stand-in for a real model's work, so that two cores can time eight ranks), and what a hog does
to such a measurement is wake the sleepers late. Four real hogs on two cores slow every cell's
compute as well, which would roughly double the notebooks' share of the suite; stretching only the
sleeps costs what they sleep (on average once more at LATE_WAKEUPS = 1: chapter 05 ran in 32 s
under nbval, 10 s of it sleeping) and flips such a verdict far more reliably than hogs, which flipped
05's cell at load 11 to 15 but not once at two hogs. The size is chosen for that cell: with delays
uniform up to 1x the old cell 27 still passed once in two tries (median idle 0.33 against its 0.323
limit); with exponential delays of mean 1x a simulation of its schedule misses the limit in 99.9 %
of median-of-3 runs (real message latency only adds idle time). What it does not model, a computed timing (a fit of
measured transfer times), is reported by the cells as a figure, never in a checked output.

WMDIST_LATE_WAKEUPS=0 in the suite's environment turns it off (a quiet run, as the stored outputs were made).
The variables are set only while an nbval notebook's first cell is being set up (where nbval starts
its kernel), and put back at once, so nothing else the suite starts is affected.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

SITE = Path(__file__).resolve().parent / "nbval_load_site"
LATE_WAKEUPS = 1.0       # a sleep of s wakes after s + s * Exp(1): 2 s on average
VARIABLE = "WMDIST_LATE_WAKEUPS"


def kernel_environment(base: dict[str, str], spread: float = LATE_WAKEUPS) -> dict[str, str]:
    """`base` with the late wake-ups switched on for every Python process started from it."""
    path = os.pathsep.join(filter(None, [str(SITE), base.get("PYTHONPATH", "")]))
    return {**base, "PYTHONPATH": path, VARIABLE: repr(float(spread))}


def _is_notebook_cell(item: pytest.Item) -> bool:
    return type(item).__name__ == "IPyNbCell"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    """Start each notebook's kernel (nbval does it in the setup of its first cell) with late wake-ups."""
    if not _is_notebook_cell(item) or os.environ.get(VARIABLE) == "0":
        return (yield)
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", VARIABLE)}
    os.environ.update(kernel_environment(dict(os.environ)))
    try:
        return (yield)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
