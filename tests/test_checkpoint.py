"""Sharded DCP checkpoints: resharded resume, bitwise state, and a crash mid-save that corrupts nothing."""
from __future__ import annotations

import pytest

from wmdist.memory import sharded_checkpoint as checkpoint
from wmdist.memory.zero import ZeroConfig
from wmdist.runtime import run
from wmdist.memory.sharded_checkpoint import latest_checkpoint, overlaps, parse_key, range_key


def test_range_keys_round_trip():
    assert parse_key(range_key("exp_avg", 702, 1404)) == ("exp_avg", 702, 1404)


def test_overlaps_cut_saved_ranges_to_a_new_range():
    saved = [(0, 702), (702, 1404), (1404, 2105)]          # 3 ranks
    assert overlaps(saved, 0, 1053) == [(0, 702, 0, 702), (702, 1404, 702, 1053)]   # rank 0 of 2
    assert overlaps(saved, 1053, 2105) == [(702, 1404, 1053, 1404), (1404, 2105, 1404, 2105)]
    with pytest.raises(ValueError, match="do not cover"):
        overlaps([(0, 702), (1000, 2105)], 0, 2105)


def test_no_pointer_means_no_checkpoint(tmp_path):
    (tmp_path / ".tmp-step000002").mkdir()              # an uncommitted save is invisible
    assert latest_checkpoint(tmp_path) is None


def test_a_save_killed_after_its_rename_but_before_the_pointer_does_not_block_the_next_save(tmp_path, one_thread):
    """The rename is done, LATEST still names the step before: the directory is stale, and resaving that step
    replaces it (a rename onto a non-empty directory fails otherwise)."""
    cfg = ZeroConfig(stage=2, steps=4)
    run(checkpoint.train_resumable, 2, str(tmp_path), cfg, until=2, save_every=2)
    stale = tmp_path / "step000004"
    stale.mkdir()
    (stale / "__0_0.distcp").write_bytes(b"half of a save")
    resumed = run(checkpoint.train_resumable, 2, str(tmp_path), cfg, until=4, save_every=2)
    assert resumed[0].resumed_from == 2 and latest_checkpoint(tmp_path) == stale
    assert (stale / ".metadata").exists() and (stale / "__0_0.distcp").read_bytes() != b"half of a save"
    assert [r.dropped for r in resumed] == [(str(stale),), ()]      # and it says what it removed (rank 0 removes)


def test_a_rerun_after_a_kill_mid_save_names_the_half_written_save_it_drops(tmp_path, one_thread):
    """A save killed before its commit leaves .tmp-stepN; the next save of step N removes it, and says so: a
    DroppedSaveWarning naming the directory, and the directory in the run's result."""
    cfg = ZeroConfig(stage=2, steps=4)
    run(checkpoint.train_resumable, 2, str(tmp_path), cfg, until=2, save_every=2)
    half = tmp_path / ".tmp-step000004"
    half.mkdir()
    (half / "__1_0.distcp").write_bytes(b"one rank's shard, then the kill")
    resumed = run(checkpoint.train_resumable, 2, str(tmp_path), cfg, until=4, save_every=2)
    assert [r.dropped for r in resumed] == [(str(half),), ()]
    assert not half.exists() and latest_checkpoint(tmp_path) == tmp_path / "step000004"
    again = run(checkpoint.train_resumable, 2, str(tmp_path), cfg, until=6, save_every=2)   # nothing left over
    assert [r.dropped for r in again] == [(), ()]


def test_dropping_an_uncommitted_save_warns_with_its_name_and_refuses_a_committed_one(tmp_path):
    (tmp_path / ".tmp-step000002").mkdir()
    with pytest.warns(checkpoint.DroppedSaveWarning, match=r"dropped .*\.tmp-step000002: an earlier save of step0+2"):
        assert checkpoint.drop_uncommitted(tmp_path, "step000002") == (tmp_path / ".tmp-step000002",)
    (tmp_path / "step000002").mkdir()
    (tmp_path / "LATEST").write_text("step000002")
    with pytest.raises(ValueError, match="already the committed checkpoint"):
        checkpoint.drop_uncommitted(tmp_path, "step000002")
    assert (tmp_path / "step000002").is_dir()


@pytest.mark.parametrize("stage", [1, 3])
def test_resume_on_a_different_world_size(stage):
    report = checkpoint.resume_report(3, resume_on=2, stage=stage)
    assert report.passed, str(report)
    exact = [c for c in report.checks if "loaded on 2 ranks == saved on 3" in c.name]
    assert len(exact) == 3 and all(c.tolerance == 0.0 for c in exact)


def test_resume_on_the_same_world_size_is_bitwise_uninterrupted():
    report = checkpoint.resume_report(2, resume_on=2, stage=2)
    assert report.passed, str(report)
    same = next(c for c in report.checks if c.name == "resumed run == uninterrupted run")
    assert same.error == 0.0      # same ranks, same order of every sum: saving and loading changes nothing


def test_kill_mid_save_keeps_the_last_good_checkpoint():
    report = checkpoint.crash_report(3, resume_on=2)
    assert report.passed, str(report)
    assert report.data.partial_files, "the killed save should have left files in its temporary directory"
    assert any("dropped the uncommitted .tmp-step000004" in c.name for c in report.checks)   # the Report says so


def test_bad_inputs_are_refused_before_any_process(no_processes):
    assert checkpoint.RESUME.jobs is not None and checkpoint.CRASH.jobs is not None      # several jobs in a row
    assert "world_size must be an integer >= 1, got 0" in checkpoint.RESUME.refuses(0)
    with pytest.raises(ValueError, match="world_size"):
        checkpoint.resume_report(0)
    with pytest.raises(ValueError, match="save_at must be an integer from 1 to 3, got 4"):
        checkpoint.resume_report(2, save_at=4, until=4)
    with pytest.raises(ValueError, match="save_at must be an integer"):
        checkpoint.resume_report(2, save_at=1.5)            # would never save: found only after two jobs
    with pytest.raises(ValueError, match="resume_on must be an integer >= 1, got 0"):
        checkpoint.crash_report(3, resume_on=0)        # was found only after the crash run, two runs in
    with pytest.raises(ValueError, match="stage must be one of"):
        checkpoint.crash_report(3, stage=4)
