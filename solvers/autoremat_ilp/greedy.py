"""A plan found without a solver: whole regions recomputed, the cheapest bytes first.

It starts the MILP's search (a solution to prune against from the first node) and is the
plan returned where the time limit stops the search before it finds one of its own.
"""

from __future__ import annotations

import numpy as np

from autoremat_ilp.memory import evaluate, prune, violations
from autoremat_ilp.problem import Problem

__all__ = ["greedy_plan"]


def greedy_plan(problem: Problem, budget: int) -> tuple[np.ndarray, np.ndarray] | None:
    """A plan ``(save, recompute)`` of peak at most ``budget``, or ``None`` where this
    heuristic finds none.

    Each region either saves what the backward reads or recomputes it from the region's
    inputs (:func:`region_plan`). The regions are recomputed in order of recompute cost
    per byte freed, as few as fit the budget.

    Example:
      >>> import numpy as np, autoremat_ilp as ilp
      >>> problem = ilp.Problem(  # two regions, one 10-byte value each
      ...     cost=np.array([100.0, 1.0]), held=np.array([10, 10]),
      ...     transient=np.array([10, 10]), region=np.array([0, 1]),
      ...     base=np.array([0, 0]), forward_base=np.array([5, 5]),
      ...     forward_held=np.array([0, 0]), must_cover=np.array([True, True]),
      ...     must_save=np.array([False, False]), can_save=np.array([True, True]),
      ...     can_recompute=np.array([True, True]), edges=np.zeros((0, 2), np.int64))
      >>> save, recompute = greedy_plan(problem, 15)
      >>> save.tolist(), recompute.tolist(), ilp.evaluate(problem, save, recompute)
      ([False, True], [True, False], (100.0, 10))
    """
    R = problem.num_regions
    inputs = _inputs(problem)
    kept = region_plan(problem, np.zeros(R, dtype=bool), inputs)
    every = region_plan(problem, np.ones(R, dtype=bool), inputs)
    if kept is None or every is None:
        return None
    # The cheapest prefix of the regions by recompute cost per byte freed that fits:
    # found by bisection, as more regions recomputed hold fewer bytes.
    order = _by_rate(problem, kept, every)

    def first(n: int) -> tuple[np.ndarray, np.ndarray] | None:
        plan = region_plan(problem, np.isin(np.arange(R), order[:n]), inputs)
        return plan if plan is not None and evaluate(problem, *plan)[1] <= budget else None

    if (plan := first(0)) is not None or first(R) is None:
        return plan
    lo, hi = 1, R  # the first hi regions fit
    while lo < hi:
        mid = (lo + hi) // 2
        if first(mid) is None:
            lo = mid + 1
        else:
            hi = mid
    return first(hi)


def region_plan(problem: Problem, recomputed: np.ndarray, inputs: list[list[int]] | None = None
                ) -> tuple[np.ndarray, np.ndarray] | None:
    """The plan that recomputes what the backward reads in the regions ``recomputed``
    (a mask over the regions) from their saved inputs, and saves it in the others
    (pruned: :func:`~autoremat_ilp.memory.prune`); ``None`` where a value can be neither
    saved nor recomputed as that needs. ``inputs``: each value's inputs (made here when
    ``None``)."""
    inputs = _inputs(problem) if inputs is None else inputs
    region = problem.region
    remat = recomputed[region] & problem.can_recompute & ~problem.must_save
    needed = problem.must_cover | problem.must_save
    save = needed & ~remat & problem.can_save
    recompute = needed & ~save & problem.can_recompute
    # Inputs come before their readers: a value marked late is visited still.
    for v in range(problem.num_values - 1, -1, -1):
        if not recompute[v]:
            continue
        for u in inputs[v]:
            if save[u] or recompute[u]:
                continue
            if region[u] == region[v] and problem.can_recompute[u] and (
                    remat[u] or not problem.can_save[u]):
                recompute[u] = True
            elif problem.can_save[u]:
                save[u] = True
            else:
                return None
    save, recompute, _ = prune(problem, save, recompute)
    return None if violations(problem, save, recompute) else (save, recompute)


def _inputs(problem: Problem) -> list[list[int]]:
    """Each value's inputs."""
    inputs: list[list[int]] = [[] for _ in range(problem.num_values)]
    for u, v in problem.edges.tolist():
        inputs[v].append(u)
    return inputs


def _by_rate(problem: Problem, kept: tuple[np.ndarray, np.ndarray],
             every: tuple[np.ndarray, np.ndarray]) -> list[int]:
    """The regions by recompute cost per byte freed, going from plan ``kept`` (nothing
    recomputed) to ``every`` (every region recomputed); last those that free none."""
    R = problem.num_regions
    held = problem.held.astype(float)
    freed = (np.bincount(problem.region, held * kept[0], R)
             - np.bincount(problem.region, held * every[0], R))
    cost = np.bincount(problem.region, problem.cost * every[1], R)
    rate = np.where(freed > 0, cost / np.maximum(freed, 1), np.inf)
    return np.argsort(rate, kind="stable").tolist()
