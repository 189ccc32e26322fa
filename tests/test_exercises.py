"""The exercise checker runs the reader's code on real ranks and says what is wrong in plain words."""
from __future__ import annotations

import re

import pytest
import torch
import torch.distributed as dist

from wmdist.data_parallel.ring import RING_PASS
from wmdist.course.exercises import check, compare, solution


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


def test_deadlock_is_caught_with_a_hint():
    """Both ranks block in a send: the running check names the deadlock at once (or, if the machine is so busy
    that the 4 s timeout comes first, the timeout does); either way the hint follows."""
    verdict = check(RING_PASS, blocking_sends, world_sizes=(2,), timeout=4)
    assert not verdict.passed
    assert any("(a deadlock)" in d or "did not finish within the timeout" in d
               for d in verdict.details), verdict.details
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


# --- stubs, solutions and known-wrong answers for every registered exercise ----------------

def stub(*args):
    # your code here
    raise NotImplementedError


def _wrong_answers():
    """One plausible wrong answer per exercise (the mistake its hint warns about, or a common slip)."""
    from wmdist.comm import ring_all_reduce, ring_reduce_scatter
    from wmdist.memory.zero import shard_range

    def plain_mean(ctx, grad, count):                        # ignores the example counts
        return ring_all_reduce(ctx, grad) / ctx.world_size

    def local_score(ctx, mu, sigma, z):                      # averages this rank's draws only
        d = z - mu
        per = (z ** 3 - 2 * z)[:, None] * torch.stack([d / sigma ** 2, (d ** 2 - sigma ** 2) / sigma ** 3], 1)
        return per.mean(0)

    def no_bias_correction(ctx, params, local_grad):        # Adam's first step without bias correction
        grad = ring_reduce_scatter(ctx, local_grad)
        start, stop = shard_range(params.numel(), ctx.world_size, ctx.rank)
        m, v = 0.1 * grad, 0.001 * grad * grad
        return params[start:stop] - 1e-2 * m / (v.sqrt() + 1e-8)

    def even_shards(params, stage, dp, dp_rank):            # forgets that shards can be uneven
        shard = params // dp
        held = lambda sharded: shard if sharded else params  # noqa: E731
        return 2 * held(stage >= 3) + 2 * held(stage >= 2) + 12 * held(stage >= 1)

    def fold_backwards(ctx, A, b, h0):                       # composes with the earlier step on the left
        from wmdist.comm import recv, send
        fold_A, fold_b = A[0], b[0]
        for t in range(1, len(b)):
            fold_A, fold_b = fold_A @ A[t], fold_A @ b[t] + fold_b
        h_in = h0 if ctx.rank == 0 else recv(ctx, torch.empty_like(h0), ctx.rank - 1)
        if ctx.rank < ctx.world_size - 1:
            send(ctx, fold_A @ h_in + fold_b, ctx.rank + 1)
        return h_in

    def shard_at_token_zero(ctx, model, x, start, t):      # gathers K/V but forgets where its shard starts
        from wmdist.comm import ring_all_gather
        from wmdist.costs.diffusion import token_shard_bounds
        mine = torch.stack(model.project_kv(x, t)).movedim(3, 0).contiguous()
        sizes = [(b - a) * mine[0].numel() for a, b in token_shard_bounds(model.cfg.tokens, ctx.world_size)]
        k_all, v_all = ring_all_gather(ctx, mine.reshape(-1), sizes).view(-1, *mine.shape[1:]).movedim(0, 3)
        return model.denoise_shard(x, (k_all, v_all), t)

    def bias_on_every_rank(ctx, x_shard, w_shard, bias):    # adds the bias before the sum: N copies of it
        return ring_all_reduce(ctx, x_shard @ w_shard.T + bias)

    def same_warmup_everywhere(stages, microbatches, rank):  # every rank warms up like rank 0 (GPipe-like memory)
        warmup = min(stages - 1, microbatches)
        order = [f"F{m}" for m in range(warmup)]
        for m in range(microbatches - warmup):
            order += [f"F{warmup + m}", f"B{m}"]
        return order + [f"B{m}" for m in range(microbatches - warmup, microbatches)]

    def plain_average(ctx, out, lse):                       # swaps, but ignores how much of the softmax each holds
        from wmdist.comm import exchange
        other = 1 - ctx.rank
        return (out + exchange(ctx, out, other, torch.empty_like(out), other)) / 2

    def forwards_its_input(ctx, microbatches, weight):         # passes x on instead of its own output y
        from wmdist.comm import recv, send
        outputs = []
        for x in microbatches:
            if ctx.rank > 0:
                x = recv(ctx, torch.empty_like(x), ctx.rank - 1)
            if ctx.rank < ctx.world_size - 1:
                send(ctx, x, ctx.rank + 1)
            outputs.append(torch.tanh(x @ weight))
        return torch.stack(outputs)

    def consecutive_ranks(rank, axis, dp, tp, pp, cp):       # treats every axis as the fastest-varying one
        size = {"dp": dp, "tp": tp, "pp": pp, "cp": cp}[axis]
        start = rank // size * size
        return tuple(range(start, start + size))

    def order_as_its_own_inverse(ctx, expert_ids):            # uses the sort order to undo the sort too
        order = torch.sort(expert_ids, stable=True).indices
        return torch.stack([order, order])

    def bubble_without_interleaving(stages, microbatches, virtual, busy_seconds):   # forgets v
        return round((stages - 1) / microbatches * busy_seconds, 9)

    return {"ring pass": wrong_direction, "weighted mean of unequal shards": plain_mean,
            "score-function estimate": local_score, "ZeRO shard update": no_bias_correction,
            "ZeRO bytes": even_shards, "incoming state": fold_backwards,
            "token-sharded denoising step": shard_at_token_zero, "row-parallel forward": bias_on_every_rank,
            "1F1B action list": same_warmup_everywhere, "online-softmax merge": plain_average,
            "pipeline stage forward": forwards_its_input, "my group along an axis": consecutive_ranks,
            "dispatch permutation": order_as_its_own_inverse, "pipeline bubble term": bubble_without_interleaving}


