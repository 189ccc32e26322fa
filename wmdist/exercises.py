"""Exercises: the reader writes a rank function in a cell, a checker runs it on real ranks.

An Exercise names a reference rank function and the inputs each rank gets.
`check(exercise, fn)` runs the reference and the reader's function on the
same ranks and inputs and answers in plain words: which rank, which element,
expected vs got, or which rank failed and how. Chapters define their own
Exercise values next to the technique they practise.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from wmdist.comm import Context, exchange
from wmdist.launch import RankFailure, run


@dataclass(frozen=True)
class Exercise:
    """What the reader must write, and how to judge it.

    `reference(ctx, *inputs)` and the reader's function get the same inputs,
    `make_inputs(rank, world_size)` (drawn on the rank), and must return the
    same tensor within `tolerance` (`reason` says why that tolerance).
    """
    name: str
    task: str
    reference: Callable[..., Any]
    make_inputs: Callable[[int, int], tuple]
    world_sizes: tuple[int, ...] = (4,)
    tolerance: float = 0.0
    reason: str = "the same operations in the same order: bitwise equal"
    hint: str = ""


@dataclass(frozen=True)
class Verdict:
    """The checker's answer. Prints as a sentence or two."""
    passed: bool
    message: str
    details: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return "\n".join([self.message, *self.details])

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))


def _on_rank(ctx: Context, fn: Callable[..., Any], make_inputs: Callable[[int, int], tuple]) -> Any:
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


def check(exercise: Exercise, fn: Callable[..., Any], world_sizes: tuple[int, ...] | None = None,
          timeout: float = 30.0) -> Verdict:
    """Run the reader's `fn` on real ranks against the exercise's reference."""
    if not callable(fn):
        return Verdict(False, f"{exercise.name}: expected a function fn(ctx, ...), got {type(fn).__name__}")
    for n in world_sizes or exercise.world_sizes:
        expected = run(_on_rank, n, exercise.reference, exercise.make_inputs, timeout=timeout)
        try:
            got = run(_on_rank, n, fn, exercise.make_inputs, timeout=timeout)
        except RankFailure as err:
            lines = str(err).splitlines()
            hint = [f"hint: {exercise.hint}"] if exercise.hint and err.reason == "timeout" else []
            if err.reason == "raised":
                lines = [lines[0], *lines[1:][-4:]]
            return Verdict(False, f"{exercise.name}: not yet, on {n} ranks.", lines + hint)
        problems = [p for r in range(n) if (p := compare(r, got[r], expected[r], exercise.tolerance))]
        if problems:
            return Verdict(False, f"{exercise.name}: not yet, on {n} ranks.", problems)
    sizes = ", ".join(map(str, world_sizes or exercise.world_sizes))
    return Verdict(True, f"{exercise.name}: passed on {sizes} ranks.")


# --- chapter 00: pass a value one step around the ring ---------------------------

def ring_pass_inputs(rank: int, world_size: int) -> tuple[torch.Tensor]:
    """Rank r holds [r, 10r, 100r]."""
    return (torch.tensor([1.0, 10.0, 100.0]) * rank,)


def ring_pass_reference(ctx: Context, x: torch.Tensor) -> torch.Tensor:
    """Send x to the right neighbour, return what the left neighbour sent."""
    received = torch.empty_like(x)
    right, left = (ctx.rank + 1) % ctx.world_size, (ctx.rank - 1) % ctx.world_size
    return exchange(ctx, x, right, received, left, phase="ring pass")


RING_PASS = Exercise(
    name="ring pass",
    task="Return the tensor held by your left neighbour (rank - 1, wrapping around): "
         "every rank sends its x to rank + 1 and receives from rank - 1.",
    reference=ring_pass_reference,
    make_inputs=ring_pass_inputs,
    world_sizes=(2, 3, 4),
    hint="if every rank calls a blocking send first, all ranks wait for a receive that never "
         "starts. Post the send with dist.isend (or use wmdist.comm.exchange), then receive.",
)
