"""Tensor and sequence parallelism in closed form: the collectives of each layout, and the bytes a rank keeps.

Pure Python. Sources, and what each assumes:

* Megatron-LM (Shoeybi et al. 2019): an MLP split column-then-row, and
  attention split by heads (QKV column-wise, output projection row-wise),
  need one all-reduce of the (b, s, h) activations in forward and one in
  backward each: 4 all-reduces of b*s*h elements per layer per training step.
* Sequence parallelism (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
  Models"): outside the matmuls (LayerNorm, dropout, residual) activations are split along the sequence, and
  each all-reduce becomes a reduce-scatter (into the sequence-split region) plus an all-gather (out of it).
  A ring all-reduce *is* a reduce-scatter followed by an all-gather, so the bytes are the same.
  Megatron-LM's code keeps only the sequence shard of a linear layer's input and all-gathers it again in
  backward for the weight gradient ("sp-regather"): activation memory then divides by t exactly, for one
  more all-gather per sublayer. Keeping the gathered input instead ("sp") costs no extra bytes but leaves
  that input whole on every rank. With SP, LayerNorm weights and row-parallel biases see only the rank's
  tokens, so their gradients are summed over the group once per step (one small all-reduce).

Counts are exact integers for the ring collectives in wmdist.comm: chunk sizes are given per rank, so shards
that N does not divide (tensor_split layout: the first n % N ranks hold one more) are counted exactly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from wmdist.costs.collectives import ring_allreduce_bytes, ring_chunk_sizes
from wmdist.costs.validate import require_bool, require_choice, require_fields, require_heads, require_int

Op = Literal["all-reduce", "reduce-scatter", "all-gather"]
BlockLayout = Literal["tp", "sp", "sp-regather"]                       # how a TP block splits its activations
MLPLayout = Literal["column -> row", "column+gather -> row", "column+gather -> column+gather", "row -> row"]
MemoryLayout = Literal["single", "tp", "sp", "sp-regather", "cp"]       # block_saved_elements' cases
OPS: tuple[str, ...] = get_args(Op)
BLOCK_LAYOUTS: tuple[str, ...] = get_args(BlockLayout)
MLP_LAYOUTS: tuple[str, ...] = get_args(MLPLayout)
MEMORY_LAYOUTS: tuple[str, ...] = get_args(MemoryLayout)
LN_STATS = 4          # per token: mean and 1/std saved by each of the block's two LayerNorms


def shard_sizes(numel: int, world_size: int) -> list[int]:
    """Sizes of N shards of `numel` units (heads, hidden units, tokens): torch.tensor_split's layout."""
    return ring_chunk_sizes(numel, world_size)


@dataclass(frozen=True)
class Collective:
    """One ring collective as every rank runs it: where, which way, which op, and each rank's chunk (elements)."""
    site: str
    direction: str                # "forward", "backward", or "after backward"
    op: Op                        # one of OPS
    sizes: tuple[int, ...]        # chunk r's element count; ring all-reduce chunks follow tensor_split

    def __post_init__(self) -> None:
        require_choice("op", self.op, OPS)
        if not self.sizes or any(s < 0 for s in self.sizes):
            raise ValueError(f"sizes must be non-negative chunk sizes, one per rank, got {self.sizes!r}")

    @property
    def phase(self) -> str:
        """The ledger phase the rank functions record it under."""
        return f"{self.site} {self.direction} {self.op}"

    @property
    def numel(self) -> int:
        return sum(self.sizes)

    def bytes_sent(self, rank: int, *, elem_size: int = 4) -> int:
        """Exact bytes rank `rank` sends: a ring reduce-scatter forwards every chunk but its own, an
        all-gather every chunk but its right neighbour's, an all-reduce does both."""
        n = len(self.sizes)
        require_int("rank", rank, 0, high=n - 1)
        if n == 1:
            return 0
        if self.op == "all-reduce":
            return ring_allreduce_bytes(self.numel, n, rank, elem_size=elem_size)
        skipped = self.sizes[rank] if self.op == "reduce-scatter" else self.sizes[(rank + 1) % n]
        return (self.numel - skipped) * elem_size

    @property
    def rounds(self) -> int:
        """Ring rounds: N-1 per phase, two phases for an all-reduce."""
        n = len(self.sizes)
        return (2 if self.op == "all-reduce" else 1) * (n - 1)


