"""Chapter 06, long context: ring attention, built from attention one block at a time.

The algorithm is in blockwise.py (attention one query block and key/value block pair at a time, merged by
online softmax: `attend_block`, `merge`, `attend_block_backward`, `blockwise_attention`) and ring.py (ring
attention: queries stay, K and V travel with counted isend/irecv overlapped with the block computation;
forward, backward with dK, dV partial sums, and `ring_attention` as a differentiable op); neither imports
the harness. They use layout.py for which positions each rank holds. The rest checks it:

  layout.py      pure: which positions each rank holds (contiguous, zigzag), which K, V block it sees at
                 each ring step, the causal work each (rank, step) does, which steps are skipped.
  pruned.py      the pruned causal ring: a block stops after the last rank that reads it (no dead sends on
                 the contiguous layout; zigzag has none to drop), forward and backward.
  profiling.py   the allocator measurement behind every memory claim (`measure_allocations`), and
                 counting a library's collectives, with torch's autograd profiler.
  tolerance.py   the derived rounding bound between two attention implementations (elementwise).
  traffic.py     pure: the traffic widget's model (bytes, FLOPs, memory, overlap, DP/TP/CP per step).
  spec.py        the sizes of a run, refused before any process starts; seeded inputs; the shared cases.
  checks.py      what the ring demos check alike: SDPA within the rounding bound, the forward's work.
  demos.py       ring == SDPA (fp32, fp64, causal or not, forward and backward), bytes and work exact.
  pruned_demo.py  pruned ring, uniform ring and zigzag side by side: == SDPA, bytes and sends exact.
  versus_torch.py  torch's private ring template on the same gloo ranks.
  balance.py     causal load balance: contiguous vs zigzag, exact work, measured CPU time.
  long_context.py  a context whose scores exceed a budget, run on N ranks; memory measured.
  generation.py  prefill in parallel, new tokens one round each.
  measure.py, panel.py, figures.py  the widget's "run it", its view, the chapter's plots.
  exercises.py   the online-softmax merge exercise.
The bytes, FLOPs and memory formulas live in wmdist.costs.ring_attention.
"""
