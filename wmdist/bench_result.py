"""What one benchmark reports: its inputs, what it measured, the headline figure and its target.

On its own, so that `bench.py` (the measurements) and `bench_panels.py` (the panels' timings)
both use it without importing each other.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(kw_only=True)
class BenchResult:
    """One benchmark's inputs, measurements, its headline figure (a ratio, or MB) and target."""
    name: str
    inputs: dict[str, Any]
    measured: dict[str, Any]
    value: float
    unit: str           # "x" for a ratio, "MB" for memory
    target: str
    met: bool
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        lines = [f"{self.name}: {self.value:.3g}{self.unit} (target {self.target}) -> {'met' if self.met else 'NOT met'}",
                 f"  inputs:   {self.inputs}", f"  measured: {self.measured}"]
        return "\n".join(lines + [f"  note: {n}" for n in self.notes])
