"""Moccasin's interval model of rematerialization, solved with OR-tools CP-SAT.

Bartan, Li, Talati, Lian, Kalra and Stojanovic, "Moccasin: Efficient Tensor
Rematerialization for Neural Networks", ICML 2023. Instead of Checkmate's ``O(n^2)``
stage grid, node ``v`` gets at most ``C_v`` *retention intervals*, one per computation:
interval ``(v, c)`` starts at the time slot where the ``c``-th computation of ``v`` runs
and ends after the slot of its last reader. ``O(n C)`` interval variables in all:

- one computation per time slot (``NoOverlap`` of unit intervals); the first
  computations follow the graph's topological order, as in Checkmate's frontier-advancing
  stages; later computations of a node start after the previous one's interval ends;
- a computation of ``v`` in slot ``s`` reads, for each input ``u``, one present interval of
  ``u`` that started before ``s`` and is still open at ``s`` (a boolean per pair of
  intervals, ``C^2`` per edge);
- ``Cumulative``: the bytes of the intervals open at any slot stay within the budget;
- minimize the cost of all computations.

Integers. Memory is quantized *up*: a value of ``b`` bytes counts ``ceil(b / unit)`` units
against a capacity of ``floor(budget / unit)`` units, where ``unit`` is the larger of the
greatest common divisor of the sizes and ``max size // mem_resolution``; so any schedule the
model accepts fits the budget exactly (the simulator decides anyway), and the model is exact
whenever the sizes' divisor is at least that large. Costs are quantized *down* to
``floor(cost * cost_resolution / max cost)``, which keeps CP-SAT's objective bound a valid
lower bound on the true cost under the model. A node without readers gets one interval.

The solution's sequence of computations is turned into a schedule that frees every value
after its last reader (:func:`schedule_from_sequence`), whose memory never exceeds the
model's. CP-SAT is hinted with the cheapest baseline schedule that fits the budget.
Infeasibility of this restricted, quantized model proves nothing about the budget, so it
is reported as ``NO_SOLUTION``; only budgets under the memory floor are ``INFEASIBLE``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import numpy as np
from autoremat_ilp import Status
from ortools.sat.python import cp_model

from autoremat_solvers._stages import schedule_from_sequence, sequence_of
from autoremat_solvers.base import SolverResult
from autoremat_solvers.baselines import BASELINES
from autoremat_solvers.graph import ComputeGraph
from autoremat_solvers.schedule import Schedule

__all__ = ["IntervalModel", "Quantization", "build_interval_model", "solve"]


@dataclasses.dataclass(frozen=True)
class Quantization:
    """Integer costs and sizes.

    ``ram_units[v] * mem_unit >= ram[v]`` and ``cost_units[v] <= cost[v] * cost_scale``.
    """

    mem_unit: int
    ram_units: tuple[int, ...]
    capacity: int
    cost_scale: float
    cost_units: tuple[int, ...]

    @classmethod
    def of(
        cls, graph: ComputeGraph, budget: float, mem_resolution: int, cost_resolution: int
    ) -> Quantization:
        """Quantizes memory up and costs down (see the module docstring)."""
        mem_unit = max(1, math.gcd(*graph.ram), max(graph.ram) // mem_resolution)
        cost_scale = cost_resolution / max(max(graph.cost), 1e-12)
        return cls(
            mem_unit=mem_unit,
            ram_units=tuple(-(-r // mem_unit) for r in graph.ram),
            capacity=int(budget // mem_unit),
            cost_scale=cost_scale,
            cost_units=tuple(math.floor(c * cost_scale) for c in graph.cost),
        )


@dataclasses.dataclass(frozen=True, eq=False)
class IntervalModel:
    """The CP-SAT model and its variables, indexed by ``(node, copy)``."""

    model: cp_model.CpModel
    start: dict[tuple[int, int], cp_model.IntVar]
    end: dict[tuple[int, int], cp_model.IntVar]  # one past the slot of the last reader
    present: dict[tuple[int, int], cp_model.IntVar]
    # (u, cu, v, cv): copy cv of v reads copy cu of u
    reads: dict[tuple[int, int, int, int], cp_model.IntVar]
    quantization: Quantization

    def sequence(self, solver: cp_model.CpSolver) -> list[int]:
        """The solution's computations in time order."""
        slots = sorted(
            (solver.Value(s), v)
            for (v, c), s in self.start.items()
            if solver.BooleanValue(self.present[v, c])
        )
        return [v for _, v in slots]

    def add_hint(self, graph: ComputeGraph, sequence: list[int]) -> None:
        """Hints a sequence of computations (nothing if it computes a node too often)."""
        copies: dict[int, int] = {}
        at: list[tuple[int, int]] = []  # (node, copy) per slot
        for v in sequence:
            copies[v] = copies.get(v, 0) + 1
            if (v, copies[v] - 1) not in self.start:
                return
            at.append((v, copies[v] - 1))
        current: dict[int, int] = {}
        last_read = {key: slot for slot, key in enumerate(at)}
        chosen = set()
        for slot, (v, c) in enumerate(at):
            for u in graph.preds[v]:
                key = (u, current[u])
                last_read[key] = slot
                chosen.add((*key, v, c))
            current[v] = c
        used = {key: slot for slot, key in enumerate(at)}
        model: Any = self.model  # the CamelCase API is not in ortools' type stubs
        for key in self.start:
            if key[1] > 0:  # first computations are always present (a shared constant)
                model.AddHint(self.present[key], key in used)
            if key in used:
                model.AddHint(self.start[key], used[key])
                model.AddHint(self.end[key], last_read[key] + 1)
        for key, var in self.reads.items():
            model.AddHint(var, key in chosen)


