"""Chapter 04's experiments, each a Report: the Megatron block, four MLP layouts, torch's DTensor, SP vs CP.

Every demo runs on real gloo ranks, compares every output and gradient with
one device (tolerance in compare.py), and sets each rank's ledger next to
costs.tensor_parallel: collectives, bytes sent per collective, rounds, and
the bytes autograd kept for backward, all exact integers. Bad sizes are
refused before any process starts.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from wmdist.compare import worst as worst_of
from wmdist.costs import require_int
from wmdist.costs import tensor_parallel as costs
from wmdist.report import Count, Demo, Report, close_check, counts_per_rank, differ_check, exact_check, max_abs_error
from wmdist.runtime import run
from wmdist.tensor_parallel.block import NAMES, block_shape, shard_of
from wmdist.tensor_parallel.compare import WHY, agreement_checks, collective_counts, reordered_terms, tolerance
from wmdist.tensor_parallel.layouts import MLP_NAMES, mlp_rank, mlp_reference, mlp_slice
from wmdist.tensor_parallel.sequence import LAYOUTS, block_rank, reference_run, token_slice
from wmdist.tensor_parallel.versus_dtensor import DTENSOR_CONFIG, ours_and_torch
from wmdist.transformer import TransformerConfig

CONFIG = TransformerConfig(width=32, heads=8)     # MLP hidden width 128; 8 heads, so up to 8 ranks hold one each
BATCH, SEQ = 2, 12


def _shape(world_size: int, cfg: TransformerConfig, batch: int, seq: int, sequence: bool) -> costs.BlockShape:
    """Validate the sizes before any process starts; the block's shape."""
    require_int("world_size", world_size, 1)
    shape = block_shape(cfg, require_int("batch", batch, 1), require_int("seq", seq, 1))
    shape.check_world(world_size, sequence)
    return shape


def _tensors(run_: object) -> dict[str, torch.Tensor]:
    return {"output": run_.output, "input gradient": run_.input_grad, **run_.grads}


@dataclass(frozen=True)
class Traffic:
    """Bytes each rank sent per layout (ledger), and the papers' per-rank figure for one layer and step."""
    bytes_sent: dict[str, list[int]]            # layout -> per rank
    ideal_bytes: float                          # Megatron's 4 x 2(N-1)/N b*s*h*4 (the same with SP)


@dataclass(frozen=True)
class BlockTraffic(Traffic):
    """Traffic, plus the bytes each rank kept for backward per layout and the one-device figure."""
    saved_bytes: dict[str, list[int]]           # layout -> per rank
    single_saved_bytes: int                     # the same block on one device


def tp_block_demo(world_size: int, batch: int = BATCH, seq: int = SEQ, seed: int = 0) -> Report:
    """The Megatron block (heads and MLP split, "tp" layout): outputs, every gradient, 4 all-reduces, bytes kept."""
    shape = _shape(world_size, CONFIG, batch, seq, sequence=False)
    n, start = world_size, time.perf_counter()
    runs = [r[0] for r in run(block_rank, n, CONFIG, ("tp",), batch, seq, seed)]
    seconds = time.perf_counter() - start
    ref = reference_run(CONFIG, batch, seq, seed)
    want = [{"output": ref.output, "input gradient": ref.input_grad,
             **{nm: shard_of(nm, ref.grads[nm], CONFIG, n, r) for nm in NAMES}} for r in range(n)]
    checks = agreement_checks("tp", [_tensors(r) for r in runs], want, reordered_terms(shape))
    exact = collective_counts([r.collectives for r in runs], costs.block_schedule(shape, n, "tp"), "tp")
    exact += counts_per_rank("saved activation bytes", [r.saved_bytes for r in runs],
                             [4 * costs.block_saved_elements(shape, n, r, "tp") for r in range(n)], case="tp")
    data = BlockTraffic({"tp": [sum(m.bytes_sent for m in r.collectives) for r in runs]},
                        costs.megatron_layer_bytes(batch, seq, shape.width, n, False),
                        {"tp": [r.saved_bytes for r in runs]}, ref.saved_bytes)
    return Report("tp-block", n, checks, exact, seconds, {"batch": batch, "seq": seq, "width": shape.width,
                                                          "heads": shape.heads, "hidden": shape.hidden}, data)


