"""Chapter 11, planning a cluster: the checked formulas carried from eight ranks to thousands of GPUs.

No process is started here: every term of a predicted step is a formula an earlier chapter checked on real
ranks, read from wmdist.costs and the memory calculator, never restated.

The algorithm is in breakdown.py (one step of a layout as a sum of terms: compute at the GPU type's one
efficiency, each axis's exposed communication on the link tier its place in the mesh gives it, the pipeline
bubble, what overlaps and what does not) and stage.py (what each pipeline stage computes and moves through HBM,
and the fill and drain of stages of unequal pace); neither imports the harness.
The rest checks it:

    model.py, presets.py, hardware.py   the inputs: a transformer, a cluster, a job; published shapes and GPUs
    layout.py       dp x tp x pp x cp x ep with ZeRO stage, micro-batch, virtual stages, recompute; all a job allows
    memory.py       bytes on a layout's fullest GPU, asked of the memory calculator (memory.footprint)
    rank.py         each layout's step and memory together; the layouts that fit, ranked exactly by a bounded search
    records.py, published.py, published_a100.py   published training runs as data, each with its citation
    scoring.py      the planner against those runs: MFU, memory and layout goals (`wmdist bench plan`)
    misses.py       chapter 11's table of predicted against published, the misses explained
    small.py        the small end: chapter 09's 8-rank step on this machine, from counted operators and
                    messages and their costs measured here (mesh/calibrate.py; alpha, beta from chapter 01)
    explore.py, panel_search.py, panel.py, figures.py   the planner panel (its model, its search, its view)
    predictions.py, exercises.py, chapter.py, cli.py   the prompt's answer, the exercise, registration, `wmdist plan`
"""
