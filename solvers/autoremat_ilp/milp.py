"""A mixed-integer linear program in array form, solved with HiGHS (highspy) or OR-tools.

Every model here and in ``autoremat_solvers`` is stated as arrays (a cost vector, a sparse
constraint matrix, bounds) and handed to :func:`solve_milp`. Building models from arrays
instead of Python expression objects keeps model construction linear-time and fast
(measured: about 50x faster at 100k variables).

Backends: ``"HIGHS"`` (default) through highspy, which reports its progress (best
solution and bound) while it searches and, measured on the zoo's tiny models, solved 35
budgets to the same costs as OR-tools' bundled (older) HiGHS, several times faster
(gpt2-small-tiny 31.7 s -> 8.3 s in all); ``"SCIP"`` and ``"CBC"`` through OR-tools'
``pywraplp``. All run single-threaded, so results are deterministic for given solver
versions, except where a time limit stops a search: a node limit (HiGHS and SCIP) stops it
at the same place on any machine, and :attr:`MilpResult.timed_out` says which stopped it.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import highspy
import numpy as np
import scipy.sparse as sp
from ortools.linear_solver import linear_solver_pb2, pywraplp

from autoremat_ilp.status import Status

__all__ = ["Milp", "MilpResult", "Progress", "solve_milp"]

Progress = Callable[[float, float, float], None]
"""``progress(elapsed_s, best, bound)``: seconds since the solve started, the objective of
the best solution found so far and the solver's lower bound on the optimum."""

# Least seconds between two progress reports that bring no better solution.
_PROGRESS_INTERVAL_S = 0.25


