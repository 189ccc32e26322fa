"""Chapter 08 in one process: token-sharded denoising, the sequential sampler, Picard iteration, costs."""
from __future__ import annotations

import re

import pytest
import torch

from wmdist.costs import diffusion as dcost
from wmdist.diffusion.denoiser import Denoiser, DenoiserConfig, denoise_by_shards, shard_tokens, shard_tolerance
from wmdist.diffusion.sampler import initial_noise, picard_sample, running_sum_tolerance, sample, time_grid

CFG = DenoiserConfig()                       # 4 frames of 4 x 4 tokens (S = 64), C = 8, D = 16, 2 heads


pytestmark = pytest.mark.usefixtures("one_thread")     # conftest: the parent as one of the ranks


@pytest.fixture(scope="module")
def model() -> Denoiser:
    return Denoiser(CFG)


def noise(batch: int = 2, seed: int = 0) -> torch.Tensor:               # (B, S, C)
    return initial_noise(batch, CFG.tokens, CFG.channels, seed=seed)


def toy_velocity(calls: list[int]):
    """A cheap nonlinear velocity field that counts its calls (for the counting tests)."""
    def v(x: torch.Tensor, t: float) -> torch.Tensor:
        calls.append(1)
        return torch.tanh(1.5 * x) * (1.0 + t) - 0.5 * x.roll(1, dims=1)
    return v


# --- the denoiser, whole and by token shards ----------------------------------------

@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5, 7, 63, 64, 65])   # uneven, 1-token and empty shards
def test_denoise_equals_its_token_shards(model, batch, world_size):
    # Same operations on the same numbers; only a BLAS kernel's accumulation order may
    # change with a product's row count, which shard_tolerance bounds (its docstring derives it).
    x, t = noise(batch, seed=world_size), 0.4
    whole = model.denoise(x, t)                                           # (B, S, C)
    by_shards = denoise_by_shards(model, x, t, world_size)
    assert by_shards.shape == whole.shape
    assert float((by_shards - whole).abs().max()) <= shard_tolerance(CFG, whole)


def test_a_sample_does_not_depend_on_its_batch(model):
    # Samples batched over ranks: each slice of the batch is computed alone (same bound, same reason).
    x, t = noise(4), 0.6
    whole = model.denoise(x, t)
    for a, b in ((0, 1), (1, 3), (3, 4)):
        assert float((model.denoise(x[a:b], t) - whole[a:b]).abs().max()) <= shard_tolerance(CFG, whole)


def test_a_token_sees_other_tokens_only_through_their_keys_and_values(model):
    x, t, n, m = noise(1), 0.7, 5, 40
    x2 = x.clone()
    x2[:, m] += 1.0                                                        # change one other token
    assert not torch.allclose(model.denoise(x2, t)[:, n], model.denoise(x, t)[:, n])   # attention is global...
    kv = model.project_kv(x, t)
    own = model.denoise_shard(x[:, n:n + 1], kv, t, start=n)
    assert torch.equal(model.denoise_shard(x2[:, n:n + 1], kv, t, start=n), own)       # ...but only via K and V


def test_a_shard_needs_its_true_position(model):
    # The shard's start offset feeds the position embedding: a wrong one is far outside the tolerance.
    x, t = noise(1), 0.5
    kv = model.project_kv(x, t)
    right = model.denoise_shard(x[:, 16:32], kv, t, start=16)
    wrong = model.denoise_shard(x[:, 16:32], kv, t, start=0)
    assert float((right - wrong).abs().max()) > 1000 * shard_tolerance(CFG, right)


def test_noise_level_as_float_or_per_sample_tensor(model):
    x = noise(2)
    assert torch.equal(model.denoise(x, 0.25), model.denoise(x, torch.tensor([0.25, 0.25])))
    assert not torch.equal(model.denoise(x, 0.25), model.denoise(x, 0.75))


# --- the sequential sampler -----------------------------------------------------------

def test_sampler_is_deterministic_and_seeded():
    a = sample(Denoiser(DenoiserConfig(seed=3)), noise(2, seed=1), steps=6, trajectory=True)
    b = sample(Denoiser(DenoiserConfig(seed=3)), noise(2, seed=1), steps=6, trajectory=True)
    assert a.shape == (7, 2, CFG.tokens, CFG.channels) and torch.equal(a, b)
    assert torch.equal(a[0], noise(2, seed=1))
    assert torch.equal(sample(Denoiser(DenoiserConfig(seed=3)), noise(2, seed=1), steps=6), a[-1])
    assert not torch.equal(sample(Denoiser(DenoiserConfig(seed=4)), noise(2, seed=1), steps=6), a[-1])
    assert torch.equal(noise(3, seed=1)[1], noise(2, seed=1)[1])        # sample b depends on (seed, b) only
    assert time_grid(4) == [1.0, 0.75, 0.5, 0.25, 0.0]


