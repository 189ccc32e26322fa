"""The pipelined ring (comm/ring_rounds.py): chunks cut into pieces change the messages, not the bytes or the bits.

Every case runs on real gloo ranks with tiny `chunk_bytes`, so small vectors are cut into many pieces,
with lengths that N and N*C do not divide (pieces then differ by one element).
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from wmdist import costs
from wmdist.comm import all_reduce, ring_all_gather, ring_all_reduce, ring_reduce_scatter
from wmdist.course.compare import bound_ratio
from wmdist.costs import collectives as coll
from wmdist.data_parallel.ring import rank_vector, reference_sum, sum_bound
from wmdist.runtime import run

LENGTHS = [1, 3, 37, 1003]          # shorter than N, and lengths N*C does not divide
CHUNKS = [None, 4, 12, 40, 400]     # bytes per piece: 1, 3, 10, 100 floats, and None (one piece per chunk)


def _watch_sends(sizes: list[int]):
    """Make torch.distributed.isend (as the ring calls it) note each message's element count; returns the undo."""
    original = dist.isend

    def isend(tensor, *args, **kwargs):
        sizes.append(tensor.numel())
        return original(tensor, *args, **kwargs)
    dist.isend = isend
    return lambda: setattr(dist, "isend", original)


def pieces_case(ctx, lengths, chunks):
    """For each length and chunk size: the ring all-reduce (with every message it posted), gloo's, and the phases."""
    out = []
    for numel in lengths:
        x = rank_vector(ctx.rank, numel, seed=numel)
        theirs = x.clone()
        all_reduce(ctx, theirs, phase="gloo")
        for chunk in chunks:
            tag = f"{numel}/{chunk}"
            sent: list[int] = []
            undo = _watch_sends(sent)
            try:
                ours = ring_all_reduce(ctx, x, phase=f"ar{tag}", chunk_bytes=chunk)
            finally:
                undo()
            sizes = costs.ring_chunk_sizes(numel, ctx.world_size)
            lo = sum(sizes[:ctx.rank])
            mine = ring_reduce_scatter(ctx, x, phase=f"rs{tag}", chunk_bytes=chunk)
            gathered = ring_all_gather(ctx, x[lo:lo + sizes[ctx.rank]].clone(), sizes, phase=f"ag{tag}",
                                       chunk_bytes=chunk)
            out.append({"numel": numel, "chunk": chunk, "ours": ours, "theirs": theirs, "sent": sent,
                        "mine": mine, "gathered": gathered,
                        "ar": ctx.ledger.totals(phase=f"ar{tag}/", prefix=True),
                        "rs": ctx.ledger.totals(phase=f"rs{tag}"), "ag": ctx.ledger.totals(phase=f"ag{tag}")})
    return out


@pytest.mark.parametrize("n", [2, 3, 4])
def test_pieces_keep_bytes_bits_and_count_messages_exactly(n):
    results = run(pieces_case, n, LENGTHS, CHUNKS)
    for i, case in enumerate(results[0]):
        numel, chunk = case["numel"], case["chunk"]
        expected, bound = reference_sum(n, numel, seed=numel), sum_bound(n, numel, seed=numel)
        unchunked = next(c for c in results[0] if c["numel"] == numel and c["chunk"] is None)["ours"]
        sizes = costs.ring_chunk_sizes(numel, n)
        starts = [sum(sizes[:r]) for r in range(n + 1)]
        elems = coll.ring_chunk_elems(chunk)
        for rank, res in enumerate(results):
            got, where = res[i], f"rank {rank}, numel {numel}, chunk_bytes {chunk}"
            # Float32 sums of N vectors in another order than float64's: the bound derived in ring.sum_bound.
            assert bound_ratio(got["ours"], expected, bound) <= 1, where
            assert bound_ratio(got["ours"], got["theirs"], bound) <= 1, where
            # Pieces change no element's order of additions: bit for bit the unchunked ring, on every rank.
            assert torch.equal(got["ours"], unchunked), where
            assert torch.equal(got["ours"], results[0][i]["ours"]), where
            segment = slice(starts[rank], starts[rank + 1])
            assert torch.equal(got["mine"], unchunked[segment]), where
            assert torch.equal(got["gathered"], torch.cat([rank_vector(r, numel, seed=numel)[starts[r]:starts[r + 1]]
                                                           for r in range(n)])), where
            # The wire: every message at most one piece, their count and total the formulas'.
            if elems is not None:
                assert max(got["sent"]) <= elems, where
            assert len(got["sent"]) == coll.ring_allreduce_messages(numel, n, rank, chunk_bytes=chunk), where
            assert 4 * sum(got["sent"]) == costs.ring_allreduce_bytes(numel, n, rank), where
            # The ledger: the same bytes and messages, and still 2(N-1) rounds.
            assert got["ar"]["bytes_sent"] == costs.ring_allreduce_bytes(numel, n, rank), where
            assert got["ar"]["messages"] == len(got["sent"]), where
            assert got["ar"]["rounds"] == costs.ring_allreduce_rounds(n), where
            assert got["rs"]["bytes_sent"] == costs.ring_reduce_scatter_bytes(numel, n, rank), where
            assert got["ag"]["bytes_sent"] == costs.ring_all_gather_bytes(numel, n, rank), where
            assert got["rs"]["messages"] == coll.ring_reduce_scatter_messages(numel, n, rank, chunk_bytes=chunk)
            assert got["ag"]["messages"] == coll.ring_all_gather_messages(numel, n, rank, chunk_bytes=chunk)


