"""ZeRO on real ranks, checked: bytes held and sent against the formulas, weights against Adam.

zero_memory_report runs wmdist.memory.zero at one stage and compares what each
rank's tensors hold with the memory model (wmdist.memory.footprint), what its
ledger sent with costs.zero_step_bytes, and the final weights with
torch.optim.Adam on one process. torch_zero_report sets our ZeRO-1 against
torch's own ZeroRedundancyOptimizer.

Each is an `Experiment` on one spec type, `ZeroSpec` (the world size and a
ZeroConfig, checked before any process starts): one per stage ("zero-0" to
"zero-3"; `wmdist verify` runs stages 1-3) and "zero-1-vs-torch".
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from wmdist.costs.collectives import ring_chunk_sizes
from wmdist.costs.validate import require_choice, require_int
from wmdist.costs.zero import ZERO_STAGES, zero_step_bytes, zero_step_rounds
from wmdist.comm import Context, all_reduce, counted
from wmdist.course.experiment import Experiment, Verdict
from wmdist.memory.footprint import MemoryConfig, per_rank_bytes
from wmdist.memory.transient import POINTS, zero_step_held
from wmdist.memory.zero import HELD_KINDS, ZeroConfig, ZeroRun, zero_rank
from wmdist.memory.zero_reference import adam_tolerance, reference_adam
from wmdist.models.world import flat_grads, flat_params, make_batch, make_model, shard_batch
from wmdist.course.report import Count, Report, close_check, counts_per_rank, exact_check


def _predicted_held(numel: int, world_size: int, stage: int, rank: int) -> dict[str, int]:
    return per_rank_bytes(MemoryConfig(params=numel, optimizer="adam", zero_stage=stage, dp=world_size), rank=rank)


@dataclass(frozen=True, kw_only=True)
class ZeroSpec:
    """A ZeRO run, decided before any process starts: `world_size` ranks training with `cfg` (its stage included)."""
    world_size: int
    cfg: ZeroConfig


def zero_spec(world_size: int, stage: int, *, cfg: ZeroConfig | None = None) -> ZeroSpec:
    """ZeRO-`stage` on `world_size` ranks, checked: a known stage, `cfg` of that stage, a batch row per rank."""
    require_int("world_size", world_size, 1)
    require_choice("stage", stage, ZERO_STAGES)
    cfg = ZeroConfig(stage=stage) if cfg is None else cfg
    if cfg.batch_size < world_size:
        raise ValueError(f"world_size must be <= batch_size {cfg.batch_size} (every rank needs a row), "
                         f"got {world_size}")
    if cfg.stage != stage:
        raise ValueError(f"cfg.stage={cfg.stage} but stage={stage}")
    return ZeroSpec(world_size=world_size, cfg=cfg)


def zero_ranks(ctx: Context, spec: ZeroSpec) -> ZeroRun:
    """Rank function: wmdist.memory.zero's training at the spec's stage."""
    return zero_rank(ctx, spec.cfg)


def compare_zero(spec: ZeroSpec, out: list[ZeroRun]) -> Verdict:
    """Weights against single-process Adam; held bytes (steady, within a step) and sent bytes against the formulas."""
    cfg, world_size, stage = spec.cfg, spec.world_size, spec.cfg.stage
    got, expected = torch.cat([o.chunk for o in out]), reference_adam(cfg)
    tol, why = adam_tolerance(cfg, world_size)
    checks = [close_check(f"ZeRO-{stage} weights == single-process torch.optim.Adam", got, expected, tol, why)]
    P = expected.numel()
    predicted = [_predicted_held(P, world_size, stage, r) for r in range(world_size)]
    exact = []
    for kind in HELD_KINDS:
        exact += counts_per_rank("held bytes", [o.held[kind] for o in out], [p[kind] for p in predicted], case=kind)
    phases = [zero_step_bytes(P, world_size, r, stage) for r in range(world_size)]
    for phase in phases[0]:
        exact += counts_per_rank("bytes sent per step", [o.phases.get(phase, {}).get("bytes_sent", 0) for o in out],
                                 [p[phase] for p in phases], phase=phase)
    exact += counts_per_rank("rounds per step", [o.rounds for o in out],
                             [zero_step_rounds(world_size, stage)] * world_size)
    exact += _during_step(out, P, world_size, stage)
    return Verdict(checks=checks, exact=exact,
                   params={"stage": stage, "params": P, "steps": cfg.steps, "batch_size": cfg.batch_size,
                           "lr": cfg.lr})


ZERO = {s: Experiment(name=f"zero-{s}", chapter="03", world_sizes=(1, 2, 3, 4),
                      title=f"ZeRO-{s}: bytes held per rank and sent per step vs formula, weights vs Adam",
                      spec=functools.partial(zero_spec, stage=s), ranks=zero_ranks, compare=compare_zero)
        for s in ZERO_STAGES}


def zero_memory_report(world_size: int, stage: int, *, cfg: ZeroConfig | None = None) -> Report:
    """Run ZeRO-`stage` on `world_size` ranks: held bytes and ledger vs formulas, weights vs Adam."""
    spec = zero_spec(world_size, stage, cfg=cfg)
    return ZERO[stage].run_spec(spec)


def _during_step(out: list[ZeroRun], P: int, world_size: int, stage: int) -> list[Count]:
    """Held bytes at each probe point of the last step, and the peak over them, against zero_step_held.

    The prediction is what a correct ZeRO holds: a run that keeps a full copy
    alive too long (ZeroConfig.keep_gathered) fails these counts.
    """
    predicted = [zero_step_held(P, world_size, r, stage) for r in range(world_size)]
    rows = []
    for point in POINTS:
        for kind in HELD_KINDS:
            rows += counts_per_rank("held bytes during the step", [o.during[point][kind] for o in out],
                                    [p[point][kind] for p in predicted], phase=point, case=kind)
    peak = lambda held: max(sum(h.values()) for h in held.values())   # noqa: E731 - the largest total of a step
    rows += counts_per_rank("model-state bytes", [sum(o.held.values()) for o in out],
                            [sum(_predicted_held(P, world_size, stage, r)[k] for k in HELD_KINDS)
                             for r in range(world_size)], case="steady (between steps)")
    rows += counts_per_rank("model-state bytes", [peak(o.during) for o in out],
                            [peak(p) for p in predicted], case="transient peak (within a step)")
    return rows


# --- PyTorch's own ZeRO-1 -----------------------------------------------------------

def torch_zero_rank(ctx: Context, cfg: ZeroConfig) -> torch.Tensor:
    """Rank function: the same training with torch's ZeroRedundancyOptimizer (whole parameters per rank).

    Gradients are summed with our counted all_reduce. The optimizer's own
    broadcast of updated parameters is recorded as one collective: this
    rank's parameters as input, the others' as output.
    """
    from torch.distributed.optim import ZeroRedundancyOptimizer
    model = make_model(seed=cfg.seed)
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                  lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)
    owned = sum(p.numel() * p.element_size() for g in opt.optim.param_groups for p in g["params"])
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for k in range(cfg.steps):
        batch = make_batch(cfg.batch_size, seq_len=cfg.seq_len, seed=cfg.seed + k)
        mine = shard_batch(batch, ring_chunk_sizes(cfg.batch_size, ctx.world_size), ctx.rank)
        opt.zero_grad()
        (model.per_example_loss(mine).sum() / cfg.batch_size).backward()
        flat = all_reduce(ctx, flat_grads(model), phase="gradient all-reduce")
        torch.nn.utils.vector_to_parameters(flat, [p.grad for p in model.parameters()])
        with counted(ctx, "ZeroRedundancyOptimizer.step (not observed: bytes computed from parameter ownership)",
                     "parameter broadcast",
                     sent=owned, recv=total - owned):
            opt.step()
    return flat_params(model)


@dataclass(frozen=True)
class TorchAndOurs:
    """One rank's final weights under torch's ZeroRedundancyOptimizer (whole), and our ZeRO-1 chunk."""
    theirs: torch.Tensor        # (P,) every parameter, after torch's broadcast
    ours: torch.Tensor          # this rank's chunk of our ZeRO-1 weights


def torch_and_ours(ctx: Context, spec: ZeroSpec) -> TorchAndOurs:
    """Rank function: torch's ZeRO-1 training, then ours, with the same config."""
    return TorchAndOurs(torch_zero_rank(ctx, spec.cfg), zero_rank(ctx, spec.cfg).chunk)


