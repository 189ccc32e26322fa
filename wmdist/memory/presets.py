"""Public transformer shapes for the memory calculator, with a published activation formula (pure).

So that "a 7B model on 8 GPUs with ZeRO-2 at sequence 4096" needs no hand
arithmetic: a preset gives the parameter count (computed from the shape), the
number of layers, and the activation bytes a layer stores per token.

Activations follow Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models" (section 4): one GPT-style layer
(LayerNorm, multi-head attention, a 4h GELU MLP, dropout) stores
s*b*h*(34 + 5*a*s/h) bytes for s tokens, b sequences, width h and a heads.
Their assumptions, stated again here: 16-bit activations, 1-byte dropout
masks, the softmax probabilities kept (no flash attention), no recomputation.
Of the 34 bytes per token and unit of width, 10 (LayerNorm inputs, dropout
masks, the first linears' inputs) stay whole on every tensor-parallel rank
unless sequence parallelism splits them too: the preset marks them as the
TP-replicated part, so the memory model gives their sbh(10 + 24/t + 5as/(ht))
with tp = t. The embedding, the logits and the loss are not counted. With full
recomputation a layer keeps only its 16-bit input, 2*h bytes per token. The
shapes are GPT-2 XL and GPT-3 models, whose blocks are what the formula
describes; other architectures (SwiGLU MLPs, grouped query attention, flash
attention) store different amounts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from wmdist.costs.validate import require_int

Preset = Literal["gpt2-xl", "gpt3-6.7b", "gpt3-13b", "gpt3-175b"]   # the names of PRESETS


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """A GPT-style decoder: layers, width, heads, vocabulary, learned positions; and where it is published."""
    name: str
    layers: int
    hidden: int
    heads: int
    vocab: int
    positions: int
    source: str

    @property
    def params(self) -> int:
        """12Lh^2 + 13Lh (attention, MLP, two LayerNorms per layer) + (vocab + positions) h + 2h (final LayerNorm)."""
        L, h = self.layers, self.hidden
        return 12 * L * h * h + 13 * L * h + (self.vocab + self.positions) * h + 2 * h

    def activation_bytes_per_token(self, seq_len: int) -> float:
        """Korthikanti et al.'s per-layer bytes per token, h(34 + 5as/h) = 34h + 5as, at sequence length s."""
        s = require_int("seq_len", seq_len, 1)
        return 34 * self.hidden + 5 * self.heads * s

    @property
    def replicated_bytes_per_token(self) -> int:
        """The part that tensor parallelism without sequence parallelism leaves whole on every rank: 10h."""
        return 10 * self.hidden

    @property
    def input_bytes_per_token(self) -> int:
        """What full recomputation keeps of a layer: its 16-bit input, 2h bytes per token."""
        return 2 * self.hidden


PRESETS = {m.name: m for m in (
    ModelShape(name="gpt2-xl", layers=48, hidden=1600, heads=25, vocab=50257, positions=1024,
               source="Radford et al. 2019, GPT-2 (1.5B)"),
    ModelShape(name="gpt3-6.7b", layers=32, hidden=4096, heads=32, vocab=50257, positions=2048,
               source="Brown et al. 2020, GPT-3 Table 2.1"),
    ModelShape(name="gpt3-13b", layers=40, hidden=5140, heads=40, vocab=50257, positions=2048,
               source="Brown et al. 2020, GPT-3 Table 2.1"),
    ModelShape(name="gpt3-175b", layers=96, hidden=12288, heads=96, vocab=50257, positions=2048,
               source="Brown et al. 2020, GPT-3 Table 2.1"),
)}


def preset_fields(name: Preset, *, seq_len: int | None = None) -> dict[str, int | float]:
    """MemoryConfig fields a preset fixes: params, layers, seq_len (default: its context), activation bytes
    (with their TP-replicated part) and the layer input that checkpointing keeps. A name outside Preset is
    refused (ValueError)."""
    if name not in PRESETS:
        raise ValueError(f"model must be one of {', '.join(PRESETS)}, got {name!r}")
    m = PRESETS[name]
    s = m.positions if seq_len is None else require_int("seq_len", seq_len, 1)
    return {"params": m.params, "layers": m.layers, "seq_len": s,
            "act_bytes_per_token_per_layer": m.activation_bytes_per_token(s),
            "act_replicated_bytes_per_token_per_layer": m.replicated_bytes_per_token,
            "input_bytes_per_token": m.input_bytes_per_token}
