"""Chapter 10, experts: a mixture-of-experts world model, its experts spread over ranks (expert parallelism).

The algorithm is in moe.py (the router, the dispatch permutation and its inverse, the experts, capacity,
the balancing loss, the one-process layer and the tiny MoE world model) and dispatch.py (the counts
exchange, the two uneven all-to-alls as an autograd op, the expert-parallel forward, and with data
parallelism which gradients are summed over which ranks); neither imports the harness. The rest checks it:

    spec.py        sizes and routing cases, refused before any process starts (N must divide E)
    reference.py   the one-process runs and the tolerances, derived
    demos.py       moe-ep, moe-capacity: the layer on N ranks == one process, bytes and drops exact
    balance.py     moe-balance: tokens per expert and rank over a few training steps, with the balancing loss
    ep_dp.py       moe-ep-dp: the world model trained on an ep x dp mesh == one process
    exercises.py   write the dispatch permutation and its inverse

The closed forms (capacity, drops, imbalance, all-to-all bytes and time) live in wmdist.costs.experts.
"""
