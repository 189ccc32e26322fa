"""Where a panel's parts go on screen: a control column on the left, the picture and its numbers on the right.

Sized for a laptop: in a 1366 x 768 window with JupyterLab's file browser
open, a panel's output area is about 930 px wide, so the controls take a
23em column (in tabs when there are many) and the figure (600 px) and the key
numbers share the rest; details are folded below; every panel stays under
647 px tall.

Static figures (a notebook cell's returned Figure) obey the same screen: the
notebook area of a 1366 x 768 window is 647 px tall, and its output column is
934 px wide with the file browser open (measured in JupyterLab 4 in Chromium);
JupyterLab shrinks a wider image to the column, shrinking its text with it.
At 100 dpi a point is 100/72 px, so text of 7.5 pt or more is >= 10 px.
"""
from __future__ import annotations

from typing import Any

import ipywidgets as W

from wmdist.ui.controls import STACKED_CSS, is_slider, stack_label

SCREEN_HEIGHT_PX = 647      # the notebook area of a 1366 x 768 window: a figure taller hides its bottom
COLUMN_PX = 934             # a cell's output column there (file browser open): a wider image is shrunk
FIGURE_MAX_IN = (9.0, 6.2)  # a static figure's figsize at 100 dpi, leaving the inline backend's tight
                            # bounding box (0.1 in of padding a side) room within COLUMN_PX x SCREEN_HEIGHT_PX
MIN_TEXT_PT = 7.5           # 10.4 px at 100 dpi: the smallest text a static figure draws
WRAP = "white-space: normal; overflow-wrap: break-word; line-height: 1.4"
LEFT_WIDTH = "23em"
EM_PX = 13                  # JupyterLab's widget font size (--jp-widgets-font-size): 1em in a panel
TAB_INSET_PX = 36           # a Tab's page is narrower than the Tab: 15 px padding, 1 px border, 2 px margin a side


def shown_px(width: str, *, in_tab: bool) -> float:
    """The width in px a control with layout width `width` ("22em", "97%") gets in the control column: a
    percentage is of a tab page (in_tab) or of the column."""
    column = float(LEFT_WIDTH.removesuffix("em")) * EM_PX
    if width.endswith("em"):
        return float(width.removesuffix("em")) * EM_PX
    if width.endswith("%"):
        return float(width.removesuffix("%")) / 100 * (column - TAB_INSET_PX if in_tab else column)
    raise ValueError(f"width {width!r}: expected 'Nem' or 'N%'")


def panel_layout(panel: Any, extra_widgets: list[W.Widget]) -> W.Box:
    """The widget tree of `panel` (a ui.Panel): hint; controls and run box | view buttons, figure, numbers;
    details. With `panel.control_groups`, every control must sit in one of the tabs."""
    knobs: list[W.Widget] = [*panel.controls.values(), *panel.extra.values()]
    if panel.control_groups:
        by_name = {**panel.controls, **panel.extra}
        grouped = {n for names in panel.control_groups.values() for n in names}
        missing = [n for n in by_name if n not in grouped]
        if missing:
            raise ValueError(f"control_groups leaves out {missing}: every control must be reachable")
        for c in by_name.values():               # a tab page is narrower than the column by its padding
            c.layout.width = "97%"
        pages = [W.VBox([by_name[n] for n in names]) for names in panel.control_groups.values()]
        knobs = [W.Tab(children=pages, titles=tuple(panel.control_groups))]
    hint = W.HTML(f"<div style='{WRAP}; color:#333'><b>Try first:</b> {panel.hint}</div>" if panel.hint else "")
    left = W.VBox([*knobs, panel.run_button, *extra_widgets, panel.progress, panel.status],
                  layout=W.Layout(width=LEFT_WIDTH, min_width=LEFT_WIDTH, flex="0 0 auto"))
    right = W.VBox([panel.selector, panel.figure_box, panel.summary],
                   layout=W.Layout(flex="1 1 auto", min_width="0", overflow="visible"))
    for w in _descendants(left):                 # every slider, the panel's own ones included: label above track
        if is_slider(w):
            stack_label(w)
    row = W.HBox([left, right], layout=W.Layout(width="100%", align_items="flex-start", grid_gap="0.8em"))
    style = W.HTML(f"<style>{STACKED_CSS}</style>", layout=W.Layout(display="none"))   # applies though not shown
    return W.VBox([style, hint, row, panel.details_box], layout=W.Layout(width="100%"))


def _descendants(w: W.Widget) -> list[W.Widget]:
    """`w` and every widget inside it (a Box's or a Tab's children, recursively)."""
    return [w, *(d for c in getattr(w, "children", ()) for d in _descendants(c))]
