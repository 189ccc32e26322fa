"""Chapter 08: diffusion and flow samplers, and which parts of them can run in parallel.

A sampler is a chain: each solver step consumes the state the previous step
produced. `denoiser` is a tiny video-latent denoiser whose one attention layer
is split so a rank holding a shard of the spatial-temporal tokens can compute
its shard's output from every token's keys and values; `sampler` holds the
sequential Euler sampler (the exact reference) and Picard iteration over the
steps (parallel in time, more work for fewer sequential rounds). Their costs
are closed forms in `wmdist.costs.diffusion`.
"""
