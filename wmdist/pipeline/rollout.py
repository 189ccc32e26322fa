"""Rollout training through a pipeline: one loss over a batch of trajectories, one optimizer step.

A trajectory's transitions are not optimizer steps. The learner forms a
single loss from E whole trajectories (here from E independent environments;
in imagination-based training they would be rolled out by the model from E
start states, and the accounting is the same) and takes one step. The
environments are independent, so they can be grouped into microbatches that
keep the pipeline busy; the time steps of one trajectory are causally linked
(each token attends to its past), so a trajectory never gets cut across
microbatches and its steps stay in order.

The demo runs that step on P pipeline ranks (1F1B, microbatches = groups of
whole trajectories) and compares the parameters after it with one process.
Two tempting alternatives are computed in one process and shown to be
different computations: cutting the trajectories along time into
microbatches (later windows lose their context), and one optimizer step per
transition (later transitions see parameters the earlier ones moved).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from wmdist.comm import Context
from wmdist.costs.rounding import FLOAT32_ROUNDOFF
from wmdist.costs.validate import require_int
from wmdist.course.experiment import Experiment, Verdict
from wmdist.pipeline.executor import StageRun, pipeline_rank
from wmdist.pipeline.plan import PipeWork, microbatch_sizes, require_stage_ranks
from wmdist.pipeline.schedules import Schedule, make_schedule
from wmdist.pipeline.stages import batch_for, gradient_tolerance, model_for, one_thread, reference
from wmdist.course.report import Report, close_check, differ_check, max_abs_error

LR = 0.05


@dataclass(frozen=True, kw_only=True)
class RolloutSpec:
    """The step decided before any process starts: a 1F1B schedule of M = 2P microbatches, E trajectories of T."""
    schedule: Schedule
    work: PipeWork
    lr: float = LR

    @property
    def world_size(self) -> int:
        return self.schedule.stages


@dataclass(frozen=True)
class RolloutRank:
    """One rank's part: its pipeline step (gradients of the one loss) and the parameters it owns after SGD."""
    run: StageRun
    stepped: dict[str, torch.Tensor]


def rollout_rank(ctx: Context, spec: RolloutSpec) -> RolloutRank:
    """Rank function: the pipeline computes the gradient of the one loss; this rank steps the parameters it owns."""
    result = pipeline_rank(ctx, spec.schedule, spec.work)
    owned = {n: p.detach() for n, p in model_for(spec.work).named_parameters() if n in result.grads}
    return RolloutRank(result, {n: p - spec.lr * result.grads[n] for n, p in owned.items()})      # one plain SGD step


def single_step(work: PipeWork, lr: float) -> dict[str, torch.Tensor]:
    """One process: the same loss over all E trajectories, one SGD step."""
    model, batch = model_for(work), batch_for(work)
    model.loss(batch).backward()
    return {n: (p - lr * p.grad).detach() for n, p in model.named_parameters()}


def step_per_transition(work: PipeWork, lr: float) -> dict[str, torch.Tensor]:
    """The mistake: T optimizer steps, one per time step's transitions (lr / T each, the same total step size)."""
    model, batch = model_for(work), batch_for(work)
    opt = torch.optim.SGD(model.parameters(), lr=lr / work.seq_len)
    for t in range(work.seq_len):
        opt.zero_grad()
        pred = model(batch["obs"], batch["actions"])                               # (E, T, O)
        (pred[:, t] - batch["next_obs"][:, t]).pow(2).mean().backward()           # only transition t's error
        opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def time_cut_gradient(work: PipeWork, windows: int) -> dict[str, torch.Tensor]:
    """The mistake: microbatches cut along time, each window run as a sequence of its own (its past is lost)."""
    model, batch = model_for(work), batch_for(work)
    for cut in torch.tensor_split(torch.arange(work.seq_len), windows):
        obs, actions, target = (batch[k][:, cut] for k in ("obs", "actions", "next_obs"))
        share = (model(obs, actions) - target).pow(2).sum() / target.numel() * len(cut) / work.seq_len
        share.backward()                              # shares of the same mean loss, scaled by the window length
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@dataclass(kw_only=True, frozen=True)
class RolloutResult:
    """The pipeline's one step against one process, and the two mistakes' distances from the right answer."""
    microbatch_envs: tuple[tuple[int, ...], ...]   # which environments (trajectories) each microbatch carries
    param_error: float                              # max |pipeline step - one-process step|
    param_tolerance: float
    time_cut_gap: float                             # max |time-cut gradient - full gradient|
    per_transition_gap: float                       # max |T small steps - one step|, parameters


