"""Exercises: the reader writes a function in a cell, a checker runs it and says what is wrong.

An Exercise names a reference solution and how to feed it: `make_inputs(rank,
world_size)` for a rank function run on real ranks, or `cases()` for a pure
function checked over a grid of arguments. The notebook cell ships a stub
that raises NotImplementedError; `check(exercise, fn)` answers a stub with
"not attempted yet" and the hint (deterministic text, so nbval can store it),
and an attempt with which rank and element differ, expected vs got, or which
rank failed and how. `solution(exercise)` prints the reference for a reader
who wants it. Chapters define their Exercise values next to the technique.
"""
from __future__ import annotations

import inspect
import textwrap
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch

from wmdist.runtime import RankFailure, run

NOT_ATTEMPTED = "not attempted yet"


@dataclass(kw_only=True, frozen=True)
class Exercise:
    """What the reader must write, and how to judge it.

    Rank exercises: `reference(ctx, *inputs)` and the reader's function get
    the same `make_inputs(rank, world_size)` on every rank and must return the
    same tensor within `tolerance` (`reason` says why that tolerance). Pure
    exercises: `reference(*case)` and the reader's function must return equal
    values for every tuple of `cases()`.
    """
    name: str
    task: str
    reference: Callable[..., Any]
    hint: str
    make_inputs: Callable[[int, int], tuple] | None = None
    cases: Callable[[], Iterable[tuple]] | None = None
    world_sizes: tuple[int, ...] = (4,)
    tolerance: float = 0.0
    reason: str = "the same operations in the same order: bitwise equal"

    def __post_init__(self) -> None:
        if (self.make_inputs is None) == (self.cases is None):
            raise ValueError(f"exercise {self.name!r}: give exactly one of make_inputs (ranks) or cases (pure)")


@dataclass(frozen=True)
class ExerciseResult:
    """The checker's answer; prints as a sentence or two. status: passed | wrong | not attempted yet."""
    passed: bool
    message: str
    details: list[str] = field(default_factory=list)
    status: str = "wrong"

    def __str__(self) -> str:
        return "\n".join([self.message, *self.details])

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))


def solution(exercise: Exercise) -> str:
    """Print (and return) the reference solution's source code."""
    source = textwrap.dedent(inspect.getsource(exercise.reference))
    print(source)
    return source


def _not_attempted(exercise: Exercise) -> ExerciseResult:
    return ExerciseResult(False, f"{exercise.name}: {NOT_ATTEMPTED}.", [f"hint: {exercise.hint}"], NOT_ATTEMPTED)


def _on_rank(ctx: Any, fn: Callable[..., Any], make_inputs: Callable[[int, int], tuple]) -> Any:
    return fn(ctx, *make_inputs(ctx.rank, ctx.world_size))


def compare(rank: int, got: Any, expected: torch.Tensor, tolerance: float) -> str | None:
    """None if `got` matches, else a sentence saying how it differs."""
    if not isinstance(got, torch.Tensor):
        return f"rank {rank} returned {type(got).__name__}, expected a tensor of shape {tuple(expected.shape)}"
    if got.shape != expected.shape:
        return f"rank {rank} returned shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    diff = (got.double() - expected.double()).abs()
    bad = (diff > tolerance) | diff.isnan()
    if not bool(bad.any()):
        return None
    index = tuple(int(i) for i in bad.nonzero()[0])
    where = f"element {list(index)}" if index else "the value"
    return (f"rank {rank}, {where}: expected {expected[index].item():.6g}, got {got[index].item():.6g}"
            f" ({int(bad.sum())} of {bad.numel()} elements wrong)")


def _check_pure(exercise: Exercise, fn: Callable[..., Any]) -> ExerciseResult:
    names = list(inspect.signature(exercise.reference).parameters)
    cases = 0
    for case in exercise.cases():
        call = "fn(" + ", ".join(f"{k}={v!r}" for k, v in zip(names, case)) + ")"
        expected = exercise.reference(*case)
        try:
            got = fn(*case)
        except NotImplementedError:
            return _not_attempted(exercise)
        except Exception as err:  # the reader's bug, reported as text
            return ExerciseResult(False, f"{exercise.name}: not yet.", [f"{call} raised {type(err).__name__}: {err}"])
        if got != expected:
            return ExerciseResult(False, f"{exercise.name}: not yet.", [f"{call} returned {got!r}, expected {expected!r}"])
        cases += 1
    return ExerciseResult(True, f"{exercise.name}: passed all {cases} cases.", status="passed")


def _raised_not_implemented(detail: str) -> bool:
    """Whether a rank's traceback ends in NotImplementedError (the stub a notebook ships)."""
    lines = [ln for ln in detail.strip().splitlines() if ln.strip()]
    return bool(lines) and lines[-1].startswith("NotImplementedError")


def _check_ranks(exercise: Exercise, fn: Callable[..., Any], world_sizes: tuple[int, ...],
                 timeout: float) -> ExerciseResult:
    for n in world_sizes:
        expected = run(_on_rank, n, exercise.reference, exercise.make_inputs, timeout=timeout)
        try:
            got = run(_on_rank, n, fn, exercise.make_inputs, timeout=timeout)
        except RankFailure as err:
            if err.reason == "raised" and _raised_not_implemented(err.detail):
                return _not_attempted(exercise)
            lines = str(err).splitlines()
            if err.reason == "raised":
                lines = [lines[0], *lines[1:][-4:]]
            # the hint is for ranks that wait on each other: found as it happens (unmatched) or at the timeout
            hint = [f"hint: {exercise.hint}"] if err.reason in ("timeout", "unmatched") else []
            return ExerciseResult(False, f"{exercise.name}: not yet, on {n} ranks.", lines + hint)
        problems = [p for r in range(n) if (p := compare(r, got[r], expected[r], exercise.tolerance))]
        if problems:
            return ExerciseResult(False, f"{exercise.name}: not yet, on {n} ranks.", problems)
    sizes = ", ".join(map(str, world_sizes))
    return ExerciseResult(True, f"{exercise.name}: passed on {sizes} ranks.", status="passed")


def check(exercise: Exercise, fn: Callable[..., Any], *, world_sizes: tuple[int, ...] | None = None,
          timeout: float = 30.0) -> ExerciseResult:
    """Judge the reader's `fn` against the exercise's reference (on real ranks for a rank exercise)."""
    if not callable(fn):
        return ExerciseResult(False, f"{exercise.name}: expected a function, got {type(fn).__name__}")
    if exercise.cases is not None:
        return _check_pure(exercise, fn)
    return _check_ranks(exercise, fn, world_sizes or exercise.world_sizes, timeout)
