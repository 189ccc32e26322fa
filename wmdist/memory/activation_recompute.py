"""Activation checkpointing on the recurrent dynamics: activation bytes kept vs work recomputed.

(Not to be confused with wmdist.memory.sharded_checkpoint, which saves training state to disk.)

Backward needs some tensors from forward: for each step of the DynamicsCell
unroll, the Linear's input [h, z, a] and the tanh's output. Kept for all T
steps, they grow linearly with the rollout. torch.utils.checkpoint instead
keeps only each segment's input state and runs the segment's forward again
during backward: fewer bytes resident, one more forward of compute.

We count bytes exactly with torch.autograd.graph.saved_tensors_hooks: every
tensor autograd saves passes through our pack hook, and we add up distinct
storages, leaving out the parameters and the rollout's inputs (which exist
whatever we do). We use the reentrant variant on purpose: it saves the
segment inputs through save_for_backward, so the hook sees them; the
non-reentrant variant keeps the same inputs alive in a closure the hook
cannot see, which would make the count look better than it is.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch
from torch.utils.checkpoint import checkpoint

from wmdist.course.compare import bound_ratio, worst
from wmdist.costs.rounding import reordered_sum_bound
from wmdist.costs.validate import require_int
from wmdist.models.world import DynamicsCell, WorldModelConfig
from wmdist.course.experiment import Experiment, Verdict
from wmdist.course.report import Check, Report, counts_per_rank, exact_check


@dataclass(frozen=True, kw_only=True)
class RolloutConfig:
    """A DynamicsCell unrolled over T steps for B sequences; `segment` steps per checkpoint (0 = none)."""
    batch: int = 32
    seq_len: int = 64
    segment: int = 8
    seed: int = 0
    model: WorldModelConfig = field(default_factory=WorldModelConfig)

    def __post_init__(self) -> None:
        require_int("batch", self.batch, 1)
        require_int("seq_len", self.seq_len, 1)
        require_int("segment", self.segment, 0)
        require_int("seed", self.seed, 0)


def rollout_activation_bytes(cfg: RolloutConfig, *, elem_size: int = 4) -> dict[str, int]:
    """Predicted saved-for-backward bytes (pure arithmetic).

    per step: Linear input B(2Z+A) plus tanh output BZ. Without checkpoints all
    T steps stay resident. With segments of k steps only the S-1 inner segment
    input states (BZ each) stay resident (the first is an input), every step is
    recomputed once in backward, and at most one segment's steps are held at once.
    The peak is what is alive at once: without checkpoints all T steps at the
    end of forward; with them, while segment s (0-based) is recomputed, the
    inputs of segments 1..s (later ones are done and freed) plus segment s's
    own saved tensors. Counting only the resident inputs would miss that.
    """
    m = cfg.model
    per_step, state = cfg.batch * (3 * m.latent_dim + m.action_dim) * elem_size, cfg.batch * m.latent_dim * elem_size
    if cfg.segment == 0:
        return {"resident": cfg.seq_len * per_step, "recomputed": 0, "largest segment": 0,
                "peak": cfg.seq_len * per_step}
    starts = range(0, cfg.seq_len, cfg.segment)
    return {"resident": (len(starts) - 1) * state,
            "recomputed": cfg.seq_len * per_step,
            "largest segment": min(cfg.segment, cfg.seq_len) * per_step,
            "peak": max(s * state + min(cfg.segment, cfg.seq_len - t) * per_step for s, t in enumerate(starts))}


class _LiveBytes:
    """Bytes of the distinct storages autograd holds for backward right now, and the most ever held at once."""

    def __init__(self, skip: set[int]):
        self.skip, self.refs, self.sizes = skip, {}, {}
        self.now = self.peak = 0

    def add(self, t: torch.Tensor) -> None:
        ptr = t.untyped_storage().data_ptr()
        if ptr in self.skip:
            return
        if not self.refs.get(ptr):
            self.sizes[ptr] = t.untyped_storage().nbytes()
            self.now += self.sizes[ptr]
            self.peak = max(self.peak, self.now)
        self.refs[ptr] = self.refs.get(ptr, 0) + 1

    def drop(self, t: torch.Tensor) -> None:
        ptr = t.untyped_storage().data_ptr()
        if ptr in self.skip:
            return
        self.refs[ptr] -= 1
        if not self.refs[ptr]:
            self.now -= self.sizes[ptr]


class _Saved:
    """What the pack hook hands autograd: the tensor, counted live until autograd lets go of this holder."""
    __slots__ = ("tensor", "live")

    def __init__(self, tensor: torch.Tensor, live: _LiveBytes):
        self.tensor, self.live = tensor, live
        live.add(tensor)

    def __del__(self) -> None:
        self.live.drop(self.tensor)


def _segment(cell: DynamicsCell, h: torch.Tensor, z: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """Run the cell over the segment's k steps: h (B, Z), z (B, k, Z), a (B, k, A) -> states (B, k, Z)."""
    states = []
    for t in range(z.shape[1]):
        h = cell(h, z[:, t], a[:, t])
        states.append(h)
    return torch.stack(states, dim=1)


