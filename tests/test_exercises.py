"""The exercise checker runs the reader's code on real ranks and says what is wrong in plain words."""
from __future__ import annotations

import torch
import torch.distributed as dist

from wmdist.exercises import RING_PASS, check, compare


def correct(ctx, x):
    out = torch.empty_like(x)
    req = dist.isend(x, (ctx.rank + 1) % ctx.world_size)
    dist.recv(out, (ctx.rank - 1) % ctx.world_size)
    req.wait()
    return out


def wrong_direction(ctx, x):
    out = torch.empty_like(x)
    req = dist.isend(x, (ctx.rank - 1) % ctx.world_size)
    dist.recv(out, (ctx.rank + 1) % ctx.world_size)
    req.wait()
    return out


def blocking_sends(ctx, x):
    out = torch.empty_like(x)
    dist.send(x, (ctx.rank + 1) % ctx.world_size)     # every rank blocks here: deadlock
    dist.recv(out, (ctx.rank - 1) % ctx.world_size)
    return out


def test_correct_answer_passes():
    verdict = check(RING_PASS, correct)
    assert verdict.passed and str(verdict) == "ring pass: passed on 2, 3, 4 ranks."


def test_wrong_direction_is_caught_on_three_ranks_with_rank_and_element():
    # With 2 ranks left and right neighbour coincide, so only N >= 3 exposes it.
    verdict = check(RING_PASS, wrong_direction)
    assert not verdict.passed and "on 3 ranks" in verdict.message
    assert verdict.details[0] == "rank 0, element [0]: expected 2, got 1 (3 of 3 elements wrong)"


def test_deadlock_times_out_with_a_hint():
    verdict = check(RING_PASS, blocking_sends, world_sizes=(2,), timeout=4)
    assert not verdict.passed
    assert any("did not finish within the timeout" in d for d in verdict.details)
    assert any(d.startswith("hint: if every rank calls a blocking send first") for d in verdict.details)


def test_exception_in_readers_code_names_rank_and_error():
    def crash(ctx, x):
        if ctx.rank == 1:
            raise RuntimeError("oops in my code")
        return x
    verdict = check(RING_PASS, crash, world_sizes=(2,))
    assert not verdict.passed and verdict.details[0].startswith("rank 1 raised")
    assert any("RuntimeError: oops in my code" in d for d in verdict.details)


def test_compare_messages():
    e = torch.tensor([1.0, 2.0])
    assert compare(0, e.clone(), e, 0.0) is None
    assert compare(3, [1, 2], e, 0.0) == "rank 3 returned list, expected a tensor of shape (2,)"
    assert compare(1, torch.ones(3), e, 0.0) == "rank 1 returned shape (3,), expected (2,)"
    assert compare(0, torch.tensor([1.0, float("nan")]), e, 1.0).startswith("rank 0, element [1]")
