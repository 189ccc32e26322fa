"""The progress callback's type, on its own: a run reports how far it has got, a panel shows it.

`on_progress(done, total, text)`. Pure (typing only), so that the widgets (ui/) name it without
importing the runner and the ranks beneath it.
"""
from __future__ import annotations

from typing import Callable

OnProgress = Callable[[int, int, str], None]