def checkpointed_rollout(cell: DynamicsCell, h0: torch.Tensor, z: torch.Tensor, a: torch.Tensor, *, segment: int,
            on_segment: list | None = None) -> torch.Tensor:
    """All states (B, T, Z), checkpointed every `segment` steps (0: plain autograd)."""
    if segment == 0:
        return _segment(cell, h0, z, a)
    pieces, h = [], h0
    for s in range(0, z.shape[1], segment):
        def run(h_: torch.Tensor, z_: torch.Tensor, a_: torch.Tensor) -> torch.Tensor:
            if on_segment is not None and torch.is_grad_enabled():
                on_segment.append(0)              # recomputation of a segment starts (in backward)
            return _segment(cell, h_, z_, a_)
        states = checkpoint(run, h, z[:, s:s + segment], a[:, s:s + segment], use_reentrant=True)
        pieces.append(states)
        h = states[:, -1].clone()   # a view would keep the whole segment's states alive
    return torch.cat(pieces, dim=1)


def measure(cfg: RolloutConfig) -> dict:
    """Forward and backward once with counting hooks (bytes, gradients), once more without (seconds)."""
    torch.manual_seed(cfg.seed)
    cell, m = DynamicsCell(cfg.model), cfg.model
    z = torch.randn(cfg.batch, cfg.seq_len, m.latent_dim, requires_grad=True)   # (B, T, Z) encoder output
    a = torch.randn(cfg.batch, cfg.seq_len, m.action_dim)                       # (B, T, A)
    h0 = torch.zeros(cfg.batch, m.latent_dim)                                 # (B, Z)
    weight = torch.linspace(-1, 1, cfg.seq_len)[None, :, None]                  # (1, T, 1) a fixed readout
    skip = {t.untyped_storage().data_ptr() for t in (z, a, h0, weight, *cell.parameters())}
    counted: dict[int, torch.Tensor] = {}       # storage address -> a tensor on it (kept so no address is reused)
    bytes_by_phase = {"forward": 0, "backward": 0}
    phase, segments = ["forward"], []           # segments: bytes saved by each recomputed segment
    live = _LiveBytes(skip)                     # what autograd holds at once: the peak

    def pack(t: torch.Tensor) -> _Saved:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in skip and ptr not in counted:
            counted[ptr] = t
            bytes_by_phase[phase[0]] += t.untyped_storage().nbytes()
            if phase[0] == "backward" and segments:
                segments[-1] += t.untyped_storage().nbytes()
        return _Saved(t, live)

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda held: held.tensor):
        hs = checkpointed_rollout(cell, h0, z, a, segment=cfg.segment, on_segment=segments)                  # (B, T, Z)
        phase[0] = "backward"
        (hs * weight).sum().backward()
    grads = [p.grad.clone() for p in cell.parameters()] + [z.grad.clone()]
    start = time.perf_counter()                                  # timed again without the counting hooks
    (checkpointed_rollout(cell, h0, z, a, segment=cfg.segment) * weight).sum().backward()
    seconds = time.perf_counter() - start
    return {"resident": bytes_by_phase["forward"], "recomputed": bytes_by_phase["backward"],
            "largest segment": max(segments, default=0), "peak": live.peak, "grads": grads, "seconds": seconds}


def step_contributions(cfg: RolloutConfig) -> list[torch.Tensor]:
    """Sum over steps of |each step's contribution| to the cell's weight and bias gradients.

    Gives each step its own copy of the parameters, so backward returns the T
    contributions separately instead of adding them: (T, *shape) -> summed |.|.
    """
    torch.manual_seed(cfg.seed)
    cell, m = DynamicsCell(cfg.model), cfg.model
    z = torch.randn(cfg.batch, cfg.seq_len, m.latent_dim)
    a = torch.randn(cfg.batch, cfg.seq_len, m.action_dim)
    weight = torch.linspace(-1, 1, cfg.seq_len)[None, :, None]
    copies = [p.detach().expand(cfg.seq_len, *p.shape).clone().requires_grad_() for p in cell.parameters()]
    h, states = torch.zeros(cfg.batch, m.latent_dim), []
    for t in range(cfg.seq_len):
        h = torch.tanh(torch.nn.functional.linear(torch.cat([h, z[:, t], a[:, t]], -1), copies[0][t], copies[1][t]))
        states.append(h)
    (torch.stack(states, 1) * weight).sum().backward()
    return [c.grad.abs().sum(0) for c in copies]


@dataclass(frozen=True)
class RecomputeCost:
    """What checkpointing traded: the fastest timed pass without and with it, and saved bytes with / without.

    memory_ratio compares the bytes resident after forward; peak_ratio the most
    held at once, which includes the segment being recomputed during backward.
    """
    seconds_plain: float
    seconds_checkpointed: float
    memory_ratio: float
    peak_ratio: float

    @property
    def time_ratio(self) -> float:
        return self.seconds_checkpointed / self.seconds_plain


