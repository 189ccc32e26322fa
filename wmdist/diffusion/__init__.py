"""Chapter 08: diffusion and flow samplers, and which parts of them can run in parallel.

A sampler is a chain: each solver step consumes the state the previous step
produced. `denoiser` is a tiny video-latent denoiser whose one attention layer
is split so a rank holding a shard of the spatial-temporal tokens can compute
its shard's output from every token's keys and values; `sampler` holds the
sequential Euler sampler (the exact reference) and Picard iteration over the
steps (parallel in time, more work for fewer sequential rounds). Their costs
are closed forms in `wmdist.costs.diffusion`.

On real ranks (`spec` names what is sampled and refuses bad inputs first):
`token_parallel` keeps the steps in order and shards each step's tokens
(K/V or x gathered per step); `step_parallel` puts steps on different ranks
(point-to-point hand-offs) next to samples batched over ranks, with measured
timelines; `picard_ranks` spreads each Picard round's evaluations over the
ranks; `tradeoff` says when that pays; `exercises` and `figures` serve the
notebook.
"""