@dataclass(frozen=True, kw_only=True)
class BlockShape:
    """The sizes that decide a transformer block's traffic and memory: b, s, h, heads, MLP hidden width."""
    batch: int
    seq: int
    width: int
    heads: int
    hidden: int

    def __post_init__(self) -> None:
        require_fields(self, ("batch", "seq", "width", "heads", "hidden"), 1)
        require_heads(self.width, self.heads)

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    def check_world(self, world_size: int, *, sequence: bool = False) -> None:
        """Refuse a world size that would leave a rank without a head (or, split along it, a token)."""
        require_int("world_size", world_size, 1)
        if world_size > self.heads:
            raise ValueError(f"world_size {world_size} is more than the {self.heads} attention heads: "
                             "a rank would hold no head")
        if sequence and world_size > self.seq:
            raise ValueError(f"world_size {world_size} is more than the {self.seq} tokens: a rank would hold none")


def seq_shards(shape: BlockShape, n: int) -> list[int]:
    """Tokens per rank when the sequence is split over n ranks."""
    return shard_sizes(shape.seq, n)


def _seq_chunks(shape: BlockShape, n: int, row: int) -> tuple[int, ...]:
    """Chunk sizes of a (b, s, row) activation split along the sequence."""
    return tuple(t * shape.batch * row for t in seq_shards(shape, n))


def _feature_chunks(shape: BlockShape, features: int, n: int) -> tuple[int, ...]:
    """Chunk sizes of a (b, s, features) activation split along its features (a column-parallel output)."""
    return tuple(shape.batch * shape.seq * f for f in shard_sizes(features, n))


def block_schedule(shape: BlockShape, world_size: int, *, layout: BlockLayout) -> list[Collective]:
    """Every collective of one forward and backward of one block (attention then MLP), in the order run.

    "tp": 4 all-reduces of b*s*h. "sp": 4 all-gathers and 4 reduce-scatters of
    the same tensors (the same bytes). "sp-regather": 2 all-gathers more (the
    linear inputs again, in backward). Both SP layouts end with one all-reduce
    of the LayerNorm and row-bias gradients (6h elements).
    """
    require_choice("layout", layout, BLOCK_LAYOUTS)
    n, h = require_int("world_size", world_size, 1), shape.width
    act = shape.batch * shape.seq * h
    if layout == "tp":
        full = tuple(ring_chunk_sizes(act, n))
        sites = (("attn.out", "forward"), ("mlp.fc2", "forward"), ("mlp.fc1", "backward"), ("attn.qkv", "backward"))
        return [Collective(site, d, "all-reduce", full) for site, d in sites]
    rows = _seq_chunks(shape, n, h)

    def gather(site: str, d: str) -> Collective:
        return Collective(site, d, "all-gather", rows)

    def scatter(site: str, d: str) -> Collective:
        return Collective(site, d, "reduce-scatter", rows)
    again = layout == "sp-regather"
    out = [gather("attn.qkv", "forward"), scatter("attn.out", "forward"),
           gather("mlp.fc1", "forward"), scatter("mlp.fc2", "forward"),
           gather("mlp.fc2", "backward")]
    out += [gather("mlp.fc1", "backward")] if again else []
    out += [scatter("mlp.fc1", "backward"), gather("attn.out", "backward")]
    out += [gather("attn.qkv", "backward")] if again else []
    out += [scatter("attn.qkv", "backward"),
            Collective("sequence-parallel params", "after backward", "all-reduce",
                       tuple(ring_chunk_sizes(6 * h, n)))]
    return out


