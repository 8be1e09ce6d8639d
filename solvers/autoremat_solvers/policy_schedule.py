"""JAX checkpoint policies planned with the library's model (:mod:`autoremat_ilp`) on a
Checkmate-style graph.

It shows what planning at the level of a ``jax.checkpoint`` policy costs compared with a
full schedule. The forward nodes, in topological order, are cut into ``ceil(sqrt(m))``
regions of consecutive nodes (one ``jax.checkpoint`` per block, as with
``scan(checkpoint(layer))``); the plan's policy picks which forward values to save, the
others that the backward reads are recomputed within their region, and values read by
another region's forward nodes must be saved. (One region around the whole forward pass
would recompute all unsaved values at once and fit no budget below the checkpoint-all
peak.) The plan becomes a schedule in which saved values are kept, every missing value is
recomputed on demand and then kept until its last use (the checkpoint policy of
:mod:`autoremat_solvers.baselines`, with the plan's saved set).

The ILP's memory model is coarse (saved plus recomputed bytes, no time dimension), so
its budget is searched by bisection: the largest ILP budget whose schedule the
simulator accepts at the real budget wins. The lower bound reported is the cost of
computing every node once; the ILP's bound holds only for its own memory model.
"""

from __future__ import annotations

import math
import time

import autoremat_ilp as ilp
import numpy as np

from autoremat_solvers._stages import schedule_from_policy
from autoremat_solvers.base import SolverResult
from autoremat_solvers.baselines import checkpoint_policy
from autoremat_solvers.graph import ComputeGraph
from autoremat_solvers.schedule import Schedule, simulate

__all__ = ["blockwise_problem", "solve"]


def blockwise_problem(graph: ComputeGraph) -> tuple[ilp.Problem, list[int]]:
    """The blockwise problem over the forward nodes, and those nodes.

    Value ``i`` of the problem is node ``fwd[i]``.
    """
    fwd = [v for v in range(graph.n) if not graph.backward[v]]
    n = len(fwd)
    index = {v: i for i, v in enumerate(fwd)}
    region = np.arange(n) // max(1, math.isqrt(n - 1) + 1)
    edges = np.asarray(
        [(index[u], index[v]) for u, v in graph.edges if v in index], dtype=np.int64
    ).reshape(-1, 2)
    read_by_backward = np.asarray(
        [any(graph.backward[s] for s in graph.succs[v]) for v in fwd], dtype=bool
    )
    read_by_other_region = np.zeros(n, dtype=bool)
    read_by_other_region[edges[region[edges[:, 0]] != region[edges[:, 1]], 0]] = True
    n_regions = int(region.max(initial=0)) + 1
    ram = np.asarray([graph.ram[v] for v in fwd], dtype=np.int64)
    problem = ilp.Problem(
        cost=np.asarray([graph.cost[v] for v in fwd], dtype=float),
        held=ram,
        transient=ram,
        region=region,
        base=np.zeros(n_regions, dtype=np.int64),
        forward_base=np.zeros(n_regions, dtype=np.int64),
        forward_held=ram,
        must_cover=read_by_backward,
        must_save=read_by_other_region,
        can_save=np.ones(n, dtype=bool),
        can_recompute=np.ones(n, dtype=bool),
        edges=edges,
    )
    return problem, fwd


def solve(
    graph: ComputeGraph, budget: float, time_limit_s: float | None = None, *, n_bisections: int = 8
) -> SolverResult:
    """The cheapest schedule of a checkpoint-policy plan that fits ``budget``.

    See the module docstring.

    Args:
      graph: the graph.
      budget: memory budget in bytes.
      time_limit_s: limit for all ILP solves together.
      n_bisections: ILP budgets tried.

    Returns:
      The cheapest schedule found that the simulator accepts, or ``NO_SOLUTION``.
    """
    start = time.perf_counter()
    if budget < graph.memory_floor():
        return SolverResult.below_floor(time.perf_counter() - start)
    problem, fwd = blockwise_problem(graph)
    share = 60.0 if time_limit_s is None else time_limit_s / n_bisections
    lo, hi = 0.0, float(budget)
    ilp_budget = hi
    best: tuple[float, Schedule] | None = None
    for _ in range(n_bisections):
        plan = ilp.solve(problem, int(ilp_budget), time_limit_s=share, backends=("HIGHS",))
        fits = False
        if plan.save is not None:
            saved = {fwd[i] for i in np.flatnonzero(plan.save)}
            schedule = schedule_from_policy(graph, checkpoint_policy(graph, saved))
            sim = simulate(graph, schedule, budget)
            fits = sim.ok
            if fits and (best is None or sim.cost < best[0]):
                best = (sim.cost, schedule)
        if fits and ilp_budget == budget:
            break
        if fits or plan.save is None:  # no plan: the ILP budget is too tight for the ILP
            lo = ilp_budget
        else:
            hi = ilp_budget
        ilp_budget = (lo + hi) / 2
    wall_s = time.perf_counter() - start
    if best is None:
        return SolverResult(None, ilp.Status.NO_SOLUTION, math.inf, graph.total_cost, wall_s)
    return SolverResult(best[1], ilp.Status.FEASIBLE, best[0], graph.total_cost, wall_s)
