"""Chapter 07, recurrent world models: what a scan over time can and cannot split across ranks.

The algorithm is in affine.py (the affine recurrence h_t = A_t h_{t-1} + b_t: its steps compose as maps,
so each time chunk folds into one summary (A, b) and the summaries alone give every chunk the state
entering it; a log-depth Hillis-Steele scan, and torch's associative_scan) and cell.py (a nonlinear
GRU-style cell, whose steps have no compact composition: chunks started from zero are wrong, boundary
states must be passed along, and Picard sweeps converge to the exact trajectory at the price of extra
work); neither imports the harness. The rest checks it:

    affine_ranks.py  the affine scan on ranks: summaries all-gathered or handed along; the exercise
    boundaries.py    the cell's three splits on ranks: chunks from zero, boundary hand-off, episodes
    spec.py          EpisodeSpec: the seeded episodes scan-cell and scan-picard both run on, checked first
    picard_ranks.py  Picard sweeps on ranks (scan-picard)
    bounds.py        the rounding bounds the cell's comparisons use
    one_process.py, affine_demos.py, cell_demos.py   the demos: == the sequential scan, bytes exact
    results.py, figures.py   the records the demos return and the chapter's figures

The counts and bytes these predict live in wmdist.costs.scan.
"""
