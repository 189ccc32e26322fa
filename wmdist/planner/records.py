"""The record types of a published training run, and the sources' own FLOP counts (pure).

A `PublishedRun` copies one row of a paper's table and says where it stands:
its `Citation` names the table or section, `confidence` says how the numbers
were checked, and `note` what the source leaves out. A field the source does
not print is None, never a guess.

Throughput is compared like with like through `flops_counted`. "model" FLOPs
are the step's matrix work once forward and twice backward, whatever the
implementation re-runs; "hardware" FLOPs add what activation recomputation
runs again. Narayanan et al. 2021 (and the Megatron-DeepSpeed logs BLOOM and
MT-NLG print) count a whole extra forward pass, their equation 3; Korthikanti
et al. 2022 give both, their equations 7 and 8. MFU and HFU are those FLOP/s
over the GPU's dense bf16 peak (`hardware.GPUS`).

Layout conventions: dp x tp x pp x cp is the GPU count. Expert parallelism
splits the ranks that hold one copy of the attention weights (dp x cp x tp,
divided by the experts' own tensor parallelism), as Megatron-Core counts it.
`virtual_stages` is the interleaved schedule's chunks per pipeline rank (1 for
plain 1F1B, None where the source says "interleaved" without the number).
`pipeline_padding` is how many layer slots the source's partition adds so the
stages balance: BLOOM partitions 70 blocks and its 2 embedding layers over 12
stages, Llama 3 takes one block off its first and last stages (126 + 2 = 16 x 8).
`zero_stage` 3 stands for fully sharded data parallelism.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from wmdist.costs.validate import require_fields, require_int
from wmdist.planner.presets import Architecture

Recompute = Literal["none", "selective", "full"]
FlopsCounted = Literal["model", "hardware"]
Confidence = Literal["checked", "partly checked", "unchecked"]
MEGA = {"decimal": 10 ** 6, "binary": 2 ** 20}   # "16M tokens": sources use both readings


@dataclass(frozen=True, kw_only=True)
class Citation:
    """Where a row comes from: enough to find the exact table."""
    authors: str
    year: int
    title: str
    arxiv: str | None               # "2104.04473"; None for a README or web page
    where: str                      # "Table 1", "section 3.3.2, Table 4"
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
    pipeline_padding: int = 0
    zero_stage: int | None = 0
    micro_batch: int | None = None  # sequences per micro-batch
    recompute: Recompute | None = None
    sequence_parallel: bool | None = None
    overlapped: tuple[str, ...] | None = None   # axes whose communication the source says it hides behind
                                                # compute; () where it says none is, None where it is silent

    def __post_init__(self) -> None:
        require_fields(self, ("dp", "tp", "pp", "cp", "ep", "expert_tp"), 1)
        require_int("pipeline_padding", self.pipeline_padding, 0)
        for name, value, low, high in (("virtual_stages", self.virtual_stages, 1, None),
                                       ("zero_stage", self.zero_stage, 0, 3), ("micro_batch", self.micro_batch, 1, None)):
            if value is not None:
                require_int(name, value, low, high=high)
        if self.overlapped is not None and not set(self.overlapped) <= {"dp", "tp", "pp", "cp", "ep"}:
            raise ValueError(f"overlapped must name axes among dp, tp, pp, cp, ep, got {self.overlapped!r}")
        if self.recompute not in (None, "none", "selective", "full"):
            raise ValueError(f"recompute must be 'none', 'selective', 'full' or None, got {self.recompute!r}")

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
    global_batch: int | None        # sequences per step, where published (or per-DP batch x DP)
    batch_per_dp: int | None = None # as Llama 3 prints it
    printed_batch_tokens: str | None = None   # "16M", "2M": the source's own token count
    tflops_per_gpu: float | None    # as printed, 10^12 FLOP/s per GPU
    tflops_step: float = 1.0        # the unit of the printed TFLOP/s' last digit
    flops_counted: FlopsCounted | None   # what the TFLOP/s (and a lone utilization figure) count; None: unsaid
    mfu: float | None = None        # as printed, a fraction
    hfu: float | None = None
    utilization_step: float = 0.01  # the unit of the printed percentages' last digit (0.001 for "41.5%")
    iteration_s: float | None = None  # seconds per step, where printed
    citation: Citation
    confidence: Confidence
    note: str = ""
    baseline: str = ""              # where the source itself presents this run as the baseline it improves on

    @property
    def batch_tokens(self) -> int:
        """Tokens per step: sequences x length, or (no sequence count published) the printed figure,
        reading "M" as 2^20 as the metaseq launcher that trained OPT does."""
        if self.global_batch is not None:
            return self.global_batch * self.seq_len
        if self.printed_batch_tokens is None:
            raise ValueError(f"{self.name}: neither a sequence count nor a token count is published")
        return round(float(self.printed_batch_tokens[:-1]) * MEGA["binary"])


def gpt_step_flops(m: Architecture, *, sequences: int, seq_len: int, counted: Recompute) -> float:
    """Megatron's GEMM-only FLOPs for one step of a GPT model (4h MLP, one K and V per head), as the
    papers define them: "none" 72 B s L h^2 (1 + s/6h + V/12hL), the model FLOPs of Korthikanti et al.
    eq. 7; "selective" adds the recomputed attention products, s/3h in place of s/6h (their eq. 8);
    "full" is Narayanan et al.'s eq. 3 with a whole forward again, 96 B s L h^2 (1 + s/6h + V/16Lh)."""
    if m.gated_mlp or m.moe or m.ffn != 4 * m.hidden or m.kv_heads != m.heads:
        raise ValueError(f"{m.name} is not a GPT-shaped model; these formulas count 4h MLPs and full heads")
    B, s, L, h, V = sequences, seq_len, m.layers, m.hidden, m.vocab
    if counted == "full":
        return 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    attention = s / (3 * h) if counted == "selective" else s / (6 * h)
    return 72 * B * s * L * h * h * (1 + attention + V / (12 * h * L))
