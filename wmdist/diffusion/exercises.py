"""Chapter 08's exercise: one token-sharded denoising step, written by the reader and checked on real ranks.

Each rank holds a contiguous shard of the latent's tokens. Its velocity
needs its own tokens, its position (the shard's first token), and the keys
and values of every token: the part the reader must fetch from the others.
"""
from __future__ import annotations

import torch

from wmdist.comm import Context, ring_all_gather
from wmdist.costs.diffusion import token_shard_bounds
from wmdist.costs.rounding import reordered_sum_bound
from wmdist.diffusion.denoiser import Denoiser, DenoiserConfig
from wmdist.diffusion.sampler import initial_noise
from wmdist.course.exercises import Exercise

EXERCISE_BATCH, EXERCISE_SEED, EXERCISE_T = 2, 7, 0.5
OUTPUT_BOUND = 4.0    # max |velocity| for these inputs is about 2.8; tests/test_diffusion.py checks it stays below 4


def token_step_inputs(rank: int, world_size: int) -> tuple[Denoiser, torch.Tensor, int, float]:
    """Rank r: the denoiser, its token shard (B, s, C) of a seeded state, the shard's first token, and t."""
    model = Denoiser(DenoiserConfig())
    x = initial_noise(EXERCISE_BATCH, model.cfg.tokens, model.cfg.channels, seed=EXERCISE_SEED)   # (B, S, C)
    start, stop = token_shard_bounds(model.cfg.tokens, world_size)[rank]
    return model, x[:, start:stop].clone(), start, EXERCISE_T


def token_step_solution(ctx: Context, model: Denoiser, x: torch.Tensor, start: int, t: float) -> torch.Tensor:
    """This rank's velocity (B, s, C) for its tokens [start, start + s): first gather every token's K and V."""
    k, v = model.project_kv(x, t, start=start)                         # (B, H, s, D/H) each: this shard's only
    mine = torch.stack([k, v]).movedim(3, 0).contiguous()          # (s, 2, B, H, D/H): token-major
    per_token = mine[0].numel()
    sizes = [(stop - first) * per_token for first, stop in token_shard_bounds(model.cfg.tokens, ctx.world_size)]
    every = ring_all_gather(ctx, mine.reshape(-1), sizes, phase="K/V")          # (S * per_token,)
    k_all, v_all = every.view(-1, *mine.shape[1:]).movedim(0, 3).contiguous()   # (B, H, S, D/H) each
    return model.denoise_shard(x, (k_all, v_all), t, start=start)


TOKEN_STEP = Exercise(
    name="token-sharded denoising step",
    task="Each rank holds tokens [start, start + s) of a (B, S, C) latent and the same denoiser. Return this "
         "rank's velocity (B, s, C) at noise level t, equal to its rows of model.denoise on the whole latent.",
    reference=token_step_solution,
    make_inputs=token_step_inputs,
    world_sizes=(2, 3),
    tolerance=8 * reordered_sum_bound(64, OUTPUT_BOUND),
    reason="gathering x instead of K/V runs products of another row count, which may sum in another order: "
           "shard_tolerance's bound for 64 tokens and outputs below 4",
    hint="a token's attention reads the keys and values of all S tokens, so gather them from every rank "
         "(ring_all_gather takes each rank's flat chunk and the chunk sizes, token_shard_bounds gives the "
         "shards); and pass `start=start` on: it sets your tokens' position embedding.",
)
EXERCISES = [TOKEN_STEP]
