"""Chapter 02: stochastic latents across data-parallel ranks.

    estimators.py  exact gradients and per-draw estimators (pathwise, score function, straight-through),
                   per-rank random streams (pure single-process math)
    training.py    data-parallel training where every rank draws its own latent noise
    demos.py       estimator bias and variance, and seeding modes, on real ranks; the exercise
    figures.py     the chapter's figures
"""
