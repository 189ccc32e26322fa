"""Figures drawn at the size they are shown, redrawn in place, and sent to the browser as PNG.

A panel keeps one matplotlib Figure per view for its whole life, on a plain
Agg canvas (no pyplot, so nothing is ever shown twice and no backend is
involved). A slider move empties the figure's axes of what was drawn and
draws again into the same axes: making axes and their ticks is most of the
cost of a new figure, so reusing them is what keeps a redraw within a slider's
budget. The PNG is encoded by Pillow (matplotlib's own dependency) at its
fastest compression, and shown at 1 image pixel per CSS pixel, so 10-point
text is about 14 px high on screen, never shrunk to fit a column.

Formatters here write tick labels in engineering units (1 ms, 10 kB, 1
TFLOP) as plain text, never as mathtext: parsing mathtext was a third of a
redraw, and "6×10⁻³" is not how a person reads a duration.
"""
from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter, FixedLocator, FuncFormatter, MaxNLocator, NullLocator
from PIL import Image

DPI = 100          # one image pixel per CSS pixel: a figure of 760 x 360 px is 7.6 x 3.6 inches
FONT = 10          # points: ~14 px on screen at DPI 100; nothing in a panel is drawn smaller than SMALL
SMALL = 8.5


def canvas_figure(width_px: int, height_px: int) -> Figure:
    """A Figure of exactly width_px x height_px pixels on its own Agg canvas (not tracked by pyplot)."""
    fig = Figure(figsize=(width_px / DPI, height_px / DPI), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def axes_grid(fig: Figure, *, rows: int = 1, cols: int = 1, margins: tuple[float, float, float, float] =
              (0.09, 0.97, 0.15, 0.9), **grid: object) -> list[Axes]:
    """`rows x cols` axes in `fig`, reused when the figure already holds that grid, emptied of their artists.

    margins = (left, right, bottom, top) in figure fractions, fixed: a layout
    engine would cost a slider more than the drawing. Extra keywords go to
    GridSpec (height_ratios, hspace, ...). Everything a draw function sets
    (titles, labels, limits, scales, ticks) it sets again on every call.
    """
    key = (rows, cols, margins, tuple(sorted((k, repr(v)) for k, v in grid.items())))
    if getattr(fig, "wmdist_grid", None) == key:
        for ax in fig.axes:
            empty(ax)
        for text in list(fig.texts):
            text.remove()
        return list(fig.axes)
    fig.clear()
    left, right, bottom, top = margins
    spec = fig.add_gridspec(rows, cols, left=left, right=right, bottom=bottom, top=top, **grid)
    axes = [fig.add_subplot(spec[r, c]) for r in range(rows) for c in range(cols)]
    fig.wmdist_grid = key          # what this figure's axes were made for (a plain attribute of our own figure)
    return axes


def empty(ax: Axes) -> None:
    """Remove what was drawn in `ax` (lines, bars, texts, legend) and let its limits follow the next data."""
    for artist in [*ax.lines, *ax.collections, *ax.patches, *ax.texts, *ax.images, *ax.tables]:
        artist.remove()
    ax.containers.clear()                    # bar containers would otherwise keep their legend entries
    if ax.get_legend() is not None:
        ax.get_legend().remove()
    ax.set_prop_cycle(None)
    ax.relim()
    ax.set_autoscale_on(True)


def to_png(fig: Figure) -> bytes:
    """Draw `fig` and encode it as PNG (RGB, fastest zlib level: this is for a screen, not an archive)."""
    fig.canvas.draw()
    rgba = np.asarray(fig.canvas.buffer_rgba())
    out = io.BytesIO()
    Image.fromarray(rgba[..., :3]).save(out, format="png", compress_level=1)
    return out.getvalue()


def img_html(png: bytes, alt: str) -> str:
    """An <img> that shows `png` at its own pixel size (never scaled down to a column, so text stays legible)."""
    data = base64.b64encode(png).decode("ascii")
    return (f"<img src='data:image/png;base64,{data}' alt='{html.escape(alt, quote=True)}' "
            f"style='max-width:none; display:block'>")


# --- axes in engineering units -----------------------------------------------------------------

def eng_axis(axis, unit: str, *, places: int | None = None) -> None:
    """Tick labels of `axis` (ax.xaxis / ax.yaxis) in engineering units: 1 ms, 10 kB, 1 TFLOP."""
    axis.set_major_formatter(EngFormatter(unit=unit, places=places, sep=" ", usetex=False, useMathText=False))
    axis.set_minor_locator(NullLocator())


def integer_axis(axis) -> None:
    """Integer ticks only (ranks, stages, microbatches): no 2.5 ranks."""
    axis.set_major_locator(MaxNLocator(integer=True))


def log2_axis(axis, values: Sequence[int]) -> None:
    """A log axis over integers (N = 1..256, S = 1,024..1,048,576) labelled at powers of two within `values`,
    as plain integers, every k-th power so that the labels never touch on screen."""
    lo, hi = min(values), max(values)
    ticks = [2 ** k for k in range(0, 63) if lo <= 2 ** k <= hi] or [lo, hi]
    ax = axis.axes
    box = ax.get_position()
    horizontal = axis is ax.xaxis
    room = (box.width * ax.figure.get_figwidth() if horizontal else box.height * ax.figure.get_figheight()) * DPI
    char = 0.62 * FONT * DPI / 72
    for stride in range(1, len(ticks) + 1):
        shown = ticks[::stride]
        need = sum(len(f"{t:,}") * char + 14 for t in shown) if horizontal else len(shown) * 2.2 * FONT
        if need <= room:
            break
    axis.set_major_locator(FixedLocator(shown))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{int(round(v)):,}"))
    axis.set_minor_locator(NullLocator())
