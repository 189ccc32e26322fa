"""Published training runs as data, each with its citation: every run the planner is scored against (pure).

`RUNS` gathers the A100 runs (`published_a100`) and the H100 runs below:
Megatron-Core's 2024 weak-scaling table, Llama 3 405B's three pre-training
layouts (the last one the 128K-context run with 16-way context parallelism),
and Megatron-Core's Mixtral 8x7B MoE mapping. The record types and the
conventions they follow are in `records`; the shapes in `presets`.
"""
from __future__ import annotations

from wmdist.planner.hardware import CLUSTERS, GPUS
from wmdist.planner.presets import PRESETS
from wmdist.planner.published_a100 import RUNS_A100
from wmdist.planner.records import Citation, FlopsCounted, Layout, PublishedRun, gpt_step_flops

__all__ = ["RUNS", "RUNS_BY_NAME", "Citation", "Layout", "PublishedRun", "gpt_step_flops", "known_keys_ok",
           "peak_flops", "published_share", "published_run"]

MCORE = Citation(authors="NVIDIA (Megatron-LM team)", year=2024, title="Megatron-LM README: Performance Benchmarking",
                 arxiv=None, where="model table (images/model_table.png, added in commit f2e5db402c, 2024-07-15)",
                 url="https://github.com/NVIDIA/Megatron-LM")
LLAMA3 = Citation(authors="Dubey et al. (Llama Team, AI @ Meta)", year=2024, title="The Llama 3 Herd of Models",
                  arxiv="2407.21783", where="section 3.3.2, Table 4 (v3 of the arXiv paper)")
MOE = Citation(authors="NVIDIA (Megatron-LM team)", year=2024, title="Megatron Core MoE README", arxiv=None,
               where="headline figure and 'Reference Best Parallel Mapping' (MCore v0.8; "
                     "megatron/core/transformer/moe/README.md at commit 0b981f9c53, 2024-08-02)",
               url="https://github.com/NVIDIA/Megatron-LM")


def _mcore(size: str, tp: int, pp: int, gpus: int, batch: int, tflops: float, mfu: int) -> PublishedRun:
    return PublishedRun(
        name=f"mcore24-{size.lower()}", model=f"mcore-{size.lower()}", gpu="h100", cluster=None, gpus=gpus,
        layout=Layout(dp=gpus // (tp * pp), tp=tp, pp=pp, virtual_stages=None, zero_stage=1,
                      sequence_parallel=tp > 1, overlapped=("dp", "tp", "pp")), seq_len=4096,
        global_batch=batch, tflops_per_gpu=tflops, tflops_step=0.1, flops_counted="model", mfu=mfu / 100,
        citation=MCORE, confidence="checked",
        note="Read from the README's table image: GPT models, vocabulary 131,072, sequence 4096, data-parallel "
             "size 48 in every row; throughput end to end; DP, TP and PP communication overlapped. ZeRO-1 and "
             "sequence parallelism are inferred: --overlap-param-gather needs Megatron's distributed optimizer "
             "and --tp-comm-overlap needs --sequence-parallel. Micro-batch, interleaving and "
             "recompute are not given, nor the cluster beyond 'H100'. The MFUs divide by 989 TFLOP/s.")


