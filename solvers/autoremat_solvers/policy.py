"""The policy-level remat problem: save or recompute each value, under a peak-memory budget.

This is the model autoremat plans with, stated over plain arrays so that it can be
solved, checked and compared without JAX. Values belong to *regions* (one
``jax.checkpoint`` each) numbered in program order. The backward pass visits regions
in reverse; at region ``i``'s backward and forward stages the memory in use is::

    base[i] + sum(held[v] * save[v] for v in regions <= i)
            + sum(transient[v] * recompute[v] for v in region i)
    forward_base[i] + sum(held[v] * save[v] for v in regions < i)
                    + sum(forward_held[v] * save[v] for v in region i)

(the values saved so far stay until their region's backward has run; the values region
``i`` recomputes are live together during its backward). The plan's peak is the largest
stage. Feasibility:

* a value the backward reads (``must_cover``) is saved or recomputed;
* a value another region reads (``must_save``) is saved;
* a recomputed value's inputs are saved or, within its region, recomputed too; an input
  from another region must be saved (a region cannot recompute another's values).

The objective is the total recompute cost. The integer program has ``2V + R`` variables
and ``O(V + E + R)`` nonzeros, built from arrays (``shared/notes/remat-facts.md`` §4).
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import scipy.sparse as sp

from autoremat_solvers.milp import Milp, MilpResult, MilpStatus, solve_milp

__all__ = ["PolicyProblem", "PolicyResult", "evaluate", "prune", "solve", "solve_min_peak",
           "stage_bytes", "violations"]


@dataclasses.dataclass(frozen=True, eq=False)
class PolicyProblem:
    """A policy-level remat problem over ``V`` values and ``R`` regions (see module doc).

    Attributes:
      cost: recompute cost of each value (all its instances).
      held: bytes kept from the value's region's stage on if it is saved.
      transient: bytes live during its region's backward stage if it is recomputed.
      region: region of each value, ``0..R-1`` in program order.
      base: bytes in use at each region's backward stage whatever the plan.
      forward_base: bytes in use at each region's forward stage whatever the plan.
      forward_held: bytes a saved value adds to its own region's forward stage (beyond
        what ``forward_base`` already counts).
      must_cover, must_save, can_save, can_recompute: boolean masks.
      edges: ``(E, 2)`` array of ``(input, consumer)`` value indices.
    """

    cost: np.ndarray
    held: np.ndarray
    transient: np.ndarray
    region: np.ndarray
    base: np.ndarray
    forward_base: np.ndarray
    forward_held: np.ndarray
    must_cover: np.ndarray
    must_save: np.ndarray
    can_save: np.ndarray
    can_recompute: np.ndarray
    edges: np.ndarray

    @property
    def num_values(self) -> int:
        return len(self.cost)

    @property
    def num_regions(self) -> int:
        return len(self.base)


@dataclasses.dataclass(frozen=True, eq=False)
class PolicyResult:
    """A solve's outcome; ``save``/``recompute`` are ``None`` when no plan was found."""

    status: MilpStatus
    save: np.ndarray | None
    recompute: np.ndarray | None
    cost: float
    peak: int
    bound: float
    gap: float
    wall_s: float


def stage_bytes(problem: PolicyProblem, save: np.ndarray, recompute: np.ndarray) -> np.ndarray:
    """Bytes in use at each region's backward stage, then at each forward stage, in exact
    integer arithmetic."""
    R = problem.num_regions
    held = np.zeros(R, dtype=object)
    own = np.zeros(R, dtype=object)
    trans = np.zeros(R, dtype=object)
    for v in np.flatnonzero(save):
        held[problem.region[v]] += int(problem.held[v])
        own[problem.region[v]] += int(problem.forward_held[v])
    for v in np.flatnonzero(recompute):
        trans[problem.region[v]] += int(problem.transient[v])
    as_int = lambda a: np.array([int(b) for b in a], dtype=object)
    before = np.cumsum(held) - held
    return np.concatenate([as_int(problem.base) + before + held + trans,
                           as_int(problem.forward_base) + before + own])


def evaluate(problem: PolicyProblem, save: np.ndarray, recompute: np.ndarray) -> tuple[float, int]:
    """``(recompute cost, peak bytes)`` of a plan."""
    peak = int(max(stage_bytes(problem, save, recompute), default=0))
    return float(problem.cost[recompute.astype(bool)].sum()), peak


