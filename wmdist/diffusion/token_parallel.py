"""The exact baseline on N ranks: solver steps in order, each step's tokens sharded, attention's inputs gathered.

Every rank holds a contiguous shard of the S spatial-temporal tokens (the
layout of `costs.diffusion.token_shard_bounds`) for the whole run. A step is
token-wise except for attention, so per step each rank either

- gathers every token's keys and values (2D numbers per token), or
- gathers every token's state x (C numbers per token) and recomputes K and V,

then computes its own tokens' velocity and Euler update. No state ever moves
between steps: the steps stay in order on every rank at once. The gathers are
ring all-gathers over the counted seam, so the ledger holds their exact wire
bytes, uneven shards included.

A shortcut, shown failing: keep the other shards' K and V from the previous
step (only this rank's are fresh), so a step need not wait for the gather.
DistriFusion and PipeFusion reuse one-step-stale activations in this spirit,
for speed; it is an approximation, and the sample is no longer the
sequential one.

The demo is an `Experiment`: its spec, `TokensSpec`, holds the sampling spec,
the noise and the gather modes (refused before any process starts); every
rank runs each mode in turn, the ledger reset between them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, get_args

import torch

from wmdist.comm import Context, ring_all_gather
from wmdist.costs import diffusion as dcost
from wmdist.costs.validate import require_choice
from wmdist.diffusion.denoiser import Denoiser, denoise_by_shards, shard_tolerance
from wmdist.diffusion.sampler import euler_update, sample, time_grid
from wmdist.diffusion.spec import SamplingSpec, check_noise, one_thread, reference_trajectory, require_world
from wmdist.course.experiment import Experiment, Verdict
from wmdist.course.report import Check, Count, Report, close_check, counts_per_rank, differ_check, exact_check

Gather = Literal["kv", "x", "stale kv"]
GATHERS: tuple[Gather, ...] = get_args(Gather)
GATHER_LABELS = {"kv": "gather K/V", "x": "gather x", "stale kv": "stale K/V"}


def gather_tokens(ctx: Context, y: torch.Tensor, dim: int, bounds: list[tuple[int, int]],
                  phase: str) -> torch.Tensor:
    """Every rank's token shard of y concatenated along its token dim `dim`, by a counted ring all-gather.

    The shard is made token-major, flattened and sent in `ring_all_gather`'s
    chunks (rank r's chunk = its tokens times the numbers per token), so
    uneven shards travel exactly.
    """
    front = y.movedim(dim, 0).contiguous()                                  # (s, ...): token-major
    per_token = math.prod(front.shape[1:])
    sizes = [(stop - start) * per_token for start, stop in bounds]
    every = ring_all_gather(ctx, front.reshape(-1), sizes, phase=phase)     # (S * per_token,)
    return every.view(bounds[-1][1], *front.shape[1:]).movedim(0, dim).contiguous()


@dataclass(kw_only=True, frozen=True)
class ShardRun:
    """One rank's token shard through one run: states (K+1, B, s, C), velocities (K, B, s, C), ledger per step."""
    states: torch.Tensor
    velocities: torch.Tensor
    sent: tuple[int, ...]
    recv: tuple[int, ...]
    rounds: tuple[int, ...]


def token_sharded_sampling(ctx: Context, spec: SamplingSpec, noise: torch.Tensor, *, gather: Gather) -> ShardRun:
    """Rank function: sample with this rank's token shard, gathering what attention needs at every step.

    Returns this shard's states (K+1, B, s, C), velocities (K, B, s, C), and
    the ledger's bytes and rounds per step.
    """
    require_choice("gather", gather, GATHERS)
    model = Denoiser(spec.model)
    bounds = dcost.token_shard_bounds(spec.model.tokens, ctx.world_size)
    start, stop = bounds[ctx.rank]
    x = noise[:, start:stop].clone()                                        # (B, s, C)
    ts = time_grid(spec.steps)
    states, velocities, stale = [x], [], None
    for k in range(spec.steps):
        phase = f"step {k}"
        if gather == "x":
            kv = model.project_kv(gather_tokens(ctx, x, 1, bounds, phase), ts[k])
        else:
            own = torch.stack(model.project_kv(x, ts[k], start=start))            # (2, B, H, s, D/H)
            if gather == "kv" or stale is None:
                every = gather_tokens(ctx, own, 3, bounds, phase)           # (2, B, H, S, D/H)
                stale = every
            else:                                                           # others' K/V from the step before
                every = stale.clone()
                every[:, :, :, start:stop] = own
                if k + 1 < spec.steps:                                      # fresh K/V for the next step
                    stale = gather_tokens(ctx, own, 3, bounds, phase)
            kv = (every[0], every[1])
        v = model.denoise_shard(x, kv, ts[k], start=start)                      # (B, s, C)
        x = euler_update(x, v, ts[k + 1] - ts[k])
        states.append(x)
        velocities.append(v)
    per_step = [ctx.ledger.totals(phase=f"step {k}") for k in range(spec.steps)]
    return ShardRun(states=torch.stack(states), velocities=torch.stack(velocities), sent=tuple(t["bytes_sent"] for t in per_step),
                    recv=tuple(t["bytes_recv"] for t in per_step), rounds=tuple(t["rounds"] for t in per_step))


def gathers_per_run(gather: Gather, steps: int) -> int:
    """All-gathers one run makes: one per step, or for stale K/V one fewer (the last step's is never needed)."""
    return steps if gather != "stale kv" else max(1, steps - 1)


@dataclass(frozen=True)
class TokenShardRun:
    """What the token-sharded runs measured, per gather mode (keys of GATHERS)."""
    shard_tokens: list[int]                  # tokens each rank holds
    bytes_per_step: dict[str, list[int]]     # bytes each rank sent in step 0
    sample_error: dict[str, float]           # max |sample - single-device sampler|


def _whole_velocities(spec: SamplingSpec, states: torch.Tensor) -> torch.Tensor:     # -> (K, B, S, C)
    """The single-device denoiser at each of the K states a run went through (one thread, as on a rank)."""
    model, ts = Denoiser(spec.model), time_grid(spec.steps)
    with one_thread():
        return torch.stack([model.denoise(states[k], ts[k]) for k in range(spec.steps)])


def _velocity_check(name: str, spec: SamplingSpec, velocities: torch.Tensor, whole: torch.Tensor) -> Check:
    """Each step's sharded velocity against the single-device denoiser at the very same state."""
    tol = min(shard_tolerance(spec.model, w) for w in whole)
    return close_check(name, velocities, whole, tol, "a product with fewer rows may sum in another order: "
                       "8 layers x 2(n-1) float32 roundings of unit-scale partial sums (shard_tolerance)")


@dataclass(frozen=True, kw_only=True)
class TokensSpec:
    """diffusion-tokens' run: what is sampled, from which noise, with which gathers, on N ranks (one token each
    at least). Stale K/V needs another rank's shard and a step before: with one rank or one step it is exact, so
    it is left out."""
    world_size: int
    sampling: SamplingSpec = field(default_factory=SamplingSpec)
    noise: torch.Tensor | None = None            # None: the sampling spec's own noise
    modes: tuple[Gather, ...] = field(init=False)

    def __post_init__(self) -> None:
        cfg = self.sampling.model
        require_world(self.world_size, cfg.tokens, f"each rank needs a token: the latent has {cfg.tokens} tokens")
        object.__setattr__(self, "noise", check_noise(self.noise, self.sampling))
        object.__setattr__(self, "modes", GATHERS if self.world_size > 1 and self.sampling.steps > 1 else GATHERS[:2])


@dataclass(frozen=True)
class TokenRanks:
    """One rank's shard runs, one per gather mode of the spec (in its order)."""
    runs: tuple[ShardRun, ...]


def tokens_on_ranks(ctx: Context, spec: TokensSpec) -> TokenRanks:
    """Rank function: every gather mode in turn on this rank's shard, each counted from a fresh ledger."""
    runs = []
    for mode in spec.modes:
        ctx.ledger.reset()
        runs.append(token_sharded_sampling(ctx, spec.sampling, spec.noise, gather=mode))
    return TokenRanks(tuple(runs))


def compare_tokens(spec: TokensSpec, results: list[TokenRanks]) -> Verdict:
    """Each mode's sample and velocities against the single-device sampler and denoiser; bytes and rounds vs
    the all-gather formulas."""
    sampling, x_T, modes, n = spec.sampling, spec.noise, spec.modes, spec.world_size
    cfg = sampling.model
    outs = {m: [r.runs[i] for r in results] for i, m in enumerate(modes)}
    ref = reference_trajectory(sampling, x_T)                               # (K+1, B, S, C)
    states = {m: torch.cat([o.states for o in out], dim=2) for m, out in outs.items()}
    velocities = {m: torch.cat([o.velocities for o in out], dim=2) for m, out in outs.items()}
    whole = {m: _whole_velocities(sampling, states[m]) for m in modes}
    model = Denoiser(cfg)
    with one_thread():
        simulated = sample(lambda y, t: denoise_by_shards(model, y, t, n), x_T, sampling.steps)
    induction = ("every step's velocity matched bitwise (error 0 above), so by induction every state does; "
                 "a build that sums shards in another order fails this, not the check above")
    checks = [exact_check("gather K/V: ranks == the same token shards in one process", states["kv"][-1], simulated,
                          "same operations on the same shapes, one thread each; the gather copies bits")]
    for m in ("kv", "x"):
        label = GATHER_LABELS[m]
        checks.append(_velocity_check(f"{label}: every step's velocity == single-device denoiser on that state",
                                      sampling, velocities[m], whole[m]))
        checks.append(exact_check(f"{label}: sample == single-device sampler", states[m][-1], ref[-1], induction))
    if "stale kv" in modes:
        big = 100 * shard_tolerance(cfg, ref[-1])
        checks.append(differ_check("stale K/V (others' from the step before): sample differs from the sequential one",
                                   states["stale kv"][-1], ref[-1], big,
                                   "100x what summation order can explain: another computation, not rounding"))
    exact: list[Count] = []
    for m, out in outs.items():
        case, elems = GATHER_LABELS[m], (cfg.channels if m == "x" else 2 * cfg.dim)
        formula = [dcost.token_all_gather_bytes(sampling.batch, cfg.tokens, elems, n, r) for r in range(n)]
        exact += counts_per_rank("bytes sent", [o.sent[0] for o in out], [f["sent"] for f in formula],
                                 step=0, case=case)
        exact += counts_per_rank("bytes received", [o.recv[0] for o in out], [f["recv"] for f in formula],
                                 step=0, case=case)
        runs = gathers_per_run(m, sampling.steps)
        exact += counts_per_rank("bytes sent, all steps", [sum(o.sent) for o in out],
                                 [runs * f["sent"] for f in formula], case=case)
        exact += counts_per_rank("exchange rounds, all steps", [sum(o.rounds) for o in out],
                                 [runs * dcost.token_all_gather_rounds(n)] * n, case=case)
    data = TokenShardRun([b - a for a, b in dcost.token_shard_bounds(cfg.tokens, n)],
                         {m: [o.sent[0] for o in out] for m, out in outs.items()},
                         {m: float((s[-1] - ref[-1]).abs().max()) for m, s in states.items()})
    params = {"batch": sampling.batch, "tokens": cfg.tokens, "channels": cfg.channels, "dim": cfg.dim,
              "steps": sampling.steps, "gathers": list(modes)}
    return Verdict(checks=checks, exact=exact, params=params, data=data)


TOKENS_DEMO = Experiment(name="diffusion-tokens", chapter="08", world_sizes=(2, 3, 4),
                         title="Token-sharded sampling: K/V or x all-gathered per step, vs one device",
                         spec=lambda n: TokensSpec(world_size=n), ranks=tokens_on_ranks, compare=compare_tokens)


def tokens_demo(world_size: int, *, spec: SamplingSpec | None = None, noise: torch.Tensor | None = None) -> Report:
    """Token-sharded sampling on N ranks, K/V or x gathered per step, against the single-device sampler."""
    return TOKENS_DEMO.run_spec(TokensSpec(world_size=world_size, sampling=spec or SamplingSpec(), noise=noise))


DEMOS = [TOKENS_DEMO]
