"""A tiny, seeded denoiser over the spatial-temporal tokens of a video latent.

The latent of a clip is T frames of Hs x Ws tokens with C channels, flattened
frame by frame, row by row: token n = (f * Hs + i) * Ws + j, so x is (B, S, C)
with S = T * Hs * Ws. One block turns x and the noise level t into a velocity
of the same shape:

    h   = W_in x + pos(token) + time(t)          token-wise
    h  += W_o attention(LN h)                    every token attends to ALL S tokens
    h  += MLP(LN h)                              token-wise
    out = W_out LN h                             token-wise

Which tokens' data a token's output needs decides the communication when the
tokens are sharded over ranks: everything is token-wise except attention,
whose output for token n reads the keys and values of every token. So a rank
holding tokens [start, stop) computes its queries from its own tokens, but
needs all S keys and values: one all-gather of K and V (2 * D numbers per
token), or of x (C numbers per token, then K and V recomputed locally), per
attention layer per solver step. The split is exposed as `project_kv` (a
shard's K and V) and `denoise_shard` (a shard's output given all K and V);
`denoise` is the same computation on all tokens at once.

The weights are random (seeded), not trained: the output is no video, but the
dependency structure and the arithmetic are those of a real sampler.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from wmdist.costs.rounding import reordered_sum_bound
from wmdist.costs.validate import require_fields, require_int, require_real


@dataclass(frozen=True, kw_only=True)
class DenoiserConfig:
    """Sizes of the tiny denoiser; defaults: 4 frames of 4 x 4 latent tokens, 8 channels."""
    frames: int = 4      # T: latent frames of the clip
    height: int = 4      # Hs: latent token rows per frame
    width: int = 4       # Ws: latent token columns per frame
    channels: int = 8    # C: latent channels per token (what the sampler moves)
    dim: int = 16        # D: hidden width of a token inside the block
    heads: int = 2       # attention heads; D must be a multiple of 2 * heads
    hidden: int = 32     # width of the token-wise MLP
    seed: int = 0        # the weights depend only on this

    def __post_init__(self) -> None:
        require_fields(self, ("frames", "height", "width", "channels", "heads", "hidden"), 1)
        require_int("seed", self.seed, 0)
        dim = require_int("dim", self.dim, 2)
        if dim % (2 * self.heads):
            raise ValueError(f"dim must be a multiple of 2 * heads = {2 * self.heads} "
                             f"(even head width for the time features), got {dim}")

    @property
    def tokens(self) -> int:
        """S = T * Hs * Ws: spatial-temporal tokens per sample."""
        return self.frames * self.height * self.width

    @property
    def head_dim(self) -> int:
        """Width of one attention head, D / heads."""
        return self.dim // self.heads


class Denoiser(nn.Module):
    """Velocity v(x, t) of a video latent: token-wise layers around one multi-head self-attention.

    Call `denoise(x, t)` (or the module) on all tokens, or split the work by
    tokens: `project_kv` on each shard, gather, then `denoise_shard` per shard.
    t is the noise level in [0, 1]: a float for the whole batch or a (B,) tensor.
    """

    def __init__(self, cfg: DenoiserConfig | None = None):
        super().__init__()
        self.cfg = cfg = cfg or DenoiserConfig()
        g = torch.Generator().manual_seed(cfg.seed)
        D, C, M = cfg.dim, cfg.channels, cfg.hidden

        def weight(rows: int, cols: int) -> nn.Parameter:   # Gaussian, scaled by 1/sqrt(fan-in)
            return nn.Parameter(torch.randn(rows, cols, generator=g) / math.sqrt(cols))

        self.w_in, self.b_in = weight(D, C), nn.Parameter(0.1 * torch.randn(D, generator=g))
        self.frame_pos = weight(cfg.frames, D)           # position = frame + row + column embeddings
        self.row_pos = weight(cfg.height, D)
        self.col_pos = weight(cfg.width, D)
        self.w_time = weight(D, D)
        self.w_q, self.w_k, self.w_v, self.w_o = (weight(D, D) for _ in range(4))
        self.w_1, self.b_1 = weight(M, D), nn.Parameter(0.1 * torch.randn(M, generator=g))
        self.w_2 = weight(D, M)
        self.w_out = weight(C, D)
        # Geometric frequencies from 1 to 100 for the sinusoidal features of t (fixed, not learned).
        self.register_buffer("freqs", torch.exp(torch.linspace(0.0, math.log(100.0), D // 2)), persistent=False)
        self.requires_grad_(False)                       # sampling only: no autograd graph is ever needed

    # --- token-wise pieces ---------------------------------------------------------

    def _positions(self, start: int, count: int) -> torch.Tensor:          # -> (count, D)
        """Embeddings of tokens start .. start+count-1: frame, row and column embeddings summed."""
        n = torch.arange(start, start + count)
        cfg = self.cfg
        frame, rest = n // (cfg.height * cfg.width), n % (cfg.height * cfg.width)
        return self.frame_pos[frame] + self.row_pos[rest // cfg.width] + self.col_pos[rest % cfg.width]

    def _time(self, t: float | torch.Tensor, batch: int) -> torch.Tensor:   # -> (B, D)
        """Embedding of the noise level: sinusoidal features of t, one linear map, tanh."""
        if isinstance(t, torch.Tensor):
            if t.shape not in ((), (batch,)):
                raise ValueError(f"t must be a float, a 0-d tensor or a ({batch},) tensor, got shape {tuple(t.shape)}")
            tt = t.to(self.freqs.dtype).expand(batch)
        else:
            tt = torch.full((batch,), require_real("t", t, low=0.0, high=1.0))
        angles = tt[:, None] * self.freqs                                   # (B, D/2)
        features = torch.cat([angles.sin(), angles.cos()], dim=-1)          # (B, D)
        # One sample at a time: a product's summation order may depend on its row count,
        # and sample b's result should not depend on how many samples share its batch.
        return torch.cat([torch.tanh(F.linear(row, self.w_time)) for row in features.split(1)])

    def _embed(self, x: torch.Tensor, t: float | torch.Tensor, start: int) -> torch.Tensor:  # (B, s, C) -> (B, s, D)
        """Token-wise input layer: channels -> width, plus position and time embeddings."""
        B, s, _ = x.shape
        return F.linear(x, self.w_in, self.b_in) + self._positions(start, s) + self._time(t, B)[:, None]

    def _split_heads(self, y: torch.Tensor) -> torch.Tensor:               # (B, s, D) -> (B, H, s, D/H)
        B, s, _ = y.shape
        return y.view(B, s, self.cfg.heads, self.cfg.head_dim).transpose(1, 2)

    def _check_shard(self, x: torch.Tensor, start: int) -> int:
        """Validate a shard of tokens [start, start + s) of a (B, s, C) latent; return s."""
        cfg = self.cfg
        if x.dim() != 3 or x.shape[0] < 1 or x.shape[2] != cfg.channels:
            raise ValueError(f"x must be (B, tokens, {cfg.channels}) with B >= 1, got shape {tuple(x.shape)}")
        require_int("start", start, 0, high=cfg.tokens)
        if start + x.shape[1] > cfg.tokens:
            raise ValueError(f"tokens [{start}, {start + x.shape[1]}) run past the {cfg.tokens} tokens "
                             f"of a {cfg.frames}x{cfg.height}x{cfg.width} latent")
        return x.shape[1]

    # --- the split computation -----------------------------------------------------

    def project_kv(self, x: torch.Tensor, t: float | torch.Tensor, *,
                   start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of tokens [start, start + s): (B, H, s, D/H) each.

        Token-wise, so the K and V of a shard are exactly the shard's rows of
        the K and V of all tokens; concatenating every rank's along dim 2
        (an all-gather) gives what `denoise_shard` needs.
        """
        self._check_shard(x, start)
        a = F.layer_norm(self._embed(x, t, start), (self.cfg.dim,))          # (B, s, D)
        return self._split_heads(F.linear(a, self.w_k)), self._split_heads(F.linear(a, self.w_v))

    def denoise_shard(self, x: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor],
                      t: float | torch.Tensor, *, start: int = 0) -> torch.Tensor:
        """Output for tokens [start, start + s) of x, given the K and V of ALL tokens: (B, s, C).

        Queries, the residual path, the MLP and the output layer use only the
        shard's own tokens; `kv` = (K, V) of all S tokens, (B, H, S, D/H) each.
        """
        cfg = self.cfg
        s = self._check_shard(x, start)
        k, v = kv
        want = (x.shape[0], cfg.heads, cfg.tokens, cfg.head_dim)
        if tuple(k.shape) != want or tuple(v.shape) != want:
            raise ValueError(f"kv must be the keys and values of all {cfg.tokens} tokens, {want} each, "
                             f"got {tuple(k.shape)} and {tuple(v.shape)}")
        h = self._embed(x, t, start)                                          # (B, s, D)
        q = self._split_heads(F.linear(F.layer_norm(h, (cfg.dim,)), self.w_q))  # (B, H, s, D/H)
        scores = q @ k.transpose(-2, -1) / math.sqrt(cfg.head_dim)            # (B, H, s, S)
        mixed = scores.softmax(dim=-1) @ v                                    # (B, H, s, D/H)
        h = h + F.linear(mixed.transpose(1, 2).reshape(x.shape[0], s, cfg.dim), self.w_o)
        h = h + F.linear(F.gelu(F.linear(F.layer_norm(h, (cfg.dim,)), self.w_1, self.b_1)), self.w_2)
        return F.linear(F.layer_norm(h, (cfg.dim,)), self.w_out)              # (B, s, C)

    def denoise(self, x: torch.Tensor, t: float | torch.Tensor) -> torch.Tensor:
        """Velocity for every token of x (B, S, C) at noise level t: (B, S, C)."""
        if x.dim() == 3 and x.shape[1] != self.cfg.tokens:
            raise ValueError(f"x must hold all {self.cfg.tokens} tokens "
                             f"({self.cfg.frames}x{self.cfg.height}x{self.cfg.width}), got {x.shape[1]}")
        return self.denoise_shard(x, self.project_kv(x, t), t)

    def forward(self, x: torch.Tensor, t: float | torch.Tensor) -> torch.Tensor:
        """Same as `denoise`, so the model can be passed wherever a velocity function is expected."""
        return self.denoise(x, t)