# --- Picard iteration ----------------------------------------------------------------

def test_picard_makes_states_exact_one_step_per_iteration(model):
    steps, x = 6, noise(1)
    ref = sample(model, x, steps, trajectory=True)                        # (K+1, B, S, C)
    for i in range(1, steps + 1):
        result = picard_sample(model, x, steps, iterations=i, reference=ref)
        assert result.settled[-1] == i + 1
        assert torch.equal(result.trajectory[: i + 1], ref[: i + 1])      # states 0..i: bit for bit
        if i < steps:
            assert not torch.equal(result.trajectory[i + 1:], ref[i + 1:])


def test_picard_reaches_the_sequential_sample_bitwise_and_rounding_level_sooner(model):
    steps, x = 16, noise(2)
    ref = sample(model, x, steps, trajectory=True)
    result = picard_sample(model, x, steps, iterations=steps, reference=ref)
    # Exact by construction after K iterations: same velocity calls, same running-sum order.
    assert torch.equal(result.sample, ref[-1]) and result.errors[-1] == 0.0
    assert result.sample_errors[0] > 0.1 * float(ref[-1].abs().max())   # iteration 1 is far off
    # Within what reordering the sum alone could change, long before iteration K (8 of 16 here).
    level = running_sum_tolerance(ref)
    first = next(i for i, e in enumerate(result.errors, start=1) if e <= level)
    assert first <= steps // 2 + 1
    assert all(later <= 10 * level for later in result.errors[first:])   # and it stays there


@pytest.mark.parametrize("steps", [1, 5, 8])
@pytest.mark.parametrize("window", [None, 1, 3])
@pytest.mark.parametrize("iterations", [1, 3, 8, 11])
def test_picard_work_and_rounds_match_the_cost_formulas(steps, window, iterations):
    calls: list[int] = []
    v, x = toy_velocity(calls), noise(1)
    ref = sample(v, x, steps, trajectory=True)
    calls.clear()
    result = picard_sample(v, x, steps, iterations, window=window, reference=ref)
    assert result.evaluations == dcost.picard_evaluations(steps, iterations, window=window)
    assert result.total_evaluations == len(calls)                          # the calls really made
    assert result.rounds == dcost.picard_rounds(steps, iterations)
    if iterations >= steps:
        assert torch.equal(result.trajectory, ref)
    if window == 1:                                                        # one step per round: the sequential sampler
        assert result.total_evaluations == min(iterations, steps) == result.rounds


def test_picard_tolerance_zero_stays_exact_and_positive_trades_exactness_for_rounds(model):
    steps, x = 16, noise(2)
    ref = sample(model, x, steps, trajectory=True)
    budget = sum(dcost.picard_evaluations(steps, steps))
    exact = picard_sample(model, x, steps, steps, tol=0.0, reference=ref)
    assert torch.equal(exact.trajectory, ref) and exact.total_evaluations <= budget
    fast = picard_sample(model, x, steps, steps, window=8, tol=1e-4, reference=ref)
    assert fast.rounds < steps and fast.total_evaluations < budget
    assert 0.0 < fast.sample_errors[-1] < 1e-3 * float(ref[-1].abs().max())   # approximate, but close


# --- cost formulas against the tensors they describe --------------------------------

@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5, 7])
def test_kv_all_gather_bytes_are_the_other_shards_keys_and_values(model, world_size):
    x, t = noise(2), 0.5
    shards = shard_tokens(x, world_size)
    assert [(s, s + p.shape[1]) for s, p in shards] == dcost.token_shard_bounds(CFG.tokens, world_size)
    kv_bytes = [sum(a.nbytes for a in model.project_kv(p, t, start=s)) for s, p in shards]
    for r in range(world_size):
        got = dcost.token_all_gather_bytes(2, CFG.tokens, 2 * CFG.dim, world_size, r)
        assert got["recv"] == sum(kv_bytes) - kv_bytes[r]
        assert got["sent"] == sum(kv_bytes) - kv_bytes[(r + 1) % world_size]   # ring: all but the right neighbour's
    assert dcost.token_all_gather_rounds(world_size) == world_size - 1


