"""Gradient buckets reduced while backward is still running, with a measured timeline.

Gradients are grouped, in reverse parameter order (roughly the order backward
produces them), into buckets of at most `cap_bytes` each, as DDP does (DDP also
makes its first bucket small; we do not). A hook on every parameter fires
when its gradient is final; when the last gradient of a bucket arrives, the
bucket is flattened and an asynchronous all-reduce starts, while autograd
keeps computing earlier layers. All reductions are waited for before the
optimizer could step.

Timeline method, and its limits: compute spans run from the end of one hook
to the start of the next (the backward pieces between hooks); "launch" spans
are the hook's own work (flattening a bucket, starting its all-reduce). A comm span
runs from the launch to the moment a done-callback on the work's future ran
in gloo's thread. That callback needs the GIL, so it can be late while the
main thread runs Python, and gloo's own threads compete with backward for the
same CPU cores: the end times are upper bounds, and on an oversubscribed
laptop "hidden" communication still slows the compute it hides under.
"""
from __future__ import annotations

import statistics

import time
from dataclasses import dataclass

import torch

from wmdist import costs
from wmdist.comm import Context, all_reduce, barrier
from wmdist.course.experiment import Experiment, Verdict
from wmdist.models.world import WorldModelConfig, flat_grads, make_batch, make_model, shard_batch
from wmdist.course.report import Report, close_check, counts_per_rank
from wmdist.base.spans import Overlap, Span, overlap

BIG_CONFIG = WorldModelConfig(obs_dim=64, action_dim=4, latent_dim=128)   # 49,921 parameters


def assign_buckets(sizes_bytes: list[int], cap_bytes: int) -> list[list[int]]:
    """Parameter indices per bucket, walking parameters in reverse order.

    A bucket is closed as soon as it holds at least `cap_bytes` (so one tensor
    larger than the cap gets a bucket to itself); every parameter lands in
    exactly one bucket. Bucket 0 is the one backward fills first.
    """
    costs.require_int("cap_bytes", cap_bytes, 1)
    for i, s in enumerate(sizes_bytes):
        costs.require_int(f"sizes_bytes[{i}]", s, 0)
    buckets: list[list[int]] = []
    current: list[int] = []
    filled = 0
    for i in reversed(range(len(sizes_bytes))):
        current.append(i)
        filled += sizes_bytes[i]
        if filled >= cap_bytes:
            buckets.append(current)
            current, filled = [], 0
    if current:
        buckets.append(current)
    return buckets


@dataclass(frozen=True, kw_only=True)
class BucketSpec:
    """A data-parallel backward pass with a bucket cap, on a model big enough to take time."""
    cap_bytes: int = 1 << 30       # default: everything in one bucket
    batch_size: int = 8            # examples per rank
    seq_len: int = 24
    seed: int = 0

    def __post_init__(self) -> None:
        for name, low in (("cap_bytes", 1), ("batch_size", 1), ("seq_len", 1), ("seed", 0)):
            costs.require_int(name, getattr(self, name), low)


def _launch(ctx: Context, k: int, params: list[torch.Tensor], bucket: list[int], t0: float) -> dict:
    """Flatten bucket k's gradients and start its all-reduce (async), counted by payload."""
    buf = torch.cat([params[i].grad.reshape(-1) for i in bucket])                  # (bucket numel,)
    entry = {"k": k, "buf": buf, "launch": time.perf_counter() - t0, "done": None}
    entry["work"] = all_reduce(ctx, buf, phase=f"bucket {k}", async_op=True)
    entry["work"].future().add_done_callback(lambda _: entry.__setitem__("done", time.perf_counter() - t0))
    return entry


@dataclass(kw_only=True, frozen=True)
class BucketRank:
    """One rank's bucketed backward: its gradients three ways, the bucket layout, the timed pass, its ledger."""
    bucketed: torch.Tensor                   # (P,) averaged bucket by bucket during backward
    local: torch.Tensor                      # (P,) this rank's own gradient
    flat: torch.Tensor                       # (P,) the same local gradients averaged by one flat all-reduce
    buckets: list[list[int]]                 # parameter indices per bucket
    spans: list[Span]                        # the timed pass
    bucket_rounds: int                       # bucket all-reduces (warm-up + timed pass)
    bucket_bytes: int                        # their payload bytes


