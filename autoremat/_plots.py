"""Pictures of plans and sweeps (needs matplotlib: ``pip install "autoremat[plots]"``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import autoremat_ilp as ilp
import numpy as np

from autoremat import _solve
from autoremat._budget import format_bytes

if TYPE_CHECKING:
    from autoremat._benchmark import HandComparison, Row, Sweep
    from autoremat._plan import Plan

T = TypeVar("T")


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError('plots need matplotlib: pip install "autoremat[plots]"') from None
    return plt


def _known(x: T | None) -> T:
    """``x``, which the sweep recorded (autoremat rows carry their budget and prediction)."""
    assert x is not None
    return x


def _real(sweep: Sweep, r: Row) -> tuple[int, float]:
    """Row ``r``'s compiled peak bytes and overhead, where the sweep measured them."""
    peak, overhead = r.real_peak_bytes, sweep.overhead(r)
    assert peak is not None and overhead is not None
    return peak, overhead


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
                    key=lambda r: _real(sweep, r)[0])
    for r in others:
        peak, overhead = _real(sweep, r)
        ax.scatter(peak / gib, 100 * overhead,
                   marker="s" if r.kind == "builtin" else "^", color="tab:gray", zorder=3)
        ax.annotate(r.name, (peak / gib, 100 * overhead), fontsize=7,
                    xytext=(4, 4), textcoords="offset points")
    plans = [r for r in sweep.rows if r.kind == "autoremat" and r.predicted_peak_bytes]
    real = [_real(sweep, r) for r in plans if r.real_peak_bytes is not None]
    if real:
        ax.plot([peak / gib for peak, _ in real],
                [100 * overhead for _, overhead in real], "o-", color="tab:blue",
                label=f"autoremat, compiled for {sweep.target}", zorder=4)
        budgets = [_known(r.budget_bytes) / gib for r in plans if r.real_peak_bytes is not None]
        ax.vlines(budgets, 0, [100 * overhead for _, overhead in real], color="tab:blue",
                  alpha=0.15, linestyles="dotted", label="budgets asked for")
    ax.plot([_known(r.predicted_peak_bytes) / gib for r in plans],
            [100 * _known(r.predicted_overhead) for r in plans], "x--", color="tab:orange",
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


def hand_bars(found: Sequence[tuple[str, HandComparison]], path: str | os.PathLike) -> None:
    """Per model (name, :func:`autoremat._benchmark.compare_with_hand`), the compiler's peak
    of no remat, of the user's one remat per block and of autoremat's floor plan, each over
    the no-remat peak (PNG or SVG, by ``path``'s suffix)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(found) + 2), 4.5))
    x = np.arange(len(found))
    for k, (label, field, color) in enumerate((("no remat", "no_remat", "tab:gray"),
                                               ("hand: remat per block", "hand", "tab:orange"),
                                               ("autoremat floor", "floor", "tab:blue"))):
        ax.bar(x + (k - 1) * 0.27, [getattr(c, field) / c.no_remat for _, c in found], 0.27,
               label=label, color=color)
    ax.set_xticks(x, [name for name, _ in found], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("compiler peak / no-remat peak")
    ax.set_title("Floor on the compiler: autoremat against the hand baseline", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def memory_stages(plan: Plan) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The modelled bytes in use at each stage of ``plan``'s gradient computation, in
    execution order: every region's forward stage in program order, then every region's
    backward stage in reverse (the memory model of :mod:`autoremat._solve`).

    Returns:
      ``(labels, plan_bytes, no_remat_bytes)``: a label per stage (``"F3"``, ``"B3"``;
      a scan region's label ends in ``"×length"``) and the bytes in use under the plan
      and under no remat: the function as written where the placement runs it so
      (:func:`autoremat._solve.as_written_masks`), else saving every value the backward
      pass reads.
    """
    graph = plan.graph
    problem = _solve.problem_of(graph)
    ids = graph.array("id")

    def timeline(save: np.ndarray, recompute: np.ndarray) -> np.ndarray:
        stages = ilp.stage_bytes(problem, save, recompute)
        regions = problem.num_regions  # backward stages come first, then forward
        return np.concatenate([stages[regions:], stages[:regions][::-1]]).astype(np.int64)

    names = [f"{r.index}" + (f" ×{r.length}" if r.kind == "scan" else "")
             for r in graph.regions]
    labels = [f"F{n}" for n in names] + [f"B{n}" for n in reversed(names)]
    nothing = (_solve.saving_all_masks(problem) if graph.placement.restructures
               else _solve.as_written_masks(graph, problem))
    return (labels, timeline(np.isin(ids, list(plan.saved)), np.isin(ids, list(plan.recomputed))),
            timeline(*nothing))


def memory_timeline(plan: Plan, path: str | os.PathLike, *, title: str | None = None) -> None:
    """The modelled memory in use across the forward and backward stages of every
    region, for ``plan`` against the no-remat baseline, with the budget as a line.

    Written as PNG or SVG, by ``path``'s suffix. See :func:`memory_stages` for the data.
    """
    plt = _pyplot()
    labels, planned, baseline = memory_stages(plan)
    top = max(int(baseline.max(initial=0)), int(planned.max(initial=0)), plan.budget_bytes)
    unit, scale = next((u, s) for u, s in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10),
                                           ("B", 1)) if top >= 2 * s or s == 1)
    x = np.arange(len(labels))
    edges = np.arange(len(labels) + 1) - 0.5
    fig, ax = plt.subplots(figsize=(max(7.0, min(16.0, 0.3 * len(labels) + 4)), 4.8))
    ax.stairs(baseline / scale, edges, color="tab:gray", linestyle="--", linewidth=1.5,
              label=f"no remat (peak {format_bytes(int(baseline.max(initial=0)))})")
    ax.stairs(planned / scale, edges, color="tab:blue", fill=True, alpha=0.15)
    ax.stairs(planned / scale, edges, color="tab:blue", linewidth=2,
              label=f"plan (peak {format_bytes(int(planned.max(initial=0)))})")
    ax.axhline(plan.budget_bytes / scale, color="tab:red", linewidth=1.2,
               label=f"budget {format_bytes(plan.budget_bytes)}")
    forward = len(labels) // 2
    ax.axvline(forward - 0.5, color="black", linewidth=0.8, alpha=0.5)
    ax.text(forward - 0.6, 0.02, "forward ", transform=ax.get_xaxis_transform(),
            ha="right", fontsize=8, alpha=0.7)
    ax.text(forward - 0.4, 0.02, " backward", transform=ax.get_xaxis_transform(),
            ha="left", fontsize=8, alpha=0.7)
    stride = max(1, len(labels) // 40)
    ax.set_xticks(x[::stride], labels[::stride], rotation=90 if len(labels) > 24 else 0,
                  fontsize=7)
    ax.set_xlim(-0.5, len(labels) - 0.5)
    ax.set_ylim(0, 1.08 * top / scale)
    ax.set_xlabel("stage of the gradient computation (F: forward, B: backward; region index)")
    ax.set_ylabel(f"modelled bytes in use ({unit})")
    ax.set_title(title or (f"Modelled memory over the step: plan vs no remat\n"
                           f"{len(plan.saved)} values saved, {len(plan.recomputed)} recomputed, "
                           f"recompute overhead {plan.overhead:.1%}"), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
