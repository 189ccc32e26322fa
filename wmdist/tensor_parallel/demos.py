"""Chapter 04's experiments, each a Report: the Megatron block, four MLP layouts, torch's DTensor, SP vs CP.

Every demo runs on real gloo ranks, compares every output and gradient with
one device (tolerance in compare.py), and sets each rank's ledger next to
costs.tensor_parallel: collectives, bytes sent per collective, rounds, and
the bytes autograd kept for backward, all exact integers.

Each is an `Experiment` on one spec type, `TPSpec` (the block's sizes and the
layouts to run, checked before any process starts); the public functions
(`tp_block_demo(world_size, batch=..., seq=..., seed=...)`, ...) build a spec and run it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from wmdist.comm import Context
from wmdist.course.compare import worst as worst_of
from wmdist.costs import require_int
from wmdist.costs import tensor_parallel as costs
from wmdist.course.experiment import Experiment, Verdict
from wmdist.course.report import Count, Report, close_check, counts_per_rank, differ_check, exact_check, max_abs_error
from wmdist.tensor_parallel.block import NAMES, block_shape, shard_of
from wmdist.tensor_parallel.compare import WHY, agreement_checks, collective_counts, shape_terms, reordered_tolerance
from wmdist.tensor_parallel.layouts import (MLP_NAMES, LayoutRuns, MLPRun, each_layout, mlp_reference, mlp_slice,
                                            run_mlp_layout)
from wmdist.tensor_parallel.sequence import LAYOUTS, BlockRun, block_reference_run, run_layout, token_slice
from wmdist.tensor_parallel.versus_dtensor import DTENSOR_CONFIG, OursAndTorch, ours_and_dtensor
from wmdist.models.transformer import TransformerConfig

CONFIG = TransformerConfig(width=32, heads=8)     # MLP hidden width 128; 8 heads, so up to 8 ranks hold one each
BATCH, SEQ = 2, 12


@dataclass(frozen=True, kw_only=True)
class TPSpec:
    """One chapter-04 run, decided before any process starts: the block, its input sizes, the layouts to run."""
    world_size: int
    cfg: TransformerConfig
    shape: costs.BlockShape       # validated against `world_size` by the spec functions below
    layouts: tuple[str, ...]
    seed: int = 0

    @property
    def params(self) -> dict[str, int]:
        """The block's sizes as the Reports show them."""
        s = self.shape
        return {"batch": s.batch, "seq": s.seq, "width": s.width, "heads": s.heads, "hidden": s.hidden}


def _spec(world_size: int, cfg: TransformerConfig, batch: int, seq: int, seed: int, layouts: tuple[str, ...],
          sequence: bool) -> TPSpec:
    """Validate the sizes (a ValueError names the first bad one) and build the spec."""
    require_int("world_size", world_size, 1)
    shape = block_shape(cfg, require_int("batch", batch, 1), require_int("seq", seq, 1))
    shape.check_world(world_size, sequence=sequence)
    return TPSpec(world_size=world_size, cfg=cfg, shape=shape, layouts=layouts, seed=seed)


def _tensors(run_: object) -> dict[str, torch.Tensor]:
    return {"output": run_.output, "input gradient": run_.input_grad, **run_.grads}


def block_ranks(ctx: Context, spec: TPSpec) -> LayoutRuns[BlockRun]:
    """Rank function: the block in each of the spec's layouts (sequence.run_layout, one after another)."""
    return each_layout(ctx, run_layout, spec.layouts, spec.cfg, spec.shape.batch, spec.shape.seq, seed=spec.seed)


def mlp_ranks(ctx: Context, spec: TPSpec) -> LayoutRuns[MLPRun]:
    """Rank function: the MLP in each of the spec's layouts (layouts.run_mlp_layout, one after another)."""
    return each_layout(ctx, run_mlp_layout, spec.layouts, spec.cfg, spec.shape.batch, spec.shape.seq,
                       seed=spec.seed)


def versus_ranks(ctx: Context, spec: TPSpec) -> OursAndTorch:
    """Rank function: our column -> row MLP, then torch's DTensor one (versus_dtensor.ours_and_torch)."""
    return ours_and_dtensor(ctx, spec.cfg, spec.shape.batch, spec.shape.seq, seed=spec.seed)


@dataclass(frozen=True)
class TPTraffic:
    """Bytes each rank sent per layout (ledger)."""
    bytes_sent: dict[str, list[int]]            # layout -> per rank


