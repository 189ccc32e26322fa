"""The registered demos as plain data (name, chapter, world sizes, title): what `wmdist list` prints.

`wmdist.registry.demos.registry()` builds the demos from each chapter's modules, and those import torch
(seconds on a busy machine), which naming them should not cost. This table is the same
information written out; tests/test_cli.py checks that it equals the registry, entry by entry,
and prints the line to write when a demo is added, renamed or given other world sizes.
"""
from __future__ import annotations

from typing import NamedTuple


class Demo(NamedTuple):
    """One registered demo, as `wmdist list` names it."""
    name: str
    chapter: str
    world_sizes: tuple[int, ...]
    title: str


DEMOS: tuple[Demo, ...] = (
    Demo("ring-allreduce", "01", (1, 2, 3, 4, 5, 6, 7, 8),
         "Ring all-reduce vs gloo's all_reduce vs the single-process sum"),
    Demo("allreduce-algorithms", "01", (1, 2, 3, 4, 6, 8),
         "Ring, tree, halving-doubling and direct all-reduce: bytes and rounds per rank exact, sums within rounding"),
    Demo("dp-train", "01", (1, 2, 3, 4), "Data parallel (ring all-reduce) vs one process vs DDP, 3 SGD steps"),
    Demo("dp-unequal", "01", (2, 4), "Unequal shards and token counts: plain mean (wrong) vs weighted (right)"),
    Demo("dp-pitfalls", "01", (2, 4), "Local BatchNorm, unsynchronized buffers, skewed optimizer state"),
    Demo("dp-buckets", "01", (2, 4), "Gradient buckets all-reduced during backward: timeline and overlap"),
    Demo("dp-drift", "01", (2, 3, 4),
         "Replicas from other weights or another lr drift while every all-reduce succeeds"),
    Demo("dp-batch-lr", "01", (1,),
         "Batch B vs 4B on the same samples: the same lr trains differently; 4x lr measured"),
    Demo("dp-compression", "01", (2, 4),
         "torch's DDP comm hooks (fp16, bf16, PowerSGD r=1,2,4, error feedback on/off): bytes exact, error and loss measured"),
    Demo("latent-dp", "02", (1, 2, 4),
         "Independent latent noise per rank: identical parameters after all-reduced steps"),
    Demo("latent-estimators", "02", (1, 2, 4),
         "Pathwise, score-function and straight-through gradients vs the exact gradient"),
    Demo("latent-seeds", "02", (2, 4),
         "Shared, independent and antithetic seeds: covariance and the variance of the average"),
    Demo("zero-1", "03", (1, 2, 3, 4), "ZeRO-1: bytes held per rank and sent per step vs formula, weights vs Adam"),
    Demo("zero-2", "03", (1, 2, 3, 4), "ZeRO-2: bytes held per rank and sent per step vs formula, weights vs Adam"),
    Demo("zero-3", "03", (1, 2, 3, 4), "ZeRO-3: bytes held per rank and sent per step vs formula, weights vs Adam"),
    Demo("zero-1-vs-torch", "03", (2, 3), "ZeRO-1 vs torch's ZeroRedundancyOptimizer vs single-process Adam"),
    Demo("activation-checkpointing", "03", (1,),
         "Checkpointed dynamics unroll: saved bytes vs formula, gradients, time"),
    Demo("checkpoint-resume", "03", (3, 4), "Sharded DCP checkpoint saved on N ranks, resumed on another number"),
    Demo("checkpoint-crash", "03", (3,), "A rank killed mid-save leaves the last committed checkpoint intact"),
    Demo("tp-block", "04", (1, 2, 3, 4),
         "Megatron block on N ranks: outputs, every gradient, 4 all-reduces, bytes kept"),
    Demo("tp-layouts", "04", (2, 3, 4),
         "One MLP, four layouts: the collectives follow the layout; a needless gather's bytes"),
    Demo("tp-vs-dtensor", "04", (2, 4), "Our column/row MLP vs torch's DTensor ColwiseParallel/RowwiseParallel"),
    Demo("sp-vs-cp", "04", (2, 3, 4), "Sequence parallelism (two ways) vs context parallelism: traffic and bytes kept"),
    Demo("tp-overlap", "04", (2, 4),
         "TP MLP: all-reduce overlapped with the next microbatch's matmuls vs blocking; same bytes, same output"),
    Demo("pp-forward", "05", (1, 2, 4), "Forward pipeline (GPipe's forwards): output == one process, M(P-1) transfers"),
    Demo("pp-train", "05", (1, 2, 4),
         "Pipeline training (GPipe, 1F1B, interleaved): loss and gradients == one process"),
    Demo("pp-vs-torch", "05", (2, 4), "Pipeline executor vs torch.distributed.pipelining (GPipe, 1F1B, interleaved)"),
    Demo("pp-bubble", "05", (1, 2, 4), "Measured bubble of a balanced forward pipeline vs (P-1)/(M+P-1)"),
    Demo("pp-imbalance", "05", (2, 4), "One slow stage: idle fraction vs M levels off above zero"),
    Demo("pp-stage-waits", "05", (2, 4),
         "Per stage, fill and drain measured: s t_F before, s t_B after (GPipe, 1F1B)"),
    Demo("pp-overlap", "05", (2, 4), "More microbatches, same batch: step time vs M, transfer time beside the slot"),
    Demo("pp-rollout", "05", (1, 2, 4),
         "Rollout training: one loss over whole trajectories, one step, on a 1F1B pipeline"),
    Demo("ring-attention", "06", (1, 2, 3, 4, 5, 6, 7, 8),
         "Ring attention on N ranks == SDPA (fp32, fp64, causal or not, forward and backward); KV bytes (N-1) "
         "S d_KV / N per rank"),
    Demo("ring-attention-pruned", "06", (2, 4),
         "Pruned causal ring (no dead K, V sends) == SDPA forward and backward, beside the uniform ring and "
         "zigzag; bytes and sends per rank exact"),
    Demo("ring-attention-vs-torch", "06", (1, 2, 3, 4),
         "Our ring vs torch's private _templated_ring_attention on CPU gloo: both == SDPA; torch sends dK, dV "
         "N times per rank, we N-1"),
    Demo("ring-attention-balance", "06", (2, 4),
         "Causal load balance: contiguous blocks give the last rank the most work, zigzag equal work; exact "
         "pair counts, measured CPU time"),
    Demo("ring-attention-long-context", "06", (2, 4),
         "A context whose S x S scores exceed a 32 MiB budget runs on N ranks; per-rank memory ~ 1/N of the "
         "tokens plus block-bounded scores"),
    Demo("ring-attention-generation", "06", (1, 2, 4),
         "Generation stays autoregressive: the context is attended on N ranks at once, G new tokens take G "
         "rounds on any N"),
    Demo("scan-affine", "07", (1, 2, 4, 8),
         "Affine recurrence over N ranks (all-gather and hand-off) vs the sequential loop"),
    Demo("scan-bytes", "07", (4,), "Ledger bytes of the chunked scan: set by state size and N, not by T"),
    Demo("scan-one-process", "07", (1, 4),
         "One process: Hillis-Steele, torch's associative_scan and N chunks vs the loop"),
    Demo("scan-cell", "07", (2, 4, 8),
         "GRU core over N ranks: chunks from zero (wrong), boundary hand-off, episodes split"),
    Demo("scan-picard", "07", (1, 2, 4, 8),
         "Picard sweeps over N ranks: exact after at most N sweeps, at N times the work"),
    Demo("diffusion-tokens", "08", (2, 3, 4), "Token-sharded sampling: K/V or x all-gathered per step, vs one device"),
    Demo("diffusion-steps", "08", (2, 4),
         "Steps on different ranks (hand-offs, no speed-up) vs samples batched over ranks"),
    Demo("diffusion-picard", "08", (2, 4), "Picard iteration over the steps on N ranks: error per round, extra work"),
    Demo("mesh-3d", "09", (8,), "3D parallelism: 2 dp x 2 tp x 2 pp, one step vs one device, ledger by axis, memory"),
    Demo("mesh-cp", "09", (8,),
         "2 dp x 2 cp x 2 tp: ring attention inside tensor-parallel blocks, one step vs one device"),
    Demo("mesh-2d", "09", (4,), "2 dp x 2 tp on 4 ranks (the mesh the torchrun test spreads over two nodes)"),
    Demo("moe-ep", "10", (1, 2, 4),
         "Expert parallelism: the MoE layer on N ranks == one process; all-to-all bytes exact"),
    Demo("moe-capacity", "10", (1, 2, 4),
         "Capacity: drops counted; == one process with the same rule, != dropless where dropped"),
    Demo("moe-balance", "10", (1, 2, 4),
         "Load balance: tokens per expert and rank over training steps, with the balancing loss"),
    Demo("moe-ep-dp", "10", (1, 2, 4),
         "EP x DP: dense grads over all ranks, expert grads over their replicas; steps == one process"),
)
