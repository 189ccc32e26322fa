"""Chapter 01: replicated data parallelism and the all-reduce.

The algorithm is in training.py (the data-parallel step: each rank takes its shard of the batch, flattens
its gradients into one buffer, sums it with the ring all-reduce and takes the same optimizer step; the
loss weightings, and the one-process run it must match) and wmdist/comm/ring.py (the ring all-reduce
itself: a reduce-scatter then an all-gather, N-1 sends each); neither imports the harness. The rest checks it:

    ring.py        ring all-reduce vs gloo vs one process, bytes exact (and the chapter 00 ring-pass exercise)
    algorithms.py  tree, halving-doubling and direct all-reduce, written out with counted sends
    algorithms_demo.py  the four all-reduces vs one process and the ring, bytes and rounds exact
    allreduce_figures.py  rounds against bytes: the four algorithms' model time over payload size
    versus_ddp.py  our training vs one process vs torch's DistributedDataParallel
    pitfalls.py    unequal shards, local BatchNorm, buffers, optimizer state, each shown failing; an exercise
    buckets.py     gradient buckets reduced during backward, measured timelines and overlap
    drift.py       replicas that drift while every all-reduce succeeds, replicas_agree; batch vs lr runs
    drift_demo.py  its two demos (dp-drift, dp-batch-lr)
    compression.py torch's DDP comm hooks (fp16, bf16, PowerSGD) on our ranks, their all-reduces counted
    compression_demo.py  bytes per method exact, gradient error and loss measured (dp-compression)
    scaling.py     the T(N) model and its fit to measurements (pure)
    measure.py     timing real all-reduces on local ranks (allreduce-timing, the panel's run)
    panel.py       ScalingPanel; figures.py its figure
"""
