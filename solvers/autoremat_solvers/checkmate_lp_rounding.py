"""Checkmate's LP relaxation with two-phase rounding (Jain et al., MLSys 2020, Section 5).

Phase one rounds the fractional storage matrix ``S*`` of the LP relaxation, once
deterministically (``S* > 0.5``) and ``n_samples`` times randomly (``S ~ Bernoulli(S*)``).
Phase two computes the cheapest ``R`` for each rounded ``S``
(:func:`schedule_from_storage`), which always gives a valid order of computation but may
exceed the budget. The simulator judges each candidate; the cheapest that fits wins. If
none fits, the fix-up re-solves the LP with the budget tightened by ``tighten`` factors
and rounds again.
"""

from __future__ import annotations

import math
import time

import numpy as np
from autoremat_ilp import Status, solve_milp

from autoremat_solvers._stages import schedule_from_storage
from autoremat_solvers.base import SolverResult
from autoremat_solvers.checkmate_milp import build_checkmate_milp
from autoremat_solvers.graph import ComputeGraph
from autoremat_solvers.schedule import Schedule, simulate

__all__ = ["solve"]


def _round(
    graph: ComputeGraph, S_frac: np.ndarray, n_samples: int, rng: np.random.Generator
) -> list[Schedule]:
    storages = [S_frac > 0.5] + [rng.random(S_frac.shape) < S_frac for _ in range(n_samples)]
    return [schedule_from_storage(graph, S) for S in storages]


def solve(
    graph: ComputeGraph,
    budget: float,
    time_limit_s: float | None = None,
    *,
    n_samples: int = 16,
    seed: int = 0,
    tighten: tuple[float, ...] = (1.0, 0.9, 0.8),
    backend: str = "HIGHS",
) -> SolverResult:
    """Solves the LP relaxation and rounds it to a schedule that fits ``budget``.

    Args:
      graph: the graph.
      budget: memory budget in bytes.
      time_limit_s: limit for all LP solves together (rounding is not counted).
      n_samples: randomized roundings per LP solution.
      seed: seed of the randomized rounding.
      tighten: LP budgets to try, as fractions of ``budget``, until a rounding fits.
      backend: OR-tools backend for the LP.

    Returns:
      The cheapest fitting rounded schedule; ``lower_bound`` is the LP optimum at ``budget``.
    """
    start = time.perf_counter()
    if budget < graph.memory_floor():
        return SolverResult.below_floor(time.perf_counter() - start)
    rng = np.random.default_rng(seed)
    lower_bound = -math.inf
    best: tuple[float, Schedule] | None = None
    for factor in tighten:
        remaining = None if time_limit_s is None else time_limit_s - (time.perf_counter() - start)
        if remaining is not None and remaining <= 0:
            break
        model = build_checkmate_milp(graph, budget * factor, integer=False)
        res = solve_milp(model.milp, backend=backend, time_limit_s=remaining)
        if res.status is Status.INFEASIBLE and factor == 1.0:  # proves the MILP infeasible
            return SolverResult(
                None, Status.INFEASIBLE, math.inf, math.inf, time.perf_counter() - start
            )
        if res.status is not Status.OPTIMAL:
            break
        if factor == 1.0:
            lower_bound = res.objective
        assert res.x is not None  # an OPTIMAL result has a solution
        _, S_frac = model.matrices(res.x)
        for schedule in _round(graph, S_frac, n_samples, rng):
            sim = simulate(graph, schedule, budget)
            if sim.ok and (best is None or sim.cost < best[0]):
                best = (sim.cost, schedule)
        if best is not None:
            break
    wall_s = time.perf_counter() - start
    if best is None:
        return SolverResult(None, Status.NO_SOLUTION, math.inf, lower_bound, wall_s)
    return SolverResult(best[1], Status.FEASIBLE, best[0], lower_bound, wall_s)
