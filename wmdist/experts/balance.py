"""Load balance: tokens per expert and per rank over a few training steps, with and without the balancing loss.

The busiest rank sets the step: every rank waits for the one whose experts got the most rows. The
layer starts from the skewed router (expert 0 favoured, the last expert never chosen) and trains
with SGD on a regression target, once with the balancing loss switched off and once with it on.
On N ranks and on one process: the tokens each expert got at every step must be the same integers,
each rank's rows and the busiest rank's count must equal `costs.experts.rank_loads` of them, and the
balancing loss must agree to its tolerance (first order at each step: a step's difference is not
carried into the next). What the loss does to the imbalance (max / mean tokens per expert) is
measured and reported, and checked to fall with it and not without.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from wmdist.comm import Context
from wmdist.course.compare import one_thread
from wmdist.costs import experts as ecosts
from wmdist.costs.validate import require_int, require_real
from wmdist.course.experiment import Experiment, RankSpec, Verdict
from wmdist.experts.dispatch import ExpertLayout, ep_forward, expert_group, global_counts, sync_gradients
from wmdist.experts.moe import MoEMLP, balance_loss, moe_forward
from wmdist.experts.reference import aux_tolerance
from wmdist.experts.spec import LayerCase, LayerSpec
from wmdist.course.report import Check, Count, counts_per_rank, fact_check


@dataclass(frozen=True, kw_only=True)
class BalanceSpec(RankSpec):
    """`steps` SGD steps of the skewed layer at learning rate `lr`, for each balancing-loss weight."""
    k: int = 1
    steps: int = 6
    lr: float = 0.5
    aux_weights: tuple[float, ...] = (0.0, 1.0)
    layer: LayerSpec = field(init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        require_int("steps", self.steps, 1, high=50)
        require_real("lr", self.lr)
        for w in self.aux_weights:
            require_real("aux_weight", w)
        case = LayerCase(router="skewed", k=require_int("k", self.k, 1))
        object.__setattr__(self, "layer", LayerSpec(world_size=self.world_size, cases=(case,)))

    def target(self, x: torch.Tensor) -> torch.Tensor:
        """What the layer learns to output: a fixed random linear map of its input (T, d) -> (T, d)."""
        w = torch.randn(x.shape[1], x.shape[1], generator=torch.Generator().manual_seed(77)) / x.shape[1] ** 0.5
        return torch.tanh(x @ w)


@dataclass(frozen=True, kw_only=True)
class TrainingBalance:
    """One training run (one balancing-loss weight): per step, the batch's tokens per expert and the loss."""
    aux_weight: float
    counts: tuple[tuple[int, ...], ...]     # [step][expert] over the whole batch
    rows: tuple[int, ...]                   # [step] rows this rank's experts received (on ranks; () on one process)
    aux: tuple[float, ...]                  # [step] this rank's share of the balancing loss (the whole on one)


@dataclass(frozen=True)
class BalanceRanks:
    runs: tuple[TrainingBalance, ...]


def _train(spec: BalanceSpec, weight: float, forward) -> TrainingBalance:
    """SGD on the layer; `forward(moe, x) -> (out, global counts, rows received)` is one process or the ranks."""
    layer = spec.layer
    moe = layer.layer(layer.cases[0])
    x, target = forward.inputs
    counts, rows, aux_values = [], [], []
    for _ in range(spec.steps):
        out, total, got = forward(moe, x)
        aux = balance_loss(out.routing.probs, total, tokens=layer.tokens, k=spec.k)
        task = (out.y - target).pow(2).sum() / (layer.tokens * layer.width)
        moe.zero_grad()
        (task + weight * aux).backward()
        forward.sync(moe)
        with torch.no_grad():
            for p in moe.parameters():
                p -= spec.lr * p.grad
        counts.append(tuple(total.tolist()))
        rows.append(got)
        aux_values.append(float(aux.detach()))
    return TrainingBalance(aux_weight=weight, counts=tuple(counts), rows=tuple(r for r in rows if r is not None),
                      aux=tuple(aux_values))


class _OneProcess:
    def __init__(self, spec: BalanceSpec):
        x, _ = spec.layer.inputs()
        self.inputs = (x, spec.target(x))

    def __call__(self, moe: MoEMLP, x: torch.Tensor):
        out = moe_forward(moe, x)
        return out, out.counts, None

    def sync(self, moe: MoEMLP) -> None:
        pass


