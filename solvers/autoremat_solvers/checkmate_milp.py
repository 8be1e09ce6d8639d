"""Checkmate's optimal rematerialization MILP (Jain et al., MLSys 2020), in array form.

Stage ``t`` of ``T = n`` stages must compute node ``t`` (the frontier-advancing partition),
so ``R`` is lower triangular with a unit diagonal and ``S`` strictly lower triangular.
Variables: ``R[t, i]`` (compute), ``S[t, i]`` (keep into stage ``t``), ``FREE[t, (i, k)]``
(free ``i`` after computing ``k`` in stage ``t``, for edges and self-edges ``(k, k)``), and
continuous ``U[t, k]`` (bytes in memory right after computing ``k`` in stage ``t``):

- ``R[t, k] <= R[t, i] + S[t, i]`` for each edge ``(i, k)``;
- ``S[t, i] <= R[t-1, i] + S[t-1, i]``;
- ``U[t, 0] = ram_0 R[t, 0] + sum_i ram_i S[t, i]``,
  ``U[t, k+1] = U[t, k] + ram_{k+1} R[t, k+1] - sum_{(i,k)} ram_i FREE[t, (i, k)]``;
- ``FREE[t, (i, k)] = R[t, k] (1 - S[t+1, i]) prod_{j in users(i), k < j <= t} (1 - R[t, j])``,
  linearized by counting "hazards";
- ``0 <= U <= budget``; minimize ``sum cost_i R[t, i]``.

Memory is scaled by the largest value size so that coefficients are O(1).
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import scipy.sparse as sp
from autoremat_ilp import Milp, solve_milp

from autoremat_solvers.base import SolverResult
from autoremat_solvers.graph import ComputeGraph
from autoremat_solvers.schedule import Schedule

__all__ = ["CheckmateModel", "build_checkmate_milp", "solve"]

def _tri(t: np.ndarray, i: np.ndarray) -> np.ndarray:
    """Index of ``(t, i)``, ``i <= t``, in a row-major lower triangle with diagonal."""
    return t * (t + 1) // 2 + i


def _strict(t: np.ndarray, i: np.ndarray) -> np.ndarray:
    """Index of ``(t, i)``, ``i < t``, in a row-major strictly lower triangle."""
    return t * (t - 1) // 2 + i


@dataclasses.dataclass(frozen=True, eq=False)
class CheckmateModel:
    """The MILP and where its ``R`` and ``S`` variables live."""

    milp: Milp
    n: int

    @property
    def _s_offset(self) -> int:
        return self.n * (self.n + 1) // 2

    def matrices(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The ``(n, n)`` matrices ``R`` and ``S`` of a solution vector (fractional for an LP)."""
        t, i = np.tril_indices(self.n)
        R = np.zeros((self.n, self.n))
        R[t, i] = x[_tri(t, i)]
        t, i = np.tril_indices(self.n, -1)
        S = np.zeros((self.n, self.n))
        S[t, i] = x[self._s_offset + _strict(t, i)]
        return R, S


class _Rows:
    """Accumulates COO triplets and row bounds."""

    def __init__(self) -> None:
        self.rows: list[np.ndarray] = []
        self.cols: list[np.ndarray] = []
        self.vals: list[np.ndarray] = []
        self.lb: list[np.ndarray] = []
        self.ub: list[np.ndarray] = []
        self.count = 0

    def new(self, k: int, lb: np.ndarray | float, ub: np.ndarray | float) -> int:
        """Reserves ``k`` rows; returns the first row's index."""
        first = self.count
        self.count += k
        self.lb.append(np.broadcast_to(np.asarray(lb, dtype=float), (k,)))
        self.ub.append(np.broadcast_to(np.asarray(ub, dtype=float), (k,)))
        return first

    def add(self, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray | float) -> None:
        rows = np.asarray(rows)
        self.rows.append(rows)
        self.cols.append(np.asarray(cols))
        self.vals.append(np.broadcast_to(np.asarray(vals, dtype=float), rows.shape))

    def matrix(self, n_vars: int) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray]:
        A = sp.csr_matrix(
            (np.concatenate(self.vals), (np.concatenate(self.rows), np.concatenate(self.cols))),
            shape=(self.count, n_vars),
        )
        return A, np.concatenate(self.lb), np.concatenate(self.ub)


