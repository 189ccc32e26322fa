"""Chapter 05 exercises: one stage's forward with sends and receives (real ranks), and one rank's 1F1B order (pure)."""
from __future__ import annotations

from collections.abc import Iterator

import torch

from wmdist.comm import Context, isend, recv
from wmdist.course.exercises import Exercise

MICROBATCHES, ROWS, WIDTH = 3, 2, 5


# --- on real ranks: a stage's forward in a pipeline ---------------------------------------

def stage_forward_inputs(rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank r's stage weight (D, D), and the microbatches (M, b, D): real data on rank 0, zeros elsewhere."""
    weight = torch.randn(WIDTH, WIDTH, generator=torch.Generator().manual_seed(100 + rank)) / WIDTH ** 0.5
    data = torch.randn(MICROBATCHES, ROWS, WIDTH, generator=torch.Generator().manual_seed(7))
    return (data if rank == 0 else torch.zeros_like(data)), weight


def stage_forward_solution(ctx: Context, microbatches: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Run this rank's stage, tanh(x @ W), on every microbatch in order; pass each result to the next rank."""
    outputs, sends = [], []
    for x in microbatches:                                       # (b, D): only rank 0's are real inputs
        if ctx.rank > 0:
            x = recv(ctx, torch.empty_like(x), ctx.rank - 1)     # the previous stage's output for this microbatch
        y = torch.tanh(x @ weight)                               # (b, D)
        if ctx.rank < ctx.world_size - 1:
            sends.append(isend(ctx, y, ctx.rank + 1))            # don't wait: start on the next microbatch
        outputs.append(y)
    for pending in sends:
        pending.wait()
    return torch.stack(outputs)                                   # (M, b, D)


STAGE_FORWARD = Exercise(
    name="pipeline stage forward",
    task="Each rank is one stage, y = tanh(x @ weight). Rank 0 holds the M microbatches; every other rank gets "
         "its x from the rank before it. For each microbatch in order, compute your stage's output, pass it to "
         "the next rank (unless you are the last), and return your outputs stacked, (M, b, D).",
    reference=stage_forward_solution,
    make_inputs=stage_forward_inputs,
    world_sizes=(4,),
    hint="ranks above 0 must recv their x from rank - 1 (their own `microbatches` are only zeros of the right "
         "shape), and what goes on to rank + 1 is y, not x; wmdist.comm.isend lets a rank start the next "
         "microbatch while its send is in flight (wait for the sends before returning).",
)


# --- pure: one rank's 1F1B order ------------------------------------------------------------


def one_f_one_b_solution(stages: int, microbatches: int, rank: int) -> list[str]:
    """Rank `rank`'s 1F1B order as tokens: warm-up forwards, then forward/backward pairs, then the last backwards."""
    warmup = min(stages - rank - 1, microbatches)      # how far this rank is from the last stage
    order = [f"F{m}" for m in range(warmup)]
    for m in range(microbatches - warmup):
        order += [f"F{warmup + m}", f"B{m}"]           # one new forward, then the oldest backward
    return order + [f"B{m}" for m in range(microbatches - warmup, microbatches)]


def one_f_one_b_cases() -> Iterator[tuple[int, int, int]]:
    """(stages, microbatches, rank): P from 1 to 5, M below, at and above P, every rank."""
    for stages in range(1, 6):
        for microbatches in (1, 2, 3, 4, 5, 8):
            for rank in range(stages):
                yield stages, microbatches, rank


ONE_F_ONE_B = Exercise(
    name="1F1B action list",
    task="Return rank `rank`'s actions under 1F1B (PipeDream-Flush) for P = `stages` and M = `microbatches`, "
         "as tokens 'F3' / 'B3' in the order the rank runs them.",
    reference=one_f_one_b_solution,
    cases=one_f_one_b_cases,
    hint="rank r is P-1-r stages away from the last one, so it can run that many forwards before the first "
         "backward can come back (never more than M); then alternate one forward with the oldest backward, "
         "and finish with the backwards left over.",
)

EXERCISES = [STAGE_FORWARD, ONE_F_ONE_B]
