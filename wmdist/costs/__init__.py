"""Closed-form cost models from the source text, as pure functions (no torch).

One file per topic (collectives, scaling, pipeline, zero, scan, diffusion, ...),
the validators once (validate.py) and the rounding bound behind every
tolerance once (rounding.py). The formulas chapters 00-03 use are re-exported
here, so `costs.ring_allreduce_bytes` reads the same wherever it is used; the
others are reached through their topic, e.g. `costs.scan.handoff_bytes`.
These formulas drive widgets and predict what the ledger must measure, so
they are importable and testable without processes.
"""
from wmdist.costs import collectives, diffusion, pipeline, ring_attention, rounding, scaling, scan, validate, zero
from wmdist.costs.collectives import (DEFAULT_RING_CHUNK_BYTES, allreduce_terms, allreduce_time,
                                      ring_all_gather_bytes, ring_allreduce_bytes, ring_allreduce_ideal_bytes,
                                      ring_allreduce_messages, ring_allreduce_rounds, ring_chunk_size,
                                      ring_chunk_sizes, ring_reduce_scatter_bytes)
from wmdist.costs.pipeline import bubble_fraction
from wmdist.costs.rounding import FLOAT32_ROUNDOFF, FLOAT64_ROUNDOFF, reordered_sum_bound
from wmdist.costs.scaling import efficiency, speedup
from wmdist.costs.validate import require_bool, require_choice, require_int, require_positive, require_real
from wmdist.costs.zero import ZERO_STAGES, zero_step_bytes, zero_step_rounds

__all__ = ["DEFAULT_RING_CHUNK_BYTES", "FLOAT32_ROUNDOFF", "FLOAT64_ROUNDOFF", "ZERO_STAGES", "allreduce_terms", "allreduce_time",
           "bubble_fraction", "collectives", "diffusion", "efficiency", "pipeline", "reordered_sum_bound",
           "require_bool", "require_choice", "require_int", "require_positive", "require_real",
           "ring_all_gather_bytes", "ring_allreduce_bytes", "ring_allreduce_ideal_bytes", "ring_allreduce_messages", "ring_allreduce_rounds",
           "ring_attention", "ring_chunk_size", "ring_chunk_sizes", "ring_reduce_scatter_bytes", "rounding",
           "scaling", "scan", "speedup", "validate", "zero", "zero_step_bytes", "zero_step_rounds"]
