"""Every static figure a notebook shows fits a 1366 x 768 screen, with text a learner can read.

Each figure is built by the function its notebook calls, with the notebook's
arguments (the shapes: ranks, timelines, series; the numbers a rank run would
measure are stand-ins here, since they move the lines, not the layout), and
rendered as the inline backend renders it: IPython's print_figure, PNG at the
figure's dpi, cropped to its tight bounding box. A PNG wider than the output
column is shown shrunk to it, text included, so the smallest text is checked
at that scale.
"""
from __future__ import annotations

import math
import struct
from types import SimpleNamespace

import matplotlib
import pytest
from IPython.core.pylabtools import print_figure
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.text import Text

from wmdist.base.spans import Span
from wmdist.ui.layout import COLUMN_PX, SCREEN_HEIGHT_PX

matplotlib.use("Agg")
MIN_TEXT_PX = 10.0


def shown(fig) -> tuple[int, int, float]:
    """(width, height) in px of the PNG the inline backend shows, and the smallest text's height on screen."""
    png = print_figure(fig, "png")
    width, height = struct.unpack(">II", png[16:24])
    sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    scale = min(1.0, COLUMN_PX / width)
    return width, height, min(sizes) * fig.dpi / 72 * scale


def _apart(a, b, gap: float) -> bool:
    """Two window boxes are at least `gap` px apart, across or down."""
    return a.x1 + gap <= b.x0 or b.x1 + gap <= a.x0 or a.y1 + gap <= b.y0 or b.y1 + gap <= a.y0


def _check_apart(fig, name: str) -> None:
    """Titles of different axes, a title and its own axes' legend, and neighbouring tick labels (major and
    minor) leave a gap a reader sees: 6 px (2 px to a legend, which has its own padding)."""
    if not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    fig.canvas.draw()                                # the same layout print_figure drew
    renderer = fig.canvas.get_renderer()
    titles = [(ax, t.get_window_extent(renderer)) for ax in fig.axes
              for t in (ax.title, ax._left_title, ax._right_title) if t.get_visible() and t.get_text().strip()]
    for i, (ax_a, a) in enumerate(titles):
        for ax_b, b in titles[i + 1:]:
            assert ax_a is ax_b or _apart(a, b, 6), f"{name}: titles touch"
    for ax, title in titles:
        legend = ax.get_legend()
        if legend is not None and legend.get_visible():
            assert _apart(title, legend.get_window_extent(renderer), 2), f"{name}: a title runs into its legend"
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            boxes = sorted((t.get_window_extent(renderer) for t in axis.get_ticklabels(which="both")
                            if t.get_visible() and t.get_text().strip()), key=lambda b: (b.x0, b.y0))
            for a, b in zip(boxes, boxes[1:]):
                assert _apart(a, b, 6), f"{name}: tick labels {a} and {b} touch"


def _ranks(n: int, *, kinds=("compute", "comm"), t0: float = 0.0) -> list[Span]:
    return [Span(row=r, start=t0 + 0.01 * i, end=t0 + 0.01 * i + 0.008, kind=kinds[i % len(kinds)]) for r in range(n) for i in range(6)]


# --- the figures, as each notebook calls them ----------------------------------------------------

def _01_buckets():
    from wmdist.ui import timelines_figure
    return timelines_figure({"one bucket": _ranks(4, kinds=("compute", "launch", "comm")),
                             "two buckets": _ranks(4, kinds=("compute", "launch", "comm"))})


def _02_estimators():
    from wmdist.latents.figures import estimator_figure
    from wmdist.latents.results import EstimatorStats
    names = ("f(z)", "pathwise (reparameterised)", "score function (REINFORCE)", "score + baseline", "wrong: no score")
    return estimator_figure({n: EstimatorStats(name=n, exact=1.0, mean=1.0 + 0.01 * i, bias=0.01 * i, variance=10.0 ** i, se=0.01) for i, n in
                             enumerate(names)})


