"""Our ring against PyTorch's own, on the same gloo ranks: both equal SDPA; the dK, dV traffic differs.

torch 2.13's public `context_parallel` does not run on CPU: it turns SDPA's
inputs into DTensors, and the CPU flash kernel
(aten._scaled_dot_product_flash_attention_for_cpu) has no sharding rule
for them. The private template underneath, `_templated_ring_attention` and
its backward in torch.distributed.tensor.experimental._context_parallel,
takes a process group and any SDPA op returning (out, lse), so it runs on
CPU gloo with the CPU kernels. It reads three process-wide options, set
here for the call and restored after it: `rotate_method` "alltoall" (a
true ring: each step one all_to_all_single in which rank r's whole buffer
goes to r + 1; the default "allgather" gathers all of K, V at once),
`enable_load_balance` (the zigzag layout, causal only) and `convert_to_f32`
off (otherwise float64 merges are done in float32).
Its sends are collectives inside torch, not wmdist.comm calls, so they are
counted from the autograd profiler's record of each all_to_all_single input: one
K, V block per forward step but the last, and in backward the same plus a
dK, dV message after EVERY step, N rather than our N-1.
The demo is an `Experiment` on chapter 06's `RingRun` (both layouts checked
before any process starts).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from wmdist.comm import Context
from wmdist.course.compare import bound_ratio
from wmdist.costs import ring_attention as costs
from wmdist.course.experiment import Experiment, Verdict
from wmdist.course.report import Check, Count, Report, counts_per_rank
from wmdist.ring_attention.profiling import op_input_bytes
from wmdist.ring_attention.ring import positions, ring_backward, ring_forward
from wmdist.ring_attention.spec import RingRun
from wmdist.ring_attention.layout import Layout
from wmdist.ring_attention.spec import DTypeName, RingSpec, default_seq_len
from wmdist.ring_attention.tolerance import REASON, SECOND_ORDER, exact_attention, sdpa_bounds, attention_tolerance

CASES = (("float64", False, "contiguous"), ("float64", True, "contiguous"), ("float64", True, "zigzag"),
         ("float32", True, "zigzag"))
A2A = "_c10d_functional::all_to_all_single"


@dataclass(kw_only=True, frozen=True)
class TorchCase:
    """One rank's rows of torch's and our results for one case, and torch's all-to-all traffic."""
    rows: list[int]
    theirs: tuple[torch.Tensor, ...]     # out, dq, dk, dv, each (B, H, c, D)
    ours: tuple[torch.Tensor, ...]
    calls: tuple[int, int]              # all_to_all_single calls in forward, backward
    sent: tuple[int, int]               # their input bytes


def _torch_ring(ctx: Context, spec: RingSpec, dtype: DTypeName, causal: bool, layout: Layout) -> TorchCase:
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp

    q, k, v, dout = spec.inputs(dtype=dtype)
    rows = positions(spec.seq_len, ctx.world_size, ctx.rank, layout=layout)
    q, k, v, dout = (x[:, :, rows].contiguous() for x in (q, k, v, dout))
    group, elem = ctx.group_of(range(ctx.world_size)), q.element_size()
    options = cp._cp_options
    saved = (options.rotate_method, options.enable_load_balance, options.convert_to_f32)
    try:
        cp.set_rotate_method("alltoall")
        options.enable_load_balance, options.convert_to_f32 = layout == "zigzag", False
        (out, lse), fwd_calls, fwd_bytes = op_input_bytes(lambda: cp._templated_ring_attention(
            group, 2, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default, q, k, v,
            is_causal=causal, dropout_p=0.0)[:2], A2A, elem)
        grads, bwd_calls, bwd_bytes = op_input_bytes(lambda: cp._templated_ring_attention_backward(
            group, 2, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
            grad_out=dout, grad_out_name="grad_out", query=q, key=k, value=v, out=out, logsumexp=lse,
            is_causal=causal, dropout_p=0.0)[:3], A2A, elem)
    finally:
        options.rotate_method, options.enable_load_balance, options.convert_to_f32 = saved
    sizes = {"seq_len": spec.seq_len, "layout": layout, "causal": causal, "block_size": spec.block_size}
    o, l2, _ = ring_forward(ctx, q, k, v, **sizes)
    ours = (o, *ring_backward(ctx, q, k, v, o, l2, dout, **sizes)[:3])
    return TorchCase(rows=rows.tolist(), theirs=(out, *grads), ours=ours, calls=(fwd_calls, bwd_calls), sent=(fwd_bytes, bwd_bytes))


def template_missing() -> str | None:
    """Why torch's private ring template cannot be driven here (None when it can): it is private API."""
    try:
        from torch.distributed.tensor.experimental._context_parallel import _attention as cp
    except ImportError as err:
        return f"torch {torch.__version__} has no _context_parallel._attention module ({err})"
    needed = ("_templated_ring_attention", "_templated_ring_attention_backward", "set_rotate_method", "_cp_options")
    missing = [name for name in needed if not hasattr(cp, name)]
    return f"torch {torch.__version__}'s _context_parallel._attention lacks {', '.join(missing)}" if missing else None


@dataclass(frozen=True)
class TorchCases:
    """One rank's results, one per case of CASES, in order."""
    cases: tuple[TorchCase, ...]


def _require_template() -> None:
    missing = template_missing()
    if missing is not None:
        raise RuntimeError(f"cannot compare with torch's ring attention: {missing} (written against torch 2.13)")


