"""ZeRO on real ranks, checked: bytes held and sent against the formulas, weights against Adam.

zero_memory_report runs wmdist.memory.zero at one stage and compares what each
rank's tensors hold with the memory model (wmdist.memory.footprint), what its
ledger sent with costs.zero_step_bytes, and the final weights with
torch.optim.Adam on one process. torch_zero_report sets our ZeRO-1 against
torch's own ZeroRedundancyOptimizer.
"""
from __future__ import annotations

import functools
import time

import torch

from wmdist import costs
from wmdist.comm import Context, all_reduce, counted
from wmdist.memory.footprint import MemoryConfig, per_rank_bytes
from wmdist.memory.transient import POINTS, zero_step_held
from wmdist.memory.zero import HELD_KINDS, ZeroConfig, zero_rank
from wmdist.memory.zero_reference import adam_tolerance, reference_adam
from wmdist.models import flat_grads, flat_params, make_batch, make_model, shard_batch
from wmdist.report import Demo, Report, close_check, counts_per_rank, exact_check
from wmdist.runtime import run


def _predicted_held(numel: int, world_size: int, stage: int, rank: int) -> dict[str, int]:
    return per_rank_bytes(MemoryConfig(params=numel, optimizer="adam", zero_stage=stage, dp=world_size), rank)


def zero_memory_report(world_size: int, stage: int, cfg: ZeroConfig | None = None) -> Report:
    """Run ZeRO-`stage` on `world_size` ranks: held bytes and ledger vs formulas, weights vs Adam."""
    costs.require_int("world_size", world_size, 1)
    costs.require_choice("stage", stage, costs.ZERO_STAGES)
    cfg = ZeroConfig(stage=stage) if cfg is None else cfg
    if cfg.batch_size < world_size:
        raise ValueError(f"world_size must be <= batch_size {cfg.batch_size} (every rank needs a row), "
                         f"got {world_size}")
    if cfg.stage != stage:
        raise ValueError(f"cfg.stage={cfg.stage} but stage={stage}")
    start = time.perf_counter()
    out = run(zero_rank, world_size, cfg)
    seconds = time.perf_counter() - start
    got, expected = torch.cat([o["chunk"] for o in out]), reference_adam(cfg)
    tol, why = adam_tolerance(cfg, world_size)
    checks = [close_check(f"ZeRO-{stage} weights == single-process torch.optim.Adam", got, expected, tol, why)]
    P = expected.numel()
    predicted = [_predicted_held(P, world_size, stage, r) for r in range(world_size)]
    exact = []
    for kind in HELD_KINDS:
        exact += counts_per_rank("held bytes", [o["held"][kind] for o in out], [p[kind] for p in predicted], case=kind)
    phases = [costs.zero_step_bytes(P, world_size, r, stage) for r in range(world_size)]
    for phase in phases[0]:
        exact += counts_per_rank("bytes sent per step", [o["phases"].get(phase, {}).get("bytes_sent", 0) for o in out],
                                 [p[phase] for p in phases], phase=phase)
    exact += counts_per_rank("rounds per step", [o["rounds"] for o in out],
                             [costs.zero_step_rounds(world_size, stage)] * world_size)
    exact += _during_step(out, P, world_size, stage)
    return Report(f"zero-{stage}", world_size, checks, exact, seconds,
                  {"stage": stage, "params": P, "steps": cfg.steps, "batch_size": cfg.batch_size, "lr": cfg.lr})


def _during_step(out: list[dict], P: int, world_size: int, stage: int) -> list:
    """Held bytes at each probe point of the last step, and the peak over them, against zero_step_held.

    The prediction is what a correct ZeRO holds: a run that keeps a full copy
    alive too long (ZeroConfig.keep_gathered) fails these counts.
    """
    predicted = [zero_step_held(P, world_size, r, stage) for r in range(world_size)]
    rows = []
    for point in POINTS:
        for kind in HELD_KINDS:
            rows += counts_per_rank("held bytes during the step", [o["during"][point][kind] for o in out],
                                    [p[point][kind] for p in predicted], phase=point, case=kind)
    peak = lambda held: max(sum(h.values()) for h in held.values())   # noqa: E731 - the largest total of a step
    rows += counts_per_rank("model-state bytes", [sum(o["held"].values()) for o in out],
                            [sum(_predicted_held(P, world_size, stage, r)[k] for k in HELD_KINDS)
                             for r in range(world_size)], case="steady (between steps)")
    rows += counts_per_rank("model-state bytes", [peak(o["during"]) for o in out],
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
    model = make_model(cfg.seed)
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                  lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)
    owned = sum(p.numel() * p.element_size() for g in opt.optim.param_groups for p in g["params"])
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for k in range(cfg.steps):
        batch = make_batch(cfg.batch_size, cfg.seq_len, seed=cfg.seed + k)
        mine = shard_batch(batch, costs.ring_chunk_sizes(cfg.batch_size, ctx.world_size), ctx.rank)
        opt.zero_grad()
        (model.per_example_loss(mine).sum() / cfg.batch_size).backward()
        flat = all_reduce(ctx, flat_grads(model), "gradient all-reduce")
        torch.nn.utils.vector_to_parameters(flat, [p.grad for p in model.parameters()])
        with counted(ctx, "ZeroRedundancyOptimizer.step (not observed: bytes computed from parameter ownership)",
                     "parameter broadcast",
                     sent=owned, recv=total - owned):
            opt.step()
    return flat_params(model)


def torch_zero_report(world_size: int, cfg: ZeroConfig | None = None) -> Report:
    """Our ZeRO-1 vs torch.distributed.optim.ZeroRedundancyOptimizer vs one process: final weights."""
    costs.require_int("world_size", world_size, 1)
    cfg = ZeroConfig(stage=1) if cfg is None else cfg
    start = time.perf_counter()
    theirs = run(torch_zero_rank, world_size, cfg)
    ours = torch.cat([o["chunk"] for o in run(zero_rank, world_size, cfg)])
    seconds = time.perf_counter() - start
    tol, why = adam_tolerance(cfg, world_size)
    checks = [close_check("ZeroRedundancyOptimizer == single-process Adam", theirs[0], reference_adam(cfg), tol, why),
              close_check("our ZeRO-1 == ZeroRedundancyOptimizer", ours, theirs[0], tol, why),
              exact_check("every rank holds the same weights after the broadcast", list(theirs),
                          [theirs[0]] * len(theirs), "broadcast copies exact bytes")]
    return Report("zero-1-vs-torch", world_size, checks, [], seconds, {"steps": cfg.steps, "lr": cfg.lr})


DEMOS = [Demo(f"zero-{s}", f"ZeRO-{s}: bytes held per rank and sent per step vs formula, weights vs Adam",
              functools.partial(zero_memory_report, stage=s), world_sizes=(1, 2, 3, 4), chapter="03")
         for s in (1, 2, 3)]
DEMOS.append(Demo("zero-1-vs-torch", "ZeRO-1 vs torch's ZeroRedundancyOptimizer vs single-process Adam",
                  torch_zero_report, world_sizes=(2, 3), chapter="03"))
