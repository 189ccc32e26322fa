"""The ring-attention traffic widget's model: bytes, FLOPs, memory and overlap for one setting (pure, no torch).

Everything comes from wmdist.costs (ring_attention for the ring, collectives
for data parallelism's ring all-reduce of the gradients, tensor_parallel for
Megatron's four all-reduces of b*s*h per layer and step). Curves are taken
over a grid of S and of model width h = heads * head_dim with the other
knobs fixed, so the figure can show where each quantity goes and where the
data-, tensor- and context-parallel orderings swap.

Conventions: d_KV = 2h (keys and values of every head); one layer and one
training step (forward and backward) for the DP/TP/CP comparison; the ring
(CP) total is its K, V and dK, dV traffic plus the same gradient all-reduce
as DP, because context-parallel ranks hold every weight; per-step compute
in the overlap test is the paper's 4 d c^2 b FLOPs for a block of c = S/N
tokens (half of it under a causal mask, on the balanced layout).
Device figures are vendors' datasheet peaks (dense bf16 FLOP/s; link
bandwidth in one direction), not measurements.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from wmdist.costs import ring_attention as ra
from wmdist.costs.collectives import ring_allreduce_bytes
from wmdist.costs.tensor_parallel import BlockShape, block_params, megatron_layer_bytes
from wmdist.costs.validate import require_bool, require_choice, require_fields, require_positive
from wmdist.base.knobs import knob

TrafficDType = Literal["bfloat16", "float16", "float32"]     # the widget's dtypes, by element size
DTYPE_BYTES: dict[TrafficDType, int] = {"bfloat16": 2, "float16": 2, "float32": 4}
# name -> (FLOP/s, link bytes/s one way, source). Datasheet peaks: dense bf16 Tensor Core throughput;
# NVLink totals are both directions together, so one way is half; InfiniBand rates are per port and direction.
DEVICES: dict[str, tuple[float, float, str]] = {
    "A100 SXM, NVLink 3": (312e12, 300e9, "NVIDIA A100 datasheet: 312 TFLOP/s bf16 dense; NVLink 600 GB/s total"),
    "A100 SXM, HDR InfiniBand": (312e12, 25e9, "A100 datasheet; HDR InfiniBand 200 Gb/s = 25 GB/s"),
    "H100 SXM, NVLink 4": (989e12, 450e9, "NVIDIA H100 datasheet: 989 TFLOP/s bf16 dense; NVLink 900 GB/s total"),
    "H100 SXM, NDR InfiniBand": (989e12, 50e9, "H100 datasheet; NDR InfiniBand 400 Gb/s = 50 GB/s"),
    "custom (F, B sliders)": (0.0, 0.0, "the F and B sliders, e.g. this machine's measured figures"),
}
CUSTOM = "custom (F, B sliders)"
POW2 = tuple(2 ** i for i in range(10, 21))                     # 1,024 .. 1,048,576 tokens


@dataclass(frozen=True, kw_only=True)
class TrafficConfig:
    """One setting of the widget: sizes, ring degree, tile, dtype, mask, device."""
    seq_len: int = knob(65536, "S (tokens)", options=POW2)
    heads: int = knob(16, "heads", options=(1, 2, 4, 8, 16, 32, 64, 128))
    head_dim: int = knob(128, "head width", options=(16, 32, 64, 128, 256))
    world_size: int = knob(8, "N ranks", options=(1, 2, 4, 8, 16, 32, 64))
    block_size: int = knob(512, "score tile (rows)", options=(16, 32, 64, 128, 256, 512, 1024, 2048))
    batch: int = knob(1, "batch (sequences)", options=(1, 2, 4, 8, 16))
    dtype: TrafficDType = knob("bfloat16", "dtype", options=("float32", "bfloat16", "float16"))   # by size
    causal: bool = knob(True, "causal mask")
    device: str = knob("A100 SXM, NVLink 3", "device, link", options=tuple(DEVICES))
    flops: float = knob(1e11, "custom F (FLOP/s)", low=1e8, high=1e16, log=True, step=0.1, fmt=".3s")
    link: float = knob(1e9, "custom B (bytes/s)", low=1e6, high=1e12, log=True, step=0.1, fmt=".3s")

    def __post_init__(self) -> None:
        require_fields(self, ("seq_len", "heads", "head_dim", "world_size", "block_size", "batch"), 1)
        require_choice("dtype", self.dtype, DTYPE_BYTES)
        require_bool("causal", self.causal)
        require_choice("device", self.device, DEVICES)
        require_positive("flops", self.flops)
        require_positive("link", self.link)
        if self.seq_len % (2 * self.world_size if self.causal else self.world_size):
            raise ValueError(f"seq_len must be divisible by {'2N' if self.causal else 'N'} = "
                             f"{2 * self.world_size if self.causal else self.world_size}, got {self.seq_len}")

    @property
    def width(self) -> int:
        """h = heads * head_dim."""
        return self.heads * self.head_dim

    @property
    def elem(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def device_figures(self) -> tuple[float, float]:
        """(F FLOP/s, B bytes/s) of the selected device or of the custom sliders."""
        f, b, _ = DEVICES[self.device]
        return (self.flops, self.link) if self.device == CUSTOM else (f, b)


def parallel_bytes(c: TrafficConfig, seq_len: int, width: int) -> dict[str, int]:
    """Bytes one rank sends per layer and training step: DP (gradients), TP (Megatron), CP (ring + gradients)."""
    n, e, b = c.world_size, c.elem, c.batch
    params = block_params(BlockShape(batch=b, seq=seq_len, width=width, heads=1, hidden=4 * width))
    grads = ring_allreduce_bytes(params, n, 0, elem_size=e)
    fwd = ra.ring_kv_bytes_per_rank(seq_len, n, 2 * width, batch=b, elem_size=e)
    kv_back, grad_back = ra.ring_backward_bytes_per_rank(seq_len, n, 2 * width, batch=b, elem_size=e)
    return {"DP": grads, "TP": round(megatron_layer_bytes(b, seq_len, width, n, sequence_parallel=False, elem_size=e)),
            "CP": fwd + kv_back + grad_back + grads}


@dataclass(kw_only=True, frozen=True)
class TrafficResult:
    """The numbers at the current setting and the curves over S and over width."""
    sent: int                        # forward K, V bytes per rank, N-1 sends
    sent_paper: int                  # the same with the paper's N sends
    backward: tuple[int, int]        # backward K, V and dK, dV bytes per rank
    flops: int                       # forward attention FLOPs, all ranks together
    kv_storage: int                  # K, V bytes a rank holds (block in use + block arriving)
    scores_blocked: int              # two score tiles of the chosen size
    scores_full: int                 # the S x S scores of unblocked attention, one process
    tokens_per_rank: int             # c = S/N
    step_compute_s: float            # one ring step's compute at F
    step_comm_s: float               # one ring step's K, V send at B
    min_block: int                   # smallest c that hides the send (c >= e F / 2B, doubled if causal)
    parallel: dict[str, int]         # DP, TP, CP bytes per rank per layer and step
    s_grid: tuple[int, ...]
    sent_s: tuple[int, ...]          # per-rank forward bytes (N-1 sends) over s_grid
    sent_paper_s: tuple[int, ...]
    flops_s: tuple[int, ...]
    total_sent_s: tuple[int, ...]    # all ranks' forward bytes over s_grid
    kv_storage_s: tuple[int, ...]
    scores_full_s: tuple[int, ...]
    parallel_s: dict[str, tuple[int, ...]]
    width_grid: tuple[int, ...]
    parallel_w: dict[str, tuple[int, ...]]

    @property
    def hides(self) -> bool:
        return self.step_compute_s >= self.step_comm_s

    @property
    def ranking(self) -> list[str]:
        """DP, TP, CP from fewest to most bytes per rank at the current setting."""
        return sorted(self.parallel, key=self.parallel.get)


def traffic_model(c: TrafficConfig) -> TrafficResult:
    """Evaluate every formula of the widget at `c` and along S and width."""
    n, e, b, h = c.world_size, c.elem, c.batch, c.width
    tokens = c.seq_len // n
    tile = min(c.block_size, tokens)
    f, link = c.device_figures
    half = 2 if c.causal else 1
    s_grid = tuple(s for s in POW2 if s % (2 * n) == 0) or (c.seq_len,)

    def fwd(s: int, final: bool = False) -> float:
        return ra.ring_kv_bytes_per_rank(s, n, 2 * h, batch=b, elem_size=e, final_exchange=final)

    def flops(s: int) -> float:
        return ra.attention_flops(s, c.head_dim, heads=c.heads, batch=b, causal=c.causal)

    widths = tuple(sorted({c.head_dim * k for k in (1, 2, 4, 8, 16, 32, 64, 128)} | {h}))
    by_s = [parallel_bytes(c, s, h) for s in s_grid]
    by_w = [parallel_bytes(c, c.seq_len, w) for w in widths]
    return TrafficResult(
        sent=fwd(c.seq_len), sent_paper=fwd(c.seq_len, True),
        backward=ra.ring_backward_bytes_per_rank(c.seq_len, n, 2 * h, batch=b, elem_size=e), flops=flops(c.seq_len),
        kv_storage=ra.ring_kv_storage_bytes(c.seq_len, n, 2 * h, batch=b, elem_size=e),
        scores_blocked=2 * ra.score_tile_bytes(tile, tile, heads=c.heads, batch=b, elem_size=e),
        scores_full=ra.full_scores_bytes(c.seq_len, heads=c.heads, batch=b, elem_size=e), tokens_per_rank=tokens,
        step_compute_s=b * ra.block_pair_flops(tokens, h) / half / f,
        step_comm_s=b * ra.kv_step_bytes(tokens, h, elem_size=e) / link,
        min_block=half * ra.min_overlap_block_size(f, link, elem_size=e), parallel=parallel_bytes(c, c.seq_len, h),
        s_grid=s_grid, sent_s=tuple(fwd(s) for s in s_grid), sent_paper_s=tuple(fwd(s, True) for s in s_grid),
        flops_s=tuple(flops(s) for s in s_grid), total_sent_s=tuple(n * fwd(s) for s in s_grid),
        kv_storage_s=tuple(ra.ring_kv_storage_bytes(s, n, 2 * h, batch=b, elem_size=e) for s in s_grid),
        scores_full_s=tuple(ra.full_scores_bytes(s, heads=c.heads, batch=b, elem_size=e) for s in s_grid),
        parallel_s={k: tuple(d[k] for d in by_s) for k in ("DP", "TP", "CP")}, width_grid=widths,
        parallel_w={k: tuple(d[k] for d in by_w) for k in ("DP", "TP", "CP")})


@dataclass(kw_only=True, frozen=True)
class RingMeasurement:
    """What "run it" measured on local ranks, at its own (smaller) S, with the model's predictions there."""
    seq_len: int
    world_size: int
    sent: list[int]                  # forward K, V bytes per rank (ledger)
    sent_predicted: int
    backward: list[int]              # backward K, V + dK, dV bytes per rank (ledger)
    backward_predicted: int
    peak: list[int]                  # allocator peak per rank during forward (bytes)
    kv_storage: int                  # the model's K, V bytes a rank holds at that S
