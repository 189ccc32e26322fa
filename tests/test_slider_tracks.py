"""Every slider of every panel has a track a learner can read and drag, checked from the widget layouts.

The browser test (test_browser.py) measures the tracks in Chromium, tab by tab; this one checks the
rule that gives them their length without a browser: a slider's label sits above its track, so the
track gets the control's width less the readout (wmdist.ui.controls.track_px, a model of ipywidgets
8's slider CSS that matched Chromium to the pixel: 167 px stacked and 16 px beside an 11em label in
a 255 px tab control; 198 px and 47 px in the 286 px column).
"""
from __future__ import annotations

import ipywidgets as W
import pytest

from wmdist.bench.panels import panel_factories
from wmdist.ui.controls import LABEL_WIDTH, MIN_TRACK_PX, STACKED, STACKED_CSS, is_slider, track_px
from wmdist.ui.layout import EM_PX, shown_px


def _sliders(w: W.Widget, in_tab: bool = False) -> list[tuple[W.Widget, bool]]:
    """(slider, whether it sits in a tab page) for every slider under `w`."""
    here = [(w, in_tab)] if is_slider(w) else []
    inside = in_tab or isinstance(w, W.Tab)
    return here + [s for c in getattr(w, "children", ()) for s in _sliders(c, inside)]


def _track(slider: W.Widget, in_tab: bool) -> float:
    """The track length the slider's layout gives it, stacked or with its label beside it."""
    stacked = (STACKED in slider._dom_classes and slider.style.description_width == "100%"
               and "wrap" in (slider.layout.flex_flow or ""))
    width = slider.style.description_width or LABEL_WIDTH
    label = None if stacked else (float(width.removesuffix("em")) * EM_PX if width.endswith("em") else 0.0)
    return track_px(shown_px(slider.layout.width, in_tab=in_tab), label_px=label)


@pytest.fixture(scope="module")
def panels():
    return {name: make() for name, make in panel_factories().items()}


def test_every_slider_of_every_panel_has_a_long_enough_track(panels):
    short = [f"panel {name}, {'tab' if in_tab else 'column'}, slider {s.description!r}: {_track(s, in_tab):.0f} px"
             for name, p in panels.items() for s, in_tab in _sliders(p.widget) if _track(s, in_tab) < MIN_TRACK_PX]
    assert not short, f"tracks under {MIN_TRACK_PX} px:\n" + "\n".join(short)
    counted = {name: len(_sliders(p.widget)) for name, p in panels.items()}
    assert all(counted.values()), f"a panel without sliders: {counted}"     # the check looked at something


def test_a_slider_beside_its_label_would_be_too_short():
    """The rule matters: an 11em label beside the track leaves a tab's slider 16 px, the column's 47 px."""
    label = float(LABEL_WIDTH.removesuffix("em")) * EM_PX
    assert track_px(shown_px("97%", in_tab=True), label_px=label) < MIN_TRACK_PX
    assert track_px(shown_px("22em", in_tab=False), label_px=label) < MIN_TRACK_PX
    assert track_px(shown_px("97%", in_tab=True)) >= MIN_TRACK_PX


def test_every_panel_carries_the_stacked_label_style(panels):
    for name, p in panels.items():
        styles = [c for c in p.widget.children if isinstance(c, W.HTML) and "<style>" in c.value]
        assert any(STACKED_CSS in c.value for c in styles), f"panel {name}: no <style> for stacked slider labels"


def test_a_width_the_column_cannot_read_is_refused():
    with pytest.raises(ValueError, match="'300px'"):
        shown_px("300px", in_tab=False)