def violations(problem: PolicyProblem, save: np.ndarray, recompute: np.ndarray) -> list[str]:
    """Every feasibility rule the plan breaks (empty when it is valid); budget not checked."""
    s, r = save.astype(bool), recompute.astype(bool)
    out = []
    for v in np.flatnonzero(problem.must_cover & ~s & ~r):
        out.append(f"value {v} is read by the backward pass but neither saved nor recomputed")
    for v in np.flatnonzero(problem.must_save & ~s):
        out.append(f"value {v} is read by another region but not saved")
    for v in np.flatnonzero(s & ~problem.can_save):
        out.append(f"value {v} cannot be saved")
    for v in np.flatnonzero(r & ~problem.can_recompute):
        out.append(f"value {v} cannot be recomputed")
    for u, v in problem.edges:
        same = problem.region[u] == problem.region[v]
        if r[v] and not (s[u] or (same and r[u])):
            out.append(f"value {v} is recomputed but its input {u} is not available")
    return out


def prune(problem: PolicyProblem, save: np.ndarray, recompute: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray]:
    """Drops saves and recomputes that nothing reads (a solver may leave them in)."""
    s = save.astype(bool).copy()
    r = recompute.astype(bool) & ~s
    same_region_readers: dict[int, list[int]] = {}
    readers: dict[int, list[int]] = {}
    for u, v in problem.edges:
        readers.setdefault(int(u), []).append(int(v))
        if problem.region[u] == problem.region[v]:
            same_region_readers.setdefault(int(u), []).append(int(v))
    # Readers come after their inputs (values are in program order): sweep backwards.
    for v in range(problem.num_values - 1, -1, -1):
        if r[v] and not problem.must_cover[v]:
            r[v] = any(r[w] for w in same_region_readers.get(v, ()))
    for v in np.flatnonzero(s):
        if not (problem.must_cover[v] or problem.must_save[v]):
            s[v] = any(r[w] for w in readers.get(int(v), ()))
    return s, r


def _memory_unit(problem: PolicyProblem) -> float:
    return float(max(1, problem.held.max(initial=1), problem.transient.max(initial=1)))


def _cost_unit(problem: PolicyProblem) -> float:
    return max(1.0, float(problem.cost.max(initial=1.0)))


def _model(problem: PolicyProblem, budget: float | None) -> Milp:
    """Variables ``[save (V), recompute (V), held per region (R), peak (1)]``."""
    V, R = problem.num_values, problem.num_regions
    n = 2 * V + R + 1
    S, Rv, H, P = 0, V, 2 * V, 2 * V + R
    rows, cols, vals, lo, hi = [], [], [], [], []

    def add_rows(row_ids: np.ndarray, col_ids: np.ndarray, coefs: np.ndarray) -> None:
        rows.append(row_ids), cols.append(col_ids), vals.append(coefs.astype(float))

    m = 0
    cover = np.flatnonzero(problem.must_cover)
    k = len(cover)
    add_rows(np.tile(m + np.arange(k), 2), np.concatenate([S + cover, Rv + cover]), np.ones(2 * k))
    lo.append(np.ones(k)), hi.append(np.full(k, np.inf))
    m += k

    u, v = problem.edges[:, 0], problem.edges[:, 1]
    E = len(u)
    same = problem.region[u] == problem.region[v]
    e_rows = m + np.arange(E)
    add_rows(e_rows, Rv + v, np.ones(E))
    add_rows(e_rows, S + u, -np.ones(E))
    add_rows(e_rows[same], Rv + u[same], -np.ones(int(same.sum())))
    lo.append(np.full(E, -np.inf)), hi.append(np.zeros(E))
    m += E

    # Memory rows in units of the largest value, objective in units of the largest cost:
    # coefficients near 1 keep the solver's tolerances meaningful (bytes reach 1e10).
    unit = _memory_unit(problem)
    vals_idx = np.arange(V)
    add_rows(m + problem.region, S + vals_idx, -problem.held / unit)
    add_rows(m + np.arange(R), H + np.arange(R), np.ones(R))
    lo.append(np.zeros(R)), hi.append(np.zeros(R))
    m += R

    stages = (
        (problem.base, np.tril_indices(R), problem.held, problem.transient),
        (problem.forward_base, np.tril_indices(R, -1), problem.forward_held, None),
    )
    for stage_base, (tri_r, tri_c), own, transient in stages:
        add_rows(m + tri_r, H + tri_c, np.ones(len(tri_r)))
        own_held = own.astype(float) if own is not problem.held else None
        if own_held is not None:
            add_rows(m + problem.region, S + vals_idx, own_held / unit)
        if transient is not None:
            add_rows(m + problem.region, Rv + vals_idx, transient / unit)
        base = stage_base / unit
        if budget is None:
            add_rows(m + np.arange(R), np.full(R, P), -np.ones(R))
            lo.append(np.full(R, -np.inf)), hi.append(-base)
        else:
            lo.append(np.full(R, -np.inf)), hi.append(budget / unit - base)
        m += R

    A = sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                      shape=(m, n))
    c = np.zeros(n)
    if budget is None:
        c[P] = 1.0
    else:
        c[Rv:Rv + V] = problem.cost / _cost_unit(problem)
    var_lb = np.concatenate([problem.must_save.astype(float), np.zeros(V + R + 1)])
    var_ub = np.concatenate([problem.can_save.astype(float), problem.can_recompute.astype(float),
                             np.full(R + 1, np.inf)])
    integer = np.concatenate([np.ones(2 * V, bool), np.zeros(R + 1, bool)])
    return Milp(c, A, np.concatenate(lo), np.concatenate(hi), var_lb, var_ub, integer)


