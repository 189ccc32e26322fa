"""Which kind of tensor is the limit, and which remedy shrinks it (pure data)."""
from __future__ import annotations

from dataclasses import dataclass

from wmdist.memory.footprint import KINDS, Kind


def limiting_kind(breakdown: dict[str, int]) -> Kind:
    """The kind holding the most bytes (first in KINDS order on ties)."""
    return max(KINDS, key=lambda k: breakdown.get(k, 0))


@dataclass(frozen=True)
class Remedy:
    name: str
    targets: tuple[Kind, ...]   # kinds whose per-rank bytes it divides
    how: str


REMEDIES = (
    Remedy("ZeRO-1", ("optimizer_state", "master_weights"), "shards optimizer state over the dp ranks"),
    Remedy("ZeRO-2", ("optimizer_state", "master_weights", "gradients"), "also shards gradients"),
    Remedy("ZeRO-3", ("optimizer_state", "master_weights", "gradients", "parameters"),
           "also shards parameters; gathers them layer by layer when needed"),
    Remedy("tensor parallel", ("parameters", "gradients", "optimizer_state", "master_weights", "activations"),
           "splits each layer's computation, and so its weights, across ranks"),
    Remedy("pipeline parallel", ("parameters", "gradients", "optimizer_state", "master_weights", "activations"),
           "gives each rank a contiguous block of layers"),
    Remedy("activation checkpointing", ("activations",),
           "keeps layer inputs only and recomputes the rest in backward: compute for memory"),
    Remedy("context parallel", ("activations",), "splits each sequence's token positions across ranks"),
    Remedy("smaller micro-batch", ("activations", "batch"), "fewer sequences per step (accumulate gradients)"),
    Remedy("offload to host memory or NVMe", ("optimizer_state", "master_weights", "gradients", "parameters"),
           "keeps state off the device between uses (ZeRO-Offload, ZeRO-Infinity); pays in transfers and CPU time"),
    Remedy("more replicated DP workers", (),
           "each replica still holds everything: faster, not smaller per rank"),
)


def remedies_for(kind: Kind) -> list[Remedy]:
    """Remedies that shrink `kind` on each rank, most specific (fewest targets) first; another name is refused."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    return sorted((r for r in REMEDIES if kind in r.targets), key=lambda r: len(r.targets))

