"""The transformer shapes of published training runs, and their parameter counts from the shape (pure).

One `Architecture` per published model: layers, width, FFN width, query and
key/value heads, vocabulary, and for a mixture of experts the expert count,
top-k, expert FFN width, shared experts and leading dense layers. The planner
reads its FLOPs and memory from these; the tests hold each computed parameter
count to the size in the model's name, which catches a mistyped width or depth.

`param_count` counts weight matrices and what each layer adds beside them:
attention (query and output h x h, key and value h x kv_heads*head_dim), the MLP
(two matrices, or three when gated, as SwiGLU is), norms (LayerNorm has a scale
and a bias, RMSNorm a scale), biases where the model has them, the token
embedding (twice when the output projection is not tied to it), learned
positions, and a router per MoE layer. Rotary or ALiBi positions have no weights.
"""
from __future__ import annotations

from dataclasses import dataclass

from wmdist.costs.validate import require_fields, require_heads


@dataclass(frozen=True, kw_only=True)
class Architecture:
    """A decoder-only transformer as its paper gives it; MoE fields stay 0 for a dense model."""
    name: str
    layers: int
    hidden: int
    ffn: int                         # the dense MLP's inner width (4h for GPT; 3.5h-ish with SwiGLU)
    heads: int
    kv_heads: int                    # == heads without grouped-query attention
    vocab: int
    seq_len: int                     # the context it was trained at (a run may use another)
    gated_mlp: bool = False          # SwiGLU/GeGLU: three h x ffn matrices instead of two
    biases: bool = True              # GPT-2/3 style linears and LayerNorms with bias
    tied_embeddings: bool = True     # output projection shares the token embedding
    learned_positions: int = 0       # rows of a learned position table (0: rotary or ALiBi)
    embedding_norm: bool = False     # BLOOM's LayerNorm after the embedding
    experts: int = 0                 # routed experts per MoE layer
    top_k: int = 0
    expert_ffn: int = 0
    shared_experts: int = 0          # always-active experts of width shared_ffn
    shared_ffn: int = 0
    dense_layers: int = 0            # leading layers with the dense MLP (MoE models)
    nominal: str                     # the size its name or paper prints: "175B", "1.7B", "141B"
    nominal_active: str | None = None  # MoE: the parameters one token uses, as published ("12.9B")
    source: str                      # where the shape is published

    def __post_init__(self) -> None:
        require_fields(self, ("layers", "hidden", "ffn", "heads", "kv_heads", "vocab", "seq_len"), 1)
        require_heads(self.hidden, self.heads)
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads {self.kv_heads} must divide heads {self.heads}")
        if self.experts and not (0 < self.top_k <= self.experts and self.expert_ffn > 0):
            raise ValueError(f"{self.name}: an MoE needs 0 < top_k <= experts and expert_ffn > 0")

    @property
    def moe(self) -> bool:
        return self.experts > 0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def _mlp(h: int, width: int, *, gated: bool, biases: bool) -> int:
    return (3 if gated else 2) * h * width + ((width + h) if biases and not gated else 0)


def _attention(m: Architecture) -> int:
    h, kv = m.hidden, m.kv_heads * m.head_dim
    return 2 * h * h + 2 * h * kv + ((2 * h + 2 * kv) if m.biases else 0)


def _norm(m: Architecture) -> int:
    return 2 * m.hidden if m.biases else m.hidden


def layer_params(m: Architecture, *, moe_layer: bool, active: bool = False) -> int:
    """One block: attention, two norms, and a dense MLP, or (moe_layer) the experts a token can reach or
    (active) the top-k it does reach, the shared experts and the router."""
    def mlp(width: int) -> int:
        return _mlp(m.hidden, width, gated=m.gated_mlp, biases=m.biases)
    if moe_layer:
        routed = m.top_k if active else m.experts
        ffn = routed * mlp(m.expert_ffn) + m.shared_experts * mlp(m.shared_ffn) + m.hidden * m.experts
    else:
        ffn = mlp(m.ffn)
    return _attention(m) + 2 * _norm(m) + ffn


def param_count(m: Architecture, *, active: bool = False) -> int:
    """Every weight of the model (active=True: those one token uses, top_k experts per MoE layer)."""
    moe_layers = m.layers - m.dense_layers if m.moe else 0
    blocks = (m.layers - moe_layers) * layer_params(m, moe_layer=False) \
        + moe_layers * layer_params(m, moe_layer=True, active=active)
    embeddings = m.vocab * m.hidden * (1 if m.tied_embeddings else 2) + m.learned_positions * m.hidden
    return blocks + embeddings + _norm(m) * (2 if m.embedding_norm else 1)


def printed_size(text: str) -> float:
    """A size as papers print it, as a number: "1.7B" is 1.7e9, "1T" 1e12, "176,247M" 1.76247e11."""
    scale = {"M": 1e6, "B": 1e9, "T": 1e12}[text[-1]]
    return float(text[:-1].replace(",", "")) * scale


def nominal_params(m: Architecture) -> float:
    """The size the model's name or paper prints, as a number."""
    return printed_size(m.nominal)