def _registry():
    from wmdist.registry.demos import exercises
    return exercises()


def test_every_exercise_has_a_known_wrong_answer():
    assert set(_wrong_answers()) == set(_registry())


@pytest.mark.parametrize("name", list(_wrong_answers()))
def test_every_checker_passes_its_solution_and_fails_a_wrong_answer(name):
    exercise = _registry()[name]
    assert check(exercise, exercise.reference).passed
    verdict = check(exercise, _wrong_answers()[name])
    assert not verdict.passed and verdict.status == "wrong"
    if exercise.make_inputs is not None:                      # a rank exercise names the rank and the element
        expected = r"rank \d+, (element \[\d+(, \d+)*\]|the value): expected "
        assert re.match(expected, verdict.details[0]), verdict.details
    else:
        assert verdict.details[0].startswith("fn(") and "expected" in verdict.details[0]


@pytest.mark.parametrize("name", list(_wrong_answers()))
def test_a_stub_is_not_attempted_yet_with_the_hint(name):
    exercise = _registry()[name]
    verdict = check(exercise, stub)
    assert (verdict.passed, verdict.status) == (False, "not attempted yet")
    assert str(verdict) == f"{exercise.name}: not attempted yet.\nhint: {exercise.hint}"   # same every run


def test_solution_prints_the_reference_source(capsys):
    source = solution(RING_PASS)
    assert source.startswith("def ring_pass_solution(ctx") and "exchange(" in source
    assert capsys.readouterr().out.strip() == source.strip()


def test_the_merge_exercise_needs_the_other_rank():
    """A merge of this rank's block alone is wrong: the exercise cannot be passed without communicating."""
    from wmdist.ring_attention.exercises import ONLINE_SOFTMAX_MERGE
    verdict = check(ONLINE_SOFTMAX_MERGE, lambda ctx, out, lse: out)
    assert not verdict.passed and verdict.status == "wrong"