def shard_tokens(x: torch.Tensor, world_size: int) -> list[tuple[int, torch.Tensor]]:
    """(start, tokens) of each rank's shard of x (B, S, C): contiguous, torch.tensor_split's layout.

    The same layout as `wmdist.costs.diffusion.token_shard_bounds`, so the
    bytes the cost formulas count are the bytes these shards move.
    """
    require_int("world_size", world_size, 1)
    out, start = [], 0
    for shard in torch.tensor_split(x, world_size, dim=1):               # N views of (B, ~S/N, C)
        out.append((start, shard))
        start += shard.shape[1]
    return out


def denoise_by_shards(model: Denoiser, x: torch.Tensor, t: float | torch.Tensor, world_size: int) -> torch.Tensor:
    """What N token-sharded ranks compute together, in one process: (B, S, C).

    Every shard projects its own K and V; the concatenation along the token
    dim is what an all-gather delivers to each rank; each shard's output then
    needs only its own tokens and that K, V.
    """
    shards = shard_tokens(x, world_size)
    keys, values = zip(*(model.project_kv(piece, t, start=start) for start, piece in shards))
    kv = (torch.cat(keys, dim=2), torch.cat(values, dim=2))              # (B, H, S, D/H) each: the all-gather
    return torch.cat([model.denoise_shard(piece, kv, t, start=start) for start, piece in shards], dim=1)


