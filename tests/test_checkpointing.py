"""Activation checkpointing on the dynamics unroll: saved bytes exactly as predicted, gradients unchanged."""
from __future__ import annotations

import pytest

from wmdist.memory.activation_recompute import RolloutConfig, activation_bytes, checkpointing_report


@pytest.mark.parametrize("segment", [1, 8, 10, 64])   # 10 does not divide 64: a short last segment
def test_saved_bytes_match_formula_and_gradients_agree(segment):
    report = checkpointing_report(segment=segment, repeats=1)
    assert report.passed, str(report)
    assert len(report.exact) == 4 and len(report.checks) == 2


def test_checkpointing_keeps_fewer_bytes_and_recomputes_all():
    plain, ckpt = activation_bytes(RolloutConfig(segment=0)), activation_bytes(RolloutConfig(segment=8))
    assert ckpt["resident"] < plain["resident"] / 10
    assert ckpt["recomputed"] == plain["resident"]        # every step is run forward twice


def test_bad_inputs():
    with pytest.raises(ValueError, match="world_size"):
        checkpointing_report(world_size=0)
    with pytest.raises(ValueError, match="segment"):
        checkpointing_report(segment=0)
    with pytest.raises(ValueError, match="seq_len"):
        RolloutConfig(seq_len=0)
