"""Solving: a :class:`Graph` and a budget to save/recompute decisions.

The graph is stated as an :class:`autoremat_solvers.policy.PolicyProblem` (memory model
below) and solved as an integer program through OR-tools.

Memory model. The peak of the gradient computation is taken at the backward stage of
each region ``i`` (regions in program order; the backward visits them in reverse):

* all arguments, and one gradient per floating-point argument (held to the end);
* every residual saved by regions ``0..i`` (a scan body's residuals times its length);
* region ``i``'s working set: the bytes live in one forward pass through it (one
  iteration for a scan), standing in for its cotangents and for recomputed values that
  only feed other recomputations, plus every recomputed value its backward reads, all
  counted live together (they are recomputed before the region's backward starts).

Forward stages hold a subset of this (no gradients yet), so they never set the peak.
The model is conservative: a value saved for a later region is counted from the stage
it is made in, and gradients are counted whole from the first backward stage.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from autoremat_solvers import policy as policy_model
from autoremat_solvers.milp import MilpStatus

from autoremat._graph import Graph


@dataclasses.dataclass(frozen=True)
class Decisions:
    """Which values a plan saves and recomputes, with its modelled figures."""

    saved: frozenset[int]
    recomputed: frozenset[int]
    peak_bytes: int
    saved_bytes: int
    recompute_flops: int
    status: str
    gap: float
    solve_seconds: float


def to_problem(graph: Graph) -> policy_model.PolicyProblem:
    """The graph's save/recompute problem, with the memory model of the module doc."""
    index = {v.id: k for k, v in enumerate(graph.values)}
    edges = np.array([(index[u], k) for k, v in enumerate(graph.values) for u in v.inputs],
                     dtype=np.int64).reshape(-1, 2)
    return policy_model.PolicyProblem(
        # One extra unit per instance breaks ties towards fewer recomputed values.
        cost=(graph.recompute_flops() + graph.iterations()).astype(float),
        held=graph.array("multiplicity") * graph.array("nbytes"),
        transient=graph.array("nbytes") * graph.array("needed"),
        region=graph.array("region"),
        base=np.array([graph.fixed_bytes + r.work_bytes for r in graph.regions], dtype=np.int64),
        must_cover=graph.array("needed", bool),
        must_save=graph.array("needed_across", bool),
        can_save=graph.array("saveable", bool),
        can_recompute=graph.array("recomputable", bool),
        edges=edges,
    )


def decisions(graph: Graph, problem: policy_model.PolicyProblem,
              result: policy_model.PolicyResult) -> Decisions:
    """Reads a solver result back onto the graph's value ids."""
    ids = graph.array("id")
    flops = graph.recompute_flops()
    return Decisions(
        saved=frozenset(int(i) for i in ids[result.save]),
        recomputed=frozenset(int(i) for i in ids[result.recompute]),
        peak_bytes=result.peak,
        saved_bytes=int(problem.held[result.save].sum()),
        recompute_flops=int(flops[result.recompute].sum()),
        status=result.status.value,
        gap=result.gap,
        solve_seconds=result.wall_s,
    )


def no_remat(graph: Graph, problem: policy_model.PolicyProblem) -> Decisions:
    """The plan that saves every value the backward pass reads and recomputes nothing
    (only zero-cost reads of scan inputs are 'recomputed')."""
    save = problem.must_save | (problem.must_cover & problem.can_save)
    recompute = problem.must_cover & ~problem.can_save
    cost, peak = policy_model.evaluate(problem, save, recompute)
    result = policy_model.PolicyResult(MilpStatus.OPTIMAL, save, recompute, cost,
                                       peak, cost, 0.0, 0.0)
    return decisions(graph, problem, result)
