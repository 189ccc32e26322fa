"""Replicas that drift apart without any error, the one-line check that catches them, and batch-size runs.

The all-reduce gives every rank the same averaged gradient, so every rank applies the same update.
Replicas stay identical only if they also started identical: the same weights, the same optimizer
state, the same hyperparameters. Nothing in the gradient exchange compares parameters, so a rank
that started from other weights, or steps with another learning rate, goes on differing while
every collective it posts completes normally. Plain SGD makes this exact: both ranks subtract the
same lr * g, so rank 1's weights minus rank 0's stay at their initial difference (up to one float32
rounding of each update). With rank 1 at another learning rate the difference moves by
(lr_0 - lr_1) * g every step. (Momentum or Adam state built from the same synchronized gradients
stays equal too, so the gap would stay as well; weight decay, which reads w itself, would shrink
it; optimizer state that starts different is `pitfalls.py`'s case.)

Rank side (`drift_runs`): the tiny world model, plain SGD (momentum 0, no weight decay), each rank
on its shard of the global batch, gradients summed by the counted all-reduce, in three cases:
    "same"   every rank starts from `seed` and steps with `lr`
    "init"   rank `odd_rank` starts from `odd_seed`
    "lr"     rank `odd_rank` steps with `odd_lr`
After the last step each case runs `replicas_agree` both ways.

One process (`batch_lr_curves`): the same samples, in the same order, trained at batch B and at
k * B, at the same learning rate and at k times it (the linear-scaling guess), held-out loss
recorded at equal numbers of samples seen. `drift_demo.py` judges both.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal, get_args

import torch

from wmdist import costs
from wmdist.comm import Context, all_gather, all_reduce, broadcast
from wmdist.course.compare import one_thread
from wmdist.models.world import flat_grads, flat_params, make_batch, make_model, set_flat_grads, shard_batch

Case = Literal["same", "init", "lr"]
CASES: tuple[Case, ...] = get_args(Case)
How = Literal["broadcast", "hash"]
HOWS: tuple[How, ...] = get_args(How)
DIGEST_BYTES = 8        # one int64 per rank: blake2b of the parameter bytes, cut to 8 bytes
VOTE_BYTES = 8          # one int64: how many ranks saw a mismatch


# --- the check ---------------------------------------------------------------------

def param_digest(params: torch.Tensor) -> torch.Tensor:
    """An 8-byte fingerprint of a tensor's exact bytes (blake2b): (1,) int64.

    Bitwise-equal tensors give equal digests; different ones collide with probability about
    2^-64. Bitwise means -0.0 and 0.0 differ, and NaNs with equal bits agree.
    """
    raw = params.detach().contiguous().cpu().numpy().tobytes()
    value = int.from_bytes(hashlib.blake2b(raw, digest_size=DIGEST_BYTES).digest(), "little", signed=True)
    return torch.tensor([value], dtype=torch.int64)


def replicas_agree(ctx: Context, params: torch.Tensor, *, how: How = "hash", phase: str = "replicas agree") -> bool:
    """True on every rank when every rank's `params` equal rank 0's bit for bit; the same answer everywhere.

    "hash": all-gather one 8-byte digest per rank and compare them (8 bytes sent per rank).
    "broadcast": broadcast rank 0's parameters, compare locally (torch.equal), then all-reduce the
    number of ranks that saw a mismatch, so that rank 0, which compares with itself, hears it too
    (4P + 8 bytes). The broadcast is exact where the hash is only all-but-certain; the hash is cheap.
    """
    if how not in HOWS:
        raise ValueError(f"how must be one of {HOWS}, got {how!r}")
    if how == "hash":
        digests = all_gather(ctx, param_digest(params), phase=phase)                 # (N,) int64
        return bool((digests == digests[0]).all())
    reference = broadcast(ctx, params.detach().clone(), 0, phase=phase)              # (P,) rank 0's
    mismatch = torch.tensor([0 if torch.equal(reference, params) else 1], dtype=torch.int64)
    return int(all_reduce(ctx, mismatch, phase=f"{phase}/vote").item()) == 0


# --- the rank side of the drift demo -----------------------------------------------

@dataclass(frozen=True, kw_only=True)
class DriftSpec:
    """Three short data-parallel runs on `world_size` ranks, identical except for one rank's setup."""
    world_size: int
    steps: int = 5
    batch_size: int = 12            # global examples per step, split as evenly as N allows
    lr: float = 0.05
    odd_rank: int = 1               # the rank set up differently in "init" and "lr"
    odd_seed: int = 1               # its initial-weight seed in "init"
    odd_lr: float = 0.1             # its learning rate in "lr"
    seed: int = 0                   # everyone else's weights; the data stream

    def __post_init__(self) -> None:
        n = costs.require_int("world_size", self.world_size, 1)
        if n < 2:
            raise ValueError(f"world_size must be >= 2 for replicas to drift apart (one rank has no one to differ "
                             f"from), got {n}")
        costs.require_int("steps", self.steps, 1)
        if costs.require_int("batch_size", self.batch_size, 1) < n:
            raise ValueError(f"world_size must be <= batch_size {self.batch_size} (every rank needs an example), "
                             f"got {n}")
        costs.require_int("odd_rank", self.odd_rank, 1, high=n - 1)
        costs.require_int("seed", self.seed, 0)
        if costs.require_int("odd_seed", self.odd_seed, 0) == self.seed:
            raise ValueError(f"odd_seed must differ from seed {self.seed}, or case 'init' shows nothing")
        for name in ("lr", "odd_lr"):
            if costs.require_real(name, getattr(self, name)) == 0:
                raise ValueError(f"{name} must be > 0")
        if self.odd_lr == self.lr:
            raise ValueError(f"odd_lr must differ from lr {self.lr}, or case 'lr' shows nothing")

    def setup(self, case: Case, rank: int) -> tuple[int, float]:
        """(initial-weight seed, learning rate) of `rank` in `case`."""
        odd = rank == self.odd_rank
        return (self.odd_seed if odd and case == "init" else self.seed,
                self.odd_lr if odd and case == "lr" else self.lr)


