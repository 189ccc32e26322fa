"""The small end's counts and costs: how many operators each stage of chapter 09's mesh runs, and what an operator
and a message cost this machine's ranks. A thin process layer: the formulas stay in planner/small.py.

Why these: at the mesh's sizes (width 32, 16 tokens a microbatch) a matmul is a few hundred FLOPs, so an
operator's time is its fixed cost (Python, torch's dispatch, autograd's bookkeeping: microseconds), and a
message's is the CPU both ends spend on it. With 8 ranks on 2 cores those CPU seconds queue for the cores.

* `count_stage_ops`, `count_optimizer_ops`: aten operators (every call torch's dispatcher runs: matmuls,
  elementwise ops, views), counted in this process with a TorchDispatchMode (`OpCounter`) over one warm step's
  forwards and backwards of each pipeline stage, exactly as mesh.step.run_schedule runs them (tp's
  all-reduces replaced by the identity: their cost is counted as messages), and over one warm optimizer step.
  Exact and deterministic for a given torch.
* `measure_calibration`: the costs' timings, from a micro-benchmark that is not the mesh step. On as many
  ranks as the mesh, in the groups it makes, every rank trains the model's own transformer blocks (unsharded,
  models.transformer.Block) at several depths and widths (CASES), with one ring all-reduce of a tp-sized
  message on each sub-layer's output (forward and backward: where a tensor-parallel model's messages are),
  on each block's output, or none. Each case's CPU seconds per iteration (time.process_time: every thread of
  the rank's process, gloo's loop threads included), median over repeats and averaged over the ranks, is a
  planner.small.CalibrationPoint; planner.small.fit_local_costs turns them into seconds per operator, FLOP/s
  and seconds per message. All ranks run at once, so each cost is what it is while the mesh's ranks share
  this machine's cores: the wake-up after each message and the caches other ranks evicted are in it.
"""
from __future__ import annotations

import statistics
import time
from collections import Counter
from typing import Any
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import wmdist.tensor_parallel.layers as tp_layers
from wmdist.comm import Context, Ledger, barrier, ring_all_reduce
from wmdist.costs.mesh import TRAFFIC_AXES, microbatch_rows
from wmdist.costs.ring_attention import attention_flops
from wmdist.costs.validate import require_int
from wmdist.mesh.spec import MeshSpec
from wmdist.mesh.stage import MeshStage, full_model, model_config
from wmdist.mesh.step import Momentum, loss_share, rank_microbatches
from wmdist.models.transformer import Block, TransformerConfig
from wmdist.planner.small import CalibrationPoint
from wmdist.runtime import run
from wmdist.tensor_parallel.layers import TPGroup

# (blocks, width, messages on each block's way forward and again backward: 0 none, 1 its output, 2 each
# sub-layer's output): operators, FLOPs and messages each vary apart from the others, so the fit resolves all three.
CASES: tuple[tuple[int, int, int], ...] = ((1, 16, 0), (2, 16, 0), (1, 128, 0), (1, 16, 1), (2, 16, 2),
                                           (1, 64, 2), (2, 64, 1), (1, 128, 2))
CALIBRATION_HEADS = 4


class OpCounter(TorchDispatchMode):
    """While active (`with OpCounter() as c:`), counts every aten operator torch's dispatcher runs, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.counts[str(func)] += 1
        return func(*args, **(kwargs or {}))


def _solo() -> tuple[TPGroup, Context]:
    """A one-rank context: the stage's tp and cp views when nothing is sent."""
    ctx = Context(rank=0, world_size=1, ledger=Ledger(rank=0))
    return TPGroup(ctx, None, 0, 1), ctx


def _unsent(tp: TPGroup, t: torch.Tensor, phase: str) -> torch.Tensor:
    return t


def count_stage_ops(spec: MeshSpec) -> list[Counter[str]]:
    """Per pipeline stage, the aten operators (by name) of one warm step's forwards and backwards on tp rank 0 of
    dp rank 0: all its microbatches, gradients starting from None as mesh.warm's steps do, the last stage's loss
    and the sends' detach included, tp's all-reduces not (the identity here). Every tp rank runs the same."""
    if spec.cp > 1:
        raise ValueError(f"count_stage_ops counts a mesh without cp; got cp {spec.cp} (ring attention's blocks "
                         "compute between its messages, which a one-rank count cannot follow)")
    tp, solo = _solo()
    scale = spec.batch * spec.seq_len * model_config(spec).obs_dim                  # B T O, as run_schedule
    out = []
    with mock.patch.object(tp_layers, "tp_all_reduce", _unsent):
        for p in range(spec.pp):
            stage = MeshStage(full_model(spec), spec, 0, p)
            micro = rank_microbatches(spec, {"dp": 0, "tp": 0, "pp": p, "cp": 0})
            shapes = [(mb["obs"].shape[0], mb["obs"].shape[1], spec.width) for mb in micro]
            received = [torch.zeros(s).requires_grad_(True) for s in shapes]       # what the mailbox hands over
            grads = [torch.zeros(s) for s in shapes]
            with OpCounter() as counter:
                held = []
                for mb, x in zip(micro, received):
                    y = stage((mb["obs"], mb["actions"]) if stage.first else (x,), tp, solo)
                    if stage.last:
                        y = loss_share(y, mb["next_obs"], scale)
                        float(y.detach())
                    else:
                        y.detach()                                                 # what isend sends
                    held.append(y)
                for y, g in zip(held, grads):
                    torch.autograd.backward(y, None if stage.last else g)
            out.append(counter.counts)
    return out