def build_interval_model(
    graph: ComputeGraph, budget: float, *, max_copies: int = 2, mem_resolution: int = 10_000,
    cost_resolution: int = 10_000,
) -> IntervalModel:
    """Builds the interval model (see the module docstring) for ``budget`` bytes."""
    q = Quantization.of(graph, budget, mem_resolution, cost_resolution)
    n_copies = [max_copies if graph.succs[v] else 1 for v in range(graph.n)]
    horizon = sum(n_copies)
    m: Any = cp_model.CpModel()  # the CamelCase API is not in ortools' type stubs
    start, end, present, reads = {}, {}, {}, {}
    unit_intervals, intervals, demands = [], [], []
    for v in range(graph.n):
        for c in range(n_copies[v]):
            # First computations in topological order: v of them come before node v's.
            lo = v + c
            hi = horizon - (graph.n - v) if c == 0 else horizon - 1
            s = m.NewIntVar(lo, hi, f"s{v}_{c}")
            e = m.NewIntVar(lo + 1, horizon if graph.succs[v] else hi + 1, f"e{v}_{c}")
            a = m.NewConstant(1) if c == 0 else m.NewBoolVar(f"a{v}_{c}")
            size = m.NewIntVar(1, horizon - lo, f"len{v}_{c}")
            intervals.append(m.NewOptionalIntervalVar(s, size, e, a, f"keep{v}_{c}"))
            unit_intervals.append(m.NewOptionalFixedSizeIntervalVar(s, 1, a, f"run{v}_{c}"))
            demands.append(q.ram_units[v])
            if not graph.succs[v]:
                m.Add(e == s + 1)
            if c > 0:
                m.AddImplication(a, present[v, c - 1])
                m.Add(s >= end[v, c - 1]).OnlyEnforceIf(a)
                m.Add(s == lo).OnlyEnforceIf(a.Not())
                m.Add(e == lo + 1).OnlyEnforceIf(a.Not())
            start[v, c], end[v, c], present[v, c] = s, e, a
        if v > 0:
            m.Add(start[v, 0] > start[v - 1, 0])
    for u, v in graph.edges:
        for cv in range(n_copies[v]):
            options = []
            for cu in range(n_copies[u]):
                b = m.NewBoolVar(f"r{u}_{cu}_{v}_{cv}")
                m.AddImplication(b, present[u, cu])
                m.Add(start[u, cu] < start[v, cv]).OnlyEnforceIf(b)
                m.Add(end[u, cu] > start[v, cv]).OnlyEnforceIf(b)
                reads[u, cu, v, cv] = b
                options.append(b)
            m.Add(sum(options) == present[v, cv])
    # Without loss of optimality, for propagation and against symmetry: an interval ends right
    # after its last reader (or its own slot), and the K present computations fill exactly
    # the slots 0..K-1 (no gaps).
    ends = {key: [s + 1] for key, s in start.items()}
    for (u, cu, v, cv), b in reads.items():
        w = m.NewIntVar(0, horizon, f"w{u}_{cu}_{v}_{cv}")
        m.Add(w == start[v, cv] + 1).OnlyEnforceIf(b)
        m.Add(w == start[u, cu] + 1).OnlyEnforceIf(b.Not())
        ends[u, cu].append(w)
    for key, e in end.items():
        m.AddMaxEquality(e, ends[key])
    n_present = sum(present.values())
    for key, s in start.items():
        m.Add(s < n_present).OnlyEnforceIf(present[key])
    m.AddNoOverlap(unit_intervals)
    m.AddCumulative(intervals, demands, q.capacity)
    m.Minimize(sum(q.cost_units[v] * a for (v, _), a in present.items()))
    return IntervalModel(m, start, end, present, reads, q)


