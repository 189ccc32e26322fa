"""Activation checkpointing on the dynamics unroll: saved bytes exactly as predicted, gradients unchanged."""
from __future__ import annotations

import pytest

from wmdist.memory.activation_recompute import EXPERIMENT, RolloutConfig, rollout_activation_bytes, checkpointing_report


@pytest.mark.parametrize("segment", [1, 8, 10, 64])   # 10 does not divide 64: a short last segment
def test_saved_bytes_match_formula_and_gradients_agree(segment):
    report = checkpointing_report(segment=segment, repeats=1)
    assert report.passed, str(report)
    assert len(report.exact) == 6 and len(report.checks) == 2


def test_peak_counts_the_segment_being_recomputed():
    """Measured from the saved tensors alive at once: resident inputs plus the segment recomputed in backward
    (99,328 B of 622,592 for k = 8), not the resident 21,504 B alone."""
    report = checkpointing_report(segment=8, repeats=1)
    peak = report.measured(quantity="saved bytes", case="with checkpoints: peak")[0]
    resident = report.measured(quantity="saved bytes", case="with checkpoints: resident")[0]
    segment = report.measured(quantity="saved bytes", case="with checkpoints: largest segment")[0]
    assert peak == resident + segment == 99_328
    assert report.data.peak_ratio == pytest.approx(99_328 / 622_592) and report.data.memory_ratio < report.data.peak_ratio
    # 6 full segments of 10 and one of 4: the peak is at a full one
    short = rollout_activation_bytes(RolloutConfig(segment=10))
    assert short["peak"] == 5 * 32 * 24 * 4 + short["largest segment"]


def test_checkpointing_keeps_fewer_bytes_and_recomputes_all():
    plain, ckpt = rollout_activation_bytes(RolloutConfig(segment=0)), rollout_activation_bytes(RolloutConfig(segment=8))
    assert ckpt["resident"] < plain["resident"] / 10
    assert ckpt["recomputed"] == plain["resident"]        # every step is run forward twice


def test_it_runs_in_this_process_at_one_size(no_processes):
    """A `local` experiment: it starts no rank, and any world size but 1 is refused before it runs."""
    assert EXPERIMENT.local is not None and EXPERIMENT.world_sizes == (1,)
    report = checkpointing_report(segment=16, seq_len=32, repeats=1)
    assert report.passed and report.world_size == 1 and report.params["segment"] == 16, str(report)
    assert "world_size must be 1" in EXPERIMENT.refuses(2)
    with pytest.raises(ValueError, match="world_size must be 1"):
        checkpointing_report(world_size=2)


def test_bad_inputs():
    with pytest.raises(ValueError, match="world_size"):
        checkpointing_report(world_size=0)
    with pytest.raises(ValueError, match="segment"):
        checkpointing_report(segment=0)
    with pytest.raises(ValueError, match="repeats"):
        checkpointing_report(repeats=0)
    with pytest.raises(ValueError, match="seq_len"):
        RolloutConfig(seq_len=0)
