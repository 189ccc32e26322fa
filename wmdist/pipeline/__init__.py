"""Chapter 05, pipeline parallelism: consecutive layer blocks on separate ranks, microbatches flowing through.

The algorithm is in schedules.py (schedules as data: per-rank lists of forward and backward actions for
GPipe, 1F1B and interleaved 1F1B) and executor.py (the model cut into stages, and a runner for ANY
schedule on P ranks: receives posted up front in each sender's order, counted isend/irecv); neither
imports the harness. They use plan.py for the decisions made first (blocks per stage, whole-trajectory
microbatches, who sends which Message to whom). The rest checks it:

    simulate.py      an ideal-time run of a schedule: timings, idle fraction,
                     activations in flight, deadlock detection, text diagram (pure)
    bubble.py        the bubble panel's model: both conventions and curves (pure)
    stages.py        the single-device references and their rounding bounds (re-exports the stages)
    demos.py         forward pipeline and pipeline training vs one process
    versus_torch.py  our executor vs torch.distributed.pipelining
    measure.py       timed steps: measured Gantt chart and idle fraction, imbalance
    overlap.py       per stage fill and drain measured, and step time over M beside the transfer time
    widget_run.py    the panel's "run it" as an Experiment (boundary counts exact), measure_bubble
    rollout.py       rollout training: one loss over whole trajectories, one step
    exercises.py     write one rank's 1F1B action list
    figures.py, panel.py   the bubble-fraction panel and the chapter's figures
    cli.py           `wmdist schedule {gpipe,1f1b,interleaved} -P 4 -M 8 [-v 2] [--json] [--gantt]`

The closed forms (bubble fraction in both conventions, peak activations in
flight, boundary transfers) live in wmdist.costs.pipeline.
"""
