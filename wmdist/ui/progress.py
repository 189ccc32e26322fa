"""A progress bar for slow calls in a notebook: pass it as a `progress` callback."""
from __future__ import annotations

from typing import Any

import ipywidgets as W


class Progress:
    """An IntProgress and a label; calling it as progress(done, total, text) updates both.

    Display it (leave it as a cell's last expression, or `display(p)`) before
    the slow call, e.g. `verify(world_size=4, progress=p)`.
    """

    def __init__(self, description: str = ""):
        self.bar = W.IntProgress(value=0, min=0, max=1, description=description)
        self.label = W.Label()
        self.widget = W.HBox([self.bar, self.label])

    def __call__(self, done: int, total: int, text: str) -> None:
        self.bar.max = max(total, 1)
        self.bar.value = done
        self.label.value = text

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)
