"""Chapter 08: diffusion and flow samplers, and which parts of them can run in parallel.

The algorithm is in sampler.py (the sequential Euler sampler, the exact reference, and Picard iteration
over the steps: parallel in time, more work for fewer sequential rounds) and denoiser.py (a tiny
video-latent denoiser whose one attention layer is split so a rank holding a shard of the tokens computes
its shard's output from every token's keys and values); neither imports the harness. The rest checks it:

    spec.py           what is sampled, refused before any process starts; the reference trajectory
    token_parallel.py the steps in order, each step's tokens sharded (K/V or x gathered per step)
    step_parallel.py  steps on different ranks (point-to-point hand-offs) next to samples batched over
                      ranks, with measured timelines
    picard_ranks.py   each Picard round's evaluations spread over the ranks
    tradeoff.py       when that pays
    results.py, exercises.py, figures.py   the records, the exercise and the figures

Their costs are closed forms in `wmdist.costs.diffusion`.
"""