def _result(problem: PolicyProblem, milp_result: MilpResult, bound_unit: float) -> PolicyResult:
    V = problem.num_values
    bound = milp_result.bound * bound_unit
    if milp_result.x is None:
        return PolicyResult(milp_result.status, None, None, np.inf, 0, bound, np.inf,
                            milp_result.wall_s)
    save, recompute = prune(problem, milp_result.x[:V] > 0.5, milp_result.x[V:2 * V] > 0.5)
    cost, peak = evaluate(problem, save, recompute)
    return PolicyResult(milp_result.status, save, recompute, cost, peak, bound,
                        milp_result.gap, milp_result.wall_s)


def solve(problem: PolicyProblem, budget: int, *, time_limit_s: float = 60.0,
          relative_gap: float = 1e-4, backends: tuple[str, ...] = ("HIGHS", "SCIP")
          ) -> PolicyResult:
    """The least-recompute plan whose peak is at most ``budget`` bytes.

    The backends are tried in turn, sharing ``time_limit_s``, until one proves its plan
    optimal (within ``relative_gap``) or infeasibility; otherwise the cheapest plan found
    is returned with status ``FEASIBLE``. An ``INFEASIBLE`` result's ``peak`` is the
    smallest peak any plan reaches (the budget to ask for instead). (Measured on GPT-2-small: each of HiGHS and
    SCIP sometimes stalls on a budget the other solves in seconds.) When no backend found
    a plan but the budget is at least the smallest feasible peak, the min-peak plan is
    returned as a last resort.
    """
    start = time.perf_counter()
    best: PolicyResult | None = None
    share = time_limit_s / len(backends)
    for backend in backends:
        res = _solve_within_budget(problem, budget, share, relative_gap, backend)
        if res.status is MilpStatus.OPTIMAL:
            return dataclasses.replace(res, wall_s=time.perf_counter() - start)
        if res.status is MilpStatus.INFEASIBLE:
            break
        if res.save is not None and (best is None or res.cost < best.cost):
            best = res
    if best is None:
        floor = solve_min_peak(problem, time_limit_s=share, backend=backends[0])
        if floor.save is None or floor.peak > budget:
            proven = floor.status is MilpStatus.OPTIMAL
            status = MilpStatus.INFEASIBLE if proven else MilpStatus.NO_SOLUTION
            return dataclasses.replace(floor, status=status, save=None, recompute=None,
                                       wall_s=time.perf_counter() - start)
        best = floor
    return dataclasses.replace(best, status=MilpStatus.FEASIBLE,
                               wall_s=time.perf_counter() - start)


def _solve_within_budget(problem: PolicyProblem, budget: int, time_limit_s: float,
                         relative_gap: float, backend: str) -> PolicyResult:
    margin = 0
    for _ in range(4):
        res = _result(problem, solve_milp(_model(problem, budget - margin), backend=backend,
                                          time_limit_s=time_limit_s, relative_gap=relative_gap),
                      _cost_unit(problem))
        # The solver's feasibility tolerance is relative; the exact peak decides.
        if res.save is None or res.peak <= budget:
            return res
        margin += res.peak - budget
    raise RuntimeError("solver kept returning plans over the budget")


def solve_min_peak(problem: PolicyProblem, *, time_limit_s: float | None = None,
                   backend: str = "HIGHS") -> PolicyResult:
    """A plan with the smallest peak the model allows (recompute cost not minimized)."""
    milp = _model(problem, None)
    unit = _memory_unit(problem)
    return _result(problem, solve_milp(milp, backend=backend, time_limit_s=time_limit_s), unit)