def _02_seeds():
    from wmdist.latents.figures import seeds_figure
    s = lambda v: SimpleNamespace(var_one_rank=1.0, var_average=v)           # noqa: E731
    return seeds_figure({"independent": s(0.25), "shared": s(1.0), "antithetic": s(0.05)}, 4)


def _03_zero():
    from wmdist.memory.figures import zero_stages_figure
    kinds = {"parameters": 8_000, "gradients": 8_000, "optimizer_state": 16_000}
    return zero_stages_figure({s: kinds for s in range(4)}, {s: 32_000 for s in range(4)}, world_size=3)


def _05_measured():
    from wmdist.pipeline.figures import measured_vs_ideal
    spans = tuple(_ranks(4, kinds=("forward", "backward", "send")))
    return measured_vs_ideal(SimpleNamespace(median_idle=0.3, predicted=0.27, median_timeline=spans, ideal=spans))


def _05_imbalance():
    from wmdist.pipeline.figures import imbalance_figure
    run = SimpleNamespace(work=SimpleNamespace(work=lambda stages: [1.0, 2.0, 1.0, 1.0]),
                          schedule=SimpleNamespace(stages=4))
    return imbalance_figure(SimpleNamespace(runs=[run], microbatches=(4, 16), measured=(0.45, 0.3), limit=0.375))


def _06_ring():
    from wmdist.ring_attention.figures import ring_timelines
    return ring_timelines(tuple(_ranks(4)), tuple(_ranks(4, t0=0.1)))


def _06_balance():
    from wmdist.ring_attention.figures import balance_figure
    return balance_figure({k: tuple(_ranks(4)) for k in ("contiguous", "zigzag")},
                          {k: [0.01, 0.02, 0.03, 0.04] for k in ("contiguous", "zigzag")})


def _07_bytes():
    from wmdist.scan import figures
    from wmdist.scan.results import ByteSweep, BytesRow
    rows = tuple(BytesRow(steps=t, state_size=n, diagonal=d, combine=c,
                          sent_per_rank=(n * n if c == "gathered" else n,) * 4)
                 for t, n in [*((t, 4) for t in (8, 64, 512)), *((64, n) for n in (1, 2, 8, 16))]
                 for c, d in (("gathered", False), ("gathered", True), ("handoff", False)))
    return figures.bytes_figure(ByteSweep(world_size=4, batch=2, fixed_state_size=4, fixed_steps=64, rows=rows))


def _07_ops():
    from wmdist.scan import figures
    from wmdist.scan.results import ScanTimes
    times = [ScanTimes(state_size=8, diagonal=True, steps=(16, 64, 256, 1024), loop_s=(1e-4, 4e-4, 2e-3, 8e-3),
                       hillis_steele_s=(2e-4, 5e-4, 1e-3, 3e-3), torch_scan_s=(3e-4, 6e-4, 1e-3, 2e-3)),
             ScanTimes(state_size=32, diagonal=False, steps=(16, 64, 256), loop_s=(2e-4, 8e-4, 3e-3),
                       hillis_steele_s=(4e-4, 1e-3, 3e-3), torch_scan_s=(5e-4, 1e-3, 2e-3))]
    return figures.ops_figure(times=times)


def _07_from_zero():
    from wmdist.scan import figures
    split = SimpleNamespace(from_zero_errors=tuple(1e-3 / (t + 1) if t > 9 else 0.0 for t in range(37)), bound=1e-6,
                            chunk_sizes=(10, 9, 9, 9))
    return figures.from_zero_figure(split)


def _07_picard():
    from wmdist.scan import figures
    sweeps = SimpleNamespace(sweeps=4, errors=(1.0, 0.1, 0.01, 0.0), changes=(1.0, 0.2, 0.02, 0.0),
                             chunk_sizes=(10, 9, 9, 9), work=(37, 74, 111, 148), depth=(10, 20, 30, 40), loop_steps=37)
    return figures.sweeps_figure(sweeps)


def _07_schedules(n: int):
    from wmdist.scan import figures
    names = ["hand-off (exact, sequential)", "Picard sweeps (exact after N sweeps, N x the work)",
             "episodes split (exact, parallel)"]
    return figures.schedules_figure({name: _ranks(4) for name in names[:n]})


