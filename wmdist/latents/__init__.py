"""Chapter 02: stochastic latents across data-parallel ranks.

The algorithm is in estimators.py (exact gradients and per-draw estimators: pathwise, score function,
straight-through; each rank's random stream) and noisy_dp.py (the stochastic-latent model trained data
parallel, every rank drawing its own noise, and the one process that draws every rank's); neither
imports the harness. The rest checks it:

    training.py    the latent-dp demo: identical parameters on every rank, == one process, bytes exact
    demos.py       estimator bias and variance, and seeding modes, on real ranks; the exercise
    results.py     the records the demos return and the figures draw
    figures.py     the chapter's figures
"""