def tp_layouts_demo(world_size: int, batch: int = BATCH, seq: int = SEQ, seed: int = 0) -> Report:
    """The MLP split four ways: same result, different collectives; the needless gather's bytes, exactly."""
    shape = _shape(world_size, CONFIG, batch, seq, sequence=False)
    n = world_size
    if n > shape.width:
        raise ValueError(f"world_size {n} is more than the width {shape.width}: row -> row would leave a rank "
                         "no input feature")
    start = time.perf_counter()
    runs = run(mlp_rank, n, CONFIG, costs.MLP_LAYOUTS, batch, seq, seed)
    seconds = time.perf_counter() - start
    ref = mlp_reference(CONFIG, batch, seq, seed)
    checks, exact, sent = [], [], {}
    for i, layout in enumerate(costs.MLP_LAYOUTS):
        mine = [r[i] for r in runs]
        want = [{"output": ref.output, "input gradient": ref.input_grad,
                 **{nm: mlp_slice(nm, ref.grads[nm], CONFIG, layout, n, r) for nm in MLP_NAMES}} for r in range(n)]
        checks += agreement_checks(layout, [_tensors(m) for m in mine], want, reordered_terms(shape))
        exact += collective_counts([m.collectives for m in mine], costs.mlp_schedule(shape, n, layout), layout)
        sent[layout] = [sum(c.bytes_sent for c in m.collectives) for m in mine]
    megatron, gathered = (costs.mlp_schedule(shape, n, lay) for lay in costs.MLP_LAYOUTS[:2])
    extra = [costs.schedule_bytes(gathered, r) - costs.schedule_bytes(megatron, r) for r in range(n)]
    exact += counts_per_rank("extra bytes sent for the needless gather",
                             [g - m for g, m in zip(sent[costs.MLP_LAYOUTS[1]], sent[costs.MLP_LAYOUTS[0]])], extra,
                             case=costs.MLP_LAYOUTS[1])
    checks.append(differ_check("PITFALL gathering fc1's output: rank 0 sends more bytes than column -> row",
                               float(sent[costs.MLP_LAYOUTS[1]][0]), float(sent[costs.MLP_LAYOUTS[0]][0]),
                               float(extra[0]), "at least the two all-gathers of (B, T, F) the formula predicts"))
    data = Traffic(sent, costs.megatron_layer_bytes(batch, seq, shape.width, n, False))
    return Report("tp-layouts", n, checks, exact, seconds, {"batch": batch, "seq": seq, "hidden": shape.hidden}, data)


def tp_dtensor_demo(world_size: int, batch: int = 2, seq: int = 3, seed: int = 0) -> Report:
    """Ours vs torch's parallelize_module(ColwiseParallel, RowwiseParallel): same shards, outputs, gradients."""
    n = require_int("world_size", world_size, 1)
    cfg = DTENSOR_CONFIG
    if cfg.hidden % n:
        raise ValueError(f"world_size {n} does not divide the MLP hidden width {cfg.hidden}: DTensor's RowwiseParallel "
                         "assumes equal shards")
    shape = block_shape(cfg, require_int("batch", batch, 1), require_int("seq", seq, 1))
    start = time.perf_counter()
    results = run(ours_and_torch, n, cfg, batch, seq, seed, timeout=600)
    seconds = time.perf_counter() - start
    terms = max(cfg.hidden, batch * seq)
    checks = [exact_check("every rank's local shards are torch's (fc1 rows, fc2 columns, bitwise)",
                          [[s[nm] for nm in MLP_NAMES] for _, s, _ in results],
                          [[t.local_params[nm] for nm in MLP_NAMES] for _, _, t in results],
                          "the same slices of the same weights")]
    checks += agreement_checks("ours vs DTensor", [_tensors(o) for o, _, _ in results],
                               [_tensors(t) for _, _, t in results], terms)
    ref = mlp_reference(cfg, batch, seq, seed)
    checks.append(close_check("DTensor output == single device (rank 0)", results[0][2].output, ref.output,
                              tolerance(ref.output, terms), WHY))
    calls = 2 if n > 1 else 0
    exact = [Count("collectives, torch (dispatched)", r, sum(t.comm_counts.values()), calls, case="DTensor")
             for r, (_, _, t) in enumerate(results)]
    exact += [Count("all-reduce calls, torch (dispatched)", r,
                    sum(c for op, c in t.comm_counts.items() if "all_reduce" in op), calls, case="DTensor")
              for r, (_, _, t) in enumerate(results)]
    exact += collective_counts([o.collectives for o, _, _ in results], costs.mlp_schedule(shape, n, "column -> row"),
                               "ours")
    return Report("tp-vs-dtensor", n, checks, exact, seconds, {"hidden": cfg.hidden, "batch": batch, "seq": seq})


