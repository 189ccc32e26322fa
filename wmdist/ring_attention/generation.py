"""Generation stays autoregressive: the known context is attended in parallel, each new token still takes a step.

A one-head toy decoder: token x (D,) gives q, k, v = x Wq, x Wk, x Wv; the
attention output o at the last position gives the next token tanh(o Wo).
The S context tokens are known in advance, so their attention is one ring
pass (prefill: every rank works on its S/N rows at once, N-1 K, V sends
per rank). New tokens are not known in advance: token S+g+1 is a function
of token S+g. Each new token's query meets the keys of every rank (each
rank attends it over the keys it holds, one all_gather brings the N
partial results, every rank merges them in rank order) and only then is the
next token known. G new tokens take G rounds on any N: more ranks shrink
each round's work, not the number of rounds.
Shapes: context (S, D); per rank q, k, v (1, 1, c, D); a new token's q (1, 1, 1, D).
The demo is an `Experiment` on `GenerationSpec`, refused before any process.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from wmdist.comm import Context, all_gather, broadcast
from wmdist.course.compare import bound_ratio, worst
from wmdist.costs import ring_attention as costs
from wmdist.costs.validate import require_int
from wmdist.course.experiment import Experiment, Verdict
from wmdist.course.report import Check, Report, counts_per_rank, exact_check
from wmdist.ring_attention.blockwise import attend_block, merge
from wmdist.ring_attention.layout import check_layout
from wmdist.ring_attention.ring import FORWARD, positions, ring_forward
from wmdist.ring_attention.spec import default_seq_len
from wmdist.ring_attention.tolerance import REASON, exact_attention, attention_tolerance

DECODE, HANDOFF = "decode", "prefill handoff"


@dataclass(frozen=True)
class Decoder:
    """The toy decoder's weights and its known context, all from one seed (float64)."""
    context: torch.Tensor            # (S, D)
    w: torch.Tensor                  # (4, D, D): Wq, Wk, Wv, Wo

    @staticmethod
    def make(seq_len: int, width: int, seed: int) -> Decoder:
        gen = torch.Generator().manual_seed(seed)
        context = torch.randn(seq_len, width, generator=gen, dtype=torch.float64)
        return Decoder(context, torch.randn(4, width, width, generator=gen, dtype=torch.float64) / width ** 0.5)

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys, values of tokens x (T, D), each (1, 1, T, D)."""
        return tuple((x @ self.w[i])[None, None] for i in range(3))

    def next_token(self, o: torch.Tensor) -> torch.Tensor:
        """The token after an attention output o (D,)."""
        return torch.tanh(o @ self.w[3])


@dataclass(kw_only=True, frozen=True)
class RankGeneration:
    """What one rank saw: its prefill rows, the new tokens and each step's merged attention output, ledger counts."""
    rows: list[int]
    prefill: torch.Tensor            # (1, 1, c, D)
    tokens: torch.Tensor             # (G + 1, D): the first new token (from the context) and G more
    outputs: torch.Tensor            # (G, D): merged attention output of each new token
    decode_rounds: int               # collectives this rank joined while generating
    prefill_bytes: int
    step_seconds: list[float]        # wall time of each decode step


def generate_rank(ctx: Context, seq_len: int, new_tokens: int, width: int, block_size: int,
                  seed: int) -> RankGeneration:
    """Rank function: prefill the context with one causal ring pass, then generate `new_tokens` tokens one by one."""
    n, rank = ctx.world_size, ctx.rank
    model = Decoder.make(seq_len, width, seed)
    rows = positions(seq_len, n, rank, layout="contiguous")
    q, k, v = model.qkv(model.context[rows])
    out, _, _ = ring_forward(ctx, q, k, v, seq_len=seq_len, layout="contiguous", causal=True, block_size=block_size)
    last = model.next_token(out[0, 0, -1]) if rank == n - 1 else torch.empty(width, dtype=torch.float64)
    token = broadcast(ctx, last, n - 1, phase=HANDOFF)                 # the last context row lives on the last rank
    keys, values, held = k, v, rows
    tokens, outputs, seconds = [token], [], []
    for g in range(new_tokens):
        start = time.perf_counter()
        qn, kn, vn = model.qkv(token[None])
        if rank == n - 1:                                        # the newest positions live on the last rank
            keys, values = torch.cat([keys, kn], 2), torch.cat([values, vn], 2)
            held = torch.cat([held, torch.tensor([seq_len + g])])
        part_o, part_lse = attend_block(qn, keys, values, torch.tensor([seq_len + g]), held, causal=True)
        parts = all_gather(ctx, torch.cat([part_o.reshape(1, width), part_lse.reshape(1, 1)], 1), phase=DECODE)
        o, lse = parts[:1, :width], parts[:1, width]             # (1, D), (1,)
        for r in range(1, n):                                    # the same order on every rank: the same bits
            o, lse = merge(o, lse, parts[r:r + 1, :width], parts[r:r + 1, width])
        outputs.append(o[0])
        token = model.next_token(o[0])
        tokens.append(token)
        seconds.append(time.perf_counter() - start)
    return RankGeneration(rows=rows.tolist(), prefill=out, tokens=torch.stack(tokens), outputs=torch.stack(outputs),
                          decode_rounds=len(ctx.ledger.select(phase=DECODE, kind=None)),
                          prefill_bytes=ctx.ledger.totals(phase=FORWARD)["bytes_sent"], step_seconds=seconds)