@dataclass(frozen=True)
class BlockTraffic(TPTraffic):
    """TPTraffic, plus the bytes each rank kept for backward per layout and the one-device figure."""
    saved_bytes: dict[str, list[int]]           # layout -> per rank
    single_saved_bytes: int                     # the same block on one device


def block_spec(world_size: int, *, batch: int = BATCH, seq: int = SEQ, seed: int = 0) -> TPSpec:
    """The Megatron block in the "tp" layout on `world_size` ranks (at most one rank per head), checked."""
    return _spec(world_size, CONFIG, batch, seq, seed, ("tp",), sequence=False)


def compare_block(spec: TPSpec, results: list[LayoutRuns[BlockRun]]) -> Verdict:
    """Outputs and every gradient against one device; 4 all-reduces and the bytes kept, per rank, exactly."""
    n, shape, (batch, seq) = spec.world_size, spec.shape, (spec.shape.batch, spec.shape.seq)
    runs = [r.runs[0] for r in results]
    ref = block_reference_run(spec.cfg, batch, seq, seed=spec.seed)
    want = [{"output": ref.output, "input gradient": ref.input_grad,
             **{nm: shard_of(nm, ref.grads[nm], spec.cfg, n, r) for nm in NAMES}} for r in range(n)]
    checks = agreement_checks("tp", [_tensors(r) for r in runs], want, shape_terms(shape))
    exact = collective_counts([r.collectives for r in runs], costs.block_schedule(shape, n, layout="tp"), "tp")
    exact += counts_per_rank("saved activation bytes", [r.saved_bytes for r in runs],
                             [4 * costs.block_saved_elements(shape, n, r, layout="tp") for r in range(n)], case="tp")
    data = BlockTraffic({"tp": [sum(m.bytes_sent for m in r.collectives) for r in runs]},
                        {"tp": [r.saved_bytes for r in runs]}, ref.saved_bytes)
    return Verdict(checks=checks, exact=exact, params=spec.params, data=data)


BLOCK_DEMO = Experiment(name="tp-block", chapter="04", world_sizes=(1, 2, 3, 4), spec=block_spec,
                        title="Megatron block on N ranks: outputs, every gradient, 4 all-reduces, bytes kept",
                        ranks=block_ranks, compare=compare_block)


def tp_block_demo(world_size: int, *, batch: int = BATCH, seq: int = SEQ, seed: int = 0) -> Report:
    """The Megatron block (heads and MLP split, "tp" layout): outputs, every gradient, 4 all-reduces, bytes kept."""
    return BLOCK_DEMO.run_spec(block_spec(world_size, batch=batch, seq=seq, seed=seed))


def layouts_spec(world_size: int, *, batch: int = BATCH, seq: int = SEQ, seed: int = 0) -> TPSpec:
    """The MLP in the four layouts of costs.MLP_LAYOUTS, checked (row -> row needs an input feature per rank)."""
    spec = _spec(world_size, CONFIG, batch, seq, seed, costs.MLP_LAYOUTS, sequence=False)
    if world_size > spec.shape.width:
        raise ValueError(f"world_size {world_size} is more than the width {spec.shape.width}: row -> row would "
                         "leave a rank no input feature")
    return spec


def compare_layouts(spec: TPSpec, results: list[LayoutRuns[MLPRun]]) -> Verdict:
    """Every layout against one device and its schedule; the needless gather's extra bytes, exactly."""
    n, shape, (batch, seq) = spec.world_size, spec.shape, (spec.shape.batch, spec.shape.seq)
    ref = mlp_reference(spec.cfg, batch, seq, seed=spec.seed)
    checks, exact, sent = [], [], {}
    for i, layout in enumerate(spec.layouts):
        mine = [r.runs[i] for r in results]
        want = [{"output": ref.output, "input gradient": ref.input_grad,
                 **{nm: mlp_slice(nm, ref.grads[nm], spec.cfg, n, r, layout=layout) for nm in MLP_NAMES}}
                for r in range(n)]
        checks += agreement_checks(layout, [_tensors(m) for m in mine], want, shape_terms(shape))
        exact += collective_counts([m.collectives for m in mine], costs.mlp_schedule(shape, n, layout=layout), layout)
        sent[layout] = [sum(c.bytes_sent for c in m.collectives) for m in mine]
    good, bad = costs.MLP_LAYOUTS[:2]
    megatron, gathered = (costs.mlp_schedule(shape, n, layout=lay) for lay in (good, bad))
    extra = [costs.schedule_bytes(gathered, r) - costs.schedule_bytes(megatron, r) for r in range(n)]
    exact += counts_per_rank("extra bytes sent for the needless gather",
                             [g - m for g, m in zip(sent[bad], sent[good])], extra, case=bad)
    checks.append(differ_check("PITFALL gathering fc1's output: rank 0 sends more bytes than column -> row",
                               float(sent[bad][0]), float(sent[good][0]), float(extra[0]),
                               "at least the two all-gathers of (B, T, F) the formula predicts"))
    data = TPTraffic(sent)
    return Verdict(checks=checks, exact=exact, params={"batch": batch, "seq": seq, "hidden": shape.hidden},
                   data=data)