def _want_block(ref: object, cfg: TransformerConfig, layout: str, n: int, r: int, seq: int) -> dict[str, torch.Tensor]:
    """The single-device tensors a rank must match in `layout`: its tokens (SP, CP), its shards (TP, SP)."""
    mine = slice(None) if layout == "tp" else token_slice(seq, n, r)
    grads = ref.grads if layout.startswith("cp") else {nm: shard_of(nm, ref.grads[nm], cfg, n, r) for nm in NAMES}
    return {"output": ref.output[:, mine], "input gradient": ref.input_grad[:, mine], **grads}


def sp_cp_demo(world_size: int, batch: int = BATCH, seq: int = SEQ, seed: int = 0) -> Report:
    """TP, TP+SP (both ways) and CP on the same block: results, collectives, bytes kept for backward."""
    shape = _shape(world_size, CONFIG, batch, seq, sequence=True)
    n, start = world_size, time.perf_counter()
    runs = run(block_rank, n, CONFIG, LAYOUTS, batch, seq, seed)
    seconds = time.perf_counter() - start
    ref = reference_run(CONFIG, batch, seq, seed)
    checks, exact, terms = [], [], reordered_terms(shape)
    sent, saved = {}, {}
    for i, layout in enumerate(LAYOUTS):
        mine = [r[i] for r in runs]
        want = [_want_block(ref, CONFIG, layout, n, r, seq) for r in range(n)]
        if layout == "cp-local-mask":
            worst = worst_of([max_abs_error(mine[r].output, want[r]["output"]) for r in range(n)])
            tol = tolerance(want[worst]["output"], terms)
            checks.append(differ_check("PITFALL CP masking with local positions: output differs from one device",
                                       mine[worst].output, want[worst]["output"], 1000 * tol,
                                       "1000x rounding: tokens see other spans' futures, a different model")
                          if n > 1 else
                          close_check("one rank: local positions are the global ones, so the local mask is right",
                                      mine[0].output, want[0]["output"], tol, WHY))
            continue
        checks += agreement_checks(layout, [_tensors(m) for m in mine], want, terms)
        schedule = costs.cp_schedule(shape, n) if layout == "cp" else costs.block_schedule(shape, n, layout)
        exact += collective_counts([m.collectives for m in mine], schedule, layout)
        exact += counts_per_rank("saved activation bytes", [m.saved_bytes for m in mine],
                                 [4 * costs.block_saved_elements(shape, n, r, layout) for r in range(n)], case=layout)
        sent[layout] = [sum(c.bytes_sent for c in m.collectives) for m in mine]
        saved[layout] = [m.saved_bytes for m in mine]
        if layout in ("tp", "sp"):      # the activation collectives of all ranks together: 8(N-1) b s h 4, both ways
            moved = sum(c.bytes_sent for m in mine for c in m.collectives if not c.phase.startswith("sequence"))
            exact.append(Count("activation bytes sent by all ranks together", 0, moved,
                               costs.megatron_group_bytes(batch, seq, shape.width, n), case=layout))
    data = BlockTraffic(sent, costs.megatron_layer_bytes(batch, seq, shape.width, n, True), saved, ref.saved_bytes)
    return Report("sp-vs-cp", n, checks, exact, seconds, {"batch": batch, "seq": seq, "width": shape.width,
                                                          "heads": shape.heads, "hidden": shape.hidden}, data)


DEMOS = [Demo("tp-block", "Megatron block on N ranks: outputs, every gradient, 4 all-reduces, bytes kept",
              tp_block_demo, world_sizes=(1, 2, 3, 4), chapter="04"),
         Demo("tp-layouts", "One MLP, four layouts: the collectives follow the layout; a needless gather's bytes",
              tp_layouts_demo, world_sizes=(2, 3, 4), chapter="04"),
         Demo("tp-vs-dtensor", "Our column/row MLP vs torch's DTensor ColwiseParallel/RowwiseParallel",
              tp_dtensor_demo, world_sizes=(2, 4), chapter="04"),
         Demo("sp-vs-cp", "Sequence parallelism (two ways) vs context parallelism: traffic and bytes kept",
              sp_cp_demo, world_sizes=(2, 3, 4), chapter="04")]