@dataclass(frozen=True, kw_only=True)
class GenerationSpec:
    """ring-attention-generation's run: S context tokens (default default_seq_len(N); the contiguous layout must
    accept them), `new_tokens` generated, the decoder's width, the score tile and the seed."""
    world_size: int
    seq_len: int | None = None
    new_tokens: int = 6
    width: int = 8
    block_size: int = 4
    seed: int = 0
    context: int = field(init=False)             # S as checked

    def __post_init__(self) -> None:
        asked = default_seq_len(self.world_size) if self.seq_len is None else self.seq_len
        s, _, _ = check_layout(asked, self.world_size, layout="contiguous")
        object.__setattr__(self, "context", s)
        require_int("new_tokens", self.new_tokens, 1)
        require_int("width", self.width, 1)
        require_int("block_size", self.block_size, 1)


def generation_ranks(ctx: Context, spec: GenerationSpec) -> RankGeneration:
    """Rank function: `generate_rank` on the spec."""
    return generate_rank(ctx, spec.context, spec.new_tokens, spec.width, spec.block_size, spec.seed)


def compare_generation(spec: GenerationSpec, ranks: list[RankGeneration]) -> Verdict:
    """Prefill against SDPA, every rank's tokens against rank 0's (exact), each new token's attention against SDPA
    over its prefix; decode rounds and prefill bytes against the formulas."""
    s, n, g, width, block_size, seed = (spec.context, spec.world_size, spec.new_tokens, spec.width, spec.block_size,
                                        spec.seed)
    model = Decoder.make(s, width, seed)
    q, k, v = model.qkv(model.context)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    got = want.new_empty(want.shape)
    for rk in ranks:
        got[:, :, rk.rows] = rk.prefill
    c = s // n
    tol = attention_tolerance(exact_attention(q, k, v, torch.zeros_like(q), causal=True), torch.float64,
                              min(block_size, c), n * -(-c // min(block_size, c)), grads=False)
    checks = [Check(name="prefill (context, all ranks at once) == SDPA", error=bound_ratio(got, want, tol.out), tolerance=1.0, reason=REASON),
              exact_check("every rank generated the same tokens", [rk.tokens for rk in ranks],
                          [ranks[0].tokens] * n, "all ranks merge the same gathered partials in the same order")]
    tokens = ranks[0].tokens
    whole = torch.cat([model.context, tokens[:-1]])              # every token a new one could attend to
    errors = []
    for step in range(g):
        qs, ks, vs = model.qkv(whole[: s + step + 1])
        qn, zero = qs[:, :, -1:], torch.zeros_like(qs[:, :, -1:])
        ref = F.scaled_dot_product_attention(qn, ks, vs)        # the new token sees every earlier position and itself
        bound = attention_tolerance(exact_attention(qn, ks, vs, zero, causal=False), torch.float64, c + step + 1, n,
                                    grads=False)
        errors.append(bound_ratio(ranks[0].outputs[step], ref[0, 0, 0], bound.out[0, 0, 0]))
    checks.append(Check(name="each new token's attention == SDPA over its prefix (worst step)", error=errors[worst(errors)], tolerance=1.0,
                        reason=REASON))
    exact = counts_per_rank("rounds to generate", [rk.decode_rounds for rk in ranks], [g] * n, phase=DECODE)
    exact += counts_per_rank("bytes sent", [rk.prefill_bytes for rk in ranks],
                             [costs.ring_kv_bytes_per_rank(s, n, 2 * width, batch=1, elem_size=8)] * n, phase=FORWARD)
    return Verdict(checks=checks, exact=exact,
                   params={"seq_len": s, "new_tokens": g, "width": width,
                           "decode_ms_per_token": [round(1e3 * t, 2) for t in ranks[0].step_seconds]})


GENERATION_DEMO = Experiment(name="ring-attention-generation", chapter="06", world_sizes=(1, 2, 4),
                             title="Generation stays autoregressive: the context is attended on N ranks at once, G "
                                   "new tokens take G rounds on any N",
                             spec=lambda n: GenerationSpec(world_size=n), ranks=generation_ranks,
                             compare=compare_generation)


def generation_demo(world_size: int, *, seq_len: int | None = None, new_tokens: int = 6, width: int = 8,
                    block_size: int = 4, seed: int = 0) -> Report:
    """Prefill on N ranks == SDPA; each new token's attention == SDPA on its prefix; G tokens cost G rounds on any N."""
    return GENERATION_DEMO.run_spec(GenerationSpec(world_size=world_size, seq_len=seq_len, new_tokens=new_tokens,
                                                   width=width, block_size=block_size, seed=seed))


DEMOS = [GENERATION_DEMO]
