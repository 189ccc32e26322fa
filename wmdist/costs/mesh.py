"""One training step on a dp x tp x pp x cp mesh: what each rank holds, and what it sends along each axis.

Pure Python (no torch). The four communication patterns of the source text,
for the transformer world model (wmdist.models.transformer) trained one step with
the layout wmdist.mesh runs, counted exactly per rank:

  dp  the gradient, summed over the data-parallel ranks in `buckets` equal
      pieces (torch.tensor_split of the rank's flat gradient): one ring
      all-reduce per bucket, 2(N-1) messages each, 2(N-1)/N of its bytes;
  tp  Megatron's pairing inside every block: 4 ring all-reduces of the
      (b, c, H) activations per block and microbatch (2 forward, 2 backward);
  pp  one activation per microbatch to the next stage, one gradient per
      microbatch back: M(P-1) boundary transfers each way in the pipeline;
  cp  ring attention per block and microbatch: N-1 sends of the rank's K, V
      block forward, N-1 again in backward plus N-1 sends of the dK, dV
      partial sums; then the replicated weights' gradients summed over the
      cp ranks (ring all-reduce per bucket, as for dp).

Layout, as wmdist.mesh builds it: the global batch of B trajectories is
split over dp ranks, each share into M microbatches (tensor_split layouts);
every trajectory's T tokens over cp ranks (contiguous, c = T/cp each);
blocks over pp stages (tensor_split); heads and MLP units over tp ranks
(tensor_split). The embedding and positions live on the first stage, the
final LayerNorm and head on the last; LayerNorms and row-parallel biases are
whole on every tp rank. A "message" is one send: a ring round is one message
per rank, so messages x latency is the latency term of the time model.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from wmdist.costs import experts as ecosts
from wmdist.costs.collectives import ring_allreduce_bytes, ring_chunk_sizes
from wmdist.costs.validate import require_fields, require_heads, require_int, require_real

# The four axes in the order the patterns above are told, and every table and figure of chapter 09 lists
# them (axis_traffic's keys); not the rank layout (wmdist.comm.mesh.DEFAULT_ORDER).
TRAFFIC_AXES = ("dp", "tp", "pp", "cp")


@dataclass(frozen=True, kw_only=True)
class StepShape:
    """The sizes one mesh training step depends on: model, data, the four degrees, buckets, element size."""
    width: int                 # H
    heads: int
    hidden: int                # F, the MLP's hidden width
    layers: int                # L transformer blocks
    seq_len: int               # T tokens per trajectory (the context length)
    batch: int                 # B trajectories per step, all ranks together
    microbatches: int = 1      # M per data-parallel rank
    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    buckets: int = 1           # gradient buckets per rank (equal pieces of its flat gradient)
    obs_dim: int = 16          # O
    action_dim: int = 4        # A
    max_len: int | None = None  # learned positions (None: seq_len)
    elem_size: int = 4

    def __post_init__(self) -> None:
        require_fields(self, ("width", "heads", "hidden", "layers", "seq_len", "batch", "microbatches", "dp", "tp",
                              "pp", "cp", "buckets", "obs_dim", "action_dim", "elem_size"), 1)
        require_heads(self.width, self.heads)
        if self.tp > self.heads:
            raise ValueError(f"tp {self.tp} is more than the {self.heads} heads: a tensor-parallel rank would hold "
                             "none")
        if self.pp > self.layers:
            raise ValueError(f"pp {self.pp} is more than the {self.layers} layers: a pipeline stage would hold none")
        if self.seq_len % self.cp:
            raise ValueError(f"seq_len {self.seq_len} must be divisible by cp {self.cp} (contiguous blocks of T/cp)")
        if self.batch < self.dp * self.microbatches:
            raise ValueError(f"batch {self.batch} is less than dp * microbatches = {self.dp * self.microbatches}: "
                             "every microbatch of every data-parallel rank needs a trajectory")
        if self.max_len is not None and require_int("max_len", self.max_len, 1) < self.seq_len:
            raise ValueError(f"max_len {self.max_len} is shorter than seq_len {self.seq_len}")

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    @property
    def tokens(self) -> int:
        """c: tokens of one trajectory on one cp rank."""
        return self.seq_len // self.cp


@dataclass(frozen=True)
class Traffic:
    """What one rank sends along one axis in one training step: bytes and messages (sends)."""
    bytes_sent: int          # exact for the four axes; expert_traffic's is an expectation (a float)
    messages: int


def stage_layers(shape: StepShape, pp_rank: int) -> int:
    """Blocks on pipeline stage `pp_rank` (tensor_split: the first L % P stages one more)."""
    return ring_chunk_sizes(shape.layers, shape.pp)[require_int("pp_rank", pp_rank, 0, high=shape.pp - 1)]


def microbatch_rows(shape: StepShape, dp_rank: int) -> list[int]:
    """Trajectories in each of the M microbatches of data-parallel rank `dp_rank`."""
    share = ring_chunk_sizes(shape.batch, shape.dp)[require_int("dp_rank", dp_rank, 0, high=shape.dp - 1)]
    return ring_chunk_sizes(share, shape.microbatches)


def rank_block_params(shape: StepShape, tp_rank: int) -> int:
    """Elements of one block on tp rank `tp_rank`: its heads' QKV rows and output columns, its MLP units, and
    the LayerNorms and row-parallel biases whole."""
    h, d = shape.width, shape.head_dim
    heads = ring_chunk_sizes(shape.heads, shape.tp)[require_int("tp_rank", tp_rank, 0, high=shape.tp - 1)]
    units = ring_chunk_sizes(shape.hidden, shape.tp)[tp_rank]
    qkv = 3 * heads * d * (h + 1)
    out = h * heads * d + h
    mlp = units * (h + 1) + h * units + h
    return 4 * h + qkv + out + mlp


def rank_params(shape: StepShape, tp_rank: int, pp_rank: int) -> int:
    """Parameter elements a rank at (tp_rank, pp_rank) holds: its blocks, plus the embedding and positions on the
    first stage and the final LayerNorm and head on the last (both whole on every tp rank)."""
    h = shape.width
    n = stage_layers(shape, pp_rank) * rank_block_params(shape, tp_rank)
    if pp_rank == 0:
        n += (shape.obs_dim + shape.action_dim + 1) * h + (shape.max_len or shape.seq_len) * h
    if pp_rank == shape.pp - 1:
        n += 2 * h + shape.obs_dim * (h + 1)
    return n


def bucket_sizes(shape: StepShape, tp_rank: int, pp_rank: int) -> list[int]:
    """Elements of each gradient bucket: the rank's flat gradient cut into `buckets` tensor_split pieces."""
    return ring_chunk_sizes(rank_params(shape, tp_rank, pp_rank), shape.buckets)


