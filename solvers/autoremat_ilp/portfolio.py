"""Solving a :class:`~autoremat_ilp.problem.Problem`: MILP backends tried in turn within
the time limit, the lazy stage bounds added as plans break them, the plan read back,
pruned and evaluated exactly."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable

import numpy as np

from autoremat_ilp.greedy import Start, fitted, greedy_start, relax
from autoremat_ilp.memory import evaluate, prune, reserved_peaks
from autoremat_ilp.milp import MilpResult, Progress, solve_milp
from autoremat_ilp.model import Model, build_model, cost_unit
from autoremat_ilp.problem import Problem, Solution
from autoremat_ilp.status import Status

__all__ = ["solve", "solve_min_peak"]


def solve(problem: Problem, budget: int, *, time_limit_s: float = 60.0,
          node_limit: int | None = None, relative_gap: float = 1e-4,
          backends: tuple[str, ...] = ("HIGHS", "SCIP"), progress: Progress | None = None,
          cutoff: float | None = None, start: Start | None = None) -> Solution:
    """The least-cost plan whose peak is at most ``budget`` bytes.

    The backends are tried in turn, sharing ``time_limit_s``, until one proves its plan
    optimal (within ``relative_gap``) or infeasibility; otherwise the cheapest plan found
    is returned with status ``FEASIBLE``. Each search starts from the plan of
    :func:`~autoremat_ilp.greedy.greedy_start` (or ``start``) where it finds one, which is
    returned where the backends find none of their own; where the LP relaxation's bound is
    above ``cutoff``, no backend runs (nor the rounding of ``greedy_start``). An
    ``INFEASIBLE`` result's ``peak`` is the smallest peak any plan reaches (the budget to
    ask for instead). (Measured on GPT-2-small: each of HiGHS and SCIP sometimes stalls on
    a budget the other solves in seconds.) When no backend found a plan but the budget is
    at least the smallest feasible peak, the min-peak plan is returned as a last resort.

    Args:
      problem: the problem.
      budget: the most bytes any stage may hold.
      time_limit_s: seconds for all backends together.
      node_limit: branch-and-bound nodes for each MILP solve (see
        :func:`~autoremat_ilp.milp.solve_milp`); ``None``: no limit.
      relative_gap: a plan within this relative gap of the lower bound counts as optimal.
      backends: MILP backends tried in turn (:func:`~autoremat_ilp.milp.solve_milp`).
      progress: ``progress(elapsed_s, best, bound)`` is called while the backends search
        with the seconds since this call, the cost of the best plan found so far and a
        lower bound on the least cost, and once at the end with the returned plan's cost
        when there is a plan. It does not change the result.
      cutoff: only plans costing at most this are searched for (say, less than a plan
        found already elsewhere); where none fits the budget, the status is ``CUT_OFF``
        (whether any plan fits is then not known), and no search for a plan of the least
        peak is made when none is found.
      start: ``greedy_start(problem, budget)`` where the caller has it already (it ordered
        problems by its bound, say); made here when ``None``.

    Returns:
      A :class:`~autoremat_ilp.problem.Solution`, pruned
      (:func:`~autoremat_ilp.memory.prune`) and evaluated exactly.
    """
    began = time.perf_counter()
    report = None if progress is None else _running_best(progress, began, cost_unit(problem))
    result = _portfolio(problem, budget, time_limit_s, node_limit, relative_gap, backends,
                        report, cutoff, start)
    if progress is not None and result.save is not None:
        progress(time.perf_counter() - began, result.cost, min(result.bound, result.cost))
    return result


def solve_min_peak(problem: Problem, *, time_limit_s: float | None = None,
                   node_limit: int | None = None, backend: str = "HIGHS") -> Solution:
    """A plan with the smallest peak the model allows (its cost not minimized).

    Args:
      problem: the problem.
      time_limit_s: seconds for the solve; ``None``: no limit.
      node_limit: branch-and-bound nodes for the solve; ``None``: no limit.
      backend: the MILP backend (:func:`~autoremat_ilp.milp.solve_milp`).

    Returns:
      A :class:`~autoremat_ilp.problem.Solution` whose ``peak`` is the least peak (proven
      when its status is ``OPTIMAL``; ``bound`` is a lower bound on it, in bytes).
    """
    start = time.perf_counter()

    def on(sub: Problem, _: Solution | None) -> Solution:
        model = build_model(sub, None)
        return _solution(sub, model, solve_milp(model.milp, backend=backend,
                                                time_limit_s=_left(time_limit_s, start),
                                                node_limit=node_limit))

    return _lazily(problem, on, None)


def _left(time_limit_s: float | None, start: float) -> float | None:
    """What is left of ``time_limit_s`` since ``start`` (``None``: no limit)."""
    return None if time_limit_s is None else max(0.0, time_limit_s - (time.perf_counter() - start))


def _lazily(problem: Problem, solve_on: Callable[[Problem, Solution | None], Solution],
            budget: int | None, tight: np.ndarray | None = None) -> Solution:
    """``solve_on`` the problem without its lazy bounds (:meth:`Problem.lazy_bounds`) but
    those of the mask ``tight``, then again with those its plan breaks (over ``budget``,
    or without one over the plan's peak), until it breaks none: a plan of the whole
    problem, evaluated on it, from MILPs with the few bounds that bind. ``solve_on`` is
    also given the solution before that broke them (``None`` first)."""
    start, timed_out = time.perf_counter(), False
    active = ~problem.lazy_bounds()
    if tight is not None:
        active = active | tight
    res = None
    while True:
        res = solve_on(problem.with_bounds(active), res)
        timed_out |= res.timed_out
        done = dataclasses.replace(res, wall_s=time.perf_counter() - start, timed_out=timed_out)
        if res.save is None or res.recompute is None or active.all():
            return done
        limit = res.peak if budget is None else budget
        peaks = reserved_peaks(problem, res.save, res.recompute, res.offload)
        broken = ~active & (np.array(peaks) > limit)
        if not broken.any():  # the active bounds are in ``res.peak`` already
            return dataclasses.replace(done, peak=max(res.peak, *peaks))
        active = active | broken


def _running_best(progress: Progress, start: float, unit: float) -> Progress:
    """``progress`` fed by each MILP solve of the portfolio: seconds since ``start``, and the
    best objective and bound over all the solves so far, in cost units (the MILPs' are
    divided by ``unit``)."""
    best, bound = math.inf, -math.inf

    def report(elapsed_s: float, objective: float, lower: float) -> None:
        nonlocal best, bound
        best, bound = min(best, objective * unit), max(bound, lower * unit)
        progress(time.perf_counter() - start, best, min(bound, best))

    return report


def _portfolio(problem: Problem, budget: int, time_limit_s: float, node_limit: int | None,
               relative_gap: float, backends: tuple[str, ...], progress: Progress | None,
               cutoff: float | None, given: Start | None) -> Solution:
    """The result of the backends tried in turn, started from ``given`` (made here where
    ``None``); ``timed_out`` where the time limit stopped any solve it was chosen among."""
    start = time.perf_counter()
    if given is None:
        relaxed = relax(problem, budget)
        if cutoff is not None and relaxed.bound > cutoff:
            return _cut_off(relaxed.bound, start)
        given = greedy_start(problem, budget, relaxed)
    elif cutoff is not None and given.bound > cutoff:
        return _cut_off(given.bound, start)
    first, bound = given
    first_cost, first_peak = (math.inf, 0) if first is None else evaluate(problem, *first)
    if cutoff is not None and first_cost > cutoff:
        first = None
    best: Solution | None = None
    share = max(0.0, time_limit_s - (time.perf_counter() - start)) / len(backends)
    timed_out = False
    for backend in backends:
        res = _solve_within_budget(problem, budget, share, node_limit, relative_gap, backend,
                                   progress, cutoff, None if first is None else (first, first_cost))
        timed_out, bound = timed_out or res.timed_out, max(bound, res.bound)
        if res.status is Status.INFEASIBLE and cutoff is not None:
            return dataclasses.replace(res, status=Status.CUT_OFF, peak=-1,
                                       wall_s=time.perf_counter() - start, timed_out=timed_out)
        if res.status is Status.OPTIMAL:
            return dataclasses.replace(res, wall_s=time.perf_counter() - start,
                                       timed_out=timed_out)
        if res.status is Status.INFEASIBLE:
            break
        if res.save is not None and (best is None or res.cost < best.cost):
            best = res
    if best is None and first is not None:
        best = Solution(Status.FEASIBLE, *first, first_cost, first_peak, bound, math.inf, 0.0)
    if best is None and cutoff is not None:
        return Solution(Status.NO_SOLUTION, None, None, math.inf, -1, bound, math.inf,
                        time.perf_counter() - start, timed_out=timed_out)
    if best is None:
        floor = solve_min_peak(problem, time_limit_s=share, node_limit=node_limit,
                               backend=backends[0])
        timed_out |= floor.timed_out
        if floor.save is None or floor.peak > budget:
            proven = floor.status is Status.OPTIMAL
            status = Status.INFEASIBLE if proven else Status.NO_SOLUTION
            return dataclasses.replace(floor, status=status, save=None, recompute=None,
                                       offload=None, wall_s=time.perf_counter() - start,
                                       timed_out=timed_out)
        # Its bound and gap are about the peak: nothing is known about the least cost.
        best = dataclasses.replace(floor, bound=0.0, gap=1.0)
    bound = max(bound, best.bound)
    gap = (best.cost - max(bound, 0.0)) / best.cost if best.cost > 0 else 0.0
    return dataclasses.replace(best, status=Status.FEASIBLE, bound=bound, gap=max(gap, 0.0),
                               wall_s=time.perf_counter() - start, timed_out=timed_out)


def _cut_off(bound: float, start: float) -> Solution:
    """The outcome of a search whose LP bound ``bound`` is above its cutoff, begun at
    ``start`` (a :func:`time.perf_counter` reading)."""
    return Solution(Status.CUT_OFF, None, None, math.inf, -1, bound, math.inf,
                    time.perf_counter() - start)


# Solves at a budget lowered by the excess of the plan over it, doubled each time: the
# solver's plans may exceed the budget by its feasibility tolerance (a budget one byte
# below the least peak: each plan at the least peak).
OVER_BUDGET_RETRIES = 8


def _solve_within_budget(problem: Problem, budget: int, time_limit_s: float,
                         node_limit: int | None, relative_gap: float, backend: str,
                         progress: Progress | None, cutoff: float | None,
                         first: tuple[tuple[np.ndarray, np.ndarray], float] | None
                         ) -> Solution:
    """The backend's plan within ``budget``, its search started from ``first`` (a plan
    within the budget and its cost) where there is one, or from the plan before that broke
    a lazy bound repaired (:func:`~autoremat_ilp.greedy.fitted`) where that costs less;
    the repaired plan where the search finds none (the portfolio falls back on ``first``)."""
    start = time.perf_counter()
    best = first

    def on(sub: Problem, before: Solution | None) -> Solution:
        nonlocal best
        if before is not None and before.save is not None:
            best = _cheaper(problem, fitted(problem, budget, before.save), best, cutoff)
        margin, res = 0, None
        for _ in range(OVER_BUDGET_RETRIES):
            model = build_model(sub, budget - margin)
            res = _solution(sub, model, solve_milp(
                model.milp, backend=backend, time_limit_s=_left(time_limit_s, start),
                node_limit=node_limit, relative_gap=relative_gap, progress=progress,
                cutoff=None if cutoff is None else cutoff / model.unit,
                start=None if best is None or margin else _columns(model, *best[0])))
            # The solver's feasibility tolerance is relative; the exact peak decides.
            if res.save is None or res.peak <= budget:
                return res
            margin = max(2 * margin, margin + res.peak - budget)
        # Within the tolerance of the least peak: no plan within the budget was found.
        assert res is not None  # OVER_BUDGET_RETRIES >= 1
        return dataclasses.replace(res, status=Status.NO_SOLUTION, save=None, recompute=None,
                                   offload=None)

    res = _lazily(problem, on, budget, None if first is None else _tight(problem, budget, first[0]))
    if res.save is not None or best is None or best is first:
        return res
    cost, peak = evaluate(problem, *best[0])  # found here, not by the portfolio's start
    return dataclasses.replace(res, status=Status.FEASIBLE, save=best[0][0],
                               recompute=best[0][1], cost=cost, peak=peak, gap=math.inf)


# A lazy bound on which the search's start is within this share of the budget is in the
# first MILP already: the plans the search finds from there, a little cheaper, break it.
# (On the unrolled Llama-style models of bench/planning_time.py, the bounds the first MILP's
# plan broke were the start's tightest; bench/results/planning-time-4619239/.)
TIGHT_SHARE = 0.02


def _tight(problem: Problem, budget: int, start: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """The lazy bounds at which the plan ``start`` holds at least ``1 - TIGHT_SHARE`` of
    ``budget``."""
    peaks = np.array(reserved_peaks(problem, *start), dtype=float)
    return problem.lazy_bounds() & (peaks >= (1 - TIGHT_SHARE) * budget)


def _cheaper(problem: Problem, plan: tuple[np.ndarray, np.ndarray] | None,
             best: tuple[tuple[np.ndarray, np.ndarray], float] | None, cutoff: float | None
             ) -> tuple[tuple[np.ndarray, np.ndarray], float] | None:
    """``(plan, its cost)`` where ``plan`` (one that fits, :func:`fitted`'s) costs less
    than ``best`` and at most ``cutoff``; otherwise ``best``."""
    if plan is None:
        return best
    cost = evaluate(problem, *plan)[0]
    if (cutoff is not None and cost > cutoff) or (best is not None and cost >= best[1]):
        return best
    return plan, cost


def _columns(model: Model, save: np.ndarray, recompute: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray]:
    """The plan ``(save, recompute)`` (nothing offloaded) as ``model``'s integer columns
    and their values."""
    x = model.variables
    columns = [x.save, x.recompute, *([] if x.offload is None else [x.offload])]
    values = [save, recompute, *([] if x.offload is None else [np.zeros_like(save)])]
    return np.concatenate(columns), np.concatenate(values).astype(float)


def _solution(problem: Problem, model: Model, result: MilpResult) -> Solution:
    """The plan a MILP solution stands for, pruned (:func:`~autoremat_ilp.memory.prune`)
    and evaluated exactly."""
    bound = result.bound * model.unit
    if result.x is None:
        return Solution(result.status, None, None, math.inf, 0, bound, math.inf,
                        result.wall_s, timed_out=result.timed_out)
    x = model.variables
    offered = None if x.offload is None else result.x[x.offload] > 0.5
    save, recompute, offload = prune(problem, result.x[x.save] > 0.5,
                                     result.x[x.recompute] > 0.5, offered)
    if offered is None:
        offload = None
    cost, peak = evaluate(problem, save, recompute, offload)
    return Solution(result.status, save, recompute, cost, peak, bound, result.gap,
                    result.wall_s, offload, result.timed_out)
