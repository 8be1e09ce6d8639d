"""Budget sweeps of a zoo model: autoremat's plans beside JAX's built-in policies.

For one model and one compiler target, :func:`sweep` plans at budgets spread from the
model's floor to the real compiler's peak without remat, and compiles every plan and
every built-in per-layer policy (``jax.checkpoint_policies`` and, where the model names
its tensors, MaxText's presets). Each row holds the analytic prediction and the
compiler's figures side by side; :func:`frontier_gap` says how far each plan lies below
the line a user gets by mixing two adjacent built-in policies across layers.

Overheads are FLOPs of the gradient computation over those of the step without
checkpoints, counted two ways: by the compiler (``cost_analysis``; it counts a scan body
once, so it is only meaningful for unrolled models) and on the differentiated jaxpr
(scan bodies times their length), which is the figure used for scanned models.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import platform
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from autoremat import _measure, zoo
from autoremat._budget import format_bytes
from autoremat._cost import live_flops
from autoremat._errors import BudgetNotVerifiedError, InfeasibleBudgetError
from autoremat._layout import Layout
from autoremat._placement import Placement
from autoremat._plan import Plan
from autoremat._planner import PlanOptions, plan, plan_with

BUILTIN_POLICIES: dict[str, Callable | None] = {
    "no checkpoint": None,
    "everything_saveable": jax.checkpoint_policies.everything_saveable,
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
    "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "nothing_saveable": jax.checkpoint_policies.nothing_saveable,
}

#: The status of a budget row the closed loop found no fitting plan for within its compiles.
NOT_VERIFIED = "not verified"


@dataclasses.dataclass(frozen=True)
class Row:
    """One measured variant of the training step.

    Attributes:
      kind: ``"autoremat"``, ``"builtin"`` or ``"maxtext"``.
      name: the budget or the policy.
      budget_bytes: the budget asked for (autoremat rows).
      predicted_peak_bytes, predicted_overhead: autoremat's analytic model.
      real_peak_bytes: the compiler's peak (``None`` without a compiler).
      compiler_overhead: FLOPs counted by the compiler, over the no-checkpoint step's.
      program_overhead: FLOPs of the ``value_and_grad`` jaxpr, over the no-checkpoint
        step's.
      solve_seconds, compile_seconds: wall time planning (closed loop included) and
        compiling.
      status: the plan's solver status, or ``"infeasible"``.
      compiles: the compiles planning made (autoremat rows with ``verify``).
      regions: the plan's number of remat regions (autoremat rows).
      structure: how its placement runs the program otherwise than one region per scan
        and per segment (scans split into pieces, nested scans or segments), ``"-"`` for
        none (autoremat rows).
    """

    kind: str
    name: str
    budget_bytes: int | None = None
    predicted_peak_bytes: int | None = None
    predicted_overhead: float | None = None
    real_peak_bytes: int | None = None
    compiler_overhead: float | None = None
    program_overhead: float | None = None
    solve_seconds: float | None = None
    compile_seconds: float | None = None
    status: str | None = None
    compiles: int | None = None
    regions: int | None = None
    structure: str | None = None


@dataclasses.dataclass(frozen=True)
class Sweep:
    """A model's sweep: rows, and what was run to make them."""

    model: str
    description: str
    target: str | None
    floor_bytes: int
    rows: tuple[Row, ...]
    versions: dict[str, str]

    def overhead(self, row: Row) -> float | None:
        """The overhead the comparison uses: the compiler's for unrolled programs, the
        jaxpr's where a scan hides iterations from the compiler."""
        return row.program_overhead if "scan" in self.description else row.compiler_overhead