def mlp_schedule(shape: BlockShape, world_size: int, *, layout: MLPLayout) -> list[Collective]:
    """The collectives of one forward and backward of the MLP alone, for each way of splitting its two linears.

    Same MLP, same N, same result; only the shard layout differs, and with it
    how many collectives run and how many bytes they move.
    """
    require_choice("layout", layout, MLP_LAYOUTS)
    n = require_int("world_size", world_size, 1)
    act = shape.batch * shape.seq * shape.width
    full = tuple(ring_chunk_sizes(act, n))
    wide_full = tuple(ring_chunk_sizes(act * shape.hidden // shape.width, n))
    hidden_cols = _feature_chunks(shape, shape.hidden, n)
    width_cols = _feature_chunks(shape, shape.width, n)
    c = Collective
    if layout == "column -> row":
        return [c("mlp.fc2", "forward", "all-reduce", full), c("mlp.fc1", "backward", "all-reduce", full)]
    if layout == "column+gather -> row":
        return [c("mlp.fc1", "forward", "all-gather", hidden_cols), c("mlp.fc2", "forward", "all-reduce", full),
                c("mlp.fc2", "backward", "all-gather", hidden_cols), c("mlp.fc1", "backward", "all-reduce", full)]
    if layout == "column+gather -> column+gather":
        return [c("mlp.fc1", "forward", "all-gather", hidden_cols), c("mlp.fc2", "forward", "all-gather", width_cols),
                c("mlp.fc2", "backward", "all-reduce", wide_full), c("mlp.fc1", "backward", "all-reduce", full)]
    return [c("mlp.fc1", "forward", "all-reduce", wide_full), c("mlp.fc2", "forward", "all-reduce", full),
            c("mlp.fc2", "backward", "all-gather", hidden_cols), c("mlp.fc1", "backward", "all-gather", width_cols)]


def schedule_bytes(schedule: list[Collective], rank: int, *, elem_size: int = 4) -> int:
    """Bytes `rank` sends over a whole schedule."""
    return sum(col.bytes_sent(rank, elem_size=elem_size) for col in schedule)


def op_counts(schedule: list[Collective]) -> dict[str, int]:
    """How many collectives of each op a schedule runs (ops with none left out); 0 on one rank."""
    out: dict[str, int] = {}
    for col in schedule:
        if len(col.sizes) > 1:
            out[col.op] = out.get(col.op, 0) + 1
    return out


def megatron_layer_bytes(b: int, s: int, h: int, world_size: int, *, sequence_parallel: bool,
                         elem_size: int = 4) -> float:
    """The papers' per-rank volume per layer per step: 4 all-reduces of G = b*s*h*elem bytes, 2(N-1)G/N
    each; or, with SP, 4 reduce-scatters and 4 all-gathers of (N-1)G/N each: the same total."""
    for name, v in (("b", b), ("s", s), ("h", h), ("elem_size", elem_size)):
        require_int(name, v, 1)
    n = require_int("world_size", world_size, 1)
    g = b * s * h * elem_size
    per = (n - 1) * g / n
    return (4 + 4) * per if require_bool("sequence_parallel", sequence_parallel) else 4 * 2 * per


def megatron_group_bytes(b: int, s: int, h: int, world_size: int, *, elem_size: int = 4) -> int:
    """Bytes all N ranks send together per layer per step, with or without SP: 8(N-1)G, G = b*s*h*elem.

    A ring reduce-scatter or all-gather moves (N-1)G in all, however the
    chunks are cut; an all-reduce twice that. So 4 all-reduces and 4 + 4
    reduce-scatters / all-gathers move the same integer for every N.
    """
    for name, v in (("b", b), ("s", s), ("h", h), ("elem_size", elem_size)):
        require_int(name, v, 1)
    return 8 * (require_int("world_size", world_size, 1) - 1) * b * s * h * elem_size


def korthikanti_layer_bytes(s: int, b: int, h: int, a: int, *, t: int = 1, sequence_parallel: bool = False) -> float:
    """Activation bytes of one transformer layer per rank, as in Korthikanti et al. 2022 (section 4).

    No parallelism: sbh(34 + 5as/h). Tensor parallel over t ranks: sbh(10 + 24/t + 5as/(ht)), since the
    LayerNorm inputs, the inputs of the first linears and the dropout masks (10sbh) stay whole on every
    rank. With SP as well: sbh/t (34 + 5as/h). Their assumptions, not ours: 16-bit activations, 1-byte
    dropout masks, softmax probabilities kept (no flash attention), no recomputation.
    """
    for name, v in (("s", s), ("b", b), ("h", h), ("a", a), ("t", t)):
        require_int(name, v, 1)
    quadratic = 5 * a * s / h
    if require_bool("sequence_parallel", sequence_parallel):
        return s * b * h / t * (34 + quadratic)
    return s * b * h * (10 + 24 / t + quadratic / t)


def block_elements_per_token(width: int, heads: int, hidden: int) -> int:
    """Elements per token per layer our Block keeps for backward on one device (see block_saved_elements)."""
    for name, v in (("width", width), ("heads", heads), ("hidden", hidden)):
        require_int(name, v, 1)
    return replicated_elements_per_token(width) + 3 * width + width + heads + 2 * hidden


def replicated_elements_per_token(width: int) -> int:
    """Elements per token per layer that TP without SP keeps whole on every rank (the LayerNorm region)."""
    return 4 * require_int("width", width, 1) + LN_STATS


def block_params(shape: BlockShape) -> int:
    """Parameters of one block: two LayerNorms, QKV, output projection, fc1, fc2 (weights and biases)."""
    h, f = shape.width, shape.hidden
    return 4 * h + (3 * h * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h)


def block_saved_elements(shape: BlockShape, world_size: int, rank: int, *, layout: MemoryLayout) -> int:
    """Elements (float32) autograd keeps for backward on `rank`, for one forward of our Block.

    Counted by distinct storage, parameters left out. Per token the block keeps
    4h + 4 in the LayerNorm region (block input, LN1 output, residual, LN2
    output, and the two LayerNorms' mean and 1/std) and, per local head or
    hidden unit, the QKV output (3d per head), attention output (d) and
    log-sum-exp (1) of torch's CPU flash attention, whose output the output
    projection reads as a view, plus the MLP's pre- and post-GELU values.
    "tp": the LayerNorm region whole on every rank; "sp-regather": it is split
    along the sequence too; "sp": split, except the two gathered linear inputs
    (2h per token) kept whole. "cp": all weights on every rank, its own tokens,
    plus the gathered keys and values (2h per token of the whole sequence) and
    the float mask (local tokens x all tokens) built from global positions.
    """
    require_choice("layout", layout, MEMORY_LAYOUTS)
    n = 1 if layout == "single" else require_int("world_size", world_size, 1)
    require_int("rank", rank, 0, high=n - 1)
    b, s, h, d = shape.batch, shape.seq, shape.width, shape.head_dim
    mine = seq_shards(shape, n)[rank]
    if layout == "cp":
        return b * mine * block_elements_per_token(h, shape.heads, shape.hidden) + b * s * 2 * h + mine * s
    heads, hidden = shard_sizes(shape.heads, n)[rank], shard_sizes(shape.hidden, n)[rank]
    sharded = b * s * (4 * heads * d + heads + 2 * hidden)
    if layout in ("single", "tp"):
        return b * s * replicated_elements_per_token(h) + sharded
    if layout == "sp-regather":
        return b * mine * replicated_elements_per_token(h) + sharded
    return b * mine * (2 * h + LN_STATS) + b * s * 2 * h + sharded


def cp_schedule(shape: BlockShape, world_size: int) -> list[Collective]:
    """Context parallelism (simple form): all-gather keys and values along the sequence in forward,
    reduce-scatter their gradients in backward, and sum the replicated weights' gradients once per step."""
    n = require_int("world_size", world_size, 1)
    kv = _seq_chunks(shape, n, 2 * shape.width)
    return [Collective("attn.kv", "forward", "all-gather", kv), Collective("attn.kv", "backward", "reduce-scatter", kv),
            Collective("weights", "after backward", "all-reduce", tuple(ring_chunk_sizes(block_params(shape), n)))]
