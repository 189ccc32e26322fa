"""Bad arguments to the chapters' entry points are refused before any process starts, by the name the user gave.

Each case once slipped through: a zero that quietly became the default, an
error that blamed an argument the user never passed, a dtype left unnamed,
an overflow or ZeroDivisionError from deep inside, a NaN where the loop has
inf. The `no_processes` fixture fails a test the moment anything would start
a rank, so every refusal here is made up front.
"""
from __future__ import annotations

import re

import pytest
import torch

from wmdist.diffusion.spec import SamplingSpec
from wmdist.diffusion.token_parallel import tokens_demo
from wmdist.pipeline.demos import forward_demo
from wmdist.pipeline.measure import bubble_demo
from wmdist.pipeline.rollout import rollout_demo
from wmdist.ring_attention.blockwise import attend_block, blockwise_attention
from wmdist.ring_attention.ring import ring_attention, ring_forward
from wmdist.scan import affine

SPEC = SamplingSpec()
NOISE64 = torch.zeros(SPEC.batch, SPEC.model.tokens, SPEC.model.channels, dtype=torch.float64)
INT_QKV = torch.ones(1, 1, 4, 2, dtype=torch.int64)
EMPTY_HEAD = torch.ones(1, 1, 4, 0)
POS = torch.arange(4)


@pytest.mark.parametrize("call, message", [
    (lambda: forward_demo(2, microbatches=0), "microbatches must be an integer from 1 to 1024, got 0"),
    (lambda: bubble_demo(2, microbatches=0), "microbatches must be an integer from 1 to 1024, got 0"),
    (lambda: bubble_demo(2, microbatches=-3), "microbatches must be an integer from 1 to 1024, got -3"),
    (lambda: rollout_demo(4, environments=1), "environments must be an integer >= 8, got 1: each of the M = 2P = 8 "
                                              "microbatches holds at least one whole trajectory"),
    (lambda: rollout_demo(2, horizon=0), "horizon must be an integer from 1 to 64, got 0"),
    (lambda: tokens_demo(2, noise=NOISE64), "noise must be a float32 tensor of shape (2, 64, 8) (batch, tokens 4x4x4, "
                                            "channels), got a float64 tensor of shape (2, 64, 8)"),
    (lambda: blockwise_attention(INT_QKV, INT_QKV, INT_QKV, block_size=2, causal=True),
     "q, k, v must share one floating-point dtype (float32, float64, bfloat16 or float16): softmax needs real "
     "numbers; got torch.int64, torch.int64, torch.int64"),
    (lambda: blockwise_attention(INT_QKV.double(), INT_QKV.float(), INT_QKV.float(), block_size=2, causal=True),
     "got torch.float64, torch.float32, torch.float32"),
    (lambda: blockwise_attention(EMPTY_HEAD, EMPTY_HEAD, EMPTY_HEAD, block_size=2, causal=True),
     "head_dim (the last dimension of q, k and v) must be an integer >= 1, got q/k 0 and v 0"),
    (lambda: attend_block(EMPTY_HEAD, EMPTY_HEAD, EMPTY_HEAD, POS, POS, causal=True), "head_dim (the last dimension"),
    # a rank's own entry points check before touching the context or sending anything (ctx=None here)
    (lambda: ring_forward(None, INT_QKV, INT_QKV, INT_QKV, seq_len=4, layout="contiguous", causal=True, block_size=2),
     "floating-point dtype"),
    (lambda: ring_attention(None, EMPTY_HEAD, EMPTY_HEAD, EMPTY_HEAD, seq_len=4, layout="contiguous", causal=True,
                            block_size=2), "head_dim"),
])
def test_bad_demo_and_kernel_arguments_are_named_with_their_range(no_processes, call, message):
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        call()
    assert "batch_size" not in str(err.value)          # never blamed on an argument the user did not give
    assert "\n" not in str(err.value)


def _diagonal_system():
    return affine.random_system(1, 8, 2, diagonal=True, seed=0)


@pytest.mark.parametrize("where, value", [("A", float("inf")), ("A", float("-inf")), ("b", float("nan")),
                                          ("h0", float("inf"))])
def test_every_scan_refuses_non_finite_inputs_that_the_loop_would_turn_into_inf(where, value):
    """With inf in a diagonal A the loop gives +-inf and a regrouped scan NaN (inf * 0): refused, not mismatched."""
    A, b, h0 = _diagonal_system()
    tensors = {"A": A, "b": b, "h0": h0}
    index = (0, 1) if where == "h0" else (0, 3, 1)
    tensors[where][index] = value
    scans = [affine.sequential, lambda A, b, h0: affine.chunked(A, b, h0, 2),
             lambda A, b, h0: affine.chunked(A, b, h0, 4, combine="gather"), affine.associative_scan]
    for scan in scans:
        with pytest.raises(ValueError, match=re.escape(f"{where} must be finite (no inf or NaN), got {value} at "
                                                       f"index {index}")):
            scan(A, b, h0)


def test_a_state_a_rank_computed_may_overflow_and_still_be_applied():
    """apply_incoming takes a received state as it is: inputs are checked, an overflowed h_in is not refused."""
    A, b, h0 = _diagonal_system()
    h_in = torch.full_like(h0, float("inf"))
    states = affine.apply_incoming(A, b, h_in)
    assert states.shape == b.shape and torch.isinf(states[:, 0]).all()        # A_1 * inf + b_1, A_1 != 0
    with pytest.raises(ValueError, match="h0 must be finite"):
        affine.sequential(A, b, h_in)                                          # a user's h0 is still refused