LAYOUTS_DEMO = Experiment(name="tp-layouts", chapter="04", world_sizes=(2, 3, 4), spec=layouts_spec,
                          title="One MLP, four layouts: the collectives follow the layout; a needless gather's bytes",
                          ranks=mlp_ranks, compare=compare_layouts)


def tp_layouts_demo(world_size: int, *, batch: int = BATCH, seq: int = SEQ, seed: int = 0) -> Report:
    """The MLP split four ways: same result, different collectives; the needless gather's bytes, exactly."""
    return LAYOUTS_DEMO.run_spec(layouts_spec(world_size, batch=batch, seq=seq, seed=seed))


def dtensor_spec(world_size: int, *, batch: int = 2, seq: int = 3, seed: int = 0) -> TPSpec:
    """Our column -> row MLP next to DTensor's, on DTENSOR_CONFIG; N must divide its hidden width (equal shards)."""
    n, cfg = require_int("world_size", world_size, 1), DTENSOR_CONFIG
    if cfg.hidden % n:
        raise ValueError(f"world_size {n} does not divide the MLP hidden width {cfg.hidden}: DTensor's RowwiseParallel "
                         "assumes equal shards")
    shape = block_shape(cfg, require_int("batch", batch, 1), require_int("seq", seq, 1))
    return TPSpec(world_size=n, cfg=cfg, shape=shape, layouts=("column -> row",), seed=seed)


def compare_dtensor(spec: TPSpec, results: list[OursAndTorch]) -> Verdict:
    """Shards bitwise, outputs and gradients within rounding, and torch's dispatched collectives against ours."""
    n, cfg, (batch, seq) = spec.world_size, spec.cfg, (spec.shape.batch, spec.shape.seq)
    terms = max(cfg.hidden, batch * seq)
    checks = [exact_check("every rank's local shards are torch's (fc1 rows, fc2 columns, bitwise)",
                          [[r.shards[nm] for nm in MLP_NAMES] for r in results],
                          [[r.torch.local_params[nm] for nm in MLP_NAMES] for r in results],
                          "the same slices of the same weights")]
    checks += agreement_checks("ours vs DTensor", [_tensors(r.ours) for r in results],
                               [_tensors(r.torch) for r in results], terms)
    ref = mlp_reference(cfg, batch, seq, seed=spec.seed)
    checks.append(close_check("DTensor output == single device (rank 0)", results[0].torch.output, ref.output,
                              reordered_tolerance(ref.output, terms), WHY))
    calls = 2 if n > 1 else 0
    exact = [Count(quantity="collectives, torch (dispatched)", rank=r, measured=sum(x.torch.comm_counts.values()), predicted=calls, case="DTensor")
             for r, x in enumerate(results)]
    exact += [Count(quantity="all-reduce calls, torch (dispatched)", rank=r,
                    measured=sum(c for op, c in x.torch.comm_counts.items() if "all_reduce" in op), predicted=calls, case="DTensor")
              for r, x in enumerate(results)]
    exact += collective_counts([r.ours.collectives for r in results],
                               costs.mlp_schedule(spec.shape, n, layout="column -> row"), "ours")
    return Verdict(checks=checks, exact=exact, params={"hidden": cfg.hidden, "batch": batch, "seq": seq})


DTENSOR_DEMO = Experiment(name="tp-vs-dtensor", chapter="04", world_sizes=(2, 4), spec=dtensor_spec,
                          title="Our column/row MLP vs torch's DTensor ColwiseParallel/RowwiseParallel",
                          ranks=versus_ranks, compare=compare_dtensor, timeout=600)


def tp_dtensor_demo(world_size: int, *, batch: int = 2, seq: int = 3, seed: int = 0) -> Report:
    """Ours vs torch's parallelize_module(ColwiseParallel, RowwiseParallel): same shards, outputs, gradients."""
    return DTENSOR_DEMO.run_spec(dtensor_spec(world_size, batch=batch, seq=seq, seed=seed))


