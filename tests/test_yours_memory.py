"""wmdist.yours' memory: the estimate written out, the memory available read as the system gives it, and a
check that would not fit refused before any process starts, with both numbers (issue 35 §7).

The ranks other than 0 now send a digest of their parameters instead of a copy: the every-rank check
judged on digests still fails when one rank's bytes differ.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from test_yours import _dp_results, conv_work, gru_work
from wmdist.yours import data_parallel, dp_check, footprint, zero
from wmdist.yours.footprint import MiB, Estimate, available_bytes, estimate_bytes, refuse_if_too_big
from wmdist.yours.workload import prepare_workload


@pytest.mark.parametrize("stage,results,rank_copies", [(0, 4, 14), (1, 3, 18), (2, 3, 25), (3, 3, 31)])
def test_the_estimate_is_its_formula_written_out(stage, results, rank_copies):
    p, n, slots, steps = 4_197_376, 4, 2, 3
    e = estimate_bytes(p, n, stage=stage, slots=slots, steps=steps)
    assert e.parent == (2 * results + (2 + 2 + 7) + slots + steps) * 4 * p + 32 * MiB
    assert e.per_rank == rank_copies * 4 * p + 48 * MiB
    assert e.total == e.parent + n * e.per_rank


def _cgroup(root: Path, rel: str, files: dict[str, str]) -> None:
    where = root / rel.lstrip("/")
    where.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (where / name).write_text(text + "\n")


def _proc(tmp: Path, cgroup_line: str, available_kib: int) -> Path:
    proc = tmp / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text(cgroup_line + "\n")
    (proc / "meminfo").write_text(f"MemTotal:       99999999 kB\nMemAvailable:   {available_kib} kB\n")
    return proc


def test_available_memory_is_the_tightest_cgroup_v2_limit_up_the_tree(tmp_path):
    root = tmp_path / "cg"
    _cgroup(root, "/user/session", {"memory.max": "max", "memory.current": str(300 * MiB)})   # no limit here
    _cgroup(root, "/user", {"memory.max": str(2048 * MiB), "memory.current": str(1500 * MiB)})   # Binder's 2 GiB
    proc = _proc(tmp_path, "0::/user/session", available_kib=8 * 2 ** 20)
    have, source = available_bytes(root=root, proc=proc, env={})
    assert have == 548 * MiB and "cg/user/memory.max" in source


def test_available_memory_reads_cgroup_v1_and_ignores_its_no_limit_value(tmp_path):
    root = tmp_path / "cg"
    _cgroup(root, "memory/docker/abc", {"memory.limit_in_bytes": str(2 ** 63 - 4096),
                                        "memory.usage_in_bytes": str(100 * MiB)})
    proc = _proc(tmp_path, "12:memory:/docker/abc\n11:cpu,cpuacct:/docker/abc", available_kib=700 * 1024)
    assert available_bytes(root=root, proc=proc, env={}) == (700 * MiB, "MemAvailable in /proc/meminfo")
    _cgroup(root, "memory/docker/abc", {"memory.limit_in_bytes": str(512 * MiB)})
    assert available_bytes(root=root, proc=proc, env={})[0] == 412 * MiB
    assert available_bytes(root=root, proc=proc, env={footprint.OVERRIDE: "12345"}) == (
        12345, f"${footprint.OVERRIDE}")


def test_a_run_that_does_not_fit_is_refused_with_the_estimate_and_the_limit():
    e = Estimate(parent=300 * MiB, per_rank=900 * MiB, world_size=2)
    refuse_if_too_big(e, (2100 * MiB, "the cgroup limit"), numel=4_197_376, what="data_parallel")       # fits
    with pytest.raises(MemoryError, match=r"data_parallel on 4,197,376 parameters \(16\.0 MiB a copy\) would need "
                                          r"about 2,100 MiB at its peak \(300 MiB here, 900 MiB in each of 2 ranks;"
                                          r".* more than the 2,000 MiB available \(the cgroup limit\)"):
        refuse_if_too_big(e, (2000 * MiB, "the cgroup limit"), numel=4_197_376, what="data_parallel")


@pytest.mark.parametrize("call", [lambda: data_parallel(conv_work(), world_size=2),
                                  lambda: zero(gru_work(), stage=3, world_size=2)], ids=["dp", "zero-3"])
def test_the_real_entry_points_refuse_before_any_process(no_processes, monkeypatch, call):
    monkeypatch.setenv(footprint.OVERRIDE, str(50 * MiB))
    with pytest.raises(MemoryError, match=rf"more than the 50 MiB available \(\${footprint.OVERRIDE}\)"):
        call()


def test_the_every_rank_check_on_digests_fails_when_one_rank_differs(no_processes):
    spec = prepare_workload(gru_work(), 2)
    results = _dp_results(spec, *_reference(spec))
    assert next(c for c in dp_check.compare_dp(spec, results).checks if c.name.startswith("every rank")).passed
    moved = results[1].ours.params.clone()
    moved[0] = torch.nextafter(moved[0], torch.tensor(1e9))                       # one ulp on rank 1
    import dataclasses

    from wmdist.yours.refusals import digest
    results[1] = dataclasses.replace(results[1], ours=dataclasses.replace(results[1].ours, digest=digest(moved)))
    check = next(c for c in dp_check.compare_dp(spec, results).checks if c.name.startswith("every rank"))
    assert not check.passed and check.detail == "ranks [1] differ from rank 0"


def _reference(spec):
    from wmdist.yours.reference import one_process
    ref = one_process(spec.work, spec.world_size)
    return ref.grad0, ref.params
