"""Chapters 00 and 03: what each rank holds, and sharding it away.

    footprint.py             bytes per rank by tensor kind (pure): MemoryConfig, per_rank_bytes
    remedies.py              the limiting kind and the remedies that target it (pure)
    zero.py                  ZeRO-1/2/3 on flat element ranges: the rank side and the Adam reference
    zero_demos.py            ZeRO runs checked: bytes held and sent vs formulas, weights vs Adam and torch
    activation_recompute.py  activation checkpointing on the dynamics unroll: bytes kept vs recompute
    sharded_checkpoint.py    resumable torch.distributed.checkpoint saves, resharded on another world size
    exercises.py             ZeRO bytes (pure) and the sharded update (ranks)
    panel.py                 MemoryPanel; figures.py its bars
"""
