"""Plans found without a branch-and-bound search: the LP relaxation rounded, and whole
regions recomputed, the cheapest bytes first.

They start the MILP's search (a solution to prune against from the first node; measured
on one placement of an 80-layer Llama with an 8 s limit, HiGHS from the start ended 0.015%
from its bound, alone 30%) and are the plan returned where the time limit stops the search
before it finds one of its own.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from autoremat_ilp.memory import evaluate, prune, violations
from autoremat_ilp.milp import solve_milp
from autoremat_ilp.model import build_model
from autoremat_ilp.problem import Problem
from autoremat_ilp.status import Status

__all__ = ["Relaxation", "Start", "covering_plan", "fitted", "greedy_start", "region_plan",
           "relax"]

Plan = tuple[np.ndarray, np.ndarray]


class Relaxation(NamedTuple):
    """The LP relaxation of a problem within a budget: its least cost, a lower bound on
    any plan's (``inf`` where it is infeasible, ``-inf`` where the LP was not solved), and
    the share of each value it saves (``None`` where it has no solution)."""

    bound: float
    share: np.ndarray | None


class Start(NamedTuple):
    """Where a search for the least cost within a budget starts: a plan ``(save,
    recompute)`` within the budget (``None`` where none was found) and a lower bound on
    the least cost, the LP relaxation's (``inf`` where no plan fits)."""

    plan: Plan | None
    bound: float

    def cost(self, problem: Problem) -> float:
        """The plan's cost (``inf`` where there is none)."""
        return math.inf if self.plan is None else evaluate(problem, *self.plan)[0]


def relax(problem: Problem, budget: int) -> Relaxation:
    """The :class:`Relaxation` of ``problem`` within ``budget``, its lazy stage bounds left
    out (:meth:`~autoremat_ilp.problem.Problem.lazy_bounds`)."""
    model = build_model(problem.with_bounds(~problem.lazy_bounds()), budget)
    lp = solve_milp(dataclasses.replace(model.milp, integer=np.zeros_like(model.milp.integer)))
    if lp.x is None:
        return Relaxation(math.inf if lp.status is Status.INFEASIBLE else -math.inf, None)
    return Relaxation(lp.objective * model.unit, lp.x[model.variables.save])


def greedy_start(problem: Problem, budget: int, relaxation: Relaxation | None = None
                 ) -> Start:
    """The plan of :func:`_rounded` within ``budget`` (measured on Llama-style models,
    cheaper than :func:`_by_regions`'s, the plan where it finds none), and the LP
    relaxation's bound (``relaxation``: :func:`relax`'s, made here where ``None``;
    ``tests/ilp/test_greedy.py`` shows both on small problems)."""
    relaxation = relax(problem, budget) if relaxation is None else relaxation
    plan = None if relaxation.share is None else _rounded(problem, budget, relaxation.share)
    if plan is None or violations(problem, *plan):
        plan = _by_regions(problem, budget)
        if plan is not None and violations(problem, *plan):
            plan = None
    return Start(plan, relaxation.bound)


def covering_plan(problem: Problem, saved: np.ndarray) -> Plan | None:
    """The plan that saves the values ``saved`` (a mask) that it may, and what it must,
    and recomputes the rest of what the backward reads, from saved inputs or inputs
    recomputed in the same region (pruned: :func:`~autoremat_ilp.memory.prune`); ``None``
    where a value can be neither saved nor recomputed as that needs (a value that must be
    saved but cannot is left to :func:`~autoremat_ilp.memory.violations`)."""
    inputs, region = problem.adjacency.inputs, problem.region.tolist()
    can_save, can_recompute = problem.can_save.tolist(), problem.can_recompute.tolist()
    wanted = saved.tolist()
    saving = (saved | problem.must_save) & problem.can_save
    recompute = ((problem.must_cover | problem.must_save) & problem.can_recompute
                 & ~saving).tolist()
    save = saving.tolist()
    # Inputs come before their readers: a value marked late is visited still.
    for v in range(problem.num_values - 1, -1, -1):
        if not recompute[v]:
            continue
        for u in inputs[v]:
            if save[u] or recompute[u]:
                continue
            if region[u] == region[v] and can_recompute[u] and not wanted[u]:
                recompute[u] = True
            elif can_save[u]:
                save[u] = True
            else:
                return None
    save, recompute, _ = prune(problem, np.array(save), np.array(recompute))
    return save, recompute


