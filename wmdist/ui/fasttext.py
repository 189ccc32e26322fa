"""An Agg canvas that lays out and rasterises each text once, for figures a panel redraws on every move.

Profiled on a slider move (matplotlib 3.11), drawing text was about half of
`canvas.draw()`: each string is shaped again (`FT2Font._layout`, ~15 us a
character) and each glyph rendered again by FreeType, with a few numpy calls
per glyph, though a panel redraws the same tick labels, titles and tokens
("F3", "rank 0") move after move. This renderer keeps, per canvas:

- the layout of a string (glyph indices and offsets) by font, size, dpi,
  hinting, features and language: what `_layout` depends on;
- the bitmap of a glyph by font file, size, dpi, hinting, render mode,
  rotation and the sub-pixel part of its origin (1/64 px). FreeType places a
  glyph translated by whole pixels at the same bitmap, moved by those pixels,
  so the whole-pixel part only moves where the kept bitmap is stamped.

The canvas also takes a `checkpoint` (a callable, or None): the renderer
calls it before each text, path, marker set, collection and image it paints,
so the prefetcher's worker can abandon a picture half drawn when the learner
moves (wmdist.ui.prefetch.Superseded).

Every pixel comes out as matplotlib's own `RendererAgg.draw_text` draws it
(tests/test_fasttext.py compares whole panels both ways); mathtext and TeX
go to matplotlib unchanged. The caches live on the canvas (one per figure,
no module state) and are emptied when they outgrow their bound. If
matplotlib's private text API changes, the canvas says so at first use and
draws with matplotlib's own code from then on.
"""
from __future__ import annotations

import math
import warnings
from typing import Any, Callable

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg, get_hinting_flag
from matplotlib.figure import Figure
from matplotlib.ft2font import RenderMode

from wmdist.ui.render import DPI

MAX_LAYOUTS = 4096          # strings kept per canvas
MAX_GLYPHS = 20000          # glyph bitmaps kept per canvas (~100-300 bytes each)


class TextCache:
    """The layouts and glyph bitmaps one canvas has drawn (shared by the renderers it makes)."""

    def __init__(self) -> None:
        self.layouts: dict[tuple, tuple[Any, list[tuple[Any, int, float, float]]]] = {}
        self.glyphs: dict[tuple, tuple[np.ndarray, int, int]] = {}
        self.broken = False          # matplotlib's private API did not answer as expected: draw as matplotlib does
        self.hits = self.misses = 0


