"""Figures for chapter 02: estimator bias and variance, seed modes. Pure functions returning a Figure."""
from __future__ import annotations


import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from wmdist.latents.results import EstimatorStats, SeedStats


def estimator_figure(stats: dict[str, EstimatorStats]) -> Figure:
    """Left: each estimator's bias in standard errors, with the +-4 SE band. Right: variance per draw."""
    names = [n for n in stats if n != "f(z)"]
    z = [stats[n].bias_in_se for n in names]
    with plt.ioff():
        fig, (left, right) = plt.subplots(1, 2, figsize=(9.0, 3.2), layout="constrained")
    left.axvspan(-4, 4, color="0.9", label="within 4 SE")
    left.barh(names, z, color=["tab:red" if abs(v) > 4 else "tab:green" for v in z])
    left.set(xlabel="bias / standard error", title="bias against the exact gradient")
    left.invert_yaxis()
    left.legend(fontsize=9)
    right.barh(names, [stats[n].variance for n in names], color="tab:blue")
    right.set(xscale="log", xlabel="variance of one draw", title="noise per draw")
    right.invert_yaxis()
    plt.close(fig)   # returned, not left in pyplot: a cell shows it once
    return fig


def seeds_figure(stats: dict[str, SeedStats], world_size: int) -> Figure:
    """Variance of the rank-averaged estimate for each seeding mode, against Var/N and Var."""
    modes = list(stats)
    one = stats["independent"].var_one_rank
    with plt.ioff():
        fig, ax = plt.subplots(figsize=(5.5, 3), layout="constrained")
    ax.bar(modes, [stats[m].var_average for m in modes], color=["tab:green", "tab:red", "tab:blue"])
    ax.axhline(one, color="k", ls="--", lw=1, label="one rank's variance")
    ax.axhline(one / world_size, color="k", ls=":", lw=1, label=f"variance / N (N = {world_size})")
    ax.set(ylabel="variance of the average", title="averaging over ranks: it depends on covariance")
    ax.legend(fontsize=9)
    plt.close(fig)   # returned, not left in pyplot: a cell shows it once
    return fig
