"""Closed-form cost models from the source text, as pure functions (no torch).

One file per topic (collectives, scaling, pipeline, zero, scan, diffusion, ...),
the validators once (validate.py) and the rounding bound behind every
tolerance once (rounding.py). The formulas chapters 00-03 use are named here
too, so `costs.ring_allreduce_bytes` reads the same wherever it is used; every
topic is reached through its name, e.g. `costs.scan.handoff_bytes`.
These formulas drive widgets and predict what the ledger must measure, so
they are importable and testable without processes.

Nothing is imported here: a name is imported from its topic the first time it
is used (PEP 562), so `from wmdist.costs import zero` loads zero.py and what it
imports, not every chapter's formulas. Library code imports the topic it needs
(`from wmdist.costs import zero`, `from wmdist.costs.validate import require_int`);
`from wmdist import costs; costs.ring_allreduce_bytes` keeps working for
notebooks and readers.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wmdist.costs import (allreduce, collectives, compression, diffusion, experts, layout, mesh, pipeline,
                              pipeline_stages, ring_attention, rounding, scaling, scan, tensor_parallel, units,
                              validate, zero)
    from wmdist.costs.collectives import (DEFAULT_RING_CHUNK_BYTES, allreduce_terms, allreduce_time,
                                          ring_all_gather_bytes, ring_allreduce_bytes, ring_allreduce_ideal_bytes,
                                          ring_allreduce_messages, ring_allreduce_rounds, ring_chunk_size,
                                          ring_chunk_sizes, ring_reduce_scatter_bytes)
    from wmdist.costs.pipeline import bubble_fraction
    from wmdist.costs.rounding import FLOAT32_ROUNDOFF, FLOAT64_ROUNDOFF, reordered_sum_bound
    from wmdist.costs.scaling import efficiency, speedup
    from wmdist.costs.validate import require_bool, require_choice, require_int, require_positive, require_real
    from wmdist.costs.zero import ZERO_STAGES, zero_step_bytes, zero_step_rounds

# Every topic module in this folder (tests/test_import_closure.py holds the list to the files).
TOPICS = ("allreduce", "collectives", "compression", "diffusion", "experts", "layout", "mesh", "pipeline",
          "pipeline_stages", "ring_attention", "rounding", "scaling", "scan", "tensor_parallel", "units",
          "validate", "zero")
# The formulas named at the top level, by the topic that defines them.
_HOME = {
    "collectives": ("DEFAULT_RING_CHUNK_BYTES", "allreduce_terms", "allreduce_time", "ring_all_gather_bytes",
                    "ring_allreduce_bytes", "ring_allreduce_ideal_bytes", "ring_allreduce_messages",
                    "ring_allreduce_rounds", "ring_chunk_size", "ring_chunk_sizes", "ring_reduce_scatter_bytes"),
    "pipeline": ("bubble_fraction",),
    "rounding": ("FLOAT32_ROUNDOFF", "FLOAT64_ROUNDOFF", "reordered_sum_bound"),
    "scaling": ("efficiency", "speedup"),
    "validate": ("require_bool", "require_choice", "require_int", "require_positive", "require_real"),
    "zero": ("ZERO_STAGES", "zero_step_bytes", "zero_step_rounds"),
}
_TOPIC_OF = {name: topic for topic, names in _HOME.items() for name in names}

__all__ = sorted([*TOPICS, *_TOPIC_OF])


def __getattr__(name: str) -> Any:
    """A topic module, or a formula from its topic, imported the first time it is used."""
    if name in TOPICS:
        value = importlib.import_module(f"{__name__}.{name}")
    elif name in _TOPIC_OF:
        value = getattr(importlib.import_module(f"{__name__}.{_TOPIC_OF[name]}"), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
