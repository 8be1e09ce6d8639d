"""A mixed-integer linear program in array form, solved through OR-tools.

Every solver in this package states its model as arrays (a cost vector, a sparse
constraint matrix, bounds) and hands it to :func:`solve_milp`. Building models from
arrays instead of Python expression objects keeps model construction linear-time and
fast (about 50x faster at 100k variables, see ``shared/notes/remat-facts.md`` §4).

Backends are the MIP solvers bundled with OR-tools' ``pywraplp``: ``"HIGHS"`` (default),
``"SCIP"`` and ``"CBC"``. All run single-threaded, so results are deterministic.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import time

import numpy as np
import scipy.sparse as sp
from ortools.linear_solver import linear_solver_pb2, pywraplp

__all__ = ["Milp", "MilpResult", "MilpStatus", "solve_milp"]


class MilpStatus(str, enum.Enum):
    """Outcome of a solve."""

    OPTIMAL = "optimal"
    FEASIBLE = "feasible"  # a solution, optimality not proven (time limit): see the gap
    INFEASIBLE = "infeasible"
    NO_SOLUTION = "no_solution"  # time limit reached before any solution was found


@dataclasses.dataclass(frozen=True, eq=False)
class Milp:
    """``min c @ x  s.t.  row_lb <= A @ x <= row_ub,  var_lb <= x <= var_ub``.

    ``integer[j]`` marks ``x[j]`` integral. Infinite bounds are ``±np.inf``.
    """

    c: np.ndarray
    A: sp.csr_matrix
    row_lb: np.ndarray
    row_ub: np.ndarray
    var_lb: np.ndarray
    var_ub: np.ndarray
    integer: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.c)
        m = self.A.shape[0]
        if self.A.shape[1] != n:
            raise ValueError(f"A has {self.A.shape[1]} columns for {n} variables")
        for name, arr, size in (
            ("row_lb", self.row_lb, m),
            ("row_ub", self.row_ub, m),
            ("var_lb", self.var_lb, n),
            ("var_ub", self.var_ub, n),
            ("integer", self.integer, n),
        ):
            if len(arr) != size:
                raise ValueError(f"{name} has length {len(arr)}, expected {size}")


@dataclasses.dataclass(frozen=True, eq=False)
class MilpResult:
    """A solve's outcome. ``x`` is ``None`` unless a solution was found."""

    status: MilpStatus
    x: np.ndarray | None
    objective: float
    bound: float
    wall_s: float

    @property
    def gap(self) -> float:
        """Relative gap between the solution and the proven lower bound (0 when optimal)."""
        if self.x is None:
            return math.inf
        if self.status is MilpStatus.OPTIMAL:
            return 0.0
        denom = max(abs(self.objective), 1e-9)
        return max(0.0, (self.objective - self.bound) / denom)


def _to_proto(milp: Milp) -> linear_solver_pb2.MPModelProto:
    proto = linear_solver_pb2.MPModelProto()
    for j in range(len(milp.c)):
        var = proto.variable.add()
        var.objective_coefficient = float(milp.c[j])
        var.lower_bound = float(milp.var_lb[j])
        var.upper_bound = float(milp.var_ub[j])
        var.is_integer = bool(milp.integer[j])
    A = milp.A.tocsr()
    A.sort_indices()
    for i in range(A.shape[0]):
        lo, hi = A.indptr[i], A.indptr[i + 1]
        row = proto.constraint.add()
        row.lower_bound = float(milp.row_lb[i])
        row.upper_bound = float(milp.row_ub[i])
        row.var_index.extend(A.indices[lo:hi].tolist())
        row.coefficient.extend(A.data[lo:hi].tolist())
    return proto


def solve_milp(
    milp: Milp,
    *,
    backend: str = "HIGHS",
    time_limit_s: float | None = None,
    relative_gap: float = 0.0,
) -> MilpResult:
    """Solves ``milp`` with an OR-tools MIP backend.

    Args:
      milp: the model.
      backend: ``"HIGHS"``, ``"SCIP"`` or ``"CBC"``.
      time_limit_s: stop after this many seconds and return the best solution found.
      relative_gap: stop once the relative optimality gap is at most this.

    Returns:
      A :class:`MilpResult`; ``x`` is rounded for integer variables.
    """
    solver = pywraplp.Solver.CreateSolver(backend)
    if solver is None:
        raise ValueError(f"OR-tools has no MIP backend {backend!r}; use 'HIGHS', 'SCIP' or 'CBC'")
    err = solver.LoadModelFromProto(_to_proto(milp))
    if err:
        raise RuntimeError(f"OR-tools rejected the model: {err}")
    solver.SuppressOutput()
    if backend == "HIGHS":  # its banner ignores SuppressOutput
        solver.SetSolverSpecificParametersAsString("output_flag=false\n")
    solver.SetNumThreads(1)
    if time_limit_s is not None:
        solver.SetTimeLimit(max(1, int(time_limit_s * 1000)))
    params = pywraplp.MPSolverParameters()
    params.SetDoubleParam(pywraplp.MPSolverParameters.RELATIVE_MIP_GAP, relative_gap)
    start = time.perf_counter()
    code = solver.Solve(params)
    wall_s = time.perf_counter() - start
    if code == pywraplp.Solver.INFEASIBLE:
        return MilpResult(MilpStatus.INFEASIBLE, None, math.inf, math.inf, wall_s)
    if code not in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
        return MilpResult(MilpStatus.NO_SOLUTION, None, math.inf, -math.inf, wall_s)
    x = np.array([v.solution_value() for v in solver.variables()])
    x = np.where(milp.integer, np.round(x), x)
    objective = float(milp.c @ x)
    if code == pywraplp.Solver.OPTIMAL:
        return MilpResult(MilpStatus.OPTIMAL, x, objective, objective, wall_s)
    bound = float(solver.Objective().BestBound())
    return MilpResult(MilpStatus.FEASIBLE, x, objective, bound, wall_s)
