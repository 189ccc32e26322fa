"""Keep the cyclic garbage collector's full passes out of a control move.

Measured in `wmdist bench panels`: the worst move of most panels (an extra
~100 ms of CPU on the kernel's main thread) was a full collection landing
inside it, not the drawing. A panel calls `settle_garbage()` once it is built.
"""
from __future__ import annotations

import gc


def settle_garbage() -> None:
    """Collect the garbage now, then take every object alive out of the cyclic collector's walks (gc.freeze).

    A process with matplotlib, ipywidgets and a panel holds ~250,000 tracked objects; a full collection walks
    them all (~100 ms, measured) and one landed inside a control move every few dozen moves: it was the worst
    move of most panels. Frozen, they are not walked again; what moves create still is, so a full collection
    costs a few ms. The price: an object alive now that later becomes garbage inside a reference cycle is
    never collected (a panel and its figures are held by ipywidgets' widget registry anyway); the collection
    first leaves no garbage frozen. Nothing is unfrozen: the kernel's zygote froze its imports on purpose, so
    that the kernels forked from it share those pages (wmdist.runtime.frozen)."""
    gc.collect()
    gc.freeze()
