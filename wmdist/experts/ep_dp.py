"""Expert parallelism with data parallelism: the MoE world model trained on an ep x dp mesh == one process.

Rank r holds trajectories [r B/N, (r+1) B/N) and is expert-parallel rank r % ep of replica r // ep
(`dispatch.ExpertLayout`): the ep ranks of a replica share E experts, E/ep each, and every replica
holds all E. Each step: forward with the MoE block's tokens dispatched inside the replica, the
balancing loss's counts summed over all ranks, backward, then `dispatch.sync_gradients`: the dense
parameters (embedding, attention, LayerNorms, router, head) all-reduced over all N ranks, an
expert's only over the dp ranks holding it. After a few SGD steps every parameter a rank holds must
equal one process's (tolerance below), the routing of every step must be the same integers, and
every all-reduce's and all-to-all's bytes must equal their formulas.

Tolerance, per parameter, summed over the steps: lr times the gradient's first-order allowance
2(K-1) u max|g| (K = max(3d, F, B*T): the block's longest reordered sums, as chapter 09 has them),
plus p - lr g rounded twice on each side, 2 u (lr max|g| + max|p|). Like chapter 09's, it does not
carry an early step's difference through later gradients: a first-order allowance.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from wmdist.comm import Context
from wmdist.course.compare import bound_ratio, one_thread, reordered_terms, worst
from wmdist.costs import experts as ecosts
from wmdist.costs.collectives import ring_allreduce_bytes
from wmdist.costs.rounding import FLOAT32_ROUNDOFF, reordered_sum_bound
from wmdist.costs.validate import require_int, require_real
from wmdist.course.experiment import Experiment, RankSpec, Verdict
from wmdist.experts.dispatch import ExpertLayout, ep_forward, expert_group, global_counts, is_expert, sync_gradients
from wmdist.experts.moe import MoEConfig, MoEWorldModel, balance_loss, make_moe_model, moe_forward
from wmdist.models.world import make_batch
from wmdist.course.report import Check, Count, counts_per_rank, exact_check

WHY = ("per step: lr 2(K-1) 2^-24 max|g| + 2 2^-24 (lr max|g| + max|p|), K = max(3d, F, B*T) (first order); "
       "in units of each tensor's tolerance")


@dataclass(frozen=True, kw_only=True)
class MeshTrainSpec(RankSpec):
    """`steps` SGD steps of the MoE world model on ep x dp = `world_size` ranks, B trajectories of T steps."""
    ep: int
    steps: int = 3
    lr: float = 0.1
    batch: int = 8
    seq_len: int = 4
    aux_weight: float = 0.1
    seed: int = 0
    model: MoEConfig = field(default_factory=MoEConfig)
    layout: ExpertLayout = field(init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        require_int("steps", self.steps, 1, high=20)
        require_real("lr", self.lr)
        require_real("aux_weight", self.aux_weight)
        if self.world_size % require_int("ep", self.ep, 1):
            raise ValueError(f"ep={self.ep} must divide the world size {self.world_size} (ep x dp ranks)")
        ecosts.experts_per_rank(self.model.experts, self.ep)
        if require_int("batch", self.batch, 1) % self.world_size:
            raise ValueError(f"batch={self.batch} trajectories must be divisible by the world size {self.world_size}")
        require_int("seq_len", self.seq_len, 1, high=self.model.max_len)
        object.__setattr__(self, "layout", ExpertLayout(ep=self.ep, dp=self.world_size // self.ep))

    @property
    def tokens(self) -> int:
        return self.batch * self.seq_len


@dataclass(frozen=True, kw_only=True)
class MeshTrainRank:
    """One rank after the steps: its parameters, its routing at every step, its bytes per step and phase."""
    params: dict[str, torch.Tensor]
    experts: tuple[torch.Tensor, ...]                    # [step] (B T / N, k) its tokens' routing
    bytes: tuple[dict[str, tuple[int, int]], ...]        # [step] phase -> (sent, received)


def _step_loss(spec: MeshTrainSpec, model: MoEWorldModel, batch: dict, mix, total) -> tuple[torch.Tensor, torch.Tensor]:
    pred, out = model(batch["obs"], batch["actions"], mix)
    task = (pred - batch["next_obs"]).pow(2).sum() / (spec.tokens * spec.model.obs_dim)
    aux = balance_loss(out.routing.probs, total(out.counts), tokens=spec.tokens, k=spec.model.k)
    return task + spec.aux_weight * aux, out.routing.experts


def _sgd(model: MoEWorldModel, lr: float) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad


def mesh_train_rank(ctx: Context, spec: MeshTrainSpec) -> MeshTrainRank:
    """Rank function: the steps on this rank's trajectories and experts."""
    torch.set_num_threads(1)
    layout, cfg = spec.layout, spec.model
    model = make_moe_model(cfg, seed=spec.seed)
    per = cfg.experts // spec.ep
    first = layout.ep_ranks(ctx.rank).index(ctx.rank) * per
    model.moe.keep_experts(first, per)
    ep = expert_group(ctx, layout, cfg.experts)
    rows = slice(ctx.rank * spec.batch // spec.world_size, (ctx.rank + 1) * spec.batch // spec.world_size)
    batch = {k: v[rows] for k, v in make_batch(spec.batch, seq_len=spec.seq_len, seed=spec.seed).items()}
    routes, traffic = [], []
    for _ in range(spec.steps):
        ctx.ledger.reset()
        model.zero_grad()
        loss, ids = _step_loss(spec, model, batch, lambda moe, x: ep_forward(moe, x, ep).out,
                               lambda c: global_counts(ctx, c))
        loss.backward()
        sync_gradients(ctx, model, layout)
        _sgd(model, spec.lr)
        routes.append(ids)
        traffic.append({p: (t["bytes_sent"], t["bytes_recv"]) for p, t in ctx.ledger.by_phase(kind=None).items()})
    return MeshTrainRank(params={n: p.detach() for n, p in model.named_parameters()}, experts=tuple(routes),
                         bytes=tuple(traffic))


@dataclass(frozen=True, kw_only=True)
class MeshTrainReference:
    """One process, the whole batch, the same steps: parameters after them, each step's routing, the tolerances."""
    params: dict[str, torch.Tensor]
    experts: tuple[torch.Tensor, ...]        # [step] (B T, k)
    tolerances: dict[str, float]             # per parameter, summed over the steps


def mesh_train_reference(spec: MeshTrainSpec) -> MeshTrainReference:
    """The steps on one process and one thread; each step's allowance from its gradient and parameters."""
    u, cfg = FLOAT32_ROUNDOFF, spec.model
    terms = reordered_terms(cfg.width, cfg.hidden, spec.tokens)
    with one_thread():
        model = make_moe_model(cfg, seed=spec.seed)
        batch = make_batch(spec.batch, seq_len=spec.seq_len, seed=spec.seed)
        tol = {n: 0.0 for n, _ in model.named_parameters()}
        routes = []
        for _ in range(spec.steps):
            model.zero_grad()
            loss, ids = _step_loss(spec, model, batch, lambda moe, x: moe_forward(moe, x), lambda c: c)
            loss.backward()
            for p in model.parameters():
                p.grad = p.grad if p.grad is not None else torch.zeros_like(p)
            _sgd(model, spec.lr)
            routes.append(ids)
            for n, p in model.named_parameters():
                g, top = float(p.grad.abs().max()), float(p.detach().abs().max())
                tol[n] += spec.lr * reordered_sum_bound(terms, g) + 2 * u * (spec.lr * g + top)
    return MeshTrainReference(params={n: p.detach() for n, p in model.named_parameters()}, experts=tuple(routes),
                              tolerances=tol)


@dataclass(frozen=True, kw_only=True)
class GradientWire:
    """One rank's gradient all-reduces per step: the payload each carries (what the ledger records for torch's
    built-in all-reduce) and what a ring all-reduce of that payload sends, 2(n-1)/n of it over its n ranks,
    summed tensor by tensor (`costs.collectives.ring_allreduce_bytes`). `plain_dp_*`: the expert gradients
    if every rank held all E experts and all-reduced them over all N ranks, as plain data parallelism does."""
    dense_payload: int
    dense_ring: int
    expert_payload: int
    expert_ring: int
    plain_dp_expert_payload: int
    plain_dp_expert_ring: int


def gradient_wire(spec: MeshTrainSpec, *, rank: int = 0) -> GradientWire:
    """Payload and ring wire bytes of `rank`'s dense and expert gradient all-reduces (formulas; no run)."""
    numel = {n: p.numel() for n, p in make_moe_model(spec.model, seed=spec.seed).named_parameters()}
    dense = [v for n, v in numel.items() if not is_expert(n)]
    experts = [v for n, v in numel.items() if is_expert(n)]
    per = spec.model.experts // spec.ep                 # a rank holds E/ep experts, all of one shape
    held = [v for n, v in numel.items() if is_expert(n) and int(n.split(".experts.")[1].split(".")[0]) < per]
    n, dp = spec.world_size, spec.layout.dp
    dp_rank = spec.layout.replica_ranks(rank).index(rank)

    def ring(sizes: list[int], ranks: int, r: int) -> int:
        return sum(ring_allreduce_bytes(v, ranks, r) for v in sizes) if ranks > 1 else 0
    return GradientWire(dense_payload=4 * sum(dense), dense_ring=ring(dense, n, rank),
                        expert_payload=4 * sum(held) if dp > 1 else 0, expert_ring=ring(held, dp, dp_rank),
                        plain_dp_expert_payload=4 * sum(experts),
                        plain_dp_expert_ring=ring(experts, n, rank))


def mesh_counts(spec: MeshTrainSpec, results: list[MeshTrainRank], ref: MeshTrainReference) -> list[Count]:
    """Per step and rank: gradient all-reduce payloads and the dispatch's bytes, against their formulas.

    The all-reduces are torch's own (gloo picks the algorithm), so the ledger holds their payload, not wire
    bytes; `gradient_wire` gives what a ring would send for the same payload."""
    shapes = {n: p.numel() * 4 for n, p in make_moe_model(spec.model, seed=spec.seed).named_parameters()}
    dense = sum(b for n, b in shapes.items() if not is_expert(n))
    n_ranks, per_tokens = spec.world_size, spec.tokens // spec.world_size
    out: list[Count] = []
    for step, ids in enumerate(ref.experts):
        expert_bytes = [sum(b for n, b in shapes.items() if is_expert(n) and n in r.params) if spec.layout.dp > 1
                        else 0 for r in results]
        out += counts_per_rank("payload", [r.bytes[step].get("dense grads", (0, 0))[0] for r in results],
                               [dense] * n_ranks, phase="dense grads", step=step)
        out += counts_per_rank("payload", [r.bytes[step].get("expert grads", (0, 0))[0] for r in results],
                               expert_bytes, phase="expert grads", step=step)
        sent = []
        for g in range(spec.layout.dp):
            group = spec.layout.ep_ranks(g * spec.ep)
            matrix = ecosts.rank_matrix([ids[r * per_tokens:(r + 1) * per_tokens].reshape(-1).tolist()
                                         for r in group], spec.model.experts)
            sent += [t.dispatch[0] for t in ecosts.rank_traffic(matrix, spec.model.width, 4)]
        out += counts_per_rank("bytes sent", [r.bytes[step]["dispatch forward"][0] for r in results], sent,
                               phase="dispatch", step=step)
    return out


def compare_mesh_train(spec: MeshTrainSpec, results: list[MeshTrainRank]) -> Verdict:
    """Parameters after the steps against one process; routing every step exact; bytes against formulas."""
    ref = mesh_train_reference(spec)
    rows = [(bound_ratio(p, ref.params[n], ref.tolerances[n]), f"{n} on rank {r}")
            for r, res in enumerate(results) for n, p in res.params.items()]
    ratio, where = rows[worst([x for x, _ in rows])]
    checks = [exact_check(f"routing at step {s} == one process", torch.cat([r.experts[s] for r in results]),
                          ref.experts[s], "which experts each token chose: integers, compared exactly")
              for s in range(spec.steps)]
    checks.append(Check(name=f"every parameter after {spec.steps} steps == one process", error=ratio, tolerance=1.0,
                        reason=WHY, detail=where))
    params = {"ep": spec.ep, "dp": spec.layout.dp, "experts": spec.model.experts, "k": spec.model.k,
              "steps": spec.steps, "lr": spec.lr, "batch": spec.batch, "seq_len": spec.seq_len}
    return Verdict(checks=checks, exact=mesh_counts(spec, results, ref), params=params)


def mesh_train_spec(world_size: int) -> MeshTrainSpec:
    """ep = 2 where there are two ranks or more (so 4 ranks are a 2 x 2 mesh), else 1."""
    return MeshTrainSpec(world_size=world_size, ep=2 if world_size >= 2 else 1)


EP_DP_DEMO = Experiment(name="moe-ep-dp", chapter="10", world_sizes=(1, 2, 4), spec=mesh_train_spec,
                        ranks=mesh_train_rank, compare=compare_mesh_train,
                        title="EP x DP: dense grads over all ranks, expert grads over their replicas; "
                              "steps == one process")

DEMOS = [EP_DP_DEMO]
