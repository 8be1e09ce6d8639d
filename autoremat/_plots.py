"""Pictures of plans and sweeps (needs matplotlib: ``pip install "autoremat[plots]"``)."""

from __future__ import annotations

import os
from typing import Any

from autoremat._benchmark import Sweep


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError('plots need matplotlib: pip install "autoremat[plots]"') from None
    return plt


def pareto(sweep: Sweep, path: str | os.PathLike) -> None:
    """Peak memory against recompute overhead: autoremat's plans (real and predicted)
    beside the built-in policies and the frontier their per-layer mixtures reach.

    Written as PNG or SVG, by ``path``'s suffix.
    """
    plt = _pyplot()
    gib = 2**30
    fig, ax = plt.subplots(figsize=(8, 5.5))
    others = sorted((r for r in sweep.rows if r.kind != "autoremat"
                     and r.real_peak_bytes is not None and sweep.overhead(r) is not None),
                    key=lambda r: r.real_peak_bytes)
    for r in others:
        ax.scatter(r.real_peak_bytes / gib, 100 * sweep.overhead(r),
                   marker="s" if r.kind == "builtin" else "^", color="tab:gray", zorder=3)
        ax.annotate(r.name, (r.real_peak_bytes / gib, 100 * sweep.overhead(r)), fontsize=7,
                    xytext=(4, 4), textcoords="offset points")
    plans = [r for r in sweep.rows if r.kind == "autoremat" and r.predicted_peak_bytes]
    real = [r for r in plans if r.real_peak_bytes is not None]
    if real:
        ax.plot([r.real_peak_bytes / gib for r in real],
                [100 * sweep.overhead(r) for r in real], "o-", color="tab:blue",
                label=f"autoremat, compiled for {sweep.target}", zorder=4)
        budgets = [r.budget_bytes / gib for r in real]
        ax.vlines(budgets, 0, [100 * sweep.overhead(r) for r in real], color="tab:blue",
                  alpha=0.15, linestyles="dotted", label="budgets asked for")
    ax.plot([r.predicted_peak_bytes / gib for r in plans],
            [100 * r.predicted_overhead for r in plans], "x--", color="tab:orange",
            alpha=0.7, label="autoremat, analytic prediction")
    ax.set_xlabel("peak memory of the training step (GiB)")
    ax.set_ylabel("recompute overhead (% of the step's FLOPs)")
    ax.set_title(f"{sweep.model}: peak memory vs recompute overhead\n{sweep.description}",
                 fontsize=9)
    ax.grid(alpha=0.3)
    ax.set_ylim(bottom=min(0, ax.get_ylim()[0]))
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