def torch_cases(ctx: Context, run: RingRun) -> TorchCases:
    """Rank function: every case through torch's template and through ours."""
    _require_template()
    return TorchCases(tuple(_torch_ring(ctx, run.ring, *case) for case in CASES))


def _full(spec: RingSpec, parts: list[torch.Tensor], rows: list[list[int]]) -> torch.Tensor:
    full = parts[0].new_empty(parts[0].shape[:2] + (spec.seq_len,) + parts[0].shape[3:])
    for part, r in zip(parts, rows):
        full[:, :, r] = part
    return full


def _case_report(spec: RingSpec, n: int, ranks: list[TorchCase], dtype: DTypeName, causal: bool,
                 layout: Layout) -> tuple[list[Check], list[Count]]:
    name = f"{dtype} {'causal' if causal else 'full'} {layout}"
    q, k, v, dout = spec.inputs(dtype=dtype)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    want = F.scaled_dot_product_attention(*leaves, is_causal=causal)
    wanted = (want, *torch.autograd.grad(want, leaves, dout))
    ex = exact_attention(q, k, v, dout, causal=causal)
    theirs_tol = sdpa_bounds(ex, getattr(torch, dtype)).plus(sdpa_bounds(ex, getattr(torch, dtype)),
                                                             factor=SECOND_ORDER)
    ours_tol = attention_tolerance(ex, getattr(torch, dtype), spec.tile(n), spec.key_blocks(n))
    rows = [rc.rows for rc in ranks]
    checks = []
    for i, key in enumerate(("out", "dq", "dk", "dv")):
        theirs = _full(spec, [rc.theirs[i] for rc in ranks], rows)
        ours = _full(spec, [rc.ours[i] for rc in ranks], rows)
        checks += [Check(name=f"{name}: torch's {key} == SDPA", error=bound_ratio(theirs, wanted[i], getattr(theirs_tol, key)),
                         tolerance=1.0, reason="both fused kernels at their worst-case rounding bound (2-ulp exp, every key a block)"),
                   Check(name=f"{name}: our {key} == torch's", error=bound_ratio(ours, theirs, getattr(ours_tol, key)), tolerance=1.0,
                         reason=REASON)]
    elem = q.element_size()
    kv_back, grad_back = costs.ring_backward_bytes_per_rank(spec.seq_len, n, spec.kv_width, batch=spec.batch,
                                                            elem_size=elem, every_step=True)
    fwd = costs.ring_kv_bytes_per_rank(spec.seq_len, n, spec.kv_width, batch=spec.batch, elem_size=elem)
    counts = counts_per_rank("torch all_to_all bytes", [rc.sent[0] for rc in ranks], [fwd] * n, phase="forward",
                             case=name)
    counts += counts_per_rank("torch all_to_all bytes", [rc.sent[1] for rc in ranks], [kv_back + grad_back] * n,
                              phase="backward", case=name)
    block_sends = costs.ring_kv_sends(n) + costs.ring_grad_sends(n, every_step=True)
    counts += counts_per_rank("torch all_to_all calls", [rc.calls[1] for rc in ranks], [block_sends] * n,
                              phase="backward", case=name)
    return checks, counts


def torch_run(world_size: int, *, seq_len: int | None = None, block_size: int = 4, seed: int = 0) -> RingRun:
    """The run: S = default_seq_len(N) unless given, checked on every case's layout."""
    ring = RingSpec(seq_len=default_seq_len(world_size) if seq_len is None else seq_len, block_size=block_size,
                    seed=seed)
    return RingRun(world_size=world_size, ring=ring, layouts=tuple(dict.fromkeys(layout for *_, layout in CASES)))


def compare_ring_torch(run: RingRun, results: list[TorchCases]) -> Verdict:
    """Per case: torch's results against SDPA, ours against torch's (rounding bounds); torch's traffic vs formulas."""
    checks: list[Check] = []
    exact: list[Count] = []
    for i, case in enumerate(CASES):
        c, e = _case_report(run.ring, run.world_size, [res.cases[i] for res in results], *case)
        checks += c
        exact += e
    return Verdict(checks=checks, exact=exact,
                   params={"seq_len": run.ring.seq_len, "kv_width": run.ring.kv_width, "torch": torch.__version__,
                           "template": "_templated_ring_attention, rotate 'alltoall', convert_to_f32 off"})


TORCH_DEMO = Experiment(name="ring-attention-vs-torch", chapter="06", world_sizes=(1, 2, 3, 4), spec=torch_run,
                        title="Our ring vs torch's private _templated_ring_attention on CPU gloo: both == SDPA; torch "
                              "sends dK, dV N times per rank, we N-1", ranks=torch_cases, compare=compare_ring_torch)


def versus_torch_demo(world_size: int, *, seq_len: int | None = None, block_size: int = 4, seed: int = 0) -> Report:
    """Our ring and torch's private ring template on the same ranks, both against SDPA; torch's traffic profiled.

    A torch without the template is refused here, before any process starts (RuntimeError); `wmdist verify`'s
    run meets the same error on the ranks and reports it as a failed row."""
    run = torch_run(world_size, seq_len=seq_len, block_size=block_size, seed=seed)
    _require_template()
    return TORCH_DEMO.run_spec(run)


DEMOS = [TORCH_DEMO]
