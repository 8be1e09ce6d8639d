"""Human-readable plan reports, made from a plan or from its policy file alone."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autoremat._budget import format_bytes
from autoremat._policy_file import PolicyFile

if TYPE_CHECKING:
    from autoremat._plan import Plan


def report(plan: Plan, max_rows: int = 40) -> str:
    """The plan's totals and a table of its decisions, largest bytes first."""
    text = format_report(PolicyFile.from_plan(plan), max_rows=max_rows)
    if not plan.offloaded:
        return text
    lines = text.split("\n")
    at = next(k for k, line in enumerate(lines) if line.startswith("saved residuals")) + 1
    lines.insert(at, f"offloaded to host {format_bytes(plan.offloaded_bytes):>12}   (transfers "
                     f"cost {plan.offload_flops / 1e9:.3f} GFLOP-equivalent; modelled overhead "
                     f"{100 * plan.modeled_overhead:.2f}%)")
    return "\n".join(lines)


def format_report(policy: PolicyFile, max_rows: int = 40) -> str:
    """The report of a plan stored in a policy file (see :func:`report`).

    Each row is one decision: an action on the values made at one source line. ``values``
    says how many of the values made there it covers (``all 12`` when every one, as for
    the same value in each of 12 layers); bytes and GFLOP are totals over them.
    """
    p = policy
    lines = [
        f"budget            {format_bytes(p.budget_bytes):>12}",
        (f"predicted peak    {format_bytes(p.peak_bytes):>12}   (no remat: "
        f"{format_bytes(p.no_remat_peak_bytes)}; arguments {format_bytes(p.arg_bytes)}, "
        f"gradients {format_bytes(p.grad_bytes)})"),
        *([(f"compiler peak     {format_bytes(p.verified_peak_bytes):>12}   (verified on "
           f"{p.target})")] if p.target is not None else []),
        f"saved residuals   {format_bytes(p.saved_bytes):>12}",
        (f"recompute         {p.recompute_flops / 1e9:>8.3f} GFLOP   overhead "
        f"{100 * p.overhead:.2f}% of {p.step_flops / 1e9:.3f} GFLOP per step"),
        f"solver            {p.status}"
        + (f" (gap {100 * p.gap:.3f}%)" if p.status != "optimal" else "")
        + f", {p.solve_seconds:.2f} s, {p.num_values} values in {len(p.regions)} regions",
        *p.placement.describe(),
        *([f"layout            {p.layout} (bytes of the tiled TPU layout)"]
          if p.layout == "tpu" else []),
        "",
    ]
    rows = []
    for d in p.decisions:
        save = d.action in ("save", "offload")  # bytes kept (on the device or the host)
        nbytes = d.count * d.nbytes * (d.multiplicity if save else 1)
        value = d.site.array + (f" x{d.multiplicity}" if save and d.multiplicity > 1 else "")
        values = (str(d.of) if d.of == 1 else f"all {d.of}" if d.occurrences is None
                  else f"{d.count} of {d.of}")
        rows.append((nbytes, d.action, values, value, d.site.primitive,
                     d.count * d.recompute_flops, d.site.source))
    rows.sort(key=lambda r: (-r[0], r[6]))
    header = (f"{'action':<10} {'bytes':>11}  {'values':>8}  {'value':<26} {'primitive':<18} "
              f"{'GFLOP':>8}  source")
    lines += [header, "-" * len(header)]
    for nbytes, action, values, value, prim, flops, source in rows[:max_rows]:
        flop_col = f"{flops / 1e9:8.3f}" if action == "recompute" else " " * 8
        lines.append(f"{action:<10} {format_bytes(nbytes):>11}  {values:>8}  {value:<26} "
                     f"{prim:<18} {flop_col}  {source}")
    if len(rows) > max_rows:
        lines.append(f"... {len(rows) - max_rows} more decisions")
    return "\n".join(lines)
