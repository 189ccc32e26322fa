"""Benchmarks run end to end at small sizes. Their ratios are reported, not asserted here:
wall times on a shared machine are noise for a test; what is asserted is what must hold."""
from __future__ import annotations

import json

from wmdist import costs
from wmdist.bench import suite as bench
from wmdist.base.bench_result import BenchResult
from wmdist.app.cli import main


def test_ring_vs_gloo_counts_bytes_at_the_bound():
    result = bench.bench_ring_vs_gloo(world_size=3, mib=1, repeats=2)
    numel = 2 ** 20 // 4
    assert result.measured["ring_bytes_sent_per_rank"] == [costs.ring_allreduce_bytes(numel, 3, r) for r in range(3)]
    assert result.measured["ring_median_s"] > 0 and result.measured["gloo_median_s"] > 0
    # The headline is the median of the paired gloo/ring ratios, so it lies between their quartiles (rounded to 0.001).
    low, high = result.measured["pair_ratio_quartiles"]
    assert result.unit == "x" and low - 5e-4 <= result.value <= high + 5e-4


def test_warm_vs_spawn_reports_both_paths():
    result = bench.bench_warm_vs_spawn(world_size=2, warm_calls=3, spawn_calls=1)
    assert result.measured["warm_median_ms"] > 0 and result.measured["spawn_median_ms"] > 0
    # The ratio is computed from unrounded medians; the printed ones are rounded to 0.01 ms / 0.1 ms.
    ratio = result.measured["spawn_median_ms"] / result.measured["warm_median_ms"]
    assert abs(result.value - ratio) <= 0.05 * ratio


def test_pool_memory_is_measured_for_each_size():
    result = bench.bench_memory(world_sizes=(1, 2))
    assert set(result.measured) == {"1_ranks_started_MB", "1_ranks_MB", "2_ranks_started_MB", "2_ranks_MB"}
    # Each rank is a real process with its own pages: a bigger pool cannot cost less.
    assert 0 < result.measured["1_ranks_MB"] < result.measured["2_ranks_MB"]
    assert result.unit == "MB" and result.value == result.measured["2_ranks_MB"]     # the headline: the largest pool


def test_bench_cli_json(monkeypatch, capsys):
    fake = BenchResult(name="fake", inputs={"n": 1}, measured={"t": 2.0}, value=3.0, unit="x", target=">= 1x", met=True)
    monkeypatch.setattr(bench, "benchmarks", lambda **kw: {"fake": lambda: fake})
    assert main(["bench", "fake", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [fake.to_dict()]