def test_ring_all_gather_bytes_by_simulation():
    # Round s: rank r forwards chunk (r - s) mod N to its right neighbour (wmdist.comm's ring).
    for tokens, n in ((10, 4), (64, 3), (5, 8)):
        sizes = [b - a for a, b in dcost.token_shard_bounds(tokens, n)]
        sent, recv = [0] * n, [0] * n
        for s in range(n - 1):
            for r in range(n):
                sent[r] += sizes[(r - s) % n]
                recv[(r + 1) % n] += sizes[(r - s) % n]
        for r in range(n):
            got = dcost.token_all_gather_bytes(3, tokens, 7, n, r, elem_size=2, layers=2)
            assert got == {"sent": sent[r] * 3 * 7 * 2 * 2, "recv": recv[r] * 3 * 7 * 2 * 2}


def test_boundary_transfers_and_step_owners():
    x = noise(3)
    assert dcost.boundary_transfer_bytes(3, CFG.tokens, CFG.channels) == x.nbytes
    assert dcost.step_owners(8, 3) == [0, 0, 0, 1, 1, 1, 2, 2]
    for steps in range(1, 10):
        for n in range(1, 6):
            assert dcost.step_handoffs(steps, n) == min(steps, n) - 1


def test_picard_work_closed_form():
    for steps in range(1, 12):
        assert dcost.sequential_evaluations(steps) == steps
        for k in range(1, steps + 1):
            assert sum(dcost.picard_evaluations(steps, k)) == k * steps - k * (k - 1) // 2
        assert dcost.picard_evaluations(steps, steps + 5) == dcost.picard_evaluations(steps, steps)


# --- bad inputs -------------------------------------------------------------------------

@pytest.mark.parametrize("call, message", [
    (lambda m: sample(m, noise(1), 0), "steps must be an integer >= 1"),
    (lambda m: sample(m, noise(1)[:0], 3), "B >= 1"),
    (lambda m: sample(m, noise(1)[:, :60], 3), "must hold all 64 tokens"),
    (lambda m: picard_sample(m, noise(1), 0, 2), "steps must be an integer >= 1"),
    (lambda m: picard_sample(m, noise(1), 4, 0), "iterations must be an integer >= 1"),
    (lambda m: picard_sample(m, noise(1), 4, 2, window=0), "window must be an integer >= 1"),
    (lambda m: picard_sample(m, noise(1), 4, 2, tol=-1.0), "tol must be a finite number >= 0"),
    (lambda m: picard_sample(m, noise(1), 4, 2, reference=noise(1)), "reference must be the sequential"),
    (lambda m: m.denoise(noise(1), 1.5), "t must be a finite number from 0.0 to 1.0"),
    (lambda m: m.denoise(noise(2), torch.zeros(3)), "t must be a float, a 0-d tensor or a (2,) tensor"),
    (lambda m: m.denoise(torch.zeros(1, 64, 5), 0.5), "x must be (B, tokens, 8)"),
    (lambda m: m.denoise_shard(noise(1)[:, :8], m.project_kv(noise(1)[:, :8], 0.5), 0.5),
     "kv must be the keys and values of all 64 tokens"),
    (lambda m: m.project_kv(noise(1)[:, :8], 0.5, start=60), "run past the 64 tokens"),
    (lambda m: DenoiserConfig(dim=6, heads=2), "dim must be a multiple of 2 * heads = 4"),
    (lambda m: DenoiserConfig(frames=0), "frames must be an integer >= 1"),
    (lambda m: initial_noise(0, 64, 8), "batch must be an integer >= 1"),
    (lambda m: dcost.token_all_gather_bytes(1, 64, 32, 4, 4), "rank must be an integer from 0 to 3"),
    (lambda m: dcost.token_all_gather_bytes(1, 0, 32, 4, 0), "tokens must be an integer >= 1"),
    (lambda m: dcost.step_handoffs(8, 0), "world_size must be an integer >= 1"),
    (lambda m: dcost.boundary_transfer_bytes(0, 64, 8), "batch must be an integer >= 1"),
    (lambda m: dcost.picard_evaluations(8, 2, window=0), "window must be an integer >= 1"),
])
def test_bad_inputs_are_refused_with_a_clear_message(model, call, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        call(model)