@dataclass(frozen=True, kw_only=True)
class DriftRank:
    """What one rank ends one case with: every parameter state, every applied gradient, what it sent."""
    case: str
    lr: float                          # the learning rate this rank stepped with
    params: tuple[torch.Tensor, ...]   # steps + 1 of (P,): after init, then after each step
    grads: tuple[torch.Tensor, ...]    # steps of (P,): the all-reduced gradient it applied
    reduces: int                       # gradient all-reduces in its ledger (all completed)
    reduce_bytes: int                  # bytes they sent, summed over the steps
    agree: dict[str, bool]             # replicas_agree's answer after the last step, by how
    check_bytes: dict[str, tuple[int, int]]   # (sent, received) of each way of checking


@dataclass(frozen=True)
class DriftRanks:
    """One rank's DriftRank for each case, in CASES order."""
    runs: tuple[DriftRank, ...]


def train_case(ctx: Context, spec: DriftSpec, case: Case) -> DriftRank:
    """Rank function for one case: `spec.steps` plain-SGD steps on all-reduced gradients, then both checks."""
    seed, lr = spec.setup(case, ctx.rank)
    model = make_model(seed=seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr)              # momentum 0, weight decay 0
    sizes = costs.ring_chunk_sizes(spec.batch_size, ctx.world_size)
    params, grads = [flat_params(model).clone()], []
    for step in range(spec.steps):
        shard = shard_batch(make_batch(spec.batch_size, seed=spec.seed * 1000 + step), sizes, ctx.rank)
        opt.zero_grad()
        (model.per_example_loss(shard).sum() / spec.batch_size).backward()    # summed over ranks: the batch mean
        synced = all_reduce(ctx, flat_grads(model), phase=f"{case}/step {step}/grads")   # (P,)
        set_flat_grads(model, synced)
        opt.step()
        grads.append(synced.clone())
        params.append(flat_params(model).clone())
    reduced = ctx.ledger.totals(phase=f"{case}/step", kind="collective", prefix=True)
    agree, check_bytes = {}, {}
    for how in HOWS:
        agree[how] = replicas_agree(ctx, params[-1], how=how, phase=f"{case}/check {how}")
        t = ctx.ledger.totals(phase=f"{case}/check {how}", kind="collective", prefix=True)
        check_bytes[how] = (t["bytes_sent"], t["bytes_recv"])
    return DriftRank(case=case, lr=lr, params=tuple(params), grads=tuple(grads), reduces=reduced["rounds"],
                     reduce_bytes=reduced["bytes_sent"], agree=agree, check_bytes=check_bytes)


def drift_runs(ctx: Context, spec: DriftSpec) -> DriftRanks:
    """Rank function: every case of `spec`, one after the other."""
    return DriftRanks(tuple(train_case(ctx, spec, case) for case in CASES))