def _best_baseline(graph: ComputeGraph, budget: float) -> Schedule | None:
    """The cheapest baseline schedule that the simulator accepts at ``budget``."""
    results = [solve_baseline(graph, budget) for solve_baseline in BASELINES.values()]
    fitting = [r for r in results if r.schedule is not None]
    return min(fitting, key=lambda r: r.claimed_cost).schedule if fitting else None


_STATUS = {cp_model.OPTIMAL: Status.OPTIMAL, cp_model.FEASIBLE: Status.FEASIBLE}


def solve(
    graph: ComputeGraph,
    budget: float,
    time_limit_s: float | None = None,
    *,
    max_copies: int = 2,
    mem_resolution: int = 10_000,
    cost_resolution: int = 10_000,
    num_workers: int = 1,
) -> SolverResult:
    """Solves the interval model with CP-SAT.

    Args:
      graph: the graph.
      budget: memory budget in bytes.
      time_limit_s: CP-SAT time limit (model building and the hint are not counted).
      max_copies: computations allowed per node (Moccasin's ``C``; 2 in the paper).
      mem_resolution: the largest value is at most this many memory units (coarser is faster).
      cost_resolution: the most expensive node costs this many cost units.
      num_workers: CP-SAT search workers (1: single-threaded, deterministic).

    Returns:
      The schedule of CP-SAT's best solution, its true cost, and CP-SAT's bound converted
      to a lower bound on the true cost under this model.
    """
    start_time = time.perf_counter()
    if budget < graph.memory_floor():
        return SolverResult.below_floor(time.perf_counter() - start_time)
    im = build_interval_model(
        graph,
        budget,
        max_copies=max_copies,
        mem_resolution=mem_resolution,
        cost_resolution=cost_resolution,
    )
    hint = _best_baseline(graph, budget)
    if hint is not None:
        im.add_hint(graph, sequence_of(hint))
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = num_workers
    if time_limit_s is not None:
        solver.parameters.max_time_in_seconds = time_limit_s
    code = solver.Solve(im.model)
    wall_s = time.perf_counter() - start_time
    if code not in _STATUS:
        return SolverResult(None, Status.NO_SOLUTION, math.inf, -math.inf, wall_s)
    sequence = im.sequence(solver)
    bound = solver.BestObjectiveBound() / im.quantization.cost_scale
    cost = float(np.sum(np.asarray(graph.cost)[sequence]))
    return SolverResult(
        schedule_from_sequence(graph, sequence), _STATUS[code], cost, min(bound, cost), wall_s
    )