def bucketed_backward(ctx: Context, spec: BucketSpec, *, warmup: int = 1) -> BucketRank:
    """Rank function: forward + backward with per-bucket async all-reduce; times the last pass (counts from a fresh
    ledger, so several layouts can run in one call)."""
    ctx.ledger.reset()
    model = make_model(seed=spec.seed, cfg=BIG_CONFIG)
    params = list(model.parameters())
    buckets = assign_buckets([p.numel() * p.element_size() for p in params], spec.cap_bytes)
    owner = {i: k for k, b in enumerate(buckets) for i in b}
    sizes = [spec.batch_size] * ctx.world_size
    shard = shard_batch(make_batch(spec.batch_size * ctx.world_size, seq_len=spec.seq_len, seed=spec.seed, cfg=BIG_CONFIG),
                        sizes, ctx.rank)
    for _ in range(warmup + 1):
        model.zero_grad(set_to_none=True)
        barrier(ctx, phase="align")
        t0 = time.perf_counter()
        spans, works, missing, last = [], [], [len(b) for b in buckets], [0.0]

        def ready(p: torch.Tensor, i: int) -> None:
            now = time.perf_counter() - t0
            spans.append(Span(row=ctx.rank, start=last[0], end=now, kind="compute", label=f"backward until param {i}"))
            k = owner[i]
            missing[k] -= 1
            if missing[k] == 0:
                works.append(_launch(ctx, k, params, buckets[k], t0))
                spans.append(Span(row=ctx.rank, start=now, end=time.perf_counter() - t0, kind="launch", label=f"flatten + launch bucket {k}"))
            last[0] = time.perf_counter() - t0

        hooks = [p.register_post_accumulate_grad_hook(lambda p, i=i: ready(p, i)) for i, p in enumerate(params)]
        loss = model.loss(shard)
        last[0] = time.perf_counter() - t0
        spans.append(Span(row=ctx.rank, start=0.0, end=last[0], kind="compute", label="forward"))
        loss.backward()
        end = time.perf_counter() - t0
        spans.append(Span(row=ctx.rank, start=last[0], end=end, kind="compute", label="backward tail"))
        for h in hooks:
            h.remove()
        for w in works:
            w["work"].wait()
            finish = time.perf_counter() - t0
            done = w["done"] if w["done"] is not None else finish       # callback not run yet: wait's return
            spans.append(Span(row=ctx.rank, start=w["launch"], end=max(w["launch"], min(done, finish)), kind="comm", label=f"bucket {w['k']}"))
    local = flat_grads(model)                                                     # (P,)
    bucketed = torch.empty_like(local)
    for w in works:
        offsets = [sum(params[j].numel() for j in range(i)) for i in buckets[w["k"]]]
        pos = 0
        for i, off in zip(buckets[w["k"]], offsets):
            bucketed[off:off + params[i].numel()] = w["buf"][pos:pos + params[i].numel()] / ctx.world_size
            pos += params[i].numel()
    flat = all_reduce(ctx, local.clone(), phase="no buckets") / ctx.world_size
    records = ctx.ledger.select(phase="bucket ", kind="collective", prefix=True)
    return BucketRank(bucketed=bucketed, local=local, flat=flat, buckets=buckets, spans=spans, bucket_rounds=len(records), bucket_bytes=sum(r.bytes_sent for r in records))


@dataclass(frozen=True, kw_only=True)
class BucketsSpec:
    """The demo's layouts, decided before any process starts: one BucketSpec per cap, on `world_size` ranks."""
    world_size: int
    runs: tuple[BucketSpec, ...]

    def __post_init__(self) -> None:
        costs.require_int("world_size", self.world_size, 1)
        if not self.runs:
            raise ValueError("caps must name at least one bucket cap")


@dataclass(frozen=True)
class BucketRuns:
    """One rank's BucketRank for each layout, in order."""
    runs: tuple[BucketRank, ...]


def bucket_runs(ctx: Context, spec: BucketsSpec) -> BucketRuns:
    """Rank function: each layout's bucketed backward, one after the other."""
    return BucketRuns(tuple(bucketed_backward(ctx, s) for s in spec.runs))


@dataclass(frozen=True)
class BucketTimelines:
    """Per bucket layout (e.g. "1 bucket"): every rank's spans, and each rank's measured overlap."""
    timelines: dict[str, list[Span]]
    overlap: dict[str, list[Overlap]]