def build_checkmate_milp(
    graph: ComputeGraph, budget: float, *, integer: bool = True
) -> CheckmateModel:
    """Builds Checkmate's MILP (or, with ``integer=False``, its LP relaxation)."""
    n = graph.n
    ram = np.asarray(graph.ram, dtype=float) / max(1, max(graph.ram))
    budget_scaled = budget / max(1, max(graph.ram))
    edges = np.asarray(graph.edges, dtype=np.int64).reshape(-1, 2)
    eu, ek = edges[:, 0], edges[:, 1]
    # Edges plus self-edges (k, k), sorted by target: FREE[t, e] exists for k_e <= t.
    ext = np.concatenate([edges, np.repeat(np.arange(n), 2).reshape(-1, 2)])
    ext = ext[np.lexsort((ext[:, 0], ext[:, 1]))]
    xu, xk = ext[:, 0], ext[:, 1]
    per_k = np.bincount(xk, minlength=n)
    edges_upto = np.cumsum(per_k)  # ext edges with target <= t
    ext_start = np.concatenate([[0], edges_upto[:-1]])  # first ext edge with target k

    n_tri = n * (n + 1) // 2
    r_off, s_off, u_off = 0, n_tri, n_tri + n * (n - 1) // 2
    f_off = u_off + n_tri
    f_start = np.concatenate([[0], np.cumsum(edges_upto)[:-1]])  # FREE[t, 0] relative index
    n_vars = f_off + int(edges_upto.sum())

    def R(t, i):
        return r_off + _tri(t, i)

    def S(t, i):
        return s_off + _strict(t, i)

    def U(t, k):
        return u_off + _tri(t, k)

    def F(t, e):
        return f_off + f_start[t] + e

    rows = _Rows()
    # Dependencies: R[t, k] - R[t, i] - S[t, i] <= 0 for edges (i, k), k <= t.
    tt, ee = np.nonzero(ek[None, :] <= np.arange(n)[:, None])
    first = rows.new(len(tt), -np.inf, 0.0)
    row = first + np.arange(len(tt))
    rows.add(row, R(tt, ek[ee]), 1.0)
    rows.add(row, R(tt, eu[ee]), -1.0)
    rows.add(row, S(tt, eu[ee]), -1.0)
    # Storage: S[t, i] - R[t-1, i] - S[t-1, i] <= 0.
    tt, ii = np.tril_indices(n, -1)
    first = rows.new(len(tt), -np.inf, 0.0)
    row = first + np.arange(len(tt))
    rows.add(row, S(tt, ii), 1.0)
    rows.add(row, R(tt - 1, ii), -1.0)
    prev = ii < tt - 1
    rows.add(row[prev], S(tt[prev] - 1, ii[prev]), -1.0)
    # Memory at stage start: U[t, 0] - ram_0 R[t, 0] - sum_i ram_i S[t, i] = 0.
    ts = np.arange(n)
    first = rows.new(n, 0.0, 0.0)
    rows.add(first + ts, U(ts, 0), 1.0)
    rows.add(first + ts, R(ts, 0), -ram[0])
    rows.add(first + tt, S(tt, ii), -ram[ii])
    # Memory recurrence: U[t, k+1] - U[t, k] - ram_{k+1} R[t, k+1] + sum ram_i FREE[t, (i, k)] = 0.
    tt, kk = np.tril_indices(n, -1)
    first = rows.new(len(tt), 0.0, 0.0)
    row = first + np.arange(len(tt))
    rows.add(row, U(tt, kk + 1), 1.0)
    rows.add(row, U(tt, kk), -1.0)
    rows.add(row, R(tt, kk + 1), -ram[kk + 1])
    reps = per_k[kk]
    e_idx = np.repeat(ext_start[kk], reps) + (
        np.arange(reps.sum()) - np.repeat(np.cumsum(reps) - reps, reps)
    )
    t_rep = np.repeat(tt, reps)
    rows.add(np.repeat(row, reps), F(t_rep, e_idx), ram[xu[e_idx]])
    # FREE[t, (i, k)] = 1 iff no hazard: R[t, k] = 0, S[t+1, i] = 1, or a later user of i computed.
    for e, (i, k) in enumerate(ext):
        ts = np.arange(k, n)
        users = np.asarray([j for j in graph.succs[i] if j > k], dtype=np.int64)
        has_next = ts < n - 1
        max_hazards = 1 + has_next + np.searchsorted(users, ts, side="right")
        up = rows.new(len(ts), -np.inf, 0.0)  # 1 - FREE <= hazards
        lo = rows.new(len(ts), -np.inf, max_hazards - 1)  # max_hazards (1 - FREE) >= hazards
        for first, sign in ((up, 1.0), (lo, -1.0)):
            row = first + ts - k
            rows.add(row, R(ts, k), sign)
            rows.add(row[has_next], S(ts[has_next] + 1, i), -sign)
            for j in users:
                rows.add(row[j - k :], R(ts[j - k :], j), -sign)
        rows.add(up + ts - k, F(ts, e), -1.0)
        rows.add(lo + ts - k, F(ts, e), max_hazards.astype(float))

    A, row_lb, row_ub = rows.matrix(n_vars)
    c = np.zeros(n_vars)
    tt, ii = np.tril_indices(n)
    c[R(tt, ii)] = np.asarray(graph.cost)[ii]
    var_lb = np.zeros(n_vars)
    var_lb[R(np.arange(n), np.arange(n))] = 1.0
    var_ub = np.ones(n_vars)
    var_ub[u_off : u_off + n_tri] = budget_scaled
    is_int = np.full(n_vars, integer)
    is_int[u_off : u_off + n_tri] = False
    return CheckmateModel(Milp(c, A, row_lb, row_ub, var_lb, var_ub, is_int), n)


def solve(
    graph: ComputeGraph,
    budget: float,
    time_limit_s: float | None = None,
    *,
    backend: str = "HIGHS",
    relative_gap: float = 1e-4,
) -> SolverResult:
    """Solves Checkmate's MILP; budgets below the memory floor are rejected without a solve.

    Args:
      graph: the graph.
      budget: memory budget in bytes.
      time_limit_s: MILP time limit (model building is not counted).
      backend: OR-tools MIP backend, see :func:`solve_milp`.
      relative_gap: stop at this relative optimality gap.

    Returns:
      The best schedule found, its cost and the solver's proven lower bound.
    """
    start = time.perf_counter()
    if budget < graph.memory_floor():
        return SolverResult.below_floor(time.perf_counter() - start)
    model = build_checkmate_milp(graph, budget)
    res = solve_milp(
        model.milp, backend=backend, time_limit_s=time_limit_s, relative_gap=relative_gap
    )
    schedule = None
    if res.x is not None:
        R, S = model.matrices(res.x)
        schedule = Schedule(R > 0.5, S > 0.5)
    return SolverResult(schedule, res.status, res.objective, res.bound, time.perf_counter() - start)

