"""Classic rematerialization heuristics as Checkmate-style schedules.

All four keep backward values (gradients, loss) until their last use and differ only in
which forward values they keep; a missing forward value is recomputed on demand from the
nearest values in memory (see :func:`schedule_from_policy`). A heuristic whose schedule
needs more memory than the budget returns ``NO_SOLUTION``; peaks come from the simulator.

General DAGs: checkpoint candidates for Chen et al. are the articulation points of the
undirected forward graph (every forward node of a chain), falling back to all forward
nodes in topological order when there are none. Griewank & Walther's binomial
checkpointing is defined for chains; here it runs on the forward nodes linearized in
topological order, and each backward stage is mapped to the lowest forward position it
reads (values reached through skip edges are recomputed on demand).

``time_limit_s`` is accepted for the common interface; only the greedy sweep checks it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import networkx as nx
import numpy as np
from autoremat_ilp import Status

from autoremat_solvers._stages import KeepPolicy, schedule_from_policy
from autoremat_solvers.base import SolverResult
from autoremat_solvers.graph import ComputeGraph
from autoremat_solvers.schedule import Schedule, simulate

__all__ = ["checkpoint_all", "checkpoint_policy", "chen_greedy", "chen_sqrtn", "griewank_logn"]


def _forward_nodes(graph: ComputeGraph) -> list[int]:
    return [v for v in range(graph.n) if not graph.backward[v]]


def _forward_phase_end(graph: ComputeGraph) -> int:
    """The first backward node (the loss), or ``n`` for graphs without backward nodes."""
    return next((v for v in range(graph.n) if graph.backward[v]), graph.n)


def _result(
    graph: ComputeGraph, budget: float, candidates: list[Schedule], start: float
) -> SolverResult:
    """The cheapest candidate that the simulator accepts at ``budget``."""
    best: tuple[float, Schedule] | None = None
    for schedule in candidates:
        sim = simulate(graph, schedule, budget)
        if sim.ok and (best is None or sim.cost < best[0]):
            best = (sim.cost, schedule)
    wall_s = time.perf_counter() - start
    if best is None:
        return SolverResult(None, Status.NO_SOLUTION, math.inf, graph.total_cost, wall_s)
    return SolverResult(best[1], Status.FEASIBLE, best[0], graph.total_cost, wall_s)


def _forward_use_after(graph: ComputeGraph) -> Callable[[int, int], bool]:
    """``(t, v) ->`` does a forward-phase node (up to the loss) after stage ``t`` read ``v``?"""
    end = _forward_phase_end(graph)
    return lambda t, v: any(t < j <= end for j in graph.succs[v])


def checkpoint_policy(graph: ComputeGraph, checkpoints: set[int]) -> KeepPolicy:
    """Chen et al.: keep checkpoints, values still needed by the forward pass, recomputed values."""
    forward_use_after = _forward_use_after(graph)
    return lambda t, v, recomputed: v in checkpoints or recomputed or forward_use_after(t, v)


def _chen_candidates(graph: ComputeGraph) -> list[int]:
    fwd = _forward_nodes(graph)
    undirected = nx.Graph()
    undirected.add_nodes_from(fwd)
    undirected.add_edges_from((u, v) for u, v in graph.edges if not graph.backward[v])
    return sorted(nx.articulation_points(undirected)) or fwd


def checkpoint_all(
    graph: ComputeGraph, budget: float, time_limit_s: float | None = None
) -> SolverResult:
    """Keeps every value until its last use; computes each node once."""
    start = time.perf_counter()
    return _result(graph, budget, [schedule_from_policy(graph, lambda t, v, r: True)], start)


def chen_sqrtn(
    graph: ComputeGraph, budget: float, time_limit_s: float | None = None
) -> SolverResult:
    """Chen et al. (2016) sqrt(n).

    Every ``floor(sqrt(c))``-th of ``c`` candidates is a checkpoint.
    """
    start = time.perf_counter()
    candidates = _chen_candidates(graph)
    k = max(1, math.isqrt(len(candidates)))
    checkpoints = {v for i, v in enumerate(candidates) if (i + 1) % k == 0}
    return _result(
        graph, budget, [schedule_from_policy(graph, checkpoint_policy(graph, checkpoints))], start
    )


def _greedy_checkpoints(
    graph: ComputeGraph, candidates: set[int], segment_bytes: float
) -> set[int]:
    """Chen et al. Algorithm 3.

    Checkpoints a candidate once the segment exceeds ``segment_bytes``.
    """
    checkpoints = set()
    segment = 0
    for v in _forward_nodes(graph):
        segment += graph.ram[v]
        if v in candidates and segment > segment_bytes:
            checkpoints.add(v)
            segment = 0
    return checkpoints


def chen_greedy(
    graph: ComputeGraph, budget: float, time_limit_s: float | None = None, *, n_sweep: int = 32
) -> SolverResult:
    """Chen et al. greedy, sweeping the segment size geometrically.

    Returns the cheapest fitting schedule.
    """
    start = time.perf_counter()
    candidates = set(_chen_candidates(graph))
    fwd_ram = [graph.ram[v] for v in _forward_nodes(graph)] or [1]
    sizes = np.geomspace(max(1, min(fwd_ram) / 2), sum(fwd_ram), n_sweep)
    checkpoint_sets = {frozenset(_greedy_checkpoints(graph, candidates, b)) for b in sizes}
    schedules = []
    for checkpoints in sorted(checkpoint_sets, key=sorted):
        if time_limit_s is not None and time.perf_counter() - start > time_limit_s:
            break
        schedules.append(schedule_from_policy(graph, checkpoint_policy(graph, set(checkpoints))))
    return _result(graph, budget, schedules, start)


def _bisection_alive(m: int, slots: int) -> list[frozenset[int]]:
    """Positions checkpointed while reversing each of ``m`` steps (treeverse, bisection)."""
    alive: list[frozenset[int]] = [frozenset()] * m

    def treeverse(lo: int, hi: int, s: int, stack: frozenset[int]) -> None:
        if hi - lo == 1 or s == 0:
            for p in range(lo, hi):
                alive[p] = stack
            return
        mid = (lo + hi) // 2
        treeverse(mid, hi, s - 1, stack | {mid})
        treeverse(lo, mid, s, stack)

    if m:
        treeverse(0, m, slots, frozenset({0}))
    return alive


def griewank_logn(
    graph: ComputeGraph, budget: float, time_limit_s: float | None = None
) -> SolverResult:
    """Griewank & Walther (2000) checkpointing with ``ceil(log2 m)`` slots by bisection."""
    start = time.perf_counter()
    fwd = _forward_nodes(graph)
    m = len(fwd)
    pos = {v: i for i, v in enumerate(fwd)}
    alive = _bisection_alive(m, max(1, math.ceil(math.log2(max(m, 2)))))
    end = _forward_phase_end(graph)
    forward_use_after = _forward_use_after(graph)
    # Forward position being reversed at each stage (the first reversal during the forward phase).
    reversing = [m - 1] * graph.n
    for t in range(end + 1, graph.n):
        reads = [pos[p] for p in graph.preds[t] if p in pos]
        reversing[t] = min(reads) if reads else reversing[t - 1]
    checkpoints = [{fwd[p] for p in alive[r]} if m else set() for r in reversing]

    def keep(t: int, v: int, recomputed: bool) -> bool:
        return (t + 1 < graph.n and v in checkpoints[t + 1]) or forward_use_after(t, v)

    return _result(graph, budget, [schedule_from_policy(graph, keep)], start)


BASELINES: dict[str, Callable[..., SolverResult]] = {
    "checkpoint_all": checkpoint_all,
    "chen_sqrtn": chen_sqrtn,
    "chen_greedy": chen_greedy,
    "griewank_logn": griewank_logn,
}
