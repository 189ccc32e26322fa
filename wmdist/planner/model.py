"""The planner's inputs: a transformer (dense or mixture-of-experts), a cluster, and the job (pure).

Every value is checked once, here, at the boundary: a bad one raises ValueError naming the field
and what is allowed, so nothing downstream (layouts, breakdowns, the CLI) checks again.

Parameter counts, the shapes the published runs describe (Llama, GPT-3, DeepSeek-V3 style):
per layer, attention 2h(a d) + 2h(g d) (Q and output projection, K and V with g key-value heads
of width d = h / a); a dense MLP m h F, m = 3 for a gated (SwiGLU) MLP and 2 for a GELU one;
in an MoE layer E routed and S shared experts of m h F_e each and a router of h E; two norms of
h. Then the embedding V h, the output head V h (unless tied) and a final norm h. Biases are not
counted (the gated models have none; for GPT-3 they are 0.01 % of the weights).
"""
from __future__ import annotations

from dataclasses import dataclass

from wmdist.costs.mesh import Link
from wmdist.costs.validate import require_bool, require_fields, require_int, require_positive, require_real
from wmdist.planner.presets import Architecture


@dataclass(frozen=True, kw_only=True)
class TransformerSpec:
    """A decoder-only transformer: the sizes its FLOPs, bytes and memory follow from.

    MoE: experts > 0 makes every layer after the first `dense_layers` a mixture of `experts` routed
    experts of width `expert_ffn` (each token to `top_k`) plus `shared_experts` always-on ones of `shared_ffn`.
    `from_architecture` builds one from a published shape (presets.Architecture).
    """
    name: str
    layers: int                # L
    hidden: int                # h
    ffn: int                   # F, the dense MLP's hidden width
    heads: int                 # a
    kv_heads: int              # g (grouped-query attention; = heads for multi-head)
    vocab: int                 # V
    gated: bool = True         # SwiGLU (three MLP matrices) or a two-matrix GELU MLP
    tied_embeddings: bool = False
    dropout: bool = False      # GPT-3-era blocks keep two 1-byte dropout masks per token
    experts: int = 0           # E routed experts per MoE layer (0: dense model)
    top_k: int = 0             # k experts per token
    expert_ffn: int = 0        # F_e
    shared_experts: int = 0    # S, always used
    shared_ffn: int = 0        # their width (0: expert_ffn)
    dense_layers: int = 0      # the first layers keep a dense MLP (DeepSeek-V3: 3)

    def __post_init__(self) -> None:
        require_fields(self, ("layers", "hidden", "ffn", "heads", "kv_heads", "vocab"), 1)
        require_fields(self, ("experts", "top_k", "expert_ffn", "shared_experts", "shared_ffn", "dense_layers"), 0)
        for flag in ("gated", "tied_embeddings", "dropout"):
            require_bool(flag, getattr(self, flag))
        if self.hidden % self.heads:
            raise ValueError(f"hidden must be divisible by heads: hidden={self.hidden}, heads={self.heads}")
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads must divide heads: heads={self.heads}, kv_heads={self.kv_heads}")
        if self.experts:
            require_int("top_k", self.top_k, 1, high=self.experts)
            require_int("expert_ffn", self.expert_ffn, 1)
            require_int("dense_layers", self.dense_layers, 0, high=self.layers - 1)
        elif self.top_k or self.expert_ffn or self.shared_experts or self.dense_layers:
            raise ValueError("top_k, expert_ffn, shared_experts and dense_layers need experts > 0 (an MoE model), "
                             f"got experts=0 with top_k={self.top_k}, expert_ffn={self.expert_ffn}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.experts else 0

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.gated else 2

    @property
    def attention_params(self) -> int:
        """Q, K, V and output projections of one layer: 2 h^2 + 2 h g d."""
        return 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_heads * self.head_dim

    @property
    def dense_mlp_params(self) -> int:
        return self.mlp_matrices * self.hidden * self.ffn

    @property
    def expert_params(self) -> int:
        """One expert's weights: m h F_e."""
        return self.mlp_matrices * self.hidden * self.expert_ffn

    @property
    def shared_params(self) -> int:
        """The shared experts of one MoE layer: S m h F_s."""
        return self.shared_experts * self.mlp_matrices * self.hidden * (self.shared_ffn or self.expert_ffn)

    @property
    def embedding_params(self) -> int:
        """Input embedding plus output head (V h each, once if tied)."""
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    @property
    def params(self) -> int:
        """Every weight: layers, embedding, head, norms."""
        moe = self.moe_layers * (self.experts * self.expert_params + self.shared_params + self.hidden * self.experts)
        dense = (self.layers - self.moe_layers) * self.dense_mlp_params
        return self.layers * (self.attention_params + 2 * self.hidden) + dense + moe + self.embedding_params \
            + self.hidden

    @property
    def routed_expert_params(self) -> int:
        """The weights expert parallelism spreads: every routed expert of every MoE layer."""
        return self.moe_layers * self.experts * self.expert_params

    @property
    def active_matmul_params(self) -> int:
        """Weights one token multiplies with (the 6N of the FLOP count): attention, its MLP or its k + S experts
        and the router, the output head; not the embedding lookup or the norms."""
        moe = self.moe_layers * (self.top_k * self.expert_params + self.shared_params + self.hidden * self.experts)
        dense = (self.layers - self.moe_layers) * self.dense_mlp_params
        return self.layers * self.attention_params + dense + moe + self.vocab * self.hidden


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """GPUs and links: per GPU peak dense bf16 FLOP/s, HBM bytes and bandwidth; nodes of `gpus_per_node` on a
    fast link; bandwidth per GPU between nodes (one direction); a latency per tier; and the one compute
    efficiency of this GPU type (achieved / peak FLOP/s of the model's matmuls), stated where it is built."""
    name: str
    peak_flops: float
    hbm_bytes: int
    hbm_bytes_per_s: float
    gpus_per_node: int
    intra_bytes_per_s: float
    inter_bytes_per_s: float
    intra_latency_s: float
    inter_latency_s: float
    efficiency: float
    comm_sm_share: float = 0.0    # share of the SMs an overlapped collective takes from the matmuls beside it

    def __post_init__(self) -> None:
        if not 0 <= require_real("comm_sm_share", self.comm_sm_share) < 1:
            raise ValueError(f"comm_sm_share must be in [0, 1), got {self.comm_sm_share!r}")
        for name in ("peak_flops", "hbm_bytes_per_s", "intra_bytes_per_s", "inter_bytes_per_s"):
            require_positive(name, getattr(self, name))
        require_int("hbm_bytes", self.hbm_bytes, 1)
        require_int("gpus_per_node", self.gpus_per_node, 1)
        require_real("intra_latency_s", self.intra_latency_s)
        require_real("inter_latency_s", self.inter_latency_s)
        if not 0 < require_real("efficiency", self.efficiency, high=1.0):
            raise ValueError(f"efficiency must be in (0, 1], got {self.efficiency!r}")

    @property
    def fast(self) -> Link:
        """The in-node link (NVLink): what an axis whose groups fit in a node uses."""
        return Link(self.intra_latency_s, self.intra_bytes_per_s)

    @property
    def slow(self) -> Link:
        """The network between nodes, per GPU."""
        return Link(self.inter_latency_s, self.inter_bytes_per_s)


@dataclass(frozen=True, kw_only=True)
class TrainingJob:
    """One step to plan: the model on `gpus` GPUs of the cluster, `batch_tokens` tokens of `seq_len` per step.

    flash_attention: whether attention keeps no s x s scores for backward (FlashAttention, 2022 on); without
    it, the scores stay unless recompute is selective or full. elem_bytes: activations and the tensors the
    axes send (2: bf16).
    """
    model: TransformerSpec
    cluster: ClusterSpec
    gpus: int
    seq_len: int
    batch_tokens: int
    flash_attention: bool = True
    elem_bytes: int = 2

    def __post_init__(self) -> None:
        if not isinstance(self.model, TransformerSpec) or not isinstance(self.cluster, ClusterSpec):
            raise ValueError("model must be a TransformerSpec and cluster a ClusterSpec, got "
                             f"{type(self.model).__name__} and {type(self.cluster).__name__}")
        require_fields(self, ("gpus", "seq_len", "batch_tokens", "elem_bytes"), 1)
        require_bool("flash_attention", self.flash_attention)
        if self.batch_tokens % self.seq_len:
            raise ValueError(f"batch_tokens must be a whole number of sequences of seq_len={self.seq_len}, "
                             f"got {self.batch_tokens}")

    @property
    def sequences(self) -> int:
        """Sequences per step, all GPUs together."""
        return self.batch_tokens // self.seq_len


def from_architecture(arch: Architecture) -> TransformerSpec:
    """The planner's model of a published shape. Dropout (two 1-byte masks per token and layer) is assumed
    where the block has biases (the GPT-2/3 family trained with it), not in the bias-free gated models."""
    return TransformerSpec(name=arch.name, layers=arch.layers, hidden=arch.hidden, ffn=arch.ffn, heads=arch.heads,
                           kv_heads=arch.kv_heads, vocab=arch.vocab, gated=arch.gated_mlp,
                           tied_embeddings=arch.tied_embeddings, dropout=arch.biases, experts=arch.experts,
                           top_k=arch.top_k, expert_ffn=arch.expert_ffn, shared_experts=arch.shared_experts,
                           shared_ffn=arch.shared_ffn, dense_layers=arch.dense_layers)