def shard_tolerance(cfg: DenoiserConfig, output: torch.Tensor) -> float:
    """A first-order allowance for max |pieces - whole| in one evaluation with output `output`, split by tokens
    or by samples (an allowance, not a proven bound: see the two assumptions at the end).

    Sharding the tokens (`denoise_by_shards`) or slicing the batch changes
    no operation: every layer is token-wise except attention, which sees all
    S keys and values either way, layer norm and softmax work on rows of the
    same length, and samples never mix. One thing may change: a BLAS kernel
    picks its accumulation order by the shape of a matrix product, and a
    piece gives products fewer rows (with this project's torch, products of
    1-3 rows sum in another order, 4 or more match the whole bitwise; the
    time embedding is computed one sample at a time for that reason). A
    float32 dot product of n terms summed in another order moves by at most
    2(n-1)u times its partial sums (`reordered_sum_bound`). Eight products
    lie in series on a token's path (input, query/key, scores, values,
    attention output, two MLP layers, output); the longest has
    n = max(S, D, hidden, C) terms. Taking each later layer's gain as at most
    one (layer norms keep activations at unit scale, weights are scaled by
    1/sqrt(fan-in)) and partial sums at most max(1, max|output|) gives the
    allowance. Both are assumptions about this model, not theorems: a layer
    with gain above one, or cancellation inside a sum, could exceed it.
    """
    n = max(cfg.tokens, cfg.dim, cfg.hidden, cfg.channels)
    return 8 * reordered_sum_bound(n, max(1.0, float(output.abs().max())))