@dataclasses.dataclass(frozen=True, eq=False)
class Milp:
    """``min c @ x  s.t.  row_lb <= A @ x <= row_ub,  var_lb <= x <= var_ub``.

    Attributes:
      c: the objective's coefficients, one per variable.
      A: the constraint matrix, a row per constraint.
      row_lb, row_ub: the rows' bounds (infinite bounds are ``±np.inf``).
      var_lb, var_ub: the variables' bounds.
      integer: marks the integral variables.

    Example:
      >>> import numpy as np, scipy.sparse as sp, autoremat_ilp as ilp
      >>> milp = ilp.Milp(  # max x, 2x <= 3, x integral
      ...     c=np.array([-1.0]), A=sp.csr_matrix([[2.0]]), row_lb=np.array([-np.inf]),
      ...     row_ub=np.array([3.0]), var_lb=np.array([0.0]), var_ub=np.array([10.0]),
      ...     integer=np.array([True]))
      >>> r = ilp.solve_milp(milp)  # a MilpResult
      >>> r.status.value, r.x.tolist(), r.objective, r.bound <= -1.0
      ('optimal', [1.0], -1.0, True)
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
        # scipy's sparse ``shape`` is untyped (inferred as ``None``).
        m = self.A.shape[0]  # pyright: ignore[reportOptionalSubscript]
        if self.A.shape[1] != n:  # pyright: ignore[reportOptionalSubscript]
            raise ValueError(f"A has {self.A.shape[1]} columns for {n} variables")  # pyright: ignore[reportOptionalSubscript]
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
    """A solve's outcome.

    Attributes:
      status: how the solve ended.
      x: the solution (integer variables rounded); ``None`` unless one was found.
      objective: ``c @ x``.
      bound: the solver's lower bound on the optimum.
      wall_s: seconds the solve took.
      timed_out: the time limit stopped the search (its result then depends on the
        machine's speed and load); ``False`` when it ended otherwise (proven, or stopped by
        the node limit: the same on any machine).
    """

    status: Status
    x: np.ndarray | None
    objective: float
    bound: float
    wall_s: float
    timed_out: bool = False

    @property
    def gap(self) -> float:
        """Relative gap between the solution and the proven lower bound (0 when optimal)."""
        if self.x is None:
            return math.inf
        if self.status is Status.OPTIMAL:
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
    for i in range(A.shape[0]):  # pyright: ignore[reportOptionalSubscript]
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
    node_limit: int | None = None,
    relative_gap: float = 0.0,
    progress: Progress | None = None,
    cutoff: float | None = None,
    start: tuple[np.ndarray, np.ndarray] | None = None,
) -> MilpResult:
    """Solves ``milp`` with a MIP backend (see the module docstring).

    Args:
      milp: the model.
      backend: ``"HIGHS"``, ``"SCIP"`` or ``"CBC"``.
      time_limit_s: stop after this many seconds and return the best solution found.
      node_limit: stop after this many branch-and-bound nodes and return the best solution
        found (HiGHS and SCIP; CBC ignores it): unlike the time limit, the same on every
        machine.
      relative_gap: stop once the relative optimality gap is at most this.
      progress: called while HiGHS (through highspy) searches, at each better solution
        and every quarter second or so after one was found, and once at the end with the
        final solution and bound (with every backend) when there is a solution. An
        exception it raises stops the solve and is raised again here.
      cutoff: only solutions whose objective is at most this are searched for; where
        there is none, the result is ``INFEASIBLE``.
      start: a solution to start from, ``(columns, values)``, of the integer columns or
        more; the backend completes the other columns (HiGHS: an LP with these fixed)
        and searches on from it (a hint to OR-tools' backends).

    Returns:
      A :class:`MilpResult`; ``x`` is rounded for integer variables.
    """
    if cutoff is not None and (backend != "HIGHS" or not milp.integer.any()):
        # HiGHS takes a cutoff for integer programs only.
        milp, cutoff = _with_objective_row(milp, cutoff), None
    if backend == "HIGHS":
        result = _solve_highspy(milp, time_limit_s, node_limit, relative_gap, progress, cutoff,
                                start)
    else:
        result = _solve_ortools(milp, backend, time_limit_s, node_limit, relative_gap, start)
    if progress is not None and result.x is not None:
        progress(result.wall_s, result.objective, min(result.bound, result.objective))
    return result


def _with_objective_row(milp: Milp, cutoff: float) -> Milp:
    """``milp`` with the row ``c @ x <= cutoff``."""
    return dataclasses.replace(
        milp, A=sp.vstack([milp.A, sp.csr_matrix(milp.c[None, :])], format="csr"),
        row_lb=np.append(milp.row_lb, -np.inf), row_ub=np.append(milp.row_ub, cutoff))


# HiGHS's light presolve (``presolve_mode`` 2; HiGHS's default is 0). On the unrolled Llama-style
# models of bench/planning_time.py the full presolve's probing took 17.5 of an 18.4 s solve
# (80 layers), and light presolve solves the same MILP to the same optimum in 2.4 s
# (bench/results/planning-time-presolve/).
_PRESOLVE_MODE = 2


def _solve_highspy(milp: Milp, time_limit_s: float | None, node_limit: int | None,
                   relative_gap: float, progress: Progress | None, cutoff: float | None,
                   first: tuple[np.ndarray, np.ndarray] | None) -> MilpResult:
    # The raw binding: the public ``highspy.Highs`` prints HiGHS's banner on stdout when
    # it is made, before output can be switched off.
    h = highspy._Highs()  # pyright: ignore[reportAttributeAccessIssue]
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    h.setOptionValue("presolve_mode", _PRESOLVE_MODE)
    h.setOptionValue("mip_rel_gap", float(relative_gap))
    if time_limit_s is not None:
        h.setOptionValue("time_limit", max(1e-3, float(time_limit_s)))
    if node_limit is not None:
        h.setOptionValue("mip_max_nodes", int(node_limit))
    if cutoff is not None:
        h.setOptionValue("objective_bound", float(cutoff))
    h.passModel(_to_highs_lp(milp))
    if first is not None:
        columns, values = first
        h.setSolution(len(columns), np.asarray(columns, dtype=np.int32),
                      np.asarray(values, dtype=float))
    start = time.perf_counter()
    errors: list[BaseException] = []
    if progress is not None:
        _report_progress(h, progress, start, errors)
    h.run()
    wall_s = time.perf_counter() - start
    if errors:
        raise errors[0]
    status = h.getModelStatus()
    if status in (highspy.HighsModelStatus.kInfeasible,
                  highspy.HighsModelStatus.kUnboundedOrInfeasible):
        return MilpResult(Status.INFEASIBLE, None, math.inf, math.inf, wall_s)
    timed_out = status == highspy.HighsModelStatus.kTimeLimit
    info = h.getInfo()
    bound = float(info.mip_dual_bound) if milp.integer.any() else -math.inf
    if info.primal_solution_status != highspy.SolutionStatus.kSolutionStatusFeasible:
        return MilpResult(Status.NO_SOLUTION, None, math.inf, bound, wall_s, timed_out)
    x = np.asarray(h.getSolution().col_value)
    x = np.where(milp.integer, np.round(x), x)
    objective = float(milp.c @ x)
    if cutoff is not None and objective > cutoff + 1e-9 * max(1.0, abs(cutoff)):
        # HiGHS may hold a solution above its cutoff, found outside the search it prunes.
        if status == highspy.HighsModelStatus.kOptimal:
            return MilpResult(Status.INFEASIBLE, None, math.inf, math.inf, wall_s)
        return MilpResult(Status.NO_SOLUTION, None, math.inf, bound, wall_s, timed_out)
    if status == highspy.HighsModelStatus.kOptimal:
        return MilpResult(Status.OPTIMAL, x, objective, objective, wall_s)
    return MilpResult(Status.FEASIBLE, x, objective, bound, wall_s, timed_out)


def _to_highs_lp(milp: Milp) -> object:
    A = milp.A.tocsc()
    A.sort_indices()
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = A.shape[1], A.shape[0]  # pyright: ignore[reportOptionalSubscript]
    lp.col_cost_ = np.asarray(milp.c, dtype=float)
    lp.col_lower_ = np.asarray(milp.var_lb, dtype=float)
    lp.col_upper_ = np.asarray(milp.var_ub, dtype=float)
    lp.row_lower_ = np.asarray(milp.row_lb, dtype=float)
    lp.row_upper_ = np.asarray(milp.row_ub, dtype=float)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = A.indptr.astype(np.int32)
    lp.a_matrix_.index_ = A.indices.astype(np.int32)
    lp.a_matrix_.value_ = A.data.astype(float)
    if milp.integer.any():
        lp.integrality_ = [highspy.HighsVarType.kInteger if b else
                           highspy.HighsVarType.kContinuous for b in milp.integer]
    return lp


def _report_progress(h: Any, progress: Progress, start: float,
                     errors: list[BaseException]) -> None:
    """Calls ``progress`` from HiGHS's callbacks: at each better solution, and at most every
    :data:`_PROGRESS_INTERVAL_S` otherwise. An exception (Ctrl-C included) interrupts the
    solve and is left in ``errors``."""
    kinds = highspy.cb.HighsCallbackType
    last = -math.inf

    def on_event(kind: object, message: str, out: Any, into: Any, data: object) -> None:
        nonlocal last
        now = time.perf_counter()
        improving = kind == kinds.kCallbackMipImprovingSolution
        best = out.objective_function_value if improving else out.mip_primal_bound
        if not errors and math.isfinite(best) and (improving or
                                                   now - last >= _PROGRESS_INTERVAL_S):
            last = now
            try:
                progress(now - start, best, min(out.mip_dual_bound, best))
            except BaseException as e:  # noqa: BLE001 - raised again after the solve
                errors.append(e)
        if errors and into is not None:
            into.user_interrupt = True

    h.setCallback(on_event, None)
    h.startCallback(kinds.kCallbackMipImprovingSolution)
    h.startCallback(kinds.kCallbackMipInterrupt)


def _solve_ortools(milp: Milp, backend: str, time_limit_s: float | None,
                   node_limit: int | None, relative_gap: float,
                   first: tuple[np.ndarray, np.ndarray] | None) -> MilpResult:
    solver = pywraplp.Solver.CreateSolver(backend)
    if solver is None:
        raise ValueError(f"OR-tools has no MIP backend {backend!r}; use 'HIGHS', 'SCIP' or 'CBC'")
    err = solver.LoadModelFromProto(_to_proto(milp))
    if err:
        raise RuntimeError(f"OR-tools rejected the model: {err}")
    solver.SuppressOutput()
    if first is not None:
        variables = solver.variables()
        solver.SetHint([variables[int(j)] for j in first[0]], [float(v) for v in first[1]])
    if backend == "HIGHS":  # its banner ignores SuppressOutput
        solver.SetSolverSpecificParametersAsString("output_flag=false\n")
    if backend == "SCIP" and node_limit is not None:
        solver.SetSolverSpecificParametersAsString(f"limits/nodes = {int(node_limit)}\n")
    solver.SetNumThreads(1)
    if time_limit_s is not None:
        solver.SetTimeLimit(max(1, int(time_limit_s * 1000)))
    params = pywraplp.MPSolverParameters()
    params.SetDoubleParam(pywraplp.MPSolverParameters.RELATIVE_MIP_GAP, relative_gap)
    start = time.perf_counter()
    code = solver.Solve(params)
    wall_s = time.perf_counter() - start
    if code == pywraplp.Solver.INFEASIBLE:
        return MilpResult(Status.INFEASIBLE, None, math.inf, math.inf, wall_s)
    # pywraplp does not say which limit stopped a search: the clock tells.
    timed_out = (code != pywraplp.Solver.OPTIMAL and time_limit_s is not None
                 and wall_s >= 0.99 * time_limit_s)
    if code not in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
        return MilpResult(Status.NO_SOLUTION, None, math.inf, -math.inf, wall_s, timed_out)
    x = np.array([v.solution_value() for v in solver.variables()])
    x = np.where(milp.integer, np.round(x), x)
    objective = float(milp.c @ x)
    if code == pywraplp.Solver.OPTIMAL:
        return MilpResult(Status.OPTIMAL, x, objective, objective, wall_s)
    bound = float(solver.Objective().BestBound())
    return MilpResult(Status.FEASIBLE, x, objective, bound, wall_s, timed_out)