class _OnRanks:
    def __init__(self, ctx: Context, spec: BalanceSpec):
        layer = spec.layer
        self.ctx, self.layout = ctx, ExpertLayout(ep=layer.world_size)
        self.ep = expert_group(ctx, self.layout, layer.experts)
        self.first, self.per = ctx.rank * layer.per_rank, layer.per_rank
        x, _ = layer.inputs()
        rows = layer.rows(ctx.rank)
        self.inputs = (x[rows], spec.target(x)[rows])

    def __call__(self, moe: MoEMLP, x: torch.Tensor):
        if len(moe.experts) != self.per:
            moe.keep_experts(self.first, self.per)
        res = ep_forward(moe, x, self.ep)
        return res.out, global_counts(self.ctx, res.out.counts), int(res.inputs.shape[0])

    def sync(self, moe: MoEMLP) -> None:
        sync_gradients(self.ctx, moe, self.layout)


def balance_rank(ctx: Context, spec: BalanceSpec) -> BalanceRanks:
    """Rank function: each weight's training run on this rank's tokens and experts."""
    torch.set_num_threads(1)
    forward = _OnRanks(ctx, spec)
    return BalanceRanks(tuple(_train(spec, w, forward) for w in spec.aux_weights))


def reference_runs(spec: BalanceSpec) -> list[TrainingBalance]:
    """The same training on one process, all tokens at once."""
    with one_thread():
        return [_train(spec, w, _OneProcess(spec)) for w in spec.aux_weights]


@dataclass(frozen=True, kw_only=True)
class BalanceResult:
    """What the figures read: per weight, the imbalance and the busiest rank's rows at every step."""
    aux_weights: tuple[float, ...]
    imbalance: tuple[tuple[float, ...], ...]     # [weight][step] max / mean tokens per expert
    busiest: tuple[tuple[int, ...], ...]         # [weight][step] the busiest rank's rows
    counts: tuple[tuple[tuple[int, ...], ...], ...]


def compare_balance(spec: BalanceSpec, results: list[BalanceRanks]) -> Verdict:
    """Tokens per expert per step exact, rows per rank and the busiest rank's exact, the loss to its tolerance."""
    checks: list[Check] = []
    exact: list[Count] = []
    n = spec.world_size
    imbalance, busiest, counts = [], [], []
    for i, ref in enumerate(reference_runs(spec)):
        counts.append(ref.counts)
        runs = [r.runs[i] for r in results]
        case = f"balancing loss x{ref.aux_weight:g}"
        for step, want in enumerate(ref.counts):
            loads = ecosts.rank_loads(list(want), n)
            for e, c in enumerate(want):
                exact.append(Count(quantity="tokens at this expert", rank=0, measured=runs[0].counts[step][e], predicted=c, step=step,
                                   case=f"{case}, expert {e}"))
            exact += counts_per_rank("rows at this rank's experts", [r.rows[step] for r in runs], loads, step=step,
                                     case=case)
            exact.append(Count(quantity="busiest rank's rows", rank=0, measured=max(r.rows[step] for r in runs), predicted=max(loads), step=step,
                               case=case))
            got = sum(r.aux[step] for r in runs)
            checks.append(Check(name=f"{case}, step {step}: balancing loss == one process", error=abs(got - ref.aux[step]),
                                tolerance=aux_tolerance(spec.layer, ref.aux[step]),
                                reason="T positive terms in per-rank parts (first order at this step)"))
        imbalance.append(tuple(ecosts.imbalance(c) for c in ref.counts))
        busiest.append(tuple(max(ecosts.rank_loads(list(c), n)) for c in ref.counts))
    on = [im for w, im in zip(spec.aux_weights, imbalance) if w > 0]
    off = [im for w, im in zip(spec.aux_weights, imbalance) if w == 0]
    if on and off:
        checks.append(fact_check("with the balancing loss the imbalance falls, without it it does not fall as far",
                                 holds=on[0][-1] < on[0][0] and on[0][-1] < off[0][-1],
                                 reason=f"max/mean tokens per expert: with {on[0][0]:.2f} -> {on[0][-1]:.2f}, "
                                        f"without {off[0][0]:.2f} -> {off[0][-1]:.2f}"))
    data = BalanceResult(aux_weights=spec.aux_weights, imbalance=tuple(imbalance), busiest=tuple(busiest),
                         counts=tuple(counts))
    params = {"k": spec.k, "steps": spec.steps, "lr": spec.lr, "aux weights": list(spec.aux_weights)}
    return Verdict(checks=checks, exact=exact, params=params, data=data)


def balance_spec(world_size: int) -> BalanceSpec:
    return BalanceSpec(world_size=world_size)


BALANCE_DEMO = Experiment(name="moe-balance", chapter="10", world_sizes=(1, 2, 4), spec=balance_spec,
                          ranks=balance_rank, compare=compare_balance,
                          title="Load balance: tokens per expert and rank over training steps, with the balancing loss")

DEMOS = [BALANCE_DEMO]
