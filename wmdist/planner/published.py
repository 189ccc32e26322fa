"""Published training runs as data: model, GPUs, layout, batch, and the throughput each paper reports (pure).

Each `PublishedRun` copies one row of a paper's table (or one sentence's
numbers) and says where it stands: the citation names the table or section,
`confidence` says how each number was checked, and `note` says what the source
leaves out. Fields a source does not print are None, never guessed.

Throughput is compared like with like through `flops_counted`: "model" FLOPs
count the training step's matrix work once forward and twice backward
(6 x active parameters x tokens, plus attention); "hardware" FLOPs add what
activation recomputation runs again (Narayanan et al. count one more forward
pass, Korthikanti et al. the recomputed part only). MFU and HFU are fractions of
the GPU's dense bf16 peak (`hardware.GPUS`).

Layout conventions: dp x tp x pp x cp == GPUs (`ep` splits the data-parallel
ranks of the expert layers, so it divides dp x cp x tp / expert_tp, as in
Megatron-Core and DeepSeek's reports); `virtual_stages` is the interleaved
schedule's chunks per pipeline rank (1: plain 1F1B); `zero_stage` 3 stands for
FSDP's full sharding; `micro_batch` is in sequences.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from wmdist.planner.hardware import CLUSTERS, GPUS
from wmdist.planner.presets import PRESETS

Recompute = Literal["none", "selective", "full"]
FlopsCounted = Literal["model", "hardware"]
Confidence = Literal["checked", "partly checked", "unchecked"]


@dataclass(frozen=True, kw_only=True)
class Citation:
    """Where a row comes from: enough to find the exact table."""
    authors: str            # "Narayanan et al."
    year: int
    title: str
    arxiv: str | None       # "2104.04473"; None for a web page or README
    where: str              # "Table 1", "section 3.3.2, Table 4"
    url: str | None = None


@dataclass(frozen=True, kw_only=True)
class Layout:
    """How a run split its GPUs, as the source gives it; None where the source does not say."""
    dp: int
    tp: int
    pp: int
    cp: int = 1
    ep: int = 1
    expert_tp: int = 1
    virtual_stages: int | None = 1
    zero_stage: int | None = 0
    micro_batch: int | None = None
    recompute: Recompute | None = None
    sequence_parallel: bool | None = None

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp


@dataclass(frozen=True, kw_only=True)
class PublishedRun:
    """One published measurement: a model on a cluster in one layout, and the throughput it reached."""
    name: str
    model: str                      # a key of presets.PRESETS
    gpu: str                        # a key of hardware.GPUS
    cluster: str | None             # a key of hardware.CLUSTERS, where the source describes its machine
    gpus: int
    layout: Layout
    seq_len: int
    global_batch: int | None        # sequences per step, where published
    batch_tokens: int               # tokens per step: global_batch * seq_len, or the printed figure
    tflops_per_gpu: float | None    # as printed, in 10^12 FLOP/s
    flops_counted: FlopsCounted     # what the printed TFLOP/s (or utilization) counts
    mfu: float | None = None        # model FLOPs utilization as printed (a fraction)
    hfu: float | None = None        # hardware FLOPs utilization as printed
    utilization_digits: int = 0     # decimals the source prints its percentages with
    tflops_digits: int = 0          # decimals of the printed TFLOP/s
    citation: Citation
    confidence: Confidence
    note: str = ""


NARAYANAN = Citation(authors="Narayanan, Shoeybi, Casper, LeGresley, Patwary, Korthikanti et al.", year=2021,
                     title="Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
                     arxiv="2104.04473", where="Table 1 (weak scaling)")
KORTHIKANTI = Citation(authors="Korthikanti, Casper, Lym, McAfee, Andersch, Shoeybi, Catanzaro", year=2022,
                       title="Reducing Activation Recomputation in Large Transformer Models", arxiv="2205.05198",
                       where="Table 3 (configurations) and Table 5 (MFU, HFU)")
MCORE = Citation(authors="NVIDIA", year=2024, title="Megatron-LM README, Performance Benchmarking", arxiv=None,
                 where="model table (images/model_table.png, commit f2e5db402c, 2024-07-15)",
                 url="https://github.com/NVIDIA/Megatron-LM")
LLAMA3 = Citation(authors="Dubey et al. (Llama Team, AI @ Meta)", year=2024, title="The Llama 3 Herd of Models",
                  arxiv="2407.21783", where="section 3.3.2, Table 4")
BLOOM = Citation(authors="BigScience Workshop (Le Scao et al.)", year=2022,
                 title="BLOOM: A 176B-Parameter Open-Access Multilingual Language Model", arxiv="2211.05100",
                 where="section 3.4 (Engineering)")
OPT = Citation(authors="Zhang et al.", year=2022, title="OPT: Open Pre-trained Transformer Language Models",
               arxiv="2205.01068", where="section 2.4 (Training Efficiency), Table 1 (batch)")
MTNLG = Citation(authors="Smith et al.", year=2022,
                 title="Using DeepSpeed and Megatron to Train Megatron-Turing NLG 530B", arxiv="2201.11990",
                 where="section 2.4 / Table 1 (system performance)")


def _narayanan(size: str, mp: int, gpus: int, batch: int, tflops: int, pct: int) -> PublishedRun:
    tp, pp = min(mp, 8), max(mp // 8, 1)
    return PublishedRun(
        name=f"narayanan21-{size.lower()}", model=f"megatron-{size.lower()}", gpu="a100-80gb", cluster="selene",
        gpus=gpus, layout=Layout(dp=gpus // mp, tp=tp, pp=pp, virtual_stages=None, recompute="full"),
        seq_len=2048, global_batch=batch, batch_tokens=batch * 2048, tflops_per_gpu=tflops,
        flops_counted="hardware", hfu=pct / 100, citation=NARAYANAN, confidence="checked",
        note="size, hidden, layers, model-parallel size, GPUs, batch, TFLOP/s and % of peak read from the "
             "Megatron-LM README's copy of Table 1 (images/cases_april2021.png); the README prints t x p as one "
             "'model-parallel size' and says TP is 8 wherever it exceeds 8. FLOPs count the recomputed forward "
             "(the paper's 96BslH^2 formula), so the percentage is a hardware utilization. Micro-batch and "
             "interleaving are not in the table.")


def _mcore(size: str, tp: int, pp: int, gpus: int, batch: int, tflops: float, mfu: int) -> PublishedRun:
    return PublishedRun(
        name=f"mcore24-{size.lower()}", model=f"mcore-{size.lower()}", gpu="h100", cluster=None, gpus=gpus,
        layout=Layout(dp=48, tp=tp, pp=pp, virtual_stages=None, zero_stage=None), seq_len=4096,
        global_batch=batch, batch_tokens=batch * 4096, tflops_per_gpu=tflops, tflops_digits=1,
        flops_counted="model", mfu=mfu / 100, citation=MCORE, confidence="checked",
        note="read from the README's table image; data-parallel size 48 in every row. The README names the "
             "overlaps used (grad reduce, param gather, TP comm, PP) but not the micro-batch, interleaving, "
             "recompute or distributed optimizer; the cluster is 'H100 clusters', undescribed.")


RUNS: tuple[PublishedRun, ...] = (
    *(_narayanan(*row) for row in (
        ("1.7B", 1, 32, 512, 137, 44), ("3.6B", 2, 64, 512, 138, 44), ("7.5B", 4, 128, 512, 142, 46),
        ("18.4B", 8, 256, 1024, 135, 43), ("39.1B", 16, 512, 1536, 138, 44), ("76.1B", 32, 1024, 1792, 140, 45),
        ("145.6B", 64, 1536, 2304, 148, 47), ("310.1B", 128, 1920, 2160, 155, 50),
        ("529.6B", 280, 2520, 2520, 163, 52), ("1008.0B", 512, 3072, 3072, 163, 52))),
    *(PublishedRun(
        name=f"korthikanti22-{model.split('-')[-1]}", model=model, gpu="a100-80gb", cluster="selene", gpus=gpus,
        layout=Layout(dp=1, tp=8, pp=pp, virtual_stages=None, recompute="selective", sequence_parallel=True),
        seq_len=2048, global_batch=batch, batch_tokens=batch * 2048, tflops_per_gpu=None, flops_counted="model",
        mfu=mfu, hfu=hfu, utilization_digits=1, citation=KORTHIKANTI, confidence="partly checked",
        note="MFU and HFU checked against the Megatron-LM README's copy of Table 5 (data-parallel size one); "
             "pipeline size, GPUs and batch are Table 3 as recalled, not yet confirmed.")
      for model, pp, gpus, batch, mfu, hfu in (
          ("gpt-22b", 1, 8, 4, 0.415, 0.437), ("gpt3-175b", 8, 64, 64, 0.514, 0.528),
          ("gpt-530b", 35, 280, 280, 0.560, 0.570), ("gpt-1t", 64, 512, 512, 0.563, 0.570))),
    *(_mcore(*row) for row in (
        ("1.7B", 1, 1, 48, 192, 408.8, 41), ("7.1B", 2, 1, 96, 192, 465.9, 47), ("16B", 4, 1, 192, 192, 489.1, 49),
        ("32B", 8, 1, 384, 192, 459.6, 46), ("70B", 8, 2, 768, 384, 419.7, 42),
        ("119B", 8, 4, 1536, 768, 420.5, 43), ("177B", 8, 6, 2304, 1152, 432.8, 44),
        ("314B", 8, 8, 3072, 1536, 474.4, 48), ("462B", 8, 16, 6144, 3072, 459.9, 47))),
    *(PublishedRun(
        name=name, model="llama3-405b", gpu="h100", cluster="meta-rsc-roce", gpus=gpus,
        layout=Layout(dp=dp, tp=8, pp=16, cp=cp, virtual_stages=None, zero_stage=None), seq_len=seq,
        global_batch=per_dp * dp, batch_tokens=per_dp * dp * seq, tflops_per_gpu=tflops, flops_counted="model",
        mfu=mfu, citation=LLAMA3, confidence="unchecked",
        note="Table 4 prints batch size per DP group and 16M tokens per batch; 126 layers on 16 stages with one "
             "layer fewer on the first and the last stage (section 3.3.2); interleaved schedule, "
             "micro-batch and FSDP details not in the table.")
      for name, gpus, dp, cp, seq, per_dp, tflops, mfu in (
          ("llama3-405b-8k-8192gpu", 8192, 64, 1, 8192, 32, 430, 0.43),
          ("llama3-405b-8k-16384gpu", 16384, 128, 1, 8192, 16, 400, 0.41),
          ("llama3-405b-128k-16384gpu", 16384, 8, 16, 131072, 16, 380, 0.38))),
    PublishedRun(
        name="bloom-176b", model="bloom-176b", gpu="a100-80gb", cluster="jean-zay", gpus=384,
        layout=Layout(dp=8, tp=4, pp=12, zero_stage=1, micro_batch=2, virtual_stages=1, recompute=None),
        seq_len=2048, global_batch=2048, batch_tokens=2048 * 2048, tflops_per_gpu=150, flops_counted="hardware",
        citation=BLOOM, confidence="unchecked",
        note="150 TFLOP/s per GPU in bf16 on 48 nodes of 8 A100 80GB; global batch 2048 after the ramp-up."),
    PublishedRun(
        name="opt-175b", model="opt-175b", gpu="a100-80gb", cluster="meta-opt", gpus=992,
        layout=Layout(dp=124, tp=8, pp=1, zero_stage=3, virtual_stages=1), seq_len=2048, global_batch=None,
        batch_tokens=2 * 2 ** 20, tflops_per_gpu=147, flops_counted="model", citation=OPT, confidence="unchecked",
        note="'up to 147 TFLOP/s per GPU' with FSDP and Megatron-LM tensor parallelism; batch printed as 2M "
             "tokens; tensor-parallel degree 8 is from the metaseq logbook, not the paper."),
    *(PublishedRun(
        name=f"mt-nlg-530b-{gpus}gpu", model="mt-nlg-530b", gpu="a100-80gb", cluster="selene", gpus=gpus,
        layout=Layout(dp=gpus // 280, tp=8, pp=35, micro_batch=1, virtual_stages=1, recompute="full"),
        seq_len=2048, global_batch=1920, batch_tokens=1920 * 2048, tflops_per_gpu=tflops,
        flops_counted="hardware", citation=MTNLG, confidence="unchecked",
        note="batch 1920 sequences; TFLOP/s per GPU as the paper's system-performance table prints it.")
      for gpus, tflops in ((2240, 126), (2800, 121), (3360, 113))),
)

RUNS_BY_NAME: dict[str, PublishedRun] = {r.name: r for r in RUNS}


def run(name: str) -> PublishedRun:
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