def versions() -> dict[str, str]:
    """The versions that decide the numbers."""
    out = {"python": platform.python_version()}
    for package in ("autoremat", "jax", "jaxlib", "libtpu", "ortools"):
        try:
            out[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            out[package] = "not installed"
    return out


def budgets_between(low: int, high: int, count: int) -> list[int]:
    """``count`` budgets from ``low`` to ``high`` inclusive, evenly spaced; rounded up to
    whole MiB when the range spans more than 64 MiB."""
    unit = 2**20 if high - low > 2**26 else 1
    return [-(-int(b) // unit) * unit for b in np.linspace(low, high, count)]


def program_flops(fn: Callable, *args: Any, argnums: int | Sequence[int] = 0) -> int:
    """FLOPs of ``jax.value_and_grad(fn, argnums)(*args)`` counted on its jaxpr (scans
    times length, dead equations dropped)."""
    return live_flops(jax.make_jaxpr(jax.value_and_grad(fn, argnums))(*args).jaxpr)


def sweep(model: zoo.ZooModel, *, target: str | None = "tpu-v5e", num_budgets: int = 8,
          options: PlanOptions = PlanOptions(), policies: Sequence[str] = tuple(BUILTIN_POLICIES),
          log: Callable[[str], None] = lambda _: None) -> Sweep:
    """Plans and measures ``model`` across budgets, beside the built-in policies.

    Args:
      model: a zoo model.
      target: the compiler to measure with (see :data:`autoremat.TARGETS`); ``None`` for
        the analytic model alone, budgets then spanning the floor to the model's no-remat
        peak.
      num_budgets: how many budgets, from the floor plan's real peak
        (:func:`lowest_budget`) to the compiler's no-checkpoint peak (the floor plan itself
        is one more row).
      options: how every plan is made (:class:`autoremat.PlanOptions`; its time limit is
        per plan, per closed-loop round; ``verify`` the target for the closed loop).
      policies: the names of :data:`BUILTIN_POLICIES` to measure, each applied to every
        layer by ``model.make_loss`` (with a library's own remat, for a model of another
        library: ``"nothing_saveable"`` is the user's one line of remat per block).
      log: called with a line per finished row.

    Returns:
      The :class:`Sweep`.
    """
    args = (model.param_shapes(), model.batch_shapes())
    loss = model.make_loss()
    argnums = _measure.float_argnums(args)
    base_flops = program_flops(loss, *args, argnums=argnums)
    base = None if target is None else _measure.measure_step(loss, *args, target=target,
                                                             argnums=argnums)
    rows: list[Row] = []

    def add(row: Row, fn: Callable) -> None:
        row = dataclasses.replace(
            row, program_overhead=program_flops(fn, *args, argnums=argnums) / base_flops - 1)
        if base is not None:
            assert target is not None  # base was measured on it
            m = _measure.measure_step(fn, *args, target=target, argnums=argnums)
            row = dataclasses.replace(row, real_peak_bytes=m.peak_bytes,
                                      compiler_overhead=m.flops / base.flops - 1,
                                      compile_seconds=m.compile_seconds)
        rows.append(row)
        log(_row_line(row))

    for name in policies:
        add(Row("builtin", name), model.make_loss(BUILTIN_POLICIES[name]))
    for preset in zoo.presets_for(model):
        if preset != "full":  # MaxText's "full" is nothing_saveable, measured above
            add(Row("maxtext", preset), model.make_loss(zoo.preset_policy(preset, model)))

    # With the closed loop, the floor plan the compiler puts lowest of those the model
    # puts near its least (see ``plan(budget="floor", verify=...)``).
    lowest = plan_with(loss, args, {}, "floor", options)
    floor = lowest.peak_bytes
    add(Row("autoremat", "floor", budget_bytes=floor,
            predicted_peak_bytes=lowest.peak_bytes, predicted_overhead=lowest.overhead,
            status=lowest.status, solve_seconds=lowest.solve_seconds,
            compiles=lowest.verify_compiles, regions=_regions(lowest),
            structure=structure(lowest.placement)), lowest.apply(loss))
    low = lowest_budget(floor, rows[-1].real_peak_bytes, verified=options.verify is not None)
    top = (base.peak_bytes if base is not None else plan_with(
        loss, args, {}, 1.0, PlanOptions(layout=options.resolved_layout)).peak_bytes)
    for budget in budgets_between(low, max(top, low), num_budgets):
        row = Row("autoremat", format_bytes(budget), budget_bytes=budget)
        start = time.perf_counter()
        try:
            p = plan_with(loss, args, {}, budget, options)
        except (InfeasibleBudgetError, BudgetNotVerifiedError) as e:
            status = NOT_VERIFIED if isinstance(e, BudgetNotVerifiedError) else "infeasible"
            rows.append(dataclasses.replace(row, status=status,
                                            solve_seconds=time.perf_counter() - start))
            log(_row_line(rows[-1]))
            continue
        add(dataclasses.replace(row, predicted_peak_bytes=p.peak_bytes,
                                predicted_overhead=p.overhead, status=p.status,
                                solve_seconds=time.perf_counter() - start,
                                compiles=p.verify_compiles, regions=_regions(p),
                                structure=structure(p.placement)), p.apply(loss))
    return Sweep(model.name, model.description, target, floor, tuple(rows), versions())


def lowest_budget(model_floor: int, real_floor: int | None, verified: bool) -> int:
    """The sweep's lowest budget: the floor plan's real peak where it was compiled, and
    with ``verified`` (the closed loop plans below the model's floor) even where the
    model puts the floor above it; else never below the model's floor, under which the
    model has no plan."""
    if real_floor is None:
        return model_floor
    return real_floor if verified else max(model_floor, real_floor)


def _regions(p: Plan) -> int:
    """A plan's number of remat regions."""
    return len(p.graph.regions)


def structure(placement: Placement) -> str:
    """The table's short form of how ``placement`` restructures the program: ``"split
    1+2+3"`` per split scan, ``"nested scan 2"``, ``"nested segments 3"``; ``"-"``."""
    parts = [f"split {'+'.join(map(str, p))}" for p in placement.scan_pieces if p]
    parts += [f"nested scan {g}" for g in placement.scan_groups if g > 1]
    if placement.segment_group > 1:
        parts.append(f"nested segments {placement.segment_group}")
    return ", ".join(parts) or "-"


def floor_bytes(fn: Callable, *args: Any, layout: Layout = "dense") -> int:
    """The smallest budget any plan for ``fn(*args)`` fits, under the analytic model with
    ``layout``."""
    try:
        plan(fn, *args, budget=1, layout=layout)
    except InfeasibleBudgetError as e:
        return e.floor_bytes
    return 1


def frontier_gap(sweep: Sweep, row: Row) -> float | None:
    """How far ``row``'s overhead lies below the built-in frontier at its real peak.

    The frontier is the lower convex hull of the built-in and preset points (peak,
    overhead): between two of them a user gets the straight line by mixing the two
    policies across layers. Above the largest built-in peak the frontier is the least
    overhead of any built-in that fits; below the smallest it does not exist (``inf``:
    no built-in fits). Positive means ``row`` is better.
    """
    overhead = sweep.overhead(row)
    if row.real_peak_bytes is None or overhead is None:
        return None
    points: list[tuple[int, float]] = []
    for r in sweep.rows:
        if r.kind != "autoremat" and r.real_peak_bytes is not None:
            r_overhead = sweep.overhead(r)
            assert r_overhead is not None  # a measured row has its overhead
            points.append((r.real_peak_bytes, r_overhead))
    points.sort()
    hull: list[tuple[int, float]] = []
    for p in points:  # monotone chain, lower hull, then keep its decreasing part
        while len(hull) >= 2 and _cross(hull[-2], hull[-1], p) <= 0:
            hull.pop()
        hull.append(p)
    fitting = [(x, y) for x, y in hull if x <= row.real_peak_bytes]
    if not fitting:
        return float("inf")
    x0, y0 = fitting[-1]
    later = [(x, y) for x, y in hull if x > row.real_peak_bytes]
    best = min(y for _, y in fitting)
    if later:
        x1, y1 = later[0]
        best = min(best, y0 + (y1 - y0) * (row.real_peak_bytes - x0) / (x1 - x0))
    return best - overhead


def _cross(o: tuple[float, float], a: tuple[float, float], b: tuple[float, float]) -> float:
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


def _mib(x: int | None) -> str:
    return "-" if x is None else f"{x / 2**20:.0f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def _count(x: int | None) -> str:
    return "-" if x is None else str(x)


def _row_line(row: Row) -> str:
    return (f"{row.kind} {row.name}: predicted {_mib(row.predicted_peak_bytes)} MiB "
            f"{_pct(row.predicted_overhead)}, real {_mib(row.real_peak_bytes)} MiB "
            f"compiler {_pct(row.compiler_overhead)} program {_pct(row.program_overhead)}"
            + (f" [{row.status}]" if row.status else ""))


def table(sweep: Sweep) -> str:
    """The sweep as a markdown table."""
    lines = [
        ("| kind | policy / budget | predicted peak MiB | real peak MiB | predicted overhead "
        "| compiler overhead | program overhead | below built-in frontier by | solve s "
        "| compile s | compiles | regions | structure | status |"),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sweep.rows:
        gap = frontier_gap(sweep, r) if r.kind == "autoremat" else None
        gap_text = "-" if gap is None else ("no built-in fits" if gap == float("inf")
                                            else f"{gap:+.1%}")
        secs = lambda x: "-" if x is None else f"{x:.0f}"
        lines.append(
            f"| {r.kind} | {r.name} | {_mib(r.predicted_peak_bytes)} | "
            f"{_mib(r.real_peak_bytes)} | {_pct(r.predicted_overhead)} | "
            f"{_pct(r.compiler_overhead)} | {_pct(r.program_overhead)} | {gap_text} | "
            f"{secs(r.solve_seconds)} | {secs(r.compile_seconds)} | {_count(r.compiles)} | "
            f"{_count(r.regions)} | {r.structure or '-'} | {r.status or '-'} |")
    return "\n".join(lines)


def accuracy(sweep: Sweep) -> str:
    """The analytic model's peak against the compiler's on the sweep's plans: mean and
    worst error, the worst case named."""
    pairs = [(r.name, r.predicted_peak_bytes, r.real_peak_bytes) for r in sweep.rows
             if r.predicted_peak_bytes and r.real_peak_bytes]
    if not pairs:
        return "Model accuracy: no plan was compiled."
    errors = [(pred / real - 1, name, pred, real) for name, pred, real in pairs]
    worst = max(errors, key=lambda e: abs(e[0]))
    mean = sum(abs(e[0]) for e in errors) / len(errors)
    return (f"Model accuracy (predicted peak / compiler peak - 1) over {len(errors)} plans: "
            f"mean |error| {mean:.1%}, worst {worst[0]:+.1%} at budget {worst[1]} "
            f"(predicted {_mib(worst[2])} MiB, compiler {_mib(worst[3])} MiB).")


def to_json(sweep: Sweep, command: str) -> dict[str, Any]:
    """The sweep as JSON-ready data, with the command that made it."""
    return {"command": command, "model": sweep.model, "description": sweep.description,
            "target": sweep.target, "floor_bytes": sweep.floor_bytes,
            "accuracy": accuracy(sweep),
            "versions": sweep.versions,
            "rows": [{**dataclasses.asdict(r), **_gap_fields(sweep, r)} for r in sweep.rows]}


def from_json(doc: dict[str, Any]) -> Sweep:
    """The :class:`Sweep` that :func:`to_json` wrote."""
    fields = {f.name for f in dataclasses.fields(Row)}
    rows = tuple(Row(**{k: v for k, v in r.items() if k in fields}) for r in doc["rows"])
    return Sweep(doc["model"], doc["description"], doc["target"], doc["floor_bytes"], rows,
                 doc["versions"])


def _gap_fields(sweep: Sweep, row: Row) -> dict[str, Any]:
    gap = frontier_gap(sweep, row) if row.kind == "autoremat" else None
    return {"frontier_gap": None if gap == float("inf") else gap,
            "no_builtin_fits": gap == float("inf")}


@dataclasses.dataclass(frozen=True)
class HandComparison:
    """A sweep on the compiler against what its user writes by hand.

    Attributes:
      no_remat, hand: the compiler's peaks of the step without remat and with every block
        in its library's remat with ``nothing_saveable`` (the ``"nothing_saveable"`` row).
      floor: the compiler's peak of autoremat's (verified) floor plan.
      floor_regions, floor_compiles: its regions, and the compiles it took.
      budgets: the budget rows planned (not infeasible): those with a compiled plan, and
        those the closed loop found none for within its compiles (``"not verified"``).
      fitted: of those, the ones whose compiler peak is within the budget (a budget not
        verified does not fit).
      below_line: of those, the ones whose overhead is at or below the straight line from
        the hand baseline to no remat at their peak (the hand overhead below the hand peak).
      mean_compiles: compiles per planned budget.
      worst_error: the largest |predicted / compiler peak - 1| over the autoremat rows.
    """

    no_remat: int
    hand: int
    floor: int
    floor_regions: int | None
    floor_compiles: int | None
    budgets: int
    fitted: int
    below_line: int
    mean_compiles: float | None
    worst_error: float | None


def compare_with_hand(sweep: Sweep) -> HandComparison | None:
    """:class:`HandComparison` of a compiled sweep with ``"no checkpoint"`` and
    ``"nothing_saveable"`` rows; ``None`` without them."""
    rows = {(r.kind, r.name): r for r in sweep.rows}
    base, hand = rows.get(("builtin", "no checkpoint")), rows.get(("builtin", "nothing_saveable"))
    floor = rows.get(("autoremat", "floor"))
    if (base is None or hand is None or floor is None or base.real_peak_bytes is None
            or hand.real_peak_bytes is None or floor.real_peak_bytes is None):
        return None
    hand_overhead = sweep.overhead(hand) or 0.0
    top = base.real_peak_bytes
    span = max(1, top - hand.real_peak_bytes)

    def line(peak: int) -> float:
        return hand_overhead * min(1.0, max(0.0, (top - peak) / span))

    budget_rows = [r for r in sweep.rows if r.kind == "autoremat" and r.name != "floor"
                   and r.budget_bytes is not None]
    unverified = sum(r.status == NOT_VERIFIED for r in budget_rows)
    planned = [(r, r.real_peak_bytes, r.budget_bytes) for r in budget_rows
               if r.real_peak_bytes is not None and r.budget_bytes is not None]
    fitted = [r for r, peak, budget in planned if peak <= budget]
    below = [r for r, peak, _ in planned if (sweep.overhead(r) or 0.0) <= line(peak) + 1e-4]
    compiles = [r.compiles for r, _, _ in planned if r.compiles]
    errors = [abs(r.predicted_peak_bytes / r.real_peak_bytes - 1) for r in sweep.rows
              if r.kind == "autoremat" and r.predicted_peak_bytes and r.real_peak_bytes]
    return HandComparison(
        no_remat=base.real_peak_bytes, hand=hand.real_peak_bytes, floor=floor.real_peak_bytes,
        floor_regions=floor.regions, floor_compiles=floor.compiles,
        budgets=len(planned) + unverified,
        fitted=len(fitted), below_line=len(below),
        mean_compiles=sum(compiles) / len(compiles) if compiles else None,
        worst_error=max(errors, default=None))


def corpus_totals(sweeps: Sequence[Sweep]) -> str:
    """Over every compiled sweep: the budgets that fit and that lie at or below the hand
    line, the compiles per budget, and the distribution of the model's error (predicted
    over compiler peak, every autoremat row), as one markdown paragraph."""
    found = [c for s in sweeps if (c := compare_with_hand(s)) is not None]
    budgets = sum(c.budgets for c in found)
    compiles = [r.compiles for s in sweeps for r in s.rows
                if r.kind == "autoremat" and r.name != "floor" and r.compiles]
    errors = np.array([r.predicted_peak_bytes / r.real_peak_bytes - 1 for s in sweeps
                       for r in s.rows if r.kind == "autoremat" and r.predicted_peak_bytes
                       and r.real_peak_bytes])
    lines = [f"Over {len(found)} models: {sum(c.fitted for c in found)}/{budgets} budgets fit, "
             f"{sum(c.below_line for c in found)}/{budgets} at or below the hand line"]
    if compiles:
        lines.append(f"{np.mean(compiles):.1f} compiles per budget")
    if errors.size:
        lines.append(
            f"the model's error over {errors.size} plans: median |error| "
            f"{np.median(np.abs(errors)):.1%}, {np.mean(np.abs(errors) <= 0.05):.0%} within 5%, "
            f"{np.sum(errors < 0)} under the compiler, from {errors.min():+.1%} to "
            f"{errors.max():+.1%}")
    return "; ".join(lines) + "."


def hand_table(sweeps: Sequence[Sweep]) -> str:
    """Each compiled sweep against its hand baseline, as a markdown table."""
    lines = ["| model | no remat MiB | hand MiB | autoremat floor MiB | floor vs hand "
             "| floor regions | floor compiles | budgets fit | below hand line "
             "| compiles per budget | worst model error |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in sweeps:
        c = compare_with_hand(s)
        if c is None:
            lines.append(f"| {s.model} | not compiled | | | | | | | | | |")
            continue
        per_budget = "-" if c.mean_compiles is None else f"{c.mean_compiles:.1f}"
        error = "-" if c.worst_error is None else f"{c.worst_error:.1%}"
        lines.append(
            f"| {s.model} | {_mib(c.no_remat)} | {_mib(c.hand)} | {_mib(c.floor)} | "
            f"{_pct(c.floor / c.hand - 1)} | {_count(c.floor_regions)} | "
            f"{_count(c.floor_compiles)} | {c.fitted}/{c.budgets} | {c.below_line}/{c.budgets} | "
            f"{per_budget} | {error} |")
    return "\n".join(lines)
