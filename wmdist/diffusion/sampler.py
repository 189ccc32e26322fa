"""Deterministic flow sampling: the sequential Euler sampler and Picard iteration over its steps.

The sampler integrates the flow-matching ODE dx/dt = v(x, t) from t = 1
(Gaussian noise) to t = 0 (a sample) with K Euler steps on a uniform grid:

    x_{k+1} = x_k + dt_k * v(x_k, t_k),     t_k = 1 - k / K,  dt_k = t_{k+1} - t_k = -1/K

Why flow matching with Euler rather than DDIM with eta = 0: both are
deterministic probability-flow solvers, but the Euler step has exactly the
form x_{k+1} = x_k + dt * f(x_k), so the whole trajectory is a running sum
x_{k+1} = x_0 + sum_{j<=k} dt_j f(x_j, t_j) — the form Picard iteration
needs. A DDIM step multiplies x_k by a step-dependent factor first, which
would have to be rewritten before the same sum applied.

Step k consumes the state step k-1 produced, so the K denoiser calls of one
sample are a chain. Picard iteration trades that chain for parallel work:
guess the whole trajectory, evaluate the velocity at EVERY step of the guess
at once (independent calls: one per rank), rebuild the trajectory from those
velocities, and repeat. See `picard_sample` for why it ends exactly at the
sequential sample, bit for bit.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from wmdist.costs.rounding import reordered_sum_bound
from wmdist.costs.validate import require_int, require_real

Velocity = Callable[[torch.Tensor, float], torch.Tensor]   # v(x (B, S, C), t) -> (B, S, C); a Denoiser fits
# One Picard round: (states, noise levels, the steps to evaluate) -> the velocity at each of those steps, in order.
RoundEvaluator = Callable[[list[torch.Tensor], list[float], range], list[torch.Tensor]]


def time_grid(steps: int) -> list[float]:
    """Noise levels t_0 = 1 (pure noise) > t_1 > ... > t_K = 0 (the sample), uniformly spaced, as floats."""
    k_total = require_int("steps", steps, 1)
    return [1.0 - k / k_total for k in range(k_total + 1)]


def euler_update(x: torch.Tensor, velocity: torch.Tensor, dt: float) -> torch.Tensor:  # (B, S, C) each
    """One Euler step x + dt * v; the sequential sampler and Picard both call this, so they round alike."""
    return x + dt * velocity


def initial_noise(batch: int, tokens: int, channels: int, *, seed: int = 0) -> torch.Tensor:  # -> (B, S, C)
    """Seeded Gaussian noise x_T; sample b depends only on (seed, b), so a shard of samples is a slice."""
    b_total = require_int("batch", batch, 1)
    require_int("tokens", tokens, 1)
    require_int("channels", channels, 1)
    require_int("seed", seed, 0)
    return torch.stack([torch.randn(tokens, channels, generator=torch.Generator().manual_seed(seed * 100_003 + b))
                        for b in range(b_total)])


def _check_state(x: torch.Tensor) -> None:
    if x.dim() != 3 or x.shape[0] < 1:
        raise ValueError(f"x_T must be (B, tokens, channels) with B >= 1 samples, got shape {tuple(x.shape)}")


def sample(model: Velocity, x_T: torch.Tensor, steps: int, *, trajectory: bool = False) -> torch.Tensor:
    """Run K Euler steps from x_T (B, S, C): the sample (B, S, C), or every state (K+1, B, S, C).

    The exact reference: each step waits for the one before, so K denoiser
    evaluations take K sequential rounds whatever the number of devices.
    """
    ts = time_grid(steps)
    _check_state(x_T)
    states = [x_T]
    with torch.no_grad():
        for k in range(len(ts) - 1):
            states.append(euler_update(states[-1], model(states[-1], ts[k]), ts[k + 1] - ts[k]))
    return torch.stack(states) if trajectory else states[-1]


@dataclass(kw_only=True, frozen=True)
class PicardResult:
    """What Picard iteration produced and what it cost, one list entry per iteration (round)."""
    trajectory: torch.Tensor     # (K+1, B, S, C): the last iterate, state 0 (noise) to state K (sample)
    errors: list[float]          # max |iterate - sequential| over the whole trajectory, after each iteration
    sample_errors: list[float]   # the same for the final state (the sample) only
    evaluations: list[int]       # denoiser evaluations in each iteration: independent calls, one round
    settled: list[int]           # after each iteration, states 0 .. settled-1 are final (bitwise the
                                 # sequential ones, unless a tol > 0 accepted approximate states)

    @property
    def sample(self) -> torch.Tensor:                  # (B, S, C)
        """The final state of the last iterate."""
        return self.trajectory[-1]

    @property
    def total_evaluations(self) -> int:
        """Denoiser evaluations over all iterations (the sequential sampler needs K)."""
        return sum(self.evaluations)

    @property
    def rounds(self) -> int:
        """Sequential rounds: one per iteration, however many evaluations it ran side by side."""
        return len(self.evaluations)


def picard_sample(model: Velocity, x_T: torch.Tensor, steps: int, iterations: int, *, window: int | None = None,
                  tol: float | None = None, reference: torch.Tensor | None = None,
                  evaluate: RoundEvaluator | None = None) -> PicardResult:
    """Parallel-in-time sampling: Picard iteration over the K solver steps (ParaDiGMS-style).

    Start from the guess x_k = x_T for every k. Each iteration evaluates the
    velocity d_j = v(x_j, t_j) at every step j of the current guess that is
    not settled yet, at most `window` consecutive steps (None: all), as
    independent calls (one round, on as many ranks), then rebuilds the states
    x_{k+1} = x_k + dt_k d_k; states past the window repeat the window's
    last one, the best guess there is for them. The running sum is added in
    the sequential sampler's own order with its `euler_update`, and each
    velocity call has the sequential call's shape, so no float operation
    differs from the sequential sampler's once the inputs agree:

    - State k+1 depends only on velocities at steps 0..k. If states 0..i were
      exact (bitwise the sequential sampler's) before an iteration, states
      0..i+1 are exact after it. So after iteration i at least states 0..i
      are exact, and after K iterations the whole trajectory is, BITWISE.
      A velocity read from an exact state never changes again, so it is kept,
      not recomputed: iteration i evaluates steps i-1 .. K-1 at most.
    - With `tol` (>= 0), a state that moved by at most `tol` in the last
      iteration, right after the settled ones, settles too, and the velocity
      read from it is frozen. With tol = 0 that is still exact: the velocity
      was read from that very state, now exact. In float32 the iterates
      usually hover a few ulps away until the guaranteed iteration, so
      tol = 0 seldom saves a round. With tol > 0 it is the ParaDiGMS
      approximation: fewer rounds, no longer exact.

    A window bounds the evaluations per round (the ranks at hand); it pays
    off only together with tol > 0, since exact settling advances one step
    per round. `iterations` caps the rounds; the loop also stops once every
    state is settled. `reference` is the sequential trajectory (K+1, B, S, C) to
    measure errors against; computed with `sample` (K more evaluations, not
    counted) when not given. `evaluate` runs one round's independent calls
    (default: `model` on each step in turn); `wmdist.diffusion.picard_ranks`
    spreads them over ranks and gathers the velocities back.
    """
    ts = time_grid(steps)
    k_total = len(ts) - 1
    require_int("iterations", iterations, 1)
    width = k_total if window is None else require_int("window", window, 1)
    tol = None if tol is None else require_real("tol", tol)
    _check_state(x_T)
    if reference is None:
        reference = sample(model, x_T, k_total, trajectory=True)
    if tuple(reference.shape) != (k_total + 1, *x_T.shape):
        raise ValueError(f"reference must be the sequential trajectory, shape {(k_total + 1, *x_T.shape)}, "
                         f"got {tuple(reference.shape)}")
    states = [x_T] * (k_total + 1)          # the initial guess: noise at every step
    drifts: list[torch.Tensor | None] = [None] * k_total
    exact = 0                               # velocities 0 .. exact-1 come from exact states (so are final)
    errors, sample_errors, evaluations, settled = [], [], [], []
    with torch.no_grad():
        while exact < k_total and len(evaluations) < iterations:
            lo, hi = exact, min(exact + width, k_total)
            round_steps = range(lo, hi)    # independent calls: the parallel round
            fresh = (evaluate(states, ts, round_steps) if evaluate is not None
                     else [model(states[j], ts[j]) for j in round_steps])
            if len(fresh) != hi - lo:
                raise ValueError(f"evaluate must return {hi - lo} velocities (steps {lo}..{hi - 1}), got {len(fresh)}")
            drifts[lo:hi] = fresh
            old = states[lo + 1: hi + 1]
            for k in range(lo, hi):        # the running sum, in the sequential sampler's order
                states[k + 1] = euler_update(states[k], drifts[k], ts[k + 1] - ts[k])
            for k in range(hi + 1, k_total + 1):
                states[k] = states[hi]     # past the window: the guess holds the window's last state
            exact = lo + 1                 # velocity lo read state lo, which was exact
            while tol is not None and exact < hi and _change(states[exact], old[exact - lo - 1]) <= tol:
                exact += 1                 # state `exact` settled, so the velocity read from it is final
            evaluations.append(hi - lo)
            settled.append(exact + 1)
            trajectory = torch.stack(states)                                  # (K+1, B, S, C)
            errors.append(float((trajectory - reference).abs().max()))
            sample_errors.append(float((trajectory[-1] - reference[-1]).abs().max()))
    return PicardResult(trajectory=trajectory, errors=errors, sample_errors=sample_errors, evaluations=evaluations, settled=settled)


def _change(new: torch.Tensor, old: torch.Tensor) -> float:
    """Largest |new - old|: how far one state moved in one iteration."""
    return float((new - old).abs().max())


def running_sum_tolerance(trajectory: torch.Tensor) -> float:
    """How far the sample could move if the running sum x_0 + sum_k dt_k d_k were added in another order.

    The yardstick for "converged to rounding level": the K+1 terms are x_0
    and the increments x_{k+1} - x_k of the sequential trajectory
    (K+1, B, S, C); any partial sum, in any order, is at most |x_0| plus the
    sum of |increments|, elementwise. A scan across ranks (another order)
    would need this tolerance even with identical velocities; Picard iterates
    closer than this are as good as the sequential sample up to rounding.
    """
    if trajectory.dim() < 2 or trajectory.shape[0] < 2:
        raise ValueError(f"trajectory must be (K+1, ...) with K >= 1, got shape {tuple(trajectory.shape)}")
    partial = trajectory[0].abs() + trajectory.diff(dim=0).abs().sum(dim=0)   # (B, S, C)
    return reordered_sum_bound(trajectory.shape[0], float(partial.max()))