def rollout_spec(world_size: int, *, environments: int | None = None, horizon: int = 8) -> RolloutSpec:
    """E = `environments` trajectories (default 2M) of `horizon` steps on a 1F1B pipeline of P = N ranks, checked."""
    m = 2 * require_int("world_size", world_size, 1)                   # microbatches: M = 2P
    require_int("horizon", horizon, 1, high=64)
    if environments is not None:
        try:
            require_int("environments", environments, m)
        except ValueError as err:
            raise ValueError(f"{err}: each of the M = 2P = {m} microbatches holds at least one whole "
                             f"trajectory") from None
    work = PipeWork(batch_size=2 * m if environments is None else environments, seq_len=horizon)
    schedule = make_schedule("1f1b", world_size, m)
    require_stage_ranks(world_size, schedule)
    work.check(schedule)
    return RolloutSpec(schedule=schedule, work=work)


def compare_rollout(spec: RolloutSpec, results: list[RolloutRank]) -> Verdict:
    """The pipeline's step against one process's; the two mistakes computed in one process and shown to differ."""
    work, m, lr = spec.work, spec.schedule.microbatches, spec.lr
    stepped = {n: v for r in results for n, v in r.stepped.items()}
    ref = reference(work, m)
    gtol = gradient_tolerance(work, ref.bound)
    with one_thread():                                  # the ranks' kernels
        right, cut, per_step = single_step(work, lr), time_cut_gradient(work, 2), step_per_transition(work, lr)
    names = sorted(right)
    ptol = lr * gtol + 2 * FLOAT32_ROUNDOFF * max(float(v.abs().max()) for v in right.values())
    sizes = microbatch_sizes(work.batch_size, m)
    envs = tuple(tuple(range(sum(sizes[:k]), sum(sizes[:k + 1]))) for k in range(m))
    data = RolloutResult(microbatch_envs=envs, param_error=max_abs_error([stepped[n] for n in names],
                                                                            [right[n] for n in names]), param_tolerance=ptol,
                         time_cut_gap=max_abs_error([cut[n] for n in names], [ref.grads[n] for n in names]),
                         per_transition_gap=max_abs_error([per_step[n] for n in names], [right[n] for n in names]))
    checks = [
        close_check("one step on the pipeline == one step in one process", [stepped[n] for n in names],
                    [right[n] for n in names], ptol,
                    "lr x the gradient's reordering bound, plus one rounding of each parameter"),
        differ_check("microbatches cut along time: a DIFFERENT gradient", [cut[n] for n in names],
                     [ref.grads[n] for n in names], 1000 * gtol,
                     "the second window's tokens no longer see the first window: not rounding"),
        differ_check("one optimizer step per transition: DIFFERENT parameters", [per_step[n] for n in names],
                     [right[n] for n in names], 1000 * ptol,
                     "later transitions are evaluated with parameters the earlier steps already moved")]
    params = {"environments": work.batch_size, "horizon": work.seq_len, "microbatches": m, "schedule": "1f1b",
              "lr": lr}
    return Verdict(checks=checks, params=params, data=data)


ROLLOUT_DEMO = Experiment(name="pp-rollout", chapter="05", world_sizes=(1, 2, 4), spec=rollout_spec,
                          title="Rollout training: one loss over whole trajectories, one step, on a 1F1B pipeline",
                          ranks=rollout_rank, compare=compare_rollout)


def rollout_demo(world_size: int, *, environments: int | None = None, horizon: int = 8) -> Report:
    """One optimizer step over E whole trajectories on a 1F1B pipeline of P = N ranks; two mistakes shown."""
    return ROLLOUT_DEMO.run_spec(rollout_spec(world_size, environments=environments, horizon=horizon))


DEMOS = [ROLLOUT_DEMO]