def compare_torch_zero(spec: ZeroSpec, results: list[TorchAndOurs]) -> Verdict:
    """torch's weights against one process and against ours; every rank's copy against rank 0's, bitwise."""
    cfg, theirs = spec.cfg, [r.theirs for r in results]
    ours = torch.cat([r.ours for r in results])
    tol, why = adam_tolerance(cfg, spec.world_size)
    checks = [close_check("ZeroRedundancyOptimizer == single-process Adam", theirs[0], reference_adam(cfg), tol, why),
              close_check("our ZeRO-1 == ZeroRedundancyOptimizer", ours, theirs[0], tol, why),
              exact_check("every rank holds the same weights after the broadcast", theirs,
                          [theirs[0]] * len(theirs), "broadcast copies exact bytes")]
    return Verdict(checks=checks, params={"steps": cfg.steps, "lr": cfg.lr})


TORCH_ZERO = Experiment(name="zero-1-vs-torch", chapter="03", world_sizes=(2, 3),
                        title="ZeRO-1 vs torch's ZeroRedundancyOptimizer vs single-process Adam",
                        spec=functools.partial(zero_spec, stage=1), ranks=torch_and_ours, compare=compare_torch_zero)


def torch_zero_report(world_size: int, *, cfg: ZeroConfig | None = None) -> Report:
    """Our ZeRO-1 vs torch.distributed.optim.ZeroRedundancyOptimizer vs one process: final weights."""
    return TORCH_ZERO.run_spec(zero_spec(world_size, 1, cfg=cfg))


DEMOS = [ZERO[s] for s in (1, 2, 3)] + [TORCH_ZERO]
