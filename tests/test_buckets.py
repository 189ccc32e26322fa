"""Gradient buckets: layout, overlap arithmetic, the timeline plot, and the measured demo."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from wmdist.data_parallel import buckets as bk  # noqa: E402
from wmdist.models.world import make_model  # noqa: E402
from wmdist.ui.timeline import timeline_figure, timelines_figure  # noqa: E402
from wmdist.base.spans import Span, intersection, length, overlap, union  # noqa: E402


# --- pure ------------------------------------------------------------------------------

def test_buckets_fill_in_reverse_order_and_close_at_the_cap():
    assert bk.assign_buckets([4, 4, 4, 4], 8) == [[3, 2], [1, 0]]
    assert bk.assign_buckets([4, 4, 4, 4, 4], 8) == [[4, 3], [2, 1], [0]]
    assert bk.assign_buckets([100, 1, 1], 8) == [[2, 1, 0]]           # closes only once the cap is reached
    assert bk.assign_buckets([1, 100, 1], 8) == [[2, 1], [0]]
    assert bk.assign_buckets([4, 4], 1 << 30) == [[1, 0]]
    assert bk.assign_buckets([4, 4, 4], 1) == [[2], [1], [0]]


def test_every_parameter_in_exactly_one_bucket():
    sizes = [p.numel() * 4 for p in make_model(seed=0, cfg=bk.BIG_CONFIG).parameters()]
    for cap in (1, 1000, 16_384, 100_000, 1 << 30):
        layout = bk.assign_buckets(sizes, cap)
        flat = [i for b in layout for i in b]
        assert sorted(flat) == list(range(len(sizes))) and flat == sorted(flat, reverse=True)


def test_bucket_input_validation():
    with pytest.raises(ValueError, match="cap_bytes"):
        bk.assign_buckets([4], 0)
    with pytest.raises(ValueError, match=r"sizes_bytes\[1\]"):
        bk.assign_buckets([4, -1], 8)
    with pytest.raises(ValueError, match="seq_len"):
        bk.BucketSpec(seq_len=0)


def test_interval_arithmetic():
    assert union([(5, 7), (0, 2), (1, 3), (3, 4)]) == [(0, 4), (5, 7)]
    assert length([(0, 2), (1, 3)]) == 3
    assert intersection([(0, 10)], [(5, 15), (20, 30)]) == 5
    assert intersection([(0, 1), (2, 3)], [(0.5, 2.5)]) == 1.0


def test_overlap_from_spans():
    spans = [Span(row=0, start=0, end=10, kind="compute"), Span(row=0, start=5, end=15, kind="comm"),
             Span(row=0, start=12, end=14, kind="launch"),
             Span(row=1, start=0, end=4, kind="compute"), Span(row=1, start=4, end=6, kind="comm")]
    o0, o1 = overlap(spans)
    assert (o0.row, o0.comm, o0.hidden, o0.exposed, o0.hidden_fraction) == (0, 10, 5, 5, 0.5)
    assert (o1.comm, o1.hidden, o1.hidden_fraction) == (2, 0, 0.0)       # touching is not overlapping


def test_span_validation():
    with pytest.raises(ValueError, match="ends"):
        Span(row=0, start=2.0, end=1.0, kind="comm")
    with pytest.raises(ValueError, match="row"):
        Span(row=-1, start=0.0, end=1.0, kind="comm")


def test_timeline_plot_has_one_bar_per_span():
    spans = [Span(row=0, start=0, end=0.01, kind="compute"), Span(row=0, start=0.005, end=0.02, kind="comm"),
             Span(row=2, start=0, end=0.01, kind="compute")]
    fig = timeline_figure(spans, title="t")
    ax = fig.axes[0]
    assert len(ax.collections) == 3
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0", "rank 2"]
    plt.close(fig)
    fig = timelines_figure({"a": spans, "b": spans[:1]})
    assert [a.get_title(loc="left") for a in fig.axes] == ["a", "b"]
    plt.close(fig)
    with pytest.raises(ValueError, match="unit"):
        timeline_figure(spans, unit="h")
    four = [Span(row=r, start=0.0, end=1.0, kind="compute") for r in range(4)]
    fig = timelines_figure({"hand-off": four, "sweeps": four, "episodes": four})     # chapter 07's stack
    assert fig.get_size_inches()[1] * fig.dpi <= 700, "three 4-rank timelines must fit a laptop screen"
    plt.close(fig)


# --- on real ranks ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def report4():
    return bk.buckets_demo(4)


def test_bucketed_gradients_equal_unbucketed_and_bytes_exact(report4):
    assert report4.passed, report4.failures
    assert report4.params["buckets"] == [1, 3]
    assert set(report4.measured(quantity="bucket payload bytes (warm-up + timed pass)")) == {2 * 50_113 * 4}


def test_timeline_structure(report4):
    """Ordering facts, not timings: one bucket can start only after backward's last hook;
    with small buckets the first all-reduce is launched while backward still has work left."""
    one, small = report4.data.timelines.values()
    for rank in range(4):
        comm = [s for s in one if s.row == rank and s.kind == "comm"]
        hooks = [s for s in one if s.row == rank and s.label.startswith("backward until")]
        assert len(comm) == 1 and comm[0].start >= max(s.end for s in hooks)
        comm = sorted((s for s in small if s.row == rank and s.kind == "comm"), key=lambda s: s.start)
        hooks = [s for s in small if s.row == rank and s.label.startswith("backward until")]
        assert len(comm) == 3 and comm[0].start < max(s.start for s in hooks)
    for label, rows in report4.data.overlap.items():
        assert rows == overlap(report4.data.timelines[label])
        assert all(0.0 <= o.hidden <= o.comm for o in rows)


def test_sum_tolerance_is_the_reordering_bound_written_out():
    """Pinned from above: (2(N-1) + 2) 2^-24 max_j sum_r |g_r,j| / N, computed here by hand (a 10x looser one fails)."""
    g = [torch.randn(50, generator=torch.Generator().manual_seed(r)) for r in range(4)]
    partial = max(sum(abs(float(x[j])) for x in g) for j in range(50))
    assert bk.sum_tolerance(g) == pytest.approx((2 * 3 + 2) * 2.0 ** -24 * partial / 4, rel=1e-12)
