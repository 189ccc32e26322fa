"""Our executor against torch.distributed.pipelining on the same stages: same loss, gradients and order of work.

On each rank the same StageModules are wrapped in torch's PipelineStage
(built by hand, with static shapes so that torch runs no extra forward to
infer them), and torch's ScheduleGPipe, Schedule1F1B or
ScheduleInterleaved1F1B runs one step with our loss function
(microbatch_loss, scale_grads=False: the same scaling as ours). Each
stage's forward_one_chunk and backward_one_chunk are wrapped to record the
order torch actually runs them in. torch's stages communicate on the default
process group inside step(); the ledger gets one record per step whose
bytes are the boundary tensors this rank's stages send and receive
(plan.transfer_counts times the microbatch tensor size), not an observation.

The demo is an `Experiment` on chapter 05's `Plans`: each rank runs every case
with our executor and then with torch's schedule, in one call, timing both.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from wmdist.comm import Context, counted
from wmdist.costs.pipeline import ScheduleName
from wmdist.course.experiment import Experiment, Verdict
from wmdist.pipeline.spec import Plans
from wmdist.pipeline.executor import StageRun, pipeline_rank
from wmdist.pipeline.plan import PipeWork, require_stage_ranks, transfer_counts
from wmdist.pipeline.schedules import Schedule, make_schedule, parse_token
from wmdist.pipeline.stages import StageModule, batch_for, microbatch_loss, model_for
from wmdist.course.report import Check, Count, Report, counts_per_rank, exact_check, max_abs_error
from wmdist.runtime import run


@dataclass(frozen=True)
class TorchRun:
    """One rank's step under torch's schedule."""
    rank: int
    # tokens with stage ("s1F3"), in the order torch ran them (compared as the schedule writes them)
    order: tuple[str, ...]
    loss: torch.Tensor | None           # () on the last stage's rank: the sum of the microbatch losses
    grads: dict[str, torch.Tensor]      # gradient of every parameter this rank owns


def torch_pipeline_rank(ctx: Context, schedule: Schedule, work: PipeWork) -> TorchRun:
    """Rank function: one step of torch's schedule named like `schedule`, on hand-built PipelineStages."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    P, n, M = schedule.stages, schedule.virtual_stages, schedule.microbatches
    model, batch = model_for(work), batch_for(work)
    b, T, H, D_out = work.batch_size // M, work.seq_len, model.cfg.width, model.cfg.obs_dim
    order: list[str] = []
    stages = []
    for s in range(ctx.rank, n, P):
        module = StageModule(model, s, n)
        hidden = torch.zeros(b, T, H)                                                  # one microbatch's boundary
        inputs = (batch["obs"][:b], batch["actions"][:b]) if s == 0 else hidden.clone().requires_grad_(True)
        output = torch.zeros(b, T, D_out) if module.last else hidden
        stage = PipelineStage(module, s, n, torch.device("cpu"), input_args=inputs,
                              output_args=output.clone().requires_grad_(True))
        _record(stage, s, order)
        stages.append(stage)
    loss_fn = _LossFn(work.batch_size)
    kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved": ScheduleInterleaved1F1B}[schedule.name]
    sched = kind(stages if schedule.name == "interleaved" else stages[0], M, loss_fn=loss_fn, scale_grads=False)
    losses: list[torch.Tensor] = []
    first, last = ctx.rank == 0, ctx.rank == (n - 1) % P
    counts, nbytes = transfer_counts(schedule, ctx.rank), 4 * b * T * H
    label = "torch.distributed.pipelining step (p2p inside; bytes = boundary tensors, from the schedule)"
    with counted(ctx, label, "torch/step", kind="p2p",
                 sent=nbytes * (counts["activation sends"] + counts["gradient sends"]),
                 recv=nbytes * (counts["activation receives"] + counts["gradient receives"])):
        args: tuple[Any, ...] = (batch["obs"], batch["actions"]) if first else ()
        sched.step(*args, **({"target": batch["next_obs"], "losses": losses} if last else {}))
    loss = sum(losses, torch.zeros(())).detach() if last else None       # added up as our executor does
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return TorchRun(ctx.rank, tuple(order), loss, grads)