RUNS_H100: tuple[PublishedRun, ...] = (
    *(_mcore(*row) for row in (
        ("1.7B", 1, 1, 48, 192, 408.8, 41), ("7.1B", 2, 1, 96, 192, 465.9, 47), ("16B", 4, 1, 192, 192, 489.1, 49),
        ("32B", 8, 1, 384, 192, 459.6, 46), ("70B", 8, 2, 768, 384, 419.7, 42),
        ("119B", 8, 4, 1536, 768, 420.5, 43), ("177B", 8, 6, 2304, 1152, 432.8, 44),
        ("314B", 8, 8, 3072, 1536, 474.4, 48), ("462B", 8, 16, 6144, 3072, 459.9, 47))),
    *(PublishedRun(
        name=name, model="llama3-405b", gpu="h100", cluster="meta-llama3-roce", gpus=gpus,
        layout=Layout(dp=dp, tp=8, pp=16, cp=cp, virtual_stages=None, pipeline_padding=2, zero_stage=2,
                      recompute="none" if cp == 1 else None, overlapped=("dp", "pp")),
        seq_len=seq, global_batch=per_dp * dp, batch_per_dp=per_dp, printed_batch_tokens="16M",
        tflops_per_gpu=tflops, tflops_step=10, flops_counted="model", mfu=mfu, citation=LLAMA3,
        confidence="checked",
        note="Table 4, read in two copies of the paper. FSDP shards optimizer state and gradients and keeps the "
             "parameters gathered from forward to backward (no reshard), ZeRO-2 in memory. Interleaved schedule "
             "with an unstated number of chunks; one block fewer on the first and last stages; 8K runs without "
             "activation checkpointing (section 3.3.2). FSDP prefetches and reduces asynchronously and PP "
             "point-to-point is asynchronous; CP all-gathers K and V with the latency exposed, 2 x CP chunks per "
             "sequence. "
             "Earlier arXiv versions print DP 4 in the 128K row; v3 prints 8, which GPUs / (TP x CP x PP) and "
             "16M tokens both require. TFLOP/s are printed to two digits.")
      for name, gpus, dp, cp, seq, per_dp, tflops, mfu in (
          ("llama3-405b-8k-8192gpu", 8192, 64, 1, 8192, 32, 430, 0.43),
          ("llama3-405b-8k-16384gpu", 16384, 128, 1, 8192, 16, 400, 0.41),
          ("llama3-405b-128k-16384gpu", 16384, 8, 16, 131072, 16, 380, 0.38))),
    PublishedRun(
        name="mcore24-mixtral-8x7b", model="mixtral-8x7b", gpu="h100", cluster="mcore-h100-ib", gpus=64,
        layout=Layout(dp=16, tp=1, pp=4, ep=8, virtual_stages=8, zero_stage=None, micro_batch=1), seq_len=4096,
        global_batch=256, tflops_per_gpu=438, flops_counted="model", citation=MOE, confidence="partly checked",
        note="Dropless MoE with the all-to-all dispatcher in BF16. The README prints 438 TFLOPS for Mixtral 8x7B "
             "in its opening line and the 64-GPU mapping (TP 1, EP 8, PP 4, VP 8, MBS 1, GBS 256) in its table; "
             "that the figure belongs to that mapping is our reading. Megatron's throughput counts model "
             "FLOPs with top-2 experts; recompute and distributed optimizer are not given."),
)

RUNS: tuple[PublishedRun, ...] = RUNS_A100 + RUNS_H100
RUNS_BY_NAME: dict[str, PublishedRun] = {r.name: r for r in RUNS}


def published_share(r: PublishedRun) -> tuple[float, FlopsCounted | None] | None:
    """The fraction of peak a run reached as its source counts it, and what it counts: the printed MFU, else
    the printed HFU, else the printed TFLOP/s over the GPU's peak (None where a run prints none of these)."""
    if r.mfu is not None:
        return r.mfu, "model"
    if r.hfu is not None:
        return r.hfu, "hardware"
    if r.tflops_per_gpu is not None:
        return r.tflops_per_gpu * 1e12 / peak_flops(r), r.flops_counted
    return None


def published_run(name: str) -> PublishedRun:
    """The published run called `name`; a ValueError lists the names."""
    if name not in RUNS_BY_NAME:
        raise ValueError(f"published run must be one of {', '.join(RUNS_BY_NAME)}, got {name!r}")
    return RUNS_BY_NAME[name]


def peak_flops(r: PublishedRun) -> float:
    """The dense bf16 peak of the run's GPU, FLOP/s."""
    return GPUS[r.gpu].peak_bf16_flops


def known_keys_ok(r: PublishedRun) -> bool:
    """Every key a run names exists: its model preset, GPU type and cluster."""
    return r.model in PRESETS and r.gpu in GPUS and (r.cluster is None or r.cluster in CLUSTERS)
