"""Chapter 01: replicated data parallelism and the all-reduce.

    ring.py        ring all-reduce vs gloo vs one process, bytes exact (and the chapter 00 ring-pass exercise)
    training.py    the data-parallel rank function and its single-process reference, loss weightings
    versus_ddp.py  our training vs one process vs torch's DistributedDataParallel
    pitfalls.py    unequal shards, local BatchNorm, buffers, optimizer state, each shown failing; an exercise
    buckets.py     gradient buckets reduced during backward, measured timelines and overlap
    scaling.py     the T(N) model and its fit to measurements (pure)
    measure.py     timing real all-reduces on local ranks
    panel.py       ScalingPanel; figures.py its figure
"""