def _08_gather():
    from wmdist.diffusion import figures
    return figures.gather_bytes_figure(2, 64, 32, 4, list(range(1, 9)), measured={3: {"kv": 40_000, "x": 3_000}})


def _08_steps():
    from wmdist.diffusion import figures
    from wmdist.diffusion.step_parallel import CASES as cases
    data = SimpleNamespace(timelines={c: _ranks(4) for c in cases}, concurrency=dict.fromkeys(cases, 1.0),
                           ideal=dict.fromkeys(cases, 2.0))
    return figures.steps_figure(data, 4)


def _08_picard():
    from wmdist.diffusion import figures
    result = SimpleNamespace(rounds=8, errors=[10.0 ** -k for k in range(8)], evaluations=[8 - k for k in range(8)],
                             total_evaluations=36)
    return figures.picard_figure(SimpleNamespace(result=result, world_size=4, rounding_level=1e-6, critical_path=12,
                                                 steps=8))


def _08_tradeoff():
    from wmdist.diffusion import figures
    from wmdist.diffusion.spec import SamplingSpec
    from wmdist.diffusion.tradeoff import tradeoff
    return figures.tradeoff_figure(tradeoff(SamplingSpec(steps=16), [1, 2, 4, 8, 16]))


def _10_tokens():
    from wmdist.experts.figures import tokens_figure
    return tokens_figure([40, 3, 9, 12, 0, 7, 5, 20], 12, ranks=4, title="skewed router, k = 1, c = 1")


FIGURES = {"01 buckets": _01_buckets, "02 estimators": _02_estimators, "02 seeds": _02_seeds, "03 zero": _03_zero,
           "05 measured vs ideal": _05_measured, "05 imbalance": _05_imbalance,
           "06 ring": _06_ring, "06 balance": _06_balance,
           "07 bytes": _07_bytes, "07 ops": _07_ops, "07 from zero": _07_from_zero, "07 picard": _07_picard,
           "07 two schedules": lambda: _07_schedules(2), "07 three schedules": lambda: _07_schedules(3),
           "08 gather": _08_gather, "08 steps": _08_steps, "08 picard": _08_picard, "08 tradeoff": _08_tradeoff,
           "10 tokens": _10_tokens}


@pytest.mark.parametrize("name", list(FIGURES))
def test_static_figure_fits_the_screen_with_legible_text(name):
    width, height, text_px = shown(FIGURES[name]())
    assert height <= SCREEN_HEIGHT_PX, f"{name}: {height} px tall, over the {SCREEN_HEIGHT_PX} px notebook area"
    assert width <= COLUMN_PX, f"{name}: {width} px wide, shrunk to the {COLUMN_PX} px column"
    assert math.isfinite(text_px) and text_px >= MIN_TEXT_PX, f"{name}: smallest text {text_px:.1f} px on screen"


@pytest.mark.parametrize("name", list(FIGURES))
def test_titles_and_tick_labels_keep_apart(name):
    _check_apart(FIGURES[name](), name)


@pytest.fixture(scope="module")
def panels():
    from wmdist.bench.panels import panel_factories
    return {name: make() for name, make in panel_factories().items()}


def test_every_panel_view_keeps_its_labels_apart(panels):
    for name, panel in panels.items():
        for view in panel.selector.options:
            panel.selector.value = view
            _check_apart(panel.shown, f"{name} / {view}")
        panel.selector.value = panel.selector.options[0]
        panel.prefetch.idle()


@pytest.mark.parametrize("scenario", ["tiny", "wide", "long context"])
def test_09_byte_axis_labels_stay_apart_over_many_decades(scenario):
    """09's bytes view spans 1 B to terabytes in the wide setting: one label per decade would crowd."""
    from wmdist.mesh.panel import PatternsPanel
    from wmdist.mesh.scenarios import PATTERN_SCENARIOS
    panel = PatternsPanel(PATTERN_SCENARIOS[scenario])
    _check_apart(panel.shown, f"09 {scenario}")
    panel.prefetch.idle()