def count_optimizer_ops(spec: MeshSpec) -> list[Counter[str]]:
    """Per pipeline stage, the aten operators (by name) of one warm Momentum step on that stage's parameters."""
    out = []
    for p in range(spec.pp):
        params = list(MeshStage(full_model(spec), spec, 0, p).parameters())
        for q in params:
            q.grad = torch.zeros_like(q)
        opt = Momentum(params, spec.lr)
        opt.step()                                                                 # the first makes the buffers
        with OpCounter() as counter:
            opt.step()
        out.append(counter.counts)
    return out


class _Message(torch.autograd.Function):
    """The identity on x, with one ring all-reduce of `payload` forward and one backward (none if `view` is None)."""

    @staticmethod
    def forward(fctx: Any, x: torch.Tensor, view: Context | None, payload: torch.Tensor) -> torch.Tensor:
        fctx.view, fctx.payload = view, payload
        if view is not None:
            ring_all_reduce(view, payload, phase="calibration")
        return x.view_as(x)

    @staticmethod
    def backward(fctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        if fctx.view is not None:
            ring_all_reduce(fctx.view, fctx.payload, phase="calibration")
        return grad, None, None


def _train(blocks: list[Block], x: torch.Tensor, per_block: int, view: Context | None, payload: torch.Tensor) -> None:
    """One forward and backward of the blocks, messages placed as `per_block` says (CASES)."""
    for b in blocks:
        if per_block == 2:
            x = x + _Message.apply(b.attn(b.ln1(x)), view, payload)
            x = x + _Message.apply(b.mlp(b.ln2(x)), view, payload)
        else:
            x = b(x)
            x = _Message.apply(x, view, payload) if per_block == 1 else x
    x.sum().backward()


def message_axis(spec: MeshSpec) -> str:
    """The axis the calibration's messages go around: tp (the mesh's most frequent), else the first with ranks."""
    for axis in ("tp", "cp", "dp", "pp"):
        if getattr(spec, axis) > 1:
            return axis
    raise ValueError("a mesh of one rank sends no messages: there is nothing to calibrate")


def case_flops(depth: int, width: int, rows: int, tokens: int) -> float:
    """FLOPs of one forward and backward of `depth` blocks of `width` on rows x tokens: 2 per weight per token
    (12 H^2 weights), causal attention (costs.ring_attention.attention_flops), backward twice the forward."""
    attention = attention_flops(tokens, width // CALIBRATION_HEADS, heads=CALIBRATION_HEADS, batch=rows, causal=True)
    return 3.0 * depth * (2 * 12 * width * width * rows * tokens + attention)


def time_calibration(ctx: Context, spec: MeshSpec, repeats: int) -> list[CalibrationPoint]:
    """Rank function: every case of CASES, `repeats` timed iterations after two untimed ones (module docstring)."""
    torch.set_num_threads(1)
    views = {axis: ctx.along(spec.mesh, axis) for axis in TRAFFIC_AXES}     # the mesh's groups, as its step has
    view = views[message_axis(spec)]
    rows, tokens = microbatch_rows(spec.shape, 0)[0], spec.shape.tokens
    payload = torch.zeros(rows, tokens, spec.width)                           # one tp activation, (b, c, H)
    out = []
    for depth, width, per_block in CASES:
        torch.manual_seed(spec.seed)
        blocks = [Block(TransformerConfig(width=width, heads=CALIBRATION_HEADS)) for _ in range(depth)]
        x = torch.randn(rows, tokens, width, requires_grad=True)
        with OpCounter() as counter:
            _train(blocks, x, per_block, None, payload)
        for _ in range(2):
            _train(blocks, x, per_block, view, payload)
        barrier(ctx, phase="line up")
        times = []
        for _ in range(repeats):
            start = time.process_time()
            _train(blocks, x, per_block, view, payload)
            times.append(time.process_time() - start)
        messages = 2 * per_block * depth * 2 * (view.world_size - 1)           # forward and backward, per ring
        out.append(CalibrationPoint(counter.counts.total(), case_flops(depth, width, rows, tokens), messages,
                                    statistics.median(times)))
    return out


def measure_calibration(spec: MeshSpec, *, repeats: int = 12) -> list[CalibrationPoint]:
    """Each case of CASES on `spec.world_size` ranks at once (time_calibration), its CPU seconds averaged over them.

    A helper for chapter 11's notebook: it calls `runtime.run` itself, since a timing is shown, never checked.
    """
    require_int("repeats", repeats, 1)
    message_axis(spec)
    ranks = run(time_calibration, spec.world_size, spec, repeats)
    return [CalibrationPoint(case[0].ops, case[0].flops, case[0].messages, statistics.fmean(p.cpu_s for p in case))
            for case in zip(*ranks)]
