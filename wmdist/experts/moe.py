"""A mixture-of-experts MLP on one process: the router, the dispatch permutation, the experts, the balancing loss.

The block's MLP becomes E experts (each a small MLP, d -> F -> d) and a router, a bias-free Linear
d -> E. For each token the router's softmax gives E probabilities; the token goes to its top k
experts, and its output is their outputs weighted by gates (k = 1: the probability itself, as in
Switch; k > 1: the k probabilities renormalised to sum to 1).

How the tokens reach their experts is a permutation. Flatten the T x k choices token by token into
T*k *assignments*; sort them by expert id, stably (`dispatch_order`): each expert's rows are now
one consecutive block, in token order, and since rank r holds experts [r E/N, (r+1) E/N) the blocks
are grouped by rank too. Each expert runs on its block; the inverse permutation puts every result
back beside its token, and the gates combine the k results of each token.

Capacity: an expert takes at most `cap` rows (costs.experts.capacity: ceil(c T k / E)), the first
ones in token order; the others are dropped: their output is zero, so the block's residual carries
the token on unchanged. The Switch-style balancing loss is E * sum_e f_e P_e, f_e the fraction of
assignments expert e got (a count, not differentiated) and P_e its mean router probability: 1 when
both are uniform, larger when the router favours some experts.

Shapes: T tokens, d width, E experts, k choices per token, A = T*k assignments.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from wmdist.models.transformer import SelfAttention, TransformerConfig
from wmdist.models import seeded


class ExpertMLP(nn.Module):
    """One expert: d -> F (GELU) -> d, the transformer block's MLP at a smaller size."""

    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:          # (rows, d) -> (rows, d)
        return self.fc2(F.gelu(self.fc1(x)))


class MoEMLP(nn.Module):
    """E experts and a top-k router. `experts` is keyed by the expert's global id, so a rank that keeps only
    its own (`keep_experts`) names their parameters as one process does ("experts.3.fc1.weight")."""

    def __init__(self, *, width: int, hidden: int, experts: int, k: int):
        super().__init__()
        if not 1 <= k <= experts:
            raise ValueError(f"k must be from 1 to experts={experts}, got {k}")
        self.num_experts, self.k = experts, k
        self.router = nn.Linear(width, experts, bias=False)
        self.experts = nn.ModuleDict({str(e): ExpertMLP(width, hidden) for e in range(experts)})

    def keep_experts(self, first: int, count: int) -> None:
        """Drop every expert but [first, first + count): what one rank of expert parallelism holds."""
        self.experts = nn.ModuleDict({str(e): self.experts[str(e)] for e in range(first, first + count)})


@dataclass(frozen=True)
class Routing:
    """The router's decision for T tokens."""
    probs: torch.Tensor      # (T, E) softmax of the router's logits
    experts: torch.Tensor    # (T, k) int64: the chosen experts, most probable first
    gates: torch.Tensor      # (T, k): the weights of their outputs


def route(router: nn.Linear, x: torch.Tensor, *, k: int) -> Routing:
    """Softmax over the router's logits, top k; gates = the probabilities (k = 1) or them renormalised (k > 1)."""
    probs = torch.softmax(router(x), dim=-1)                     # (T, E)
    top, ids = probs.topk(k, dim=-1)                             # (T, k) each, sorted high to low
    return Routing(probs, ids, top if k == 1 else top / top.sum(-1, keepdim=True))