def _messages_by_hand(numel: int, n: int, rank: int, chunk_elems: int | None) -> int:
    """Count the pieces the ring sends from torch.tensor_split's own layout (the oracle for the closed form)."""
    segments = torch.tensor_split(torch.arange(numel), n)

    def cut(k: int) -> int:
        m = segments[k].numel()
        return 1 if chunk_elems is None or m == 0 else len(torch.tensor_split(segments[k], -(-m // chunk_elems)))
    return sum(cut(k) for k in range(n) if k != rank) + sum(cut(k) for k in range(n) if k != (rank + 1) % n)


def test_message_formula_matches_the_pieces_counted_by_hand():
    for n in (1, 2, 3, 4, 7):
        for numel in (0, 1, 5, 37, 1003, 4096):
            for chunk in (None, 1, 4, 12, 40, 4096):
                for r in range(n):
                    assert coll.ring_allreduce_messages(numel, n, r, chunk_bytes=chunk) == \
                        _messages_by_hand(numel, n, r, coll.ring_chunk_elems(chunk)), (n, numel, chunk, r)


def test_messages_are_two_n_minus_one_times_c_when_n_c_divides():
    for n in (2, 3, 4):
        for c in (1, 2, 5):
            numel = n * c * 10                                   # segments of 10c floats, pieces of 10
            messages = [coll.ring_allreduce_messages(numel, n, r, chunk_bytes=40) for r in range(n)]
            assert messages == [2 * (n - 1) * c] * n
    # uncut, or one piece per chunk: one message per round, as the text counts them
    assert coll.ring_allreduce_messages(10 ** 6, 4, 1, chunk_bytes=None) == costs.ring_allreduce_rounds(4)


def test_the_default_sends_one_message_per_round_as_the_text_counts():
    """The measured default (costs.DEFAULT_RING_CHUNK_BYTES) does not cut: 2(N-1) messages for any payload."""
    for numel in (2105, 100_003, 2 ** 26):
        for n in range(2, 9):
            assert [coll.ring_allreduce_messages(numel, n, r) for r in range(n)] == [costs.ring_allreduce_rounds(n)] * n

    def default_ring(ctx):
        ring_all_reduce(ctx, torch.ones(3 * 2 ** 20))          # 12 MiB: cut at any piece size up to 4 MiB
        return ctx.ledger.totals()["messages"]
    assert run(default_ring, 3) == [coll.ring_allreduce_messages(3 * 2 ** 20, 3, r) for r in range(3)] == [4] * 3


@pytest.mark.parametrize("bad", [0, -4, 1.5, True, "256k"])
def test_a_bad_chunk_size_is_named_before_anything_is_sent(bad):
    with pytest.raises(ValueError, match="chunk_bytes must be an integer >= 1"):
        coll.ring_chunk_elems(bad)

    def call(ctx):
        try:
            ring_all_reduce(ctx, torch.ones(8), chunk_bytes=bad)
        except ValueError as e:
            return str(e), ctx.ledger.totals(kind=None)["rounds"]
        return None
    for message, rounds in run(call, 2):
        assert "chunk_bytes must be an integer >= 1" in message and rounds == 0
