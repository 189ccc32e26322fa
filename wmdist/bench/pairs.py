"""Two things timed in pairs, back to back: the median of the per-pair ratios, and how to read it beside the medians.

ring-vs-gloo times comm.ring_all_reduce and gloo's all_reduce alternately, once each per pair. Its
headline is the median over pairs of (gloo time / ring time); the two medians printed beside it need
not divide to it, since each median may come from a different pair. `PairedRatio.lines()` prints every
pair in run order, so the headline can be recomputed from the printed numbers, and says why the two
figures differ. Pure: timings in, numbers and text out.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

TIME_DIGITS = 4          # seconds printed to 4 significant digits
RATIO_DIGITS = 3         # ratios printed to 0.001


@dataclass(frozen=True, kw_only=True)
class PairedRatio:
    """`top` and `bottom` seconds of each pair, in run order; the headline is the median of top / bottom."""
    top_name: str
    bottom_name: str
    top: tuple[float, ...]
    bottom: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.top or len(self.top) != len(self.bottom):
            raise ValueError(f"expected as many {self.top_name} as {self.bottom_name} times, at least one; "
                             f"got {len(self.top)} and {len(self.bottom)}")
        if not all(t > 0 for t in (*self.top, *self.bottom)):
            raise ValueError(f"expected positive times, got {self.top} and {self.bottom}")

    @property
    def ratios(self) -> list[float]:
        """top / bottom for each pair, in run order."""
        return [t / b for t, b in zip(self.top, self.bottom)]

    @property
    def headline(self) -> float:
        """The median of the per-pair ratios."""
        return statistics.median(self.ratios)

    @property
    def ratio_of_medians(self) -> float:
        return statistics.median(self.top) / statistics.median(self.bottom)

    def quartiles(self) -> tuple[float, float]:
        """The lower and upper quartile of the per-pair ratios (the sorted list's n/4-th and 3n/4-th)."""
        s = sorted(self.ratios)
        return s[len(s) // 4], s[(3 * len(s)) // 4]

    def lines(self) -> list[str]:
        """The headline and where it comes from, every pair, the ratio of the medians and why it is another figure."""
        t, b, r = self.top_name, self.bottom_name, RATIO_DIGITS
        pairs = "; ".join(f"{i + 1}: {b} {y:.{TIME_DIGITS}g} s, {t} {x:.{TIME_DIGITS}g} s, {x / y:.{r}f}"
                          for i, (x, y) in enumerate(zip(self.top, self.bottom)))
        low, high = self.quartiles()
        return [
            f"headline {self.headline:.{r}f}x = the median of the {len(self.top)} per-pair ratios {t} time / {b} time "
            "listed next",
            f"pairs in run order ({b} s, {t} s, {t}/{b}): {pairs}",
            f"ratio of the medians: {t} {statistics.median(self.top):.{TIME_DIGITS}g} s / {b} "
            f"{statistics.median(self.bottom):.{TIME_DIGITS}g} s = {self.ratio_of_medians:.{r}f}x, not the headline: "
            f"each median may come from a different pair, while a pair's two runs are back to back, so load that "
            f"drifts between pairs cancels in its ratio; the two differ when the pairs were slowed unevenly "
            f"(pair ratios' quartiles {low:.{r}f}-{high:.{r}f})",
        ]