def sum_tolerance(locals_: list[torch.Tensor]) -> float:
    """Two float32 sums of the same N gradients in any order, then / N, differ by at most this.

    Partial sums are bounded by sum_r |g_r|; costs.reordered_sum_bound, plus
    one rounding each for the division by N.
    """
    n = len(locals_)
    bound = torch.stack([g.abs().double() for g in locals_]).sum(0).max().item()
    return costs.reordered_sum_bound(n, bound, extra_roundings=2) / n


def buckets_spec(world_size: int, *, caps: tuple[int, ...] = (1 << 30, 16_384), seed: int = 0) -> BucketsSpec:
    """One giant bucket and small buckets (by default) on `world_size` ranks, checked."""
    return BucketsSpec(world_size=world_size, runs=tuple(BucketSpec(cap_bytes=cap, seed=seed) for cap in caps))


def compare_buckets(spec: BucketsSpec, results: list[BucketRuns]) -> Verdict:
    """Each layout's bucketed gradient against one flat all-reduce and the float64 mean; rounds and bytes counted;
    the timelines and their overlap for the figures."""
    n = spec.world_size
    checks, exact, timelines, overlaps = [], [], {}, {}
    why = "float32 sums of N gradients in other orders: (N-1) roundings of partial sums, both ways"
    sizes = [p.numel() * 4 for p in make_model(seed=spec.runs[0].seed, cfg=BIG_CONFIG).parameters()]
    for layout, out in zip(spec.runs, zip(*(r.runs for r in results), strict=True), strict=True):
        cap = layout.cap_bytes
        locals_ = [o.local for o in out]
        mean64 = (torch.stack([g.double() for g in locals_]).sum(0) / n).float()
        tol = sum_tolerance(locals_)
        n_buckets = len(assign_buckets(sizes, cap))
        label = "1 bucket" if n_buckets == 1 else f"{n_buckets} buckets (cap {cap:,} B)"
        checks += [close_check(f"{label}: bucketed gradient == one flat all-reduce (rank {r})", o.bucketed,
                               o.flat, tol, why) for r, o in enumerate(out)]
        checks.append(close_check(f"{label}: bucketed gradient == float64 mean of local gradients",
                                  out[0].bucketed, mean64, tol, why))
        exact += counts_per_rank("bucket all-reduces (warm-up + timed pass)",
                                 [o.bucket_rounds for o in out], [2 * n_buckets] * n, case=label)
        exact += counts_per_rank("bucket payload bytes (warm-up + timed pass)",
                                 [o.bucket_bytes for o in out], [2 * sum(sizes)] * n, case=label)
        timelines[label] = [s for o in out for s in o.spans]
        overlaps[label] = overlap(timelines[label])
    caps = [s.cap_bytes for s in spec.runs]
    params = {"caps": caps, "numel": sum(sizes) // 4, "buckets": [len(assign_buckets(sizes, c)) for c in caps]}
    return Verdict(checks=checks, exact=exact, params=params, data=BucketTimelines(timelines, overlaps))


BUCKETS_DEMO = Experiment(name="dp-buckets", chapter="01", world_sizes=(2, 4), spec=buckets_spec,
                          title="Gradient buckets all-reduced during backward: timeline and overlap",
                          ranks=bucket_runs, compare=compare_buckets)


def hidden_share(report: Report) -> float:
    """The share of the all-reduce time the smallest buckets hid under compute: the median over ranks.

    The layout with the most buckets is the one that overlaps (one giant bucket waits for the whole
    backward); what chapter 09's placement model takes as `dp_hidden`.
    """
    layouts = dict(zip(report.data.overlap, report.params["buckets"], strict=True))    # label -> bucket count
    most = max(layouts, key=layouts.get)
    return statistics.median(o.hidden_fraction for o in report.data.overlap[most])


def buckets_demo(world_size: int, *, caps: tuple[int, ...] = (1 << 30, 16_384), seed: int = 0) -> Report:
    """One giant bucket vs small buckets: same gradients, different overlap with backward."""
    return BUCKETS_DEMO.run_spec(buckets_spec(world_size, caps=caps, seed=seed))


DEMOS = [BUCKETS_DEMO]
