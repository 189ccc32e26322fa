"""Chapter 07, recurrent world models: what a scan over time can and cannot split across ranks.

affine.py: the affine recurrence h_t = A_t h_{t-1} + b_t. Its steps compose as
maps, so each time chunk can be folded into one summary (A, b), and the
summaries alone give every chunk the state entering it. Also here: a log-depth
(Hillis-Steele) scan in one process, and torch's own associative_scan.
cell.py: a nonlinear GRU-style cell. Its steps have no compact composition:
chunks started from zero are wrong, boundary states must be passed along, and
Picard sweeps converge to the exact trajectory at the price of extra work.
The counts and bytes these predict live in wmdist.costs.scan.
"""
