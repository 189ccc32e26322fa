"""Chapter 05, pipeline parallelism: consecutive layer blocks on separate ranks, microbatches flowing through.

What this folder holds:

    schedules.py     schedules as data: per-rank lists of forward and backward
                     actions (GPipe, 1F1B, interleaved 1F1B), tokens, JSON (pure)
    simulate.py      an ideal-time run of a schedule: timings, idle fraction,
                     activations in flight, deadlock detection, text diagram (pure)
    plan.py          what a run needs decided first: blocks per stage, whole-
                     trajectory microbatches, who sends what to whom, PipeWork (pure)
    bubble.py        the bubble panel's model: both conventions and curves (pure)
    stages.py        the transformer world model cut into stages; the single-
                     device references and their rounding bounds
    executor.py      runs ANY Schedule on P gloo ranks with counted isend/irecv
    demos.py         forward pipeline and pipeline training vs one process
    versus_torch.py  our executor vs torch.distributed.pipelining
    measure.py       timed steps: measured Gantt chart and idle fraction, imbalance
    rollout.py       rollout training: one loss over whole trajectories, one step
    exercises.py     write one rank's 1F1B action list
    figures.py, panel.py   the bubble-fraction panel and the chapter's figures
    cli.py           `wmdist schedule {gpipe,1f1b,interleaved} -P 4 -M 8 [-v 2] [--json] [--gantt]`

The closed forms (bubble fraction in both conventions, peak activations in
flight, boundary transfers) live in wmdist.costs.pipeline.
"""
