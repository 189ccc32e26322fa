"""A tiny transformer world model: the part chapters 04-09 split across ranks.

Frames and actions become tokens; a stack of pre-LayerNorm blocks (causal
self-attention, then an MLP) reads the context; a head predicts the next
frame's features from every token. Small enough to train in milliseconds on
one core, shaped like the real thing, so that tensor parallelism can split a
block's matmuls, pipeline parallelism can give each rank consecutive blocks,
and context parallelism can split the tokens. No dropout: every run is
deterministic. Shapes: B (batch), T (tokens / time steps), O (frame
features), A (action features), H (width), N_h (heads), D (head width).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from wmdist.costs.validate import require_fields, require_heads
from wmdist.models import seeded


@dataclass(frozen=True, kw_only=True)
class TransformerConfig:
    """Sizes of the tiny transformer world model (defaults: 4 blocks of width 32, 4 heads)."""
    width: int = 32          # H
    heads: int = 4           # N_h; D = H / N_h
    mlp_ratio: int = 4       # the MLP's hidden width is mlp_ratio * H
    layers: int = 4          # transformer blocks
    obs_dim: int = 16        # O
    action_dim: int = 4      # A
    max_len: int = 64        # longest sequence (learned positions)

    def __post_init__(self) -> None:
        require_fields(self, ("width", "heads", "mlp_ratio", "layers", "obs_dim", "action_dim", "max_len"), 1)
        require_heads(self.width, self.heads)

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    @property
    def hidden(self) -> int:
        return self.mlp_ratio * self.width


class MLP(nn.Module):
    """The block's feed-forward part: H -> mlp_ratio*H (GELU) -> H."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.width, cfg.hidden)
        self.fc2 = nn.Linear(cfg.hidden, cfg.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:        # (B, T, H) -> (B, T, H)
        return self.fc2(F.gelu(self.fc1(x)))


class SelfAttention(nn.Module):
    """Causal multi-head self-attention: one fused QKV projection, one output projection."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width)
        self.out = nn.Linear(cfg.width, cfg.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:        # (B, T, H) -> (B, T, H)
        B, T, H = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, H // self.heads).permute(2, 0, 3, 1, 4)  # (B, N_h, T, D)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)                             # (B, N_h, T, D)
        return self.out(y.transpose(1, 2).reshape(B, T, H))


class Block(nn.Module):
    """x + attn(LN(x)), then + mlp(LN(.)): a pre-LayerNorm transformer block."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.width)
        self.attn = SelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.width)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:        # (B, T, H) -> (B, T, H)
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TransformerWorldModel(nn.Module):
    """Embed (frame, action) tokens, run the blocks, predict each next frame."""

    def __init__(self, cfg: TransformerConfig | None = None):
        super().__init__()
        self.cfg = cfg = cfg or TransformerConfig()
        self.embed = nn.Linear(cfg.obs_dim + cfg.action_dim, cfg.width)
        self.pos = nn.Parameter(0.02 * torch.randn(cfg.max_len, cfg.width))
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.width)
        self.head = nn.Linear(cfg.width, cfg.obs_dim)

    def embed_tokens(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """obs (B, T, O), actions (B, T, A) -> tokens (B, T, H)."""
        T = obs.shape[1]
        if T > self.cfg.max_len:
            raise ValueError(f"sequence of {T} tokens is longer than max_len {self.cfg.max_len}")
        return self.embed(torch.cat([obs, actions], dim=-1)) + self.pos[:T]

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Final LayerNorm and head: (B, T, H) -> predicted next frames (B, T, O)."""
        return self.head(self.ln_f(x))

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:   # -> (B, T, O)
        x = self.embed_tokens(obs, actions)
        for block in self.blocks:
            x = block(x)
        return self.predict(x)

    def per_example_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Mean squared next-frame error per sequence: (B,)."""
        return (self(batch["obs"], batch["actions"]) - batch["next_obs"]).pow(2).mean(dim=(1, 2))

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.per_example_loss(batch).mean()


def make_transformer(*, seed: int = 0, cfg: TransformerConfig | None = None) -> TransformerWorldModel:
    """A TransformerWorldModel whose initial weights depend only on `seed` (the same on every rank)."""
    return seeded(lambda: TransformerWorldModel(cfg), seed)
