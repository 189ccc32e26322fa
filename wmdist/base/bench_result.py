"""What one benchmark reports: its inputs, what it measured, the headline figure and its target, and the load.

Below the benchmarks, so that `bench/suite.py` (the measurements), `bench/panels.py` (the panels'
timings) and `session/bench.py` all use it without importing each other. Pure: the load averages
come in as numbers (`bench/load.py` reads them), and `load_verdict` judges them.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

# A figure is flagged when the others' load slows each of the benchmark's busy processes by more than this
# factor (see `load_verdict`): at 1.25 they get under 80% of the CPU they would have had on this machine alone.
SLOWDOWN_LIMIT = 1.25
LOAD_WINDOW_S = 60.0       # the 1-minute load average: an exponential average with this time constant


@dataclass(frozen=True, kw_only=True)
class Load:
    """The 1-minute load average just before and just after one figure was measured, and what the figure ran.

    before / after: os.getloadavg()[0] (None where the system has none). seconds: how long the figure
    took. busy: processes the benchmark itself keeps on a CPU meanwhile (its ranks). timed: False for a
    memory figure, which load slows down but does not change.
    """
    figure: str
    before: float | None
    after: float | None
    seconds: float
    cpus: int
    busy: float
    timed: bool = True


def others_load(load: Load) -> float | None:
    """Runnable tasks that are not the benchmark's, estimated from the 1-minute load averages around a figure.

    Two estimates, and the larger is kept (a figure is judged by the worst sign of a busy machine):
    the load just before (nothing of this figure in it yet; it may still hold the decaying tail of a
    benchmark that ran just before), and the load just after less the most this figure could have added
    to it: `busy` processes runnable for `seconds` raise a 1-minute average by busy (1 - exp(-seconds/60)).
    """
    known = [x for x in (load.before, None if load.after is None
                         else load.after - load.busy * (1 - math.exp(-load.seconds / LOAD_WINDOW_S))) if x is not None]
    return max(0.0, *known) if known else None


def slowdown(others: float, busy: float, cpus: int) -> float:
    """How much slower a CPU-bound process of the benchmark runs beside `others` than on this machine alone.

    Alone, `busy` processes on `cpus` cores each get min(1, cpus / busy) of a core; beside `others`
    runnable tasks, a fair scheduler gives each min(1, cpus / (busy + others)). The ratio is
    max(1, (busy + others) / max(busy, cpus)): 1 while the others fit on the cores the benchmark leaves
    free (load <= cpus - busy), and growing with every task beyond.
    """
    return max(1.0, (busy + others) / max(busy, cpus, 1e-9))


def load_verdict(load: Load) -> str | None:
    """None if the load leaves the figure meaning what it says, else the one-line reason it does not.

    Rule: the figure is too loaded when `slowdown(others_load, busy, cpus)` exceeds SLOWDOWN_LIMIT, that is
    when the 1-minute load of other work exceeds the cores the benchmark leaves free (cpus - busy, at
    least 0) by more than a quarter of max(cpus, busy). Then the benchmark's processes get under 80% of
    the CPU they get alone, and by amounts that change from second to second: a 20% error swamps what
    these benchmarks report (ring-vs-gloo's target is 0.9x, a 10% margin), ratios included, since the
    two sides of a ratio are not slowed alike. A memory figure (timed=False) is never judged so.
    The 1-minute average lags: for a figure of a few seconds it tells how busy the machine was over the
    minute around it, which is what the kernel keeps; a burst within the figure can still slip past.
    """
    others = others_load(load)
    if not load.timed or others is None:
        return None
    factor = slowdown(others, load.busy, load.cpus)
    if factor <= SLOWDOWN_LIMIT:
        return None
    return (f"load too high for this figure to mean much: other work's 1-min load ~{others:.1f} beside this "
            f"figure's {load.busy:g} busy process{'' if load.busy == 1 else 'es'} on {load.cpus} CPUs slows each {factor:.2f}x "
            f"(over {SLOWDOWN_LIMIT:g}x)")


def load_line(load: Load) -> str:
    """`figure: 1-min load B -> A over S s, C CPUs, K busy here: ok`, or the verdict's reason after the colon."""
    if load.before is None and load.after is None:
        return f"{load.figure}: no load average on this system"
    numbers = (f"{load.figure}: 1-min load {_num(load.before)} -> {_num(load.after)} over {load.seconds:.1f} s, "
               f"{load.cpus} CPUs, {load.busy:g} busy here")
    if not load.timed:
        return f"{numbers} (a memory figure: load slows it, does not change it)"
    return f"{numbers}: {load_verdict(load) or 'ok'}"


def _num(x: float | None) -> str:
    return "?" if x is None else f"{x:.2f}"


@dataclass(kw_only=True)
class BenchResult:
    """One benchmark's inputs, measurements, its headline figure (a ratio, or MB) and target, and the load around it.

    loads: one Load per figure measured (empty: not measured; printed so).
    """
    name: str
    inputs: dict[str, Any]
    measured: dict[str, Any]
    value: float
    unit: str           # "x" for a ratio, "MB" for memory
    target: str
    met: bool
    notes: list[str] = field(default_factory=list)
    loads: tuple[Load, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types: the loads a list of dicts, as json.loads gives them back."""
        return {**asdict(self), "loads": [asdict(x) for x in self.loads]}

    def __str__(self) -> str:
        loaded = any(load_verdict(x) for x in self.loads)
        head = (f"{self.name}: {self.value:.3g}{self.unit} (target {self.target}) -> {'met' if self.met else 'NOT met'}"
                + ("  [LOAD TOO HIGH for it to mean much: see load]" if loaded else ""))
        lines = [head, f"  inputs:   {self.inputs}", f"  measured: {self.measured}"]
        lines += [f"  load:     {load_line(x)}" for x in self.loads] or ["  load:     not measured"]
        return "\n".join(lines + [f"  note: {n}" for n in self.notes])