def _want_block(ref: object, cfg: TransformerConfig, layout: str, n: int, r: int, seq: int) -> dict[str, torch.Tensor]:
    """The single-device tensors a rank must match in `layout`: its tokens (SP, CP), its shards (TP, SP)."""
    mine = slice(None) if layout == "tp" else token_slice(seq, n, r)
    grads = ref.grads if layout.startswith("cp") else {nm: shard_of(nm, ref.grads[nm], cfg, n, r) for nm in NAMES}
    return {"output": ref.output[:, mine], "input gradient": ref.input_grad[:, mine], **grads}


def sp_cp_spec(world_size: int, *, batch: int = BATCH, seq: int = SEQ, seed: int = 0) -> TPSpec:
    """The block in every layout of sequence.LAYOUTS (TP, SP both ways, CP, CP's pitfall), checked."""
    return _spec(world_size, CONFIG, batch, seq, seed, LAYOUTS, sequence=True)


def compare_sp_cp(spec: TPSpec, results: list[LayoutRuns[BlockRun]]) -> Verdict:
    """Each layout against one device and its schedule; the local-mask pitfall must differ (N > 1)."""
    n, cfg, shape, (batch, seq) = spec.world_size, spec.cfg, spec.shape, (spec.shape.batch, spec.shape.seq)
    ref = block_reference_run(cfg, batch, seq, seed=spec.seed)
    checks, exact, terms = [], [], shape_terms(shape)
    sent, saved = {}, {}
    for i, layout in enumerate(spec.layouts):
        mine = [r.runs[i] for r in results]
        want = [_want_block(ref, cfg, layout, n, r, seq) for r in range(n)]
        if layout == "cp-local-mask":
            worst = worst_of([max_abs_error(mine[r].output, want[r]["output"]) for r in range(n)])
            tol = reordered_tolerance(want[worst]["output"], terms)
            checks.append(differ_check("PITFALL CP masking with local positions: output differs from one device",
                                       mine[worst].output, want[worst]["output"], 1000 * tol,
                                       "1000x rounding: tokens see other spans' futures, a different model")
                          if n > 1 else
                          close_check("one rank: local positions are the global ones, so the local mask is right",
                                      mine[0].output, want[0]["output"], tol, WHY))
            continue
        checks += agreement_checks(layout, [_tensors(m) for m in mine], want, terms)
        schedule = costs.cp_schedule(shape, n) if layout == "cp" else costs.block_schedule(shape, n, layout=layout)
        exact += collective_counts([m.collectives for m in mine], schedule, layout)
        exact += counts_per_rank("saved activation bytes", [m.saved_bytes for m in mine],
                                 [4 * costs.block_saved_elements(shape, n, r, layout=layout) for r in range(n)],
                                 case=layout)
        sent[layout] = [sum(c.bytes_sent for c in m.collectives) for m in mine]
        saved[layout] = [m.saved_bytes for m in mine]
        if layout in ("tp", "sp"):      # the activation collectives of all ranks together: 8(N-1) b s h 4, both ways
            moved = sum(c.bytes_sent for m in mine for c in m.collectives if not c.phase.startswith("sequence"))
            exact.append(Count(quantity="activation bytes sent by all ranks together", rank=0, measured=moved,
                               predicted=costs.megatron_group_bytes(batch, seq, shape.width, n), case=layout))
    data = BlockTraffic(sent, saved, ref.saved_bytes)
    return Verdict(checks=checks, exact=exact, params=spec.params, data=data)


SP_CP_DEMO = Experiment(name="sp-vs-cp", chapter="04", world_sizes=(2, 3, 4), spec=sp_cp_spec,
                        title="Sequence parallelism (two ways) vs context parallelism: traffic and bytes kept",
                        ranks=block_ranks, compare=compare_sp_cp)


def sp_cp_demo(world_size: int, *, batch: int = BATCH, seq: int = SEQ, seed: int = 0) -> Report:
    """TP, TP+SP (both ways) and CP on the same block: results, collectives, bytes kept for backward."""
    return SP_CP_DEMO.run_spec(sp_cp_spec(world_size, batch=batch, seq=seq, seed=seed))


DEMOS = [BLOCK_DEMO, LAYOUTS_DEMO, DTENSOR_DEMO, SP_CP_DEMO]