def _gradient_sum(shape: StepShape, coords: dict[str, int], axis: str) -> Traffic:
    n, r = getattr(shape, axis), coords[axis]
    sizes = bucket_sizes(shape, coords["tp"], coords["pp"])
    return Traffic(sum(ring_allreduce_bytes(s, n, r, elem_size=shape.elem_size) for s in sizes),
                   2 * (n - 1) * len(sizes))


def axis_traffic(shape: StepShape, coords: dict[str, int]) -> dict[str, Traffic]:
    """Per axis (TRAFFIC_AXES order), what the rank at `coords` ({"dp", "tp", "pp", "cp"}) sends in one training step."""
    for axis in TRAFFIC_AXES:
        require_int(f"coords[{axis!r}]", coords.get(axis), 0, high=getattr(shape, axis) - 1)
    e, h, c = shape.elem_size, shape.width, shape.tokens
    rows = microbatch_rows(shape, coords["dp"])
    layers = stage_layers(shape, coords["pp"])
    tp_n, tp_r = shape.tp, coords["tp"]
    tp = Traffic(4 * layers * sum(ring_allreduce_bytes(b * c * h, tp_n, tp_r, elem_size=e) for b in rows),
                 4 * layers * len(rows) * 2 * (tp_n - 1))
    ways = (coords["pp"] < shape.pp - 1) + (coords["pp"] > 0)         # activations forward, gradients back
    pp = Traffic(ways * sum(b * c * h * e for b in rows), ways * len(rows))
    heads = ring_chunk_sizes(shape.heads, tp_n)[tp_r]
    sends = 3 * (shape.cp - 1) * layers                               # per microbatch: K, V fwd + bwd, dK, dV
    ring = Traffic(sends * sum(b * heads * c * 2 * shape.head_dim * e for b in rows), sends * len(rows))
    grads = _gradient_sum(shape, coords, "cp")
    cp = Traffic(ring.bytes_sent + grads.bytes_sent, ring.messages + grads.messages)
    return {"dp": _gradient_sum(shape, coords, "dp"), "tp": tp, "pp": pp, "cp": cp}