def _gpt(name: str, layers: int, hidden: int, heads: int, vocab: int, seq: int, nominal: str, source: str,
         *, tied: bool = True, positions: int | None = None) -> Architecture:
    """A GPT-2/3-style block: 4h GELU MLP, biases, LayerNorm, learned positions (the sequence length)."""
    return Architecture(name=name, layers=layers, hidden=hidden, ffn=4 * hidden, heads=heads, kv_heads=heads,
                        vocab=vocab, seq_len=seq, tied_embeddings=tied,
                        learned_positions=seq if positions is None else positions, nominal=nominal, source=source)


NARAYANAN = "Narayanan et al. 2021 (arXiv 2104.04473), Table 1 (vocabulary 51,200, sequence 2048; section 5.1)"
KORTHIKANTI = "Korthikanti et al. 2022 (arXiv 2205.05198), Table 3"
MCORE = "NVIDIA Megatron-LM README, 'Performance Benchmarking' model table (images/model_table.png, 2024-07-15)"

PRESETS: dict[str, Architecture] = {m.name: m for m in (
    *(_gpt(name, layers, hidden, heads, 51200, 2048, size, NARAYANAN)
      for name, size, hidden, layers, heads in (
          ("megatron-1.7b", "1.7B", 2304, 24, 24), ("megatron-3.6b", "3.6B", 3072, 30, 32),
          ("megatron-7.5b", "7.5B", 4096, 36, 32), ("megatron-18.4b", "18.4B", 6144, 40, 48),
          ("megatron-39.1b", "39.1B", 8192, 48, 64), ("megatron-76.1b", "76.1B", 10240, 60, 80),
          ("megatron-145.6b", "145.6B", 12288, 80, 96), ("megatron-310.1b", "310.1B", 16384, 96, 128),
          ("megatron-530b", "529.6B", 20480, 105, 128), ("megatron-1t", "1008.0B", 25600, 128, 160))),
    _gpt("gpt-22b", 48, 6144, 64, 51200, 2048, "22B", KORTHIKANTI),
    _gpt("gpt3-175b", 96, 12288, 96, 51200, 2048, "175B",
         "Brown et al. 2020 (arXiv 2005.14165) Table 2.1, with Megatron's vocabulary of 51,200; Narayanan et al. "
         "2021 Table 2 prints it as 174.6B"),
    _gpt("mt-nlg-530b", 105, 20480, 128, 50257, 2048, "530B",
         "Smith et al. 2022 (arXiv 2201.11990), section 3.1 (GPT-2 BPE vocabulary)"),
    _gpt("opt-175b", 96, 12288, 96, 50272, 2048, "175B",
         "Zhang et al. 2022 (arXiv 2205.01068), Table 1; vocabulary of the released tokenizer"),
    Architecture(name="bloom-176b", layers=70, hidden=14336, ffn=4 * 14336, heads=112, kv_heads=112, vocab=250880,
                 seq_len=2048, embedding_norm=True, nominal="176,247M",
                 source="BigScience 2022, BLOOM (arXiv 2211.05100), its hyperparameter table (176,247M "
                        "parameters); ALiBi positions, embedding LayerNorm, vocabulary 250,680 padded to 250,880 "
                        "(--pad-vocab-size-to in the training script)"),
    Architecture(name="llama3-405b", layers=126, hidden=16384, ffn=53248, heads=128, kv_heads=8, vocab=128256,
                 seq_len=8192, gated_mlp=True, biases=False, tied_embeddings=False, nominal="405B",
                 source="Dubey et al. 2024 (arXiv 2407.21783), Table 3; vocabulary 128K (128,256 in the release)"),
    *(Architecture(name=f"mcore-{size.lower()}", layers=layers, hidden=hidden, ffn=4 * hidden, heads=heads,
                   kv_heads=heads, vocab=131072, seq_len=4096, tied_embeddings=False, nominal=size, source=MCORE)
      for size, heads, hidden, layers in (("1.7B", 16, 2048, 24), ("7.1B", 32, 4096, 30), ("16B", 48, 6144, 32),
                                          ("32B", 56, 7168, 48), ("70B", 64, 8192, 84), ("119B", 80, 10240, 92),
                                          ("177B", 96, 12288, 96), ("314B", 128, 16384, 96),
                                          ("462B", 144, 18432, 112))),
    Architecture(name="mixtral-8x7b", layers=32, hidden=4096, ffn=14336, heads=32, kv_heads=8, vocab=32000,
                 seq_len=32768, gated_mlp=True, biases=False, tied_embeddings=False, experts=8, top_k=2,
                 expert_ffn=14336, nominal="46.7B", nominal_active="12.9B",
                 source="Jiang et al. 2024, Mixtral of Experts (arXiv 2401.04088), Table 1; 46.7B total "
                        "parameters, 12.9B active, from Mistral AI's release"),
    Architecture(name="mixtral-8x22b", layers=56, hidden=6144, ffn=16384, heads=48, kv_heads=8, vocab=32768,
                 seq_len=4096, gated_mlp=True, biases=False, tied_embeddings=False, experts=8, top_k=2,
                 expert_ffn=16384, nominal="141B", nominal_active="39B",
                 source="Mistral AI 2024, Mixtral 8x22B release: 141B parameters, 39B active; shape from its "
                        "config.json (56 layers, 6144, 16384, 48/8 heads, vocabulary 32768, 8 experts, top-2)"),
)}
