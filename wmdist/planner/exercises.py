"""Chapter 11 exercise: the pipeline bubble term of the planner's step, checked against the planner's own rule.

The learner gets what the breakdown knows about a layout's slowest stage (pipeline stages P, microbatches M
per step, virtual stages v per rank, and the stage's busy seconds: compute, elementwise work and the exposed
tp, cp and ep time) and returns the bubble in seconds. The reference is breakdown.partial_breakdown's rule for
equal stages, costs.pipeline.bubble_over_ideal times the busy time (chapter 05 measured that ratio on ranks),
rounded to the nanosecond so that any order of the same arithmetic agrees; where the other stages are lighter
(the head on the last one, a padded partition) the planner fills and drains them at their own pace
(stage.bubble_ratio): the same rule on their share of the busy time. The cases include real layouts' numbers.
"""
from __future__ import annotations

from wmdist.costs.pipeline import bubble_over_ideal
from wmdist.course.exercises import Exercise


def bubble_solution(stages: int, microbatches: int, virtual: int, busy_seconds: float) -> float:
    """The bubble: (P - 1) / (v M) of the stage's busy time, in seconds rounded to the nanosecond."""
    return round(bubble_over_ideal(stages, microbatches, chunks=virtual) * busy_seconds, 9)


def bubble_cases() -> list[tuple[int, int, int, float]]:
    """(P, M, v, busy seconds): no pipeline, plain 1F1B, interleaved, and Llama-3-like stages (16 of them,
    16 or 128 microbatches, 4 to 7 virtual stages)."""
    return [(1, 8, 1, 5.0), (4, 8, 1, 2.0), (4, 8, 2, 2.0), (16, 16, 7, 7.84), (16, 128, 4, 5.14),
            (32, 64, 3, 4.87), (8, 8, 1, 0.125)]


BUBBLE = Exercise(
    name="pipeline bubble term",
    task="Given a layout's pipeline stages P, microbatches M per step, virtual stages v per rank and the slowest "
         "stage's busy seconds (compute, elementwise work and the exposed tp, cp and ep time), return the bubble that the "
         "planner adds to the step, in seconds, rounded with round(x, 9).",
    reference=bubble_solution,
    cases=bubble_cases,
    hint="chapter 05's bubble over the ideal time: P - 1 slots of fill and drain against M microbatches, and "
         "interleaving makes each slot v times shorter; it is a share of the busy time, not of the whole step.",
)

EXERCISES = [BUBBLE]