# --- one process: batch size and learning rate ----------------------------------------

@dataclass(frozen=True, kw_only=True)
class BatchLRSpec:
    """Runs at batch B and k * B on the same samples: base learning rates, seeds, how long."""
    world_size: int = 1                      # runs in this process: 1 is the only size
    batch_size: int = 8                      # B
    factor: int = 4                          # k: the larger batch is k * B
    samples: int = 512                       # samples every run sees, once each
    base_lrs: tuple[float, ...] = (0.1, 0.2)
    seeds: tuple[int, ...] = (0, 1, 2, 3)    # initial weights and the sample stream, one run each
    eval_size: int = 64                      # held-out sequences the loss is measured on

    def __post_init__(self) -> None:
        if costs.require_int("world_size", self.world_size, 1) != 1:
            raise ValueError(f"world_size must be 1: these runs happen in this process and start no ranks, "
                             f"got {self.world_size}")
        costs.require_int("batch_size", self.batch_size, 1)
        costs.require_int("factor", self.factor, 2)
        costs.require_int("eval_size", self.eval_size, 1)
        big = self.batch_size * self.factor
        if costs.require_int("samples", self.samples, big) % big:
            raise ValueError(f"samples must be a multiple of factor * batch_size = {big}, got {self.samples}")
        for name in ("base_lrs", "seeds"):
            if not isinstance(getattr(self, name), tuple) or not getattr(self, name):
                raise TypeError(f"{name} must be a non-empty tuple, got {getattr(self, name)!r}")
        for lr in self.base_lrs:
            if costs.require_real("base_lrs entry", lr) == 0:
                raise ValueError("base_lrs entries must be > 0")
        if len(self.seeds) < 2:
            raise ValueError(f"seeds needs at least 2 entries to measure a seed-to-seed spread, got {self.seeds}")
        for s in self.seeds:
            costs.require_int("seeds entry", s, 0)

    def arms(self) -> tuple[tuple[int, float], ...]:
        """(batch size, lr) of every run: per base lr, B at lr, k B at lr, k B at k lr; each once."""
        big, out = self.batch_size * self.factor, []
        for lr in self.base_lrs:
            out += [a for a in ((self.batch_size, lr), (big, lr), (big, self.factor * lr)) if a not in out]
        return tuple(out)


@dataclass(frozen=True, kw_only=True)
class Curve:
    """One run's held-out loss at equal numbers of samples seen."""
    batch_size: int
    lr: float
    seed: int
    samples: tuple[int, ...]      # 0, kB, 2kB, ..., spec.samples
    losses: tuple[float, ...]     # the held-out loss there (inf or NaN once a run has diverged)


EVAL_SEED = 10_000        # the held-out batch's seed: far from every training stream's
STREAM_SEED = 100         # training stream of seed s: make_batch(samples, seed=STREAM_SEED + s)


def train_curve(spec: BatchLRSpec, batch_size: int, lr: float, seed: int,
                stream: dict[str, torch.Tensor], held_out: dict[str, torch.Tensor]) -> Curve:
    """Plain SGD over `stream` in order, `batch_size` rows a step; the held-out loss every k B samples."""
    model = make_model(seed=seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    every, seen, losses = spec.batch_size * spec.factor, [0], []
    with torch.no_grad():
        losses.append(float(model.loss(held_out)))
    for start in range(0, spec.samples, batch_size):
        opt.zero_grad()
        model.loss({k: v[start:start + batch_size] for k, v in stream.items()}).backward()
        opt.step()
        if (start + batch_size) % every == 0:
            with torch.no_grad():
                losses.append(float(model.loss(held_out)))
            seen.append(start + batch_size)
    return Curve(batch_size=batch_size, lr=lr, seed=seed, samples=tuple(seen), losses=tuple(losses))


def batch_lr_curves(spec: BatchLRSpec) -> tuple[Curve, ...]:
    """Every arm on every seed, in this process, on one thread (deterministic): arms outer, seeds inner."""
    with one_thread():
        held_out = make_batch(spec.eval_size, seed=EVAL_SEED)
        streams = {s: make_batch(spec.samples, seed=STREAM_SEED + s) for s in spec.seeds}
        return tuple(train_curve(spec, b, lr, s, streams[s], held_out) for b, lr in spec.arms() for s in spec.seeds)
