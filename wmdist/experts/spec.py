"""What a chapter-10 layer run needs decided before any process starts: sizes, routers, tokens, capacity.

`LayerSpec` refuses a world size that does not divide the experts (or the tokens) before anything
runs, and builds the routing cases once. A case's router is seeded, then optionally forced through
two input features every token carries: x[:, 0] = 1 (a constant) and x[:, 1] = +1 on rank 0's
tokens, -1 on the others'. Adding to the router's weights on those features forces uneven routing:

    random      the seeded router as it is;
    skewed      expert 0 favoured, each next one less, the last one never chosen (it gets no tokens);
    one expert  every token's first choice is the last expert;
    local       rank 0's tokens choose only rank 0's experts and nobody else's do: rank 0 sends and
                receives nothing.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

import torch

from wmdist.costs import experts as ecosts
from wmdist.costs.validate import require_choice, require_fields, require_int, require_real
from wmdist.course.experiment import RankSpec
from wmdist.experts.moe import MoEMLP
from wmdist.models import seeded

RouterName = Literal["random", "skewed", "one expert", "local"]
ROUTERS: tuple[str, ...] = get_args(RouterName)
FORCE = 12.0          # logit offsets that decide the forced routes (random logits are O(1))


@dataclass(frozen=True, kw_only=True)
class LayerCase:
    """One run of the layer: its router, k, and the capacity factor (None: dropless)."""
    router: RouterName
    k: int
    capacity_factor: float | None = None

    @property
    def name(self) -> str:
        cap = "" if self.capacity_factor is None else f", capacity {self.capacity_factor:g}"
        return f"{self.router}, k={self.k}{cap}"


@dataclass(frozen=True, kw_only=True)
class LayerSpec(RankSpec):
    """E experts of width d -> F -> d over T tokens (T/N per rank) on N = `world_size` ranks, each case in turn."""
    cases: tuple[LayerCase, ...]
    experts: int = 8
    width: int = 8
    hidden: int = 16
    tokens: int = 32
    seed: int = 0
    aux_weight: float = 0.1
    per_rank: int = field(init=False)          # E/N: the experts each rank holds
    capacities: tuple[int | None, ...] = field(init=False)      # per case: C, or None (dropless)

    def __post_init__(self) -> None:
        super().__post_init__()
        require_fields(self, ("experts", "width", "hidden", "tokens"), 1)
        require_int("seed", self.seed, 0)
        require_real("aux_weight", self.aux_weight)
        if self.width < 2:
            raise ValueError(f"width must be >= 2 (two features steer the forced routers), got {self.width}")
        object.__setattr__(self, "per_rank", ecosts.experts_per_rank(self.experts, self.world_size))
        if self.tokens % self.world_size:
            raise ValueError(f"tokens={self.tokens} must be divisible by the world size {self.world_size}")
        if not self.cases:
            raise ValueError("a LayerSpec needs at least one case")
        caps = []
        for case in self.cases:
            require_choice("router", case.router, ROUTERS)
            require_int("k", case.k, 1, high=self.experts)
            if case.router == "local" and case.k > self.per_rank:
                raise ValueError(f"the local router needs k <= E/N = {self.per_rank}, got k={case.k}")
            caps.append(None if case.capacity_factor is None
                        else ecosts.capacity(self.tokens, case.k, self.experts, case.capacity_factor))
        object.__setattr__(self, "capacities", tuple(caps))

    @property
    def tokens_per_rank(self) -> int:
        return self.tokens // self.world_size

    def layer(self, case: LayerCase) -> MoEMLP:
        """The layer every rank and the reference build: seeded weights, then the case's forced router."""
        moe = seeded(lambda: MoEMLP(width=self.width, hidden=self.hidden, experts=self.experts, k=case.k), self.seed)
        with torch.no_grad():
            w = moe.router.weight                                  # (E, d)
            if case.router == "skewed":
                w[:, 0] += torch.linspace(2.0, 0.0, self.experts)
                w[-1, 0] -= FORCE
            elif case.router == "one expert":
                w[-1, 0] += FORCE
            elif case.router == "local":
                w[:, 1] += torch.where(torch.arange(self.experts) < self.per_rank, FORCE, -FORCE)
        return moe

    def inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens x (T, d), x[:, 0] = 1 and x[:, 1] = +-1 (rank 0's tokens +1), and the output gradient (T, d)."""
        gen = torch.Generator().manual_seed(1000 + self.seed)
        x = torch.randn(self.tokens, self.width, generator=gen)
        x[:, 0] = 1.0
        x[:, 1] = torch.where(torch.arange(self.tokens) < self.tokens_per_rank, 1.0, -1.0)
        return x, torch.randn(self.tokens, self.width, generator=gen)

    def rows(self, rank: int) -> slice:
        """The tokens rank `rank` holds: the T/N after rank - 1's."""
        t = self.tokens_per_rank
        return slice(rank * t, (rank + 1) * t)


def layer_spec(world_size: int, *, routers: tuple[RouterName, ...] = ROUTERS, ks: tuple[int, ...] = (1, 2),
               capacity_factor: float | None = None, experts: int = 8, tokens: int = 32) -> LayerSpec:
    """Every (router, k) case at one capacity factor; the local router only where k <= E/N."""
    per = ecosts.experts_per_rank(experts, require_int("world_size", world_size, 1))
    cases = tuple(LayerCase(router=r, k=k, capacity_factor=capacity_factor) for r in routers for k in ks
                  if r != "local" or k <= per)
    return LayerSpec(world_size=world_size, cases=cases, experts=experts, tokens=tokens)
