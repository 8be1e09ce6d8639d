"""Human-readable plan reports, made from a plan or from its policy file alone."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from autoremat._budget import format_bytes
from autoremat._layout import Layout
from autoremat._placement import Placement
from autoremat._sites import Decision, decisions_of

if TYPE_CHECKING:
    from autoremat._plan import Plan
    from autoremat._policy_file import PolicyFile

_LAYOUT_NAMES = {"tpu": "the tiled TPU layout", "tiled": "the least padded TPU tiles"}


@dataclasses.dataclass(frozen=True)
class _Totals:
    """What the report's head states, whether read from a plan or from its file."""

    budget_bytes: int
    peak_bytes: int
    no_remat_peak_bytes: int
    arg_bytes: int
    grad_bytes: int
    target: str | None
    verified_peak_bytes: int | None
    saved_bytes: int
    recompute_flops: int
    step_flops: int
    status: str
    gap: float
    solve_seconds: float
    num_values: int
    num_regions: int
    placement: Placement
    layout: Layout
    offload_line: str | None = None
    no_remat: bool = False


def report(plan: Plan, max_rows: int = 40) -> str:
    """The plan's totals and a table of its decisions, largest bytes first."""
    g = plan.graph
    offload_line = None if not plan.offloaded else (
        f"offloaded to host {format_bytes(plan.offloaded_bytes):>12}   (transfers cost "
        f"{plan.offload_flops / 1e9:.3f} GFLOP-equivalent; modelled overhead "
        f"{100 * plan.modeled_overhead:.2f}%)")
    totals = _Totals(plan.budget_bytes, plan.peak_bytes, plan.no_remat_peak_bytes, g.arg_bytes,
                     g.grad_bytes, plan.verify_target, plan.verified_peak_bytes,
                     plan.saved_bytes, plan.recompute_flops, plan.step_flops, plan.status,
                     plan.gap, plan.solve_seconds, len(g.values), len(g.regions),
                     plan.placement, plan.layout, offload_line, plan.no_remat)
    return _format(totals, decisions_of(g, plan.actions), max_rows)


def format_report(policy: PolicyFile, max_rows: int = 40) -> str:
    """The report of a plan stored in a policy file (see :func:`report`).

    Each row is one decision: an action on the values made at one source line. ``values``
    says how many of the values made there it covers (``all 12`` when every one, as for
    the same value in each of 12 layers); bytes and GFLOP are totals over them.
    """
    p = policy
    totals = _Totals(p.budget_bytes, p.peak_bytes, p.no_remat_peak_bytes, p.arg_bytes,
                     p.grad_bytes, p.target, p.verified_peak_bytes, p.saved_bytes,
                     p.recompute_flops, p.step_flops, p.status, p.gap, p.solve_seconds,
                     p.num_values, len(p.regions), p.placement, p.layout, None, p.no_remat)
    return _format(totals, p.decisions, max_rows)


def _verified_lines(t: _Totals) -> list[str]:
    """The compiler's peak of a verified plan, or that it was not compiled."""
    if t.target is None:
        return ["compiler peak     not compiled   (the model's prediction: plan with "
                'verify="tpu-v5e", or on a GPU or TPU, to check it)']
    assert t.verified_peak_bytes is not None  # a verified plan has its compiler peak
    return [f"compiler peak     {format_bytes(t.verified_peak_bytes):>12}   (verified on "
            f"{t.target})"]


def _format(t: _Totals, decisions: Sequence[Decision], max_rows: int) -> str:
    overhead = t.recompute_flops / max(1, t.step_flops)
    lines = [
        f"budget            {format_bytes(t.budget_bytes):>12}",
        (f"predicted peak    {format_bytes(t.peak_bytes):>12}   (no remat: "
         f"{format_bytes(t.no_remat_peak_bytes)}; arguments {format_bytes(t.arg_bytes)}, "
         f"gradients {format_bytes(t.grad_bytes)})"),
        *_verified_lines(t),
        f"saved residuals   {format_bytes(t.saved_bytes):>12}",
        *([t.offload_line] if t.offload_line else []),
        (f"recompute         {t.recompute_flops / 1e9:>8.3f} GFLOP   overhead "
         f"{100 * overhead:.2f}% of {t.step_flops / 1e9:.3f} GFLOP per step"),
        f"solver            {t.status}"
        + (f" (gap {100 * t.gap:.3f}%)" if t.status != "optimal" else "")
        + f", {t.solve_seconds:.2f} s, {t.num_values} values in {t.num_regions} regions",
        *(["no remat          the function runs as written: no checkpoint, nothing "
           "recomputed"] if t.no_remat else t.placement.describe()),
        *([f"                  (modelled {_over(t)} over the budget: within the model's "
           "error on the function as written, where plans this near no remat compile "
           "higher)"] if t.no_remat and t.peak_bytes > t.budget_bytes else []),
        *([f"layout            {t.layout} (bytes of {_LAYOUT_NAMES[t.layout]})"]
          if t.layout != "dense" else []),
        "",
    ]
    return "\n".join(lines + _decision_table(decisions, max_rows))


def _over(t: _Totals) -> str:
    """How far the predicted peak is over the budget, as a percentage."""
    return f"{100 * (t.peak_bytes / t.budget_bytes - 1):.1f}%"


def _decision_table(decisions: Sequence[Decision], max_rows: int) -> list[str]:
    """The decisions' rows, largest bytes first, under a header."""
    rows = []
    for d in decisions:
        save = d.action in ("save", "offload")  # bytes kept (on the device or the host)
        nbytes = d.count * (d.held_bytes if save else d.nbytes)
        value = d.site.array + (f" x{d.multiplicity}" if save and d.multiplicity > 1 else "")
        values = (str(d.of) if d.of == 1 else f"all {d.of}" if d.occurrences is None
                  else f"{d.count} of {d.of}")
        rows.append((nbytes, d.action, values, value, d.site.primitive,
                     d.count * d.recompute_flops, d.site.source))
    rows.sort(key=lambda r: (-r[0], r[6]))
    header = (f"{'action':<10} {'bytes':>11}  {'values':>8}  {'value':<26} {'primitive':<18} "
              f"{'GFLOP':>8}  source")
    lines = [header, "-" * len(header)]
    for nbytes, action, values, value, prim, flops, source in rows[:max_rows]:
        flop_col = f"{flops / 1e9:8.3f}" if action == "recompute" else " " * 8
        lines.append(f"{action:<10} {format_bytes(nbytes):>11}  {values:>8}  {value:<26} "
                     f"{prim:<18} {flop_col}  {source}")
    if len(rows) > max_rows:
        lines.append(f"... {len(rows) - max_rows} more decisions")
    return lines