def expert_traffic(shape: StepShape, coords: dict[str, int], *, experts: int, k: int) -> Traffic:
    """What the rank at `coords` would send if every block's MLP were E experts spread over its dp group
    (expert parallelism on the dp axis, ep = dp; chapter 10): per block and microbatch, the counts exchange
    and four all-to-alls (dispatch, combine, both backward) of its b c tokens, each the uniform-routing
    expectation `costs.experts.uniform_dispatch_bytes(b c, k, dp, H, elem)`; (dp - 1) sends each."""
    n = shape.dp
    ecosts.experts_per_rank(experts, n)
    require_int("k", k, 1, high=experts)
    rows = microbatch_rows(shape, require_int("coords['dp']", coords.get("dp"), 0, high=n - 1))
    layers = stage_layers(shape, coords["pp"])
    per_block = sum(4 * ecosts.uniform_dispatch_bytes(b * shape.tokens, k, n, shape.width, shape.elem_size)
                    + ecosts.counts_exchange_bytes(experts, n) for b in rows)
    return Traffic(layers * per_block, layers * len(rows) * 5 * (n - 1))


# --- time on a two-level machine --------------------------------------------------------

@dataclass(frozen=True)
class Link:
    """One kind of link: seconds per message (latency) and bytes per second (one direction)."""
    latency_s: float
    bytes_per_s: float

    def __post_init__(self) -> None:
        require_real("latency_s", self.latency_s)
        if require_real("bytes_per_s", self.bytes_per_s) == 0:
            raise ValueError("bytes_per_s must be > 0")

    def terms(self, traffic: Traffic) -> tuple[float, float]:
        """(messages x latency, bytes / bandwidth): the latency term and the bandwidth term, in seconds."""
        return traffic.messages * self.latency_s, traffic.bytes_sent / self.bytes_per_s


def strides(sizes: dict[str, int], order: tuple[str, ...]) -> dict[str, int]:
    """How far apart (in global ranks) neighbours along each axis are, for axes listed fastest-varying first."""
    out, stride = {}, 1
    for axis in order:
        out[axis] = stride
        stride *= sizes[axis]
    return out


def axis_in_node(size: int, stride: int, ranks_per_node: int, world_size: int) -> bool:
    """Whether every group along an axis (members r0, r0 + stride, ...) lies inside one node of consecutive ranks.

    A group spans (size-1)*stride + 1 consecutive rank numbers; if that is
    more than a node, it cannot fit. Otherwise the group starts are checked
    over one period of the pattern (lcm of the node size and stride*size).
    """
    size, stride = require_int("size", size, 1), require_int("stride", stride, 1)
    per_node, world = require_int("ranks_per_node", ranks_per_node, 1), require_int("world_size", world_size, 1)
    span = (size - 1) * stride
    if size == 1:
        return True
    if span >= per_node:
        return False
    period = min(world, math.lcm(per_node, stride * size))
    return all(r0 // per_node == (r0 + span) // per_node
               for base in range(0, period, stride * size) for r0 in range(base, base + stride))