def region_plan(problem: Problem, recomputed: np.ndarray) -> Plan | None:
    """The :func:`covering_plan` that recomputes what the backward reads in the regions
    ``recomputed`` (a mask over the regions) and saves it in the others."""
    remat = recomputed[problem.region] & problem.can_recompute & ~problem.must_save
    return covering_plan(problem, (problem.must_cover | problem.must_save) & ~remat)


def _rounded(problem: Problem, budget: int, share: np.ndarray) -> Plan | None:
    """The LP relaxation's plan rounded: the :func:`covering_plan` saving the values the
    LP saves most (``share`` of each), as many as fit the budget."""
    candidates = np.flatnonzero(problem.can_save)
    # Most saved by the LP first; of equal shares, the dearest to recompute per byte.
    order = candidates[np.lexsort((-_worth(problem, candidates), -share[candidates]))]
    return _longest_prefix(problem, budget, order)


def fitted(problem: Problem, budget: int, saved: np.ndarray) -> Plan | None:
    """The :func:`covering_plan` saving as many of the values ``saved`` (a mask) as fit
    ``budget``, the dearest to recompute per byte kept: a plan of the problem with fewer
    stage bounds (:meth:`~autoremat_ilp.problem.Problem.with_bounds`) repaired to keep all
    of them; ``None`` where none fits."""
    candidates = np.flatnonzero(saved & problem.can_save)
    order = candidates[np.argsort(-_worth(problem, candidates), kind="stable")]
    plan = _longest_prefix(problem, budget, order)
    return None if plan is None or violations(problem, *plan) else plan


def _worth(problem: Problem, values: np.ndarray) -> np.ndarray:
    """The recompute cost per byte held of ``values``."""
    return problem.cost[values] / np.maximum(problem.held[values], 1)


def _longest_prefix(problem: Problem, budget: int, order: np.ndarray) -> Plan | None:
    """The :func:`covering_plan` saving the longest prefix of ``order`` that fits
    ``budget``."""

    def without_last(k: int) -> Plan | None:
        return covering_plan(problem, np.isin(np.arange(problem.num_values),
                                              order[:len(order) - k]))

    return _least(without_last, problem, budget, len(order))


def _by_regions(problem: Problem, budget: int) -> Plan | None:
    """The :func:`region_plan` recomputing the fewest regions, in order of recompute cost
    per byte freed, that fits the budget."""
    R = problem.num_regions
    kept = region_plan(problem, np.zeros(R, dtype=bool))
    every = region_plan(problem, np.ones(R, dtype=bool))
    if kept is None or every is None:
        return None
    order = _by_rate(problem, kept, every)
    return _least(lambda n: region_plan(problem, np.isin(np.arange(R), order[:n])),
                  problem, budget, R)


def _least(plan: Callable[[int], Plan | None], problem: Problem, budget: int, most: int
           ) -> Plan | None:
    """``plan(k)`` for the least ``k`` in ``0..most`` where it fits ``budget``, found by
    bisection (the plans hold fewer bytes as ``k`` grows, mostly): its first fitting
    point where ``plan(most)`` fits."""

    def fitting(k: int) -> Plan | None:
        p = plan(k)
        return p if p is not None and evaluate(problem, *p)[1] <= budget else None

    if (found := fitting(0)) is not None or fitting(most) is None:
        return found
    lo, hi = 1, most  # plan(hi) fits
    while lo < hi:
        mid = (lo + hi) // 2
        if fitting(mid) is None:
            lo = mid + 1
        else:
            hi = mid
    return fitting(hi)


def _by_rate(problem: Problem, kept: Plan, every: Plan) -> list[int]:
    """The regions by recompute cost per byte freed, going from plan ``kept`` (nothing
    recomputed) to ``every`` (every region recomputed); last those that free none."""
    R = problem.num_regions
    held = problem.held.astype(float)
    freed = (np.bincount(problem.region, held * kept[0], R)
             - np.bincount(problem.region, held * every[0], R))
    cost = np.bincount(problem.region, problem.cost * every[1], R)
    rate = np.where(freed > 0, cost / np.maximum(freed, 1), np.inf)
    return np.argsort(rate, kind="stable").tolist()