def dispatch_order(expert_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The permutation that groups assignments by expert (token order kept within each), and its inverse.

    rows = x_rows[order] puts expert 0's rows first, then expert 1's, ...; grouped[inverse] undoes it:
    inverse[order[i]] = i.
    """
    order = torch.sort(expert_ids, stable=True).indices          # (A,)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel())
    return order, inverse


def run_experts(experts: nn.ModuleDict, first: int, rows: torch.Tensor, counts: list[int],
                cap: int | None) -> torch.Tensor:
    """Expert first + j on the j-th block of `counts[j]` rows; its first `cap` rows only, zeros for the rest."""
    outs = []
    for j, block in enumerate(torch.split(rows, counts)):
        kept = block if cap is None else block[:cap]
        y = experts[str(first + j)](kept)                        # (kept, d)
        outs += [y, y.new_zeros(block.shape[0] - kept.shape[0], y.shape[1])]
    return torch.cat(outs) if outs else rows.new_zeros(0, rows.shape[1])


def combine(gates: torch.Tensor, outs: torch.Tensor) -> torch.Tensor:
    """Each token's k expert outputs weighted by its gates: (T, k), (T, k, d) -> (T, d)."""
    return (gates.unsqueeze(-1) * outs).sum(1)


def balance_loss(probs: torch.Tensor, counts: torch.Tensor, *, tokens: int, k: int) -> torch.Tensor:
    """E * sum_e f_e P_e, f_e = counts_e / (T k), P_e = sum_t probs_te / T, over all T tokens of the batch.

    On one process `probs` holds all T rows; on a rank it holds its own rows (counts and T are the
    batch's), and the ranks' values add up to the batch's loss.
    """
    f = counts.to(probs.dtype) / (tokens * k)                    # (E,) not differentiated: counts are integers
    return probs.shape[-1] * (f * probs.sum(0)).sum() / tokens


@dataclass(frozen=True)
class MoEOut:
    """What the layer computed for T tokens."""
    y: torch.Tensor          # (T, d) gate-weighted expert outputs (no residual)
    routing: Routing
    counts: torch.Tensor     # (E,) int64: this process's assignments per expert


def moe_forward(moe: MoEMLP, x: torch.Tensor, *, cap: int | None = None) -> MoEOut:
    """The layer on one process: route, group the assignments by expert, run the experts, put back, combine."""
    T, k = x.shape[0], moe.k
    routing = route(moe.router, x, k=k)
    ids = routing.experts.reshape(-1)                            # (T k,) token by token
    order, inverse = dispatch_order(ids)
    counts = torch.bincount(ids, minlength=moe.num_experts)
    grouped = run_experts(moe.experts, 0, x[order // k], counts.tolist(), cap)     # (T k, d), by expert
    return MoEOut(combine(routing.gates, grouped[inverse].view(T, k, -1)), routing, counts)


Mix = Callable[[MoEMLP, torch.Tensor], MoEOut]      # how a model runs its MoE layer: one process or on ranks


@dataclass(frozen=True, kw_only=True)
class MoEConfig:
    """Sizes of the tiny MoE world model: one pre-LayerNorm block whose MLP is E experts."""
    width: int = 16          # d
    hidden: int = 32         # F, each expert's hidden width
    experts: int = 4         # E
    k: int = 2
    heads: int = 2
    obs_dim: int = 16        # O, as models.make_batch draws frames
    action_dim: int = 4      # A
    max_len: int = 16


class MoEWorldModel(nn.Module):
    """Embed (frame, action) tokens, x + attn(LN x), then x + MoE(LN x), predict each next frame."""

    def __init__(self, cfg: MoEConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Linear(cfg.obs_dim + cfg.action_dim, cfg.width)
        self.pos = nn.Parameter(0.02 * torch.randn(cfg.max_len, cfg.width))
        self.ln1, self.ln2, self.ln_f = (nn.LayerNorm(cfg.width) for _ in range(3))
        self.attn = SelfAttention(TransformerConfig(width=cfg.width, heads=cfg.heads))
        self.moe = MoEMLP(width=cfg.width, hidden=cfg.hidden, experts=cfg.experts, k=cfg.k)
        self.head = nn.Linear(cfg.width, cfg.obs_dim)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor, mix: Mix) -> tuple[torch.Tensor, MoEOut]:
        """obs (B, T, O), actions (B, T, A) -> predicted next frames (B, T, O), and what the MoE layer did."""
        B, T, _ = obs.shape
        x = self.embed(torch.cat([obs, actions], dim=-1)) + self.pos[:T]           # (B, T, d)
        x = x + self.attn(self.ln1(x))
        out = mix(self.moe, self.ln2(x).reshape(B * T, -1))                         # tokens (B T, d)
        x = x + out.y.view(B, T, -1)
        return self.head(self.ln_f(x)), out



def make_moe_model(cfg: MoEConfig, *, seed: int = 0) -> MoEWorldModel:
    """A MoEWorldModel whose initial weights depend only on `seed` (the same on every rank)."""
    return seeded(lambda: MoEWorldModel(cfg), seed)
