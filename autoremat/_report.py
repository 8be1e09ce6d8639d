"""Human-readable plan reports."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autoremat._budget import format_bytes

if TYPE_CHECKING:
    from autoremat._plan import Plan


def report(plan: Plan, max_rows: int = 40) -> str:
    """The plan's totals and a table of its decisions, largest bytes first."""
    g = plan.graph
    lines = [
        f"budget            {format_bytes(plan.budget_bytes):>12}",
        f"predicted peak    {format_bytes(plan.peak_bytes):>12}   (no remat: "
        f"{format_bytes(plan.no_remat_peak_bytes)}; arguments {format_bytes(g.arg_bytes)}, "
        f"gradients {format_bytes(g.grad_bytes)})",
        f"saved residuals   {format_bytes(plan.saved_bytes):>12}",
        f"recompute         {plan.recompute_flops / 1e9:>8.3f} GFLOP   overhead "
        f"{100 * plan.overhead:.2f}% of {plan.step_flops / 1e9:.3f} GFLOP per step",
        f"solver            {plan.status}"
        + (f" (gap {100 * plan.gap:.3f}%)" if plan.status != "optimal" else "")
        + f", {plan.solve_seconds:.2f} s, {len(g.values)} values in {len(g.regions)} regions",
        "",
    ]
    rows = []
    for v, flops in zip(g.values, g.recompute_flops()):
        action = "save" if v.id in plan.saved else "recompute" if v.id in plan.recomputed else None
        if action is None:
            continue
        nbytes = v.nbytes * (v.multiplicity if action == "save" else 1)
        shape = f"{v.dtype}[{','.join(map(str, v.shape))}]"
        if action == "save" and v.multiplicity > 1:
            shape += f" x{v.multiplicity}"
        rows.append((nbytes, action, shape, v.primitive, int(flops), v.source))
    rows.sort(key=lambda r: (-r[0], r[5]))
    header = f"{'action':<10} {'bytes':>11}  {'value':<26} {'primitive':<18} {'GFLOP':>8}  source"
    lines += [header, "-" * len(header)]
    for nbytes, action, shape, prim, flops, source in rows[:max_rows]:
        flop_col = f"{flops / 1e9:8.3f}" if action == "recompute" else " " * 8
        lines.append(f"{action:<10} {format_bytes(nbytes):>11}  {shape:<26} {prim:<18} "
                     f"{flop_col}  {source}")
    if len(rows) > max_rows:
        lines.append(f"... {len(rows) - max_rows} more decisions")
    return "\n".join(lines)