class _LossFn:
    """torch's loss_fn(output, target): our microbatch_loss with the full batch size (a class: it pickles)."""

    def __init__(self, batch_size: int):
        self.batch_size = batch_size

    def __call__(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return microbatch_loss(pred, target, self.batch_size)


def _record(stage: Any, s: int, order: list[str]) -> None:
    """Wrap a PipelineStage's forward_one_chunk / backward_one_chunk to log ("s<s>F<m>", "s<s>B<m>") as they run."""
    for method, kind in (("forward_one_chunk", "F"), ("backward_one_chunk", "B")):
        original = getattr(stage, method)

        def logged(chunk_id: int, *args: Any, _original: Any = original, _kind: str = kind, **kwargs: Any) -> Any:
            order.append(f"s{s}{_kind}{chunk_id}")
            return _original(chunk_id, *args, **kwargs)
        setattr(stage, method, logged)


@dataclass(kw_only=True, frozen=True)
class Comparison:
    """Ours vs torch for one schedule: each rank's order of work, and how far apart losses and gradients are."""
    schedule: str
    ours: tuple[tuple[str, ...], ...]          # ours[r]: rank r's actions as run by our executor
    theirs: tuple[tuple[str, ...], ...]        # theirs[r]: as run by torch's schedule
    loss_error: float
    grad_error: float


def check_torch_plan(world_size: int, name: ScheduleName, microbatches: int, chunks: int,
                     work: PipeWork) -> Schedule:
    """Build the schedule and refuse what torch's schedules cannot run the same way, before any process starts."""
    schedule = make_schedule(name, world_size, microbatches, chunks=chunks)
    require_stage_ranks(world_size, schedule)
    work.check(schedule)
    if world_size < 2:
        raise ValueError(f"world_size must be >= 2 to compare with torch.distributed.pipelining, got {world_size}")
    if work.batch_size % microbatches:
        raise ValueError(f"batch_size ({work.batch_size}) must be a multiple of microbatches ({microbatches}): "
                         f"torch splits the batch into equal microbatches")
    if work.forward_only or work.slot_seconds or work.repeats != 1:
        raise ValueError("the torch comparison runs one plain training step: forward_only=False, slot_seconds=0, "
                         "repeats=1")
    if name == "1f1b" and microbatches < world_size:
        raise ValueError(f"torch's Schedule1F1B needs microbatches >= stages, got M={microbatches}, P={world_size}")
    return schedule


@dataclass(frozen=True)
class BothRuns:
    """One rank's step of every case twice: our executor, then torch's schedule."""
    ours: tuple[StageRun, ...]
    theirs: tuple[TorchRun, ...]


def both_rank(ctx: Context, plans: Plans) -> BothRuns:
    """Rank function: each case with our executor, then with torch.distributed.pipelining, on the same stages."""
    ours, theirs = [], []
    for schedule, work in plans.cases:
        ours.append(pipeline_rank(ctx, schedule, work))
        theirs.append(torch_pipeline_rank(ctx, schedule, work))
    return BothRuns(tuple(ours), tuple(theirs))


def comparisons(plans: Plans, results: list[BothRuns]) -> list[Comparison]:
    """Per case: each rank's order of work under both, and how far the losses and gradients are apart."""
    out = []
    for k, (schedule, _) in enumerate(plans.cases):
        ours, theirs = [r.ours[k] for r in results], [r.theirs[k] for r in results]
        mine = {n: v for r in ours for n, v in r.grads.items()}
        torch_grads = {n: v for r in theirs for n, v in r.grads.items()}
        grad_error = max_abs_error([mine[n] for n in sorted(mine)],
                                   [torch_grads.get(n, torch.zeros(0)) for n in sorted(mine)])
        loss_error = max_abs_error(ours[-1].loss, theirs[-1].loss)
        out.append(Comparison(schedule=schedule.name, ours=tuple(r.order for r in ours),
                              theirs=tuple(tuple(schedule.token(parse_token(t)) for t in r.order) for r in theirs),
                              loss_error=loss_error,
                              grad_error=grad_error))
    return out


def compare_with_torch(world_size: int, name: ScheduleName, microbatches: int, *, chunks: int = 1,
            work: PipeWork | None = None) -> Comparison:
    """Run `name` on `world_size` ranks with our executor and with torch's schedule; compare everything.

    A helper for tests of one schedule at a time: it calls `runtime.run` itself; the demo is TORCH_DEMO.
    """
    work = work or PipeWork(batch_size=2 * microbatches)
    schedule = check_torch_plan(world_size, name, microbatches, chunks, work)
    plans = Plans(world_size=world_size, cases=((schedule, work),))
    return comparisons(plans, run(both_rank, world_size, plans))[0]


def torch_spec(world_size: int) -> Plans:
    """GPipe, 1F1B and interleaved 1F1B (v = 2 where the blocks allow), M = 2P, batch 2M, checked against torch's."""
    chunks = 2 if 2 * world_size <= PipeWork().layers else 1
    cases = [(name, 2 * world_size, v) for name, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", chunks))]
    works = [PipeWork(batch_size=2 * m) for _, m, _ in cases]
    return Plans(world_size=world_size, cases=tuple((check_torch_plan(world_size, name, m, v, work), work)
                                                    for (name, m, v), work in zip(cases, works)))


def compare_torch(plans: Plans, results: list[BothRuns]) -> Verdict:
    """Losses and gradients bitwise equal torch's; every rank ran the same actions in torch's order."""
    why = "same stages, same loss, same order: torch runs the very same float operations"
    checks: list[Check] = []
    exact: list[Count] = []
    found = comparisons(plans, results)
    for c in found:
        checks.append(exact_check(f"{c.schedule}: loss == torch's", c.loss_error, 0.0, why))
        checks.append(exact_check(f"{c.schedule}: every gradient == torch's", c.grad_error, 0.0, why))
        exact += counts_per_rank("actions in torch's order", [sum(a == b for a, b in zip(o, t)) for o, t in
                                                              zip(c.ours, c.theirs)],
                                 [len(t) for t in c.theirs], case=c.schedule)
        exact += counts_per_rank("actions run", [len(o) for o in c.ours], [len(t) for t in c.theirs], case=c.schedule)
    params = {"schedules": [f"{s.name} M={s.microbatches} v={s.chunks}" for s, _ in plans.cases]}
    return Verdict(checks=checks, exact=exact, params=params, data=tuple(found))


TORCH_DEMO = Experiment(name="pp-vs-torch", chapter="05", world_sizes=(2, 4), spec=torch_spec,
                        title="Pipeline executor vs torch.distributed.pipelining (GPipe, 1F1B, interleaved)",
                        ranks=both_rank, compare=compare_torch)


def torch_demo(world_size: int) -> Report:
    """GPipe, 1F1B and interleaved 1F1B: our executor vs torch.distributed.pipelining, per rank order and values."""
    return TORCH_DEMO.run(world_size)


DEMOS = [TORCH_DEMO]
