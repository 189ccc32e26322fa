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

A picture stored in a notebook is read without a kernel (nbconvert, the course site,
GitHub), where its alt text is all a screen reader has: `figure_alt` writes one from what
the figure already says (titles, axis labels, legend entries), and `describe_figures`
makes IPython attach it to every Figure a cell displays (output metadata `alt`; the
refresh tool also stores it in a `text/html` <img>, since nbconvert's default template
writes no alt for a bare PNG).
"""
from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
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
        for artist in [*fig.texts, *fig.legends]:       # a figure legend left here would be drawn again on top
            artist.remove()
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


def whole_figure_extent(fig: Figure) -> None:
    """Make a figure's tight crop (the inline backend's bbox_inches="tight") its whole canvas.

    For a figure of measured values whose tick labels and numbers change width from run to run: an
    invisible frame on the figure's edges keeps the stored picture the same size every run, so the
    stored-output check compares like with like.
    """
    fig.add_artist(Rectangle((0, 0), 1, 1, transform=fig.transFigure, fill=False, linewidth=0, zorder=-10))


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


ALT_LIMIT = 600    # characters: an alt text is read aloud in full; past this it says "…" and stops


def figure_alt(fig: Figure) -> str:
    """What `fig` shows, in words, from its own text: the figure title, then per chart its title, axes and key.

    e.g. "Figure, 2 charts. 1) GPipe, P = 4 — x axis time (ms), y axis stage; key: forward, backward. 2) ..."
    A chart with no text of its own (a colour bar) is counted but not described.
    """
    def said(*texts: str) -> list[str]:
        return [t.strip() for t in texts if t and t.strip()]

    charts = []
    for ax in fig.axes:
        title = ", ".join(said(ax.get_title("left"), ax.get_title("center"), ax.get_title("right")))
        parts = []
        axes = said(*(f"{name} axis {label.strip()}" for name, label in (("x", ax.get_xlabel()), ("y", ax.get_ylabel()))
                      if label.strip()))
        if axes:
            parts.append(", ".join(axes))
        legend = ax.get_legend()
        key = said(*(t.get_text() for t in legend.get_texts())) if legend is not None else []
        if key:
            parts.append(f"key: {', '.join(key)}")
        body = "; ".join(parts)
        if title or body:
            charts.append(f"{title} — {body}" if title and body else title or body)
    head = list(dict.fromkeys(said(*(t.get_text() for t in fig.texts))))     # suptitle and figure-level text
    count = len(fig.axes)
    words = ["Figure" + (f": {'; '.join(head)}" if head else "") + f", {count} chart{'s' if count != 1 else ''}."]
    if len(charts) == 1:
        words.append(charts[0] + ".")
    else:
        words += [f"{i}) {c}." for i, c in enumerate(charts, 1)]
    text = " ".join(words)
    return text if len(text) <= ALT_LIMIT else text[:ALT_LIMIT - 1].rstrip() + "…"


def describe_figures(*, shell: Any = None) -> bool:
    """Make IPython store `figure_alt(fig)` as the alt text of every Figure displayed in `shell`.

    Registered as the Figure's mime-bundle formatter returning metadata only: IPython still
    takes the PNG from matplotlib's inline backend, and keeps this metadata beside it, so a
    later `%matplotlib inline` (which re-registers the PNG formatter) does not undo it.
    `shell` defaults to the running IPython; returns False (and does nothing) outside one.
    """
    if shell is None:
        try:
            from IPython import get_ipython
        except ImportError:
            return False
        shell = get_ipython()
    if shell is None:
        return False
    shell.display_formatter.mimebundle_formatter.for_type(
        Figure, lambda fig: ({}, {"image/png": {"alt": figure_alt(fig)}}))
    return True


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
