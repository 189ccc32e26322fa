"""Chapters 00 and 03: what each rank holds, and sharding it away.

The algorithm is in zero.py (ZeRO-1/2/3 on flat element ranges: which rank owns which slice of the
optimizer state, gradients and weights, reduce-scatter, the sharded Adam step, all-gather) and
dcp_store.py (sharded torch.distributed.checkpoint saves with an atomic commit, and resharded loads);
neither imports the harness. The rest checks it:

    footprint.py             bytes per rank by tensor kind (pure): MemoryConfig, per_rank_bytes
    transient.py             ZeRO's peak within a step next to the steady state (pure)
    presets.py               public transformer shapes and Korthikanti et al.'s activation bytes (pure)
    remedies.py              the limiting kind and the remedies that target it (pure)
    command.py               `wmdist memory`: the model from a terminal
    zero_reference.py        single-process Adam and the (measured) tolerance of comparing with it
    zero_demos.py            ZeRO runs checked: bytes held (steady and within a step) and sent vs formulas,
                             weights vs Adam and torch
    activation_recompute.py  activation checkpointing on the dynamics unroll: bytes kept vs recompute
    sharded_checkpoint.py    resumable training on dcp_store; saved on N ranks, resumed on M, a rank killed mid-save
    exercises.py             ZeRO bytes (pure) and the sharded update (ranks)
    panel.py                 MemoryPanel; figures.py its bars
"""
