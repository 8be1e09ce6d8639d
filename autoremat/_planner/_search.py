"""Stage 2: the least-recompute plan within a budget, over the candidate placements."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence

import autoremat_ilp as ilp
import numpy as np
from autoremat_ilp.greedy import Start, greedy_start, relax

from autoremat import _solve
from autoremat._budget import Budget, format_bytes, parse_budget
from autoremat._errors import InfeasibleBudgetError, SolverTimeoutError
from autoremat._graph import Graph
from autoremat._placement import Placement
from autoremat._plan import Plan
from autoremat._planner._candidates import (
    Candidate,
    SolveLimits,
    SolverClock,
    checked,
    modelled_peak,
    near_no_remat,
    no_remat_baselines,
    no_remat_plan,
    per_layer_floor,
    plan_of,
    runs_as_written,
    within_model_error,
)
from autoremat._planner._options import PlanOptions

# A plan within this part of its cost of the least counts as optimal: each placement is
# solved to this relative gap, and once one has a plan the next are searched only for
# plans cheaper by more than this. Closer is not worth the solver's time: on a 24-layer
# Llama at 0.3 of its activations, one-off runs planned in 6.1 s at this gap and in 10 s
# at 1e-4, for a plan 0.001% cheaper.
OPTIMALITY_GAP = 1e-3


@dataclasses.dataclass(frozen=True)
class Margins:
    """How far below the budget each placement is solved: the closed loop's correction for
    how far the compiler's peak of that placement's plans came out above the model's
    (``by_placement``), and ``default`` for placements without one."""

    by_placement: Mapping[Placement, int] = dataclasses.field(default_factory=dict)
    default: int = 0

    def of(self, placement: Placement) -> int:
        """The margin of ``placement``."""
        return self.by_placement.get(placement, self.default)


@dataclasses.dataclass(frozen=True)
class _Outcome:
    """What solving one placement gave: a plan and its cost in the solver's units (replay
    included), a lower bound on that cost when not proven optimal or when no plan is
    cheaper than the placements' before by more than :data:`OPTIMALITY_GAP` (cut off), the
    least peak when the budget was proven infeasible, or the problem when the budget is
    below what any of its plans holds (its least peak is solved for only if no placement
    fits)."""

    plan: Plan | None = None
    cost: float = math.inf
    bound: float = math.inf
    floor: int | None = None
    below: tuple[ilp.Problem, int] | None = None
    solve_seconds: float = 0.0


def resolve_budget(budget: Budget, graph: Graph, no_remat_peak: int) -> int:
    """``budget`` in bytes: a fraction is of the no-remat activation memory (the least
    over the placements: the model of a placement with larger regions holds more at once,
    though no remat is the same step), on top of the arguments and gradients."""
    parsed = parse_budget(budget)
    if isinstance(parsed, int):
        return parsed
    return graph.fixed_bytes + int(parsed * (no_remat_peak - graph.fixed_bytes))


def lower_bound(problem: ilp.Problem) -> int:
    """A peak no plan goes below: what every plan holds (the values it must save and the
    bytes in use whatever the plan), nothing recomputed."""
    nothing = np.zeros(problem.num_values, dtype=bool)
    return int(ilp.stage_bytes(problem, problem.must_save, nothing).max())


def search(candidates: Sequence[Candidate], budget: Budget, options: PlanOptions,
           clock: SolverClock, margins: Margins = Margins()) -> Plan:
    """The plan that costs least within ``budget`` over ``candidates``.

    Placements settled without a search come first (saving everything fits, or the budget
    is below what every plan holds); the others are solved in turn, the least LP bound
    first (:func:`autoremat_ilp.greedy.relax`), for the budget less its margin, among the
    plans cheaper by more than :data:`OPTIMALITY_GAP` than the cheapest found before (none
    once a placement's bound rules that out), each with what is left of the time limit
    (``clock``) less the least share of each later placement that its start's cost does
    not rule out (:func:`_rivals`). The plan that costs least
    (recompute, a nested group's forward run again included, and offload, in the solver's
    units; then the lower peak, then the one found first) is returned. It is ``"optimal"``
    only when every placement was solved to optimality or ruled out; otherwise its gap is
    to the least lower bound of the placements the time limit stopped. Without ``verify``,
    a plan near no remat may give way to the function as written
    (:func:`as_written_near_no_remat`).

    Raises:
      InfeasibleBudgetError: no placement has a plan within the budget.
      SolverTimeoutError: the time limit passed before any plan was found.
    """
    problems = [candidate.problem(options) for candidate in candidates]
    placed = [(c.facts, *p) for c, p in zip(candidates, problems, strict=True)]
    nothing = no_remat_baselines(placed)
    no_remat_peak = min(d.peak_bytes for _, _, d in nothing)
    budget_bytes = resolve_budget(budget, problems[0][0], no_remat_peak)

    def nothing_plan(k: int) -> Plan:
        # Made only where returned: the function as written's saved bytes take a trace.
        return no_remat_plan(*nothing[k], budget_bytes, no_remat_peak, options)

    margin = [margins.of(graph.placement) for graph, _ in problems]
    replay = [_solve.replay_cost(graph, problem) for graph, problem in problems]

    def settled(k: int) -> _Outcome | None:
        return _settled(problems[k][1], nothing[k][2].peak_bytes,
                        functools.partial(nothing_plan, k), budget_bytes - margin[k],
                        margin[k], replay[k])

    outcomes, unsettled = _settle(settled, len(problems))
    relaxed = {k: relax(problems[k][1], budget_bytes - margin[k]) for k in unsettled}
    least = {k: relaxed[k].bound + replay[k] for k in unsettled}
    order = sorted(unsettled, key=least.__getitem__)
    for i, k in enumerate(order):
        cheapest = min((o.cost for o in outcomes), default=math.inf)
        if least[k] > cheapest * (1 - OPTIMALITY_GAP):
            break  # and so are the placements after it, of larger bounds
        start = greedy_start(problems[k][1], budget_bytes - margin[k], relaxed[k])
        rivals = _rivals([least[j] for j in order[i + 1:]], cheapest,
                         start.cost(problems[k][1]) + replay[k])
        outcomes.append(_solve_placement(*problems[k], start, budget_bytes, no_remat_peak,
                                         margin[k], replay[k], options,
                                         clock.limits(1 + rivals, ranked=True), cheapest))
        if outcomes[-1].plan is not None and outcomes[-1].cost == 0:
            break
    try:
        plan = _cheapest(outcomes, budget_bytes, options, clock)
    except InfeasibleBudgetError as e:
        plan = _per_layer_within(candidates, budget_bytes, no_remat_peak, margins, options, e)
    if options.verify is not None:
        return plan
    written = next((k for k, (f, g, _) in enumerate(nothing) if runs_as_written(f, g)), None)
    return as_written_near_no_remat(plan, None if written is None else
                                    functools.partial(nothing_plan, written))


def _per_layer_within(candidates: Sequence[Candidate], budget_bytes: int, no_remat_peak: int,
                      margins: Margins, options: PlanOptions,
                      infeasible: InfeasibleBudgetError) -> Plan:
    """One remat per layer, the code around the layers as written, for ``budget_bytes``
    where no solved plan fits it but this one does (where the model puts it below their
    floor, or their floor within its error under it:
    :func:`autoremat._planner._candidates.per_layer_floor`).

    Raises:
      InfeasibleBudgetError: it does not fit either; the smallest feasible budget is the
        lower of its peak and the solved plans' floor (``infeasible.floor_bytes``).
    """
    layered = per_layer_floor(candidates, options, no_remat_peak,
                              below=[(infeasible.floor_bytes, modelled_peak)])
    if layered is None:
        raise infeasible
    needed = layered.peak_bytes + margins.of(layered.placement)
    if needed > budget_bytes:
        raise InfeasibleBudgetError(budget_bytes, min(needed, infeasible.floor_bytes))
    return dataclasses.replace(layered, budget_bytes=budget_bytes)


def _settle(settled: Callable[[int], _Outcome | None], count: int
            ) -> tuple[list[_Outcome], list[int]]:
    """The outcomes of the ``count`` placements that ``settled(k)`` settles without a
    search (see :func:`_settled`), in order, and the indices of the others; none of those
    once a placement's plan recomputes nothing."""
    outcomes: list[_Outcome] = []
    unsettled: list[int] = []
    for k in range(count):
        outcome = settled(k)
        if outcome is None:
            unsettled.append(k)
            continue
        outcomes.append(outcome)
        if outcome.plan is not None and outcome.cost == 0:
            return outcomes, []
    return outcomes, unsettled


def _settled(problem: ilp.Problem, nothing_peak: int, nothing: Callable[[], Plan],
             within: int, margin: int, replay: float) -> _Outcome | None:
    """The :class:`_Outcome` of a placement that needs no search within ``within`` bytes:
    its plan that recomputes nothing (``nothing()``, of modelled peak ``nothing_peak``)
    where that fits, recomputing nothing that can be saved (optimal); the problem where
    ``within`` is below what every plan holds; otherwise ``None``."""
    if within >= nothing_peak:
        return _Outcome(nothing(), replay)
    if within < lower_bound(problem):
        return _Outcome(below=(problem, margin))
    return None


def _rivals(bounds: Sequence[float], cheapest: float, start_cost: float) -> int:
    """How many of the placements after one whose search starts from a plan of cost
    ``start_cost`` may still hold a plan cheaper by more than :data:`OPTIMALITY_GAP` than
    what it returns (at most that cost, or ``cheapest``, found before), going by their
    lower ``bounds``: the others will be cut off, and need no share of the time limit."""
    return sum(b <= min(cheapest, start_cost) * (1 - OPTIMALITY_GAP) for b in bounds)


def _solve_placement(graph: Graph, problem: ilp.Problem, start: Start, budget_bytes: int,
                     no_remat_peak: int, margin: int, replay: float, options: PlanOptions,
                     limits: SolveLimits, cheapest: float) -> _Outcome:
    """The :class:`_Outcome` of one placement (``graph``, whose forward replays cost
    ``replay``) within ``budget_bytes - margin``, its search started from ``start``, among
    the plans cheaper by more than :data:`OPTIMALITY_GAP` than ``cheapest``, the cheapest
    plan of the placements solved before."""
    cutoff = None if math.isinf(cheapest) else cheapest * (1 - OPTIMALITY_GAP) - replay
    result = checked(ilp.solve(problem, budget_bytes - margin, **limits,
                               relative_gap=OPTIMALITY_GAP, backends=options.backends,
                               progress=options.progress, cutoff=cutoff, start=start))
    if result.status is ilp.Status.CUT_OFF:
        return _Outcome(bound=cheapest, solve_seconds=result.wall_s)
    if result.status is ilp.Status.INFEASIBLE:
        return _Outcome(floor=result.peak + margin, solve_seconds=result.wall_s)
    bound = math.inf if result.status is ilp.Status.OPTIMAL else result.bound + replay
    if result.status is ilp.Status.NO_SOLUTION:
        return _Outcome(bound=bound, solve_seconds=result.wall_s)
    d = _solve.decisions(graph, problem, result)
    return _Outcome(plan_of(graph, d, budget_bytes, no_remat_peak, options),
                    result.cost + replay, bound, solve_seconds=result.wall_s)


def _cheapest(outcomes: Sequence[_Outcome], budget_bytes: int, options: PlanOptions,
              clock: SolverClock) -> Plan:
    """The cheapest plan of ``outcomes``, its gap to the least bound of the others; or why
    there is none."""
    found = [(o, o.plan) for o in outcomes if o.plan is not None]
    spent = sum(o.solve_seconds for o in outcomes)
    if found:
        best, best_plan = min(found, key=lambda f: (f[0].cost, f[1].peak_bytes))
        plan = dataclasses.replace(best_plan, solve_seconds=spent)
        lower = min(o.bound for o in outcomes)
        if lower < best.cost:
            gap = max(plan.gap, (best.cost - max(0.0, lower)) / best.cost)
            plan = dataclasses.replace(plan, status="feasible", gap=gap)
        return plan
    below = [o.below for o in outcomes if o.below is not None]
    floors = [o.floor for o in outcomes if o.floor is not None]
    if len(floors) + len(below) == len(outcomes):
        lowest = [(checked(ilp.solve_min_peak(p, **clock.limits(len(below) - k))), m)
                  for k, (p, m) in enumerate(below)]
        floors += [r.peak + m for r, m in lowest if r.save is not None]
        if floors:
            raise InfeasibleBudgetError(budget_bytes, min(floors))
    raise SolverTimeoutError(
        f"the solver found no plan within {options.time_limit_s} s for a budget of "
        f"{format_bytes(budget_bytes)}; raise time_limit_s or the budget.")


def as_written_near_no_remat(plan: Plan, written: Callable[[], Plan] | None) -> Plan:
    """``plan``, or ``written()``, the function as written for the same budget (``None``
    where no placement runs it), where ``plan`` is :func:`near_no_remat` and the model puts
    its activation memory (its peak less the arguments and gradients) less than
    ``MODEL_ERROR`` below the function as written's.

    Such a plan saves all that the compiler keeps for the function as written, and its
    checkpoints stop the fusion the compiler does there, while its modelled saving is
    within the model's error on the function as written
    (``bench/results/no-remat-default-compile/no-remat.md``).
    Compiled for TPU v5e, such plans came out above no remat where the function as
    written fits the budget (``bench/results/near-no-remat.md``). So without ``verify``
    the function as written is the safer plan, though the model's figure for it (its
    ``peak_bytes``) may exceed the budget. With ``verify`` the closed loop compiles both
    instead.
    """
    if written is None or plan.no_remat or not near_no_remat(plan):
        return plan
    if not within_model_error(plan.peak_bytes, plan.no_remat_peak_bytes,
                              plan.graph.fixed_bytes):
        return plan
    # Not solved for: feasible, as the closed loop's plan of the function as written is.
    return dataclasses.replace(written(), status="feasible", solve_seconds=plan.solve_seconds)