@dataclass(frozen=True, kw_only=True)
class CheckpointingSpec:
    """The demo, decided before it runs: the checkpointed rollout, and how many times each pass is measured.

    `world_size` is always 1: the demo runs in this process and starts no ranks.
    """
    world_size: int
    rollout: RolloutConfig           # segment >= 1; the plain pass is the same rollout with segment 0
    repeats: int


def checkpointing_spec(world_size: int, *, segment: int = 8, seq_len: int = 64, repeats: int = 5
                       ) -> CheckpointingSpec:
    """The spec for `segment` steps per checkpoint over `seq_len` steps, refused (ValueError) unless world_size is 1."""
    require_int("world_size", world_size, 1)
    if world_size != 1:
        raise ValueError(f"world_size must be 1 (the demo runs in this process and starts no ranks), got {world_size}")
    cfg = RolloutConfig(seq_len=seq_len, segment=segment)
    require_int("segment", segment, 1)
    require_int("repeats", repeats, 1)
    return CheckpointingSpec(world_size=1, rollout=cfg, repeats=repeats)


@dataclass(frozen=True)
class RecomputeRuns:
    """What `measure` gave for each repeat, without checkpoints and with them (bytes, gradients, seconds)."""
    plain: list[dict]
    checkpointed: list[dict]


def measure_both(spec: CheckpointingSpec) -> RecomputeRuns:
    """The demo's run, in this process: `spec.repeats` measured passes without checkpoints, then as many with."""
    plain_cfg = replace(spec.rollout, segment=0)
    plain = [measure(plain_cfg) for _ in range(spec.repeats)]
    return RecomputeRuns(plain, [measure(spec.rollout) for _ in range(spec.repeats)])


def compare_checkpointing(spec: CheckpointingSpec, results: list[RecomputeRuns]) -> Verdict:
    """Gradients with checkpoints against without (z bitwise, the cell's within the reordering bound), and every
    saved-bytes count against `rollout_activation_bytes`; the fastest pass of each for the time ratio."""
    cfg, (runs,) = spec.rollout, results
    plain_cfg, plain, ckpt = replace(cfg, segment=0), runs.plain, runs.checkpointed
    per_unit = reordered_sum_bound(cfg.seq_len, 1.0)       # the bound scales with sum_t |term_t|, elementwise
    bounds = [per_unit * s for s in step_contributions(cfg)]
    ratios = [bound_ratio(g, e, b) for g, e, b in zip(ckpt[0]["grads"], plain[0]["grads"], bounds)]
    checks = [exact_check("z gradient with checkpoints == without", ckpt[0]["grads"][-1], plain[0]["grads"][-1],
                          "recomputed forward repeats the same operations: bitwise equal"),
              Check(name="cell gradients with checkpoints == without (in units of the rounding bound)",
                    error=ratios[worst(ratios)],
                    tolerance=1.0, reason="per-step terms are bitwise equal; their sum over T steps is grouped by segment: "
                         "at most 2(T-1) 2^-24 sum_t |term_t|")]
    predicted, measured = rollout_activation_bytes(cfg), ckpt[0]
    exact = counts_per_rank("saved bytes", [plain[0]["resident"]], [rollout_activation_bytes(plain_cfg)["resident"]],
                            case="without checkpoints")
    exact += counts_per_rank("saved bytes", [plain[0]["peak"]], [rollout_activation_bytes(plain_cfg)["peak"]],
                             case="without checkpoints: peak")
    for key in ("resident", "recomputed", "largest segment", "peak"):
        exact += counts_per_rank("saved bytes", [measured[key]], [predicted[key]], case=f"with checkpoints: {key}")
    fastest = lambda runs: min(r["seconds"] for r in runs)   # noqa: E731 - the least disturbed run
    data = RecomputeCost(seconds_plain=fastest(plain), seconds_checkpointed=fastest(ckpt),
                         memory_ratio=measured["resident"] / plain[0]["resident"],
                         peak_ratio=measured["peak"] / plain[0]["peak"])
    return Verdict(checks=checks, exact=exact, params={"seq_len": cfg.seq_len, "segment": cfg.segment,
                                                       "batch": cfg.batch}, data=data)


EXPERIMENT = Experiment(name="activation-checkpointing", chapter="03", world_sizes=(1,),
                        title="Checkpointed dynamics unroll: saved bytes vs formula, gradients, time",
                        spec=checkpointing_spec, local=measure_both, compare=compare_checkpointing)


def checkpointing_report(*, world_size: int = 1, segment: int = 8, seq_len: int = 64, repeats: int = 5) -> Report:
    """Bytes saved for backward with and without checkpointing (exact), gradients, and the time ratio.

    Runs in this process and starts no ranks, so `world_size` must be 1 (any other
    is refused before anything runs). Each pass is measured `repeats` times; the
    report's time ratio uses the fastest.
    """
    return EXPERIMENT.run_spec(checkpointing_spec(world_size, segment=segment, seq_len=seq_len, repeats=repeats))


DEMOS = [EXPERIMENT]