class _TextCachingRenderer(RendererAgg):
    """RendererAgg whose plain-text drawing reuses the layouts and glyph bitmaps in `cache`."""

    def __init__(self, width: float, height: float, dpi: float, canvas: TextCachingCanvas) -> None:
        self.canvas = canvas           # before RendererAgg.__init__, which calls _update_methods
        super().__init__(width, height, dpi)
        self.text_cache = canvas.text_cache

    def _update_methods(self) -> None:
        """RendererAgg binds its C drawing methods to the instance; each is wrapped to call the checkpoint first."""
        super()._update_methods()
        for name in ("draw_gouraud_triangles", "draw_image", "draw_markers", "draw_path_collection",
                     "draw_quad_mesh"):
            setattr(self, name, self._checked(getattr(self, name)))

    def _checked(self, draw: Callable[..., Any]) -> Callable[..., Any]:
        def checked(*args: Any, **kwargs: Any) -> Any:
            if self.canvas.checkpoint is not None:
                self.canvas.checkpoint()
            return draw(*args, **kwargs)
        return checked

    def draw_path(self, gc, path, transform, rgbFace=None):  # noqa: D102 (matplotlib's signature)
        if self.canvas.checkpoint is not None:
            self.canvas.checkpoint()
        return super().draw_path(gc, path, transform, rgbFace)

    def draw_text(self, gc, x, y, s, prop, angle, ismath=False, mtext=None):  # noqa: D102 (matplotlib's signature)
        if self.canvas.checkpoint is not None:
            self.canvas.checkpoint()
        cache = self.text_cache
        if ismath or cache.broken:
            return super().draw_text(gc, x, y, s, prop, angle, ismath=ismath, mtext=mtext)
        try:
            self._draw_cached(gc, x, y, s, prop, angle, mtext)
        except (AttributeError, TypeError) as err:    # another matplotlib: its own drawing from now on
            cache.broken = True
            cache.layouts.clear()
            cache.glyphs.clear()
            warnings.warn(f"wmdist.ui.fasttext: drawing text as matplotlib does ({type(err).__name__}: {err})",
                          RuntimeWarning, stacklevel=2)
            return super().draw_text(gc, x, y, s, prop, angle, ismath=ismath, mtext=mtext)
        return None

    def _draw_cached(self, gc, x, y, s, prop, angle, mtext) -> None:
        cache = self.text_cache
        flags = get_hinting_flag()
        features = mtext.get_fontfeatures() if mtext is not None else None
        language = mtext.get_language() if mtext is not None else None
        font = self._prepare_font(prop)                # per thread (matplotlib's fonts are), sized
        size = prop.get_size_in_points()
        key = (id(font), s, size, self.dpi, flags, _hashable(features), _hashable(language))
        entry = cache.layouts.get(key)
        if entry is None or entry[0] is not font:
            items = font._layout(s, flags=flags, features=features, language=language)
            entry = (font, [(i.ft_object, i.glyph_index, i.x, i.y) for i in items])
            if len(cache.layouts) >= MAX_LAYOUTS:
                cache.layouts.clear()
            cache.layouts[key] = entry
        cos, sin = math.cos(math.radians(angle)), math.sin(math.radians(angle))
        matrix = (0x10000 * np.array([[cos, -sin], [sin, cos]])).round().astype(int)   # extend 1, slant 0
        antialiased = gc.get_antialiased()
        mode = RenderMode.NORMAL if antialiased else RenderMode.MONO
        height = self.height
        common = (size, self.dpi, flags, antialiased, tuple(matrix.ravel().tolist()))
        draw_image = self._renderer.draw_text_image
        for ft, glyph, dx, dy in entry[1]:
            tx = round(0x40 * (x + dx * cos - dy * sin))
            ty = round(0x40 * (height - y + dx * sin + dy * cos))
            gkey = (ft.fname, ft.face_index, glyph, tx & 63, ty & 63, common)
            stamp = cache.glyphs.get(gkey)
            if stamp is None:
                cache.misses += 1
                ft.set_size(size, self.dpi)
                ft._set_transform(matrix, [tx, ty])
                bitmap = ft._render_glyph(glyph, flags, mode)
                buffer = np.array(bitmap.buffer)
                if not antialiased:
                    buffer *= 0xff
                stamp = (buffer, bitmap.left - (tx >> 6), bitmap.top - (ty >> 6))
                if len(cache.glyphs) >= MAX_GLYPHS:
                    cache.glyphs.clear()
                cache.glyphs[gkey] = stamp
            else:
                cache.hits += 1
            buffer, left, top = stamp
            draw_image(buffer, (tx >> 6) + left, int(height) - ((ty >> 6) + top) + buffer.shape[0], 0, gc)


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


class TextCachingCanvas(FigureCanvasAgg):
    """FigureCanvasAgg whose renderer keeps text layouts and glyph bitmaps from one draw to the next."""

    def __init__(self, figure: Figure | None = None) -> None:
        super().__init__(figure)
        self.text_cache = TextCache()
        self.checkpoint: Callable[[], None] | None = None    # called before each thing painted (see above)

    def get_renderer(self):  # noqa: D102 (as FigureCanvasAgg's, with our renderer)
        w, h = self.get_width_height(physical=True)
        key = w, h, self.figure.dpi
        if self._lastKey != key:
            self.renderer = _TextCachingRenderer(w, h, self.figure.dpi, self)
            self._lastKey = key
        return self.renderer


def fast_figure(width_px: int, height_px: int) -> Figure:
    """A Figure of width_px x height_px pixels on a TextCachingCanvas (not tracked by pyplot)."""
    fig = Figure(figsize=(width_px / DPI, height_px / DPI), dpi=DPI)
    TextCachingCanvas(fig)
    return fig
