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
``i`` recomputes are live together during its backward). Nested regions (optional, off
unless the problem sets ``nest``): regions sharing a ``nest`` id form a group run inside
one more checkpoint that keeps only the group's inputs, its forward run again when its
backward starts; their saved values are then held only at the backward stages of their
group's regions ``>=`` their own (the sums above skip them elsewhere). The plan's peak is the largest
stage. Feasibility:

* a value the backward reads (``must_cover``) is saved or recomputed;
* a value another region reads (``must_save``) is saved;
* a recomputed value's inputs are saved or, within its region, recomputed too; an input
  from another region must be saved (a region cannot recompute another's values).

Reserved buffers (optional, off unless the problem sets ``unshared``): buffers that exist
for the whole step (the compiler allocates the step's outputs apart, whatever their live
range) but can hold any value that fits in one of them and is dead by the time it is
written. Each stage then also has a second bound, ``reserved_base[i]`` (backward) or
``reserved_forward_base[i]`` (forward), plus the same terms restricted to the values in
``unshared`` (those that fit in no reserved buffer): a stage's bytes are the larger of
the two (the values that fit are taken to pack into the reserved buffers perfectly).

The objective is the total recompute cost. The integer program has ``2V + R`` variables
and ``O(V + E + R)`` nonzeros, built from arrays (``shared/notes/remat-facts.md`` §4).

Host offload (optional, off unless the problem sets ``can_offload``): a third choice per
value, exclusive with saving. An offloaded value is copied to host memory in its region's
forward pass and brought back for its region's backward pass; it occupies device memory
only around those two transfers, so it adds ``offload_forward[v]`` to its region's forward
stage and ``offload_backward[v]`` to its region's backward stage and nothing to the stages
in between (where a saved value adds ``held[v]``). Only values no other region reads can
be offloaded (an input of another region is saved by that region's checkpoint itself).
With offload the rules become: a value the backward reads is saved, offloaded or
recomputed; a recomputed value's input is saved, or, within its region, recomputed or
offloaded; ``sum(held[v] * offload[v]) <= host_budget``; and ``offload_cost[v]`` (the
transfer time the step cannot hide, in the units of ``cost``) joins the objective. The
program gains ``V`` binaries and ``V + 1`` rows.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
import scipy.sparse as sp

from autoremat_solvers.milp import Milp, MilpResult, MilpStatus, Progress, solve_milp

__all__ = ["PolicyProblem", "PolicyResult", "evaluate", "host_bytes", "prune", "prune_offload",
           "solve", "solve_min_peak", "stage_bytes", "violations"]


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
      nest: per region, the nested group it belongs to (``-1``: none); ``None`` (the
        default): no nesting.
      must_cover, must_save, can_save, can_recompute: boolean masks.
      edges: ``(E, 2)`` array of ``(input, consumer)`` value indices.
      can_offload: boolean mask of the values that may be offloaded to host memory;
        ``None`` (the default) disables offload and leaves the model exactly as without it.
      offload_cost: cost of offloading each value (same units as ``cost``).
      offload_forward: bytes an offloaded value adds to its region's forward stage.
      offload_backward: bytes an offloaded value adds to its region's backward stage.
      host_budget: most bytes offloaded values may occupy in host memory (an offloaded
        value takes ``held[v]`` there).
      reserved_base, reserved_forward_base, unshared: the second bound on each stage
        (see "Reserved buffers" in the module doc): its bytes whatever the plan, with the
        reserved buffers, at each backward and forward stage, and the mask of the values
        that cannot share them. ``None`` (the default): no second bound.
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
    can_offload: np.ndarray | None = None
    offload_cost: np.ndarray | None = None
    offload_forward: np.ndarray | None = None
    offload_backward: np.ndarray | None = None
    host_budget: float = math.inf
    reserved_base: np.ndarray | None = None
    reserved_forward_base: np.ndarray | None = None
    unshared: np.ndarray | None = None
    nest: np.ndarray | None = None

    @property
    def num_values(self) -> int:
        return len(self.cost)

    @property
    def offloading(self) -> bool:
        """Whether any value may be offloaded (the model then has offload variables)."""
        return self.can_offload is not None and bool(np.any(self.can_offload))

    @property
    def num_regions(self) -> int:
        return len(self.base)


@dataclasses.dataclass(frozen=True, eq=False)
class PolicyResult:
    """A solve's outcome; ``save``/``recompute`` are ``None`` when no plan was found.
    ``offload`` is the offload mask when the problem allows offload, else ``None``."""

    status: MilpStatus
    save: np.ndarray | None
    recompute: np.ndarray | None
    cost: float
    peak: int
    bound: float
    gap: float
    wall_s: float
    offload: np.ndarray | None = None


def _no_offload(problem: PolicyProblem, offload: np.ndarray | None) -> np.ndarray:
    if offload is None:
        return np.zeros(problem.num_values, dtype=bool)
    return offload.astype(bool)


def stage_bytes(problem: PolicyProblem, save: np.ndarray, recompute: np.ndarray,
                offload: np.ndarray | None = None) -> np.ndarray:
    """Bytes in use at each region's backward stage, then at each forward stage, in exact
    integer arithmetic."""
    trans = _by_region(problem, recompute.astype(bool), problem.transient)
    offloaded = _no_offload(problem, offload)
    trans += _by_region(problem, offloaded, problem.offload_backward)
    saved = save.astype(bool)
    held, own = _held_by_region(problem, saved)
    own += _by_region(problem, offloaded, problem.offload_forward)
    stages = _stages(problem, problem.base, problem.forward_base, held, own, trans)
    if problem.unshared is None:
        return stages
    rheld, rown = _held_by_region(problem, saved & problem.unshared)
    return np.maximum(stages, _stages(problem, problem.reserved_base,
                                      problem.reserved_forward_base, rheld, rown, trans))


def _windows(problem: PolicyProblem) -> tuple[np.ndarray, np.ndarray]:
    """``(backward, forward)``: ``[i, j]`` is whether region ``j``'s saved values are held
    at region ``i``'s backward (forward) stage."""
    R = problem.num_regions
    backward, forward = np.tri(R, dtype=bool), np.tri(R, k=-1, dtype=bool)
    if problem.nest is None:
        return backward, forward
    nested = problem.nest >= 0
    same = problem.nest[:, None] == problem.nest[None, :]
    return backward & (~nested[None, :] | same), forward & ~nested[None, :]


def _by_region(problem: PolicyProblem, mask: np.ndarray, nbytes: np.ndarray | None
               ) -> np.ndarray:
    """Per region, the total of ``nbytes`` over the values in ``mask`` (exact Python
    integers; zeros where ``nbytes`` is ``None``)."""
    total = np.zeros(problem.num_regions, dtype=object)
    if nbytes is not None:
        for v in np.flatnonzero(mask):
            total[problem.region[v]] += int(nbytes[v])
    return total


def _held_by_region(problem: PolicyProblem, saved: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per region, the bytes the ``saved`` values hold to the end of its backward, and
    those they hold at its forward stage (exact Python integers)."""
    return (_by_region(problem, saved, problem.held),
            _by_region(problem, saved, problem.forward_held))


def _stages(problem: PolicyProblem, base: np.ndarray, forward_base: np.ndarray,
            held: np.ndarray, own: np.ndarray, trans: np.ndarray) -> np.ndarray:
    """Backward then forward stage bytes: a stage's base, what the regions whose saved
    values it holds hold, and the region's own (forward) and recomputed (backward) values."""
    as_int = lambda a: np.array([int(b) for b in a], dtype=object)
    backward, forward = _windows(problem)
    over = lambda window: np.array([sum(held[window[i]], 0) for i in range(len(held))],
                                   dtype=object)
    return np.concatenate([as_int(base) + over(backward) + trans,
                           as_int(forward_base) + over(forward) + own])


def evaluate(problem: PolicyProblem, save: np.ndarray, recompute: np.ndarray,
             offload: np.ndarray | None = None) -> tuple[float, int]:
    """``(cost, peak bytes)`` of a plan: recompute cost plus offload cost."""
    peak = int(max(stage_bytes(problem, save, recompute, offload), default=0))
    cost = float(problem.cost[recompute.astype(bool)].sum())
    if offload is not None and offload.any():
        cost += float(problem.offload_cost[offload.astype(bool)].sum())
    return cost, peak


def host_bytes(problem: PolicyProblem, offload: np.ndarray | None) -> int:
    """Bytes the plan's offloaded values occupy in host memory."""
    return int(sum(int(problem.held[v]) for v in np.flatnonzero(_no_offload(problem, offload))))


def violations(problem: PolicyProblem, save: np.ndarray, recompute: np.ndarray,
               offload: np.ndarray | None = None) -> list[str]:
    """Every feasibility rule the plan breaks (empty when it is valid); the device budget
    is not checked, the host budget is."""
    s, r, o = save.astype(bool), recompute.astype(bool), _no_offload(problem, offload)
    out = []
    for v in np.flatnonzero(problem.must_cover & ~s & ~r & ~o):
        out.append(f"value {v} is read by the backward pass but neither saved nor recomputed"
                   + (" nor offloaded" if o.any() else ""))
    can_offload = (problem.can_offload if problem.can_offload is not None
                   else np.zeros(problem.num_values, dtype=bool))
    for v in np.flatnonzero(o & ~can_offload):
        out.append(f"value {v} cannot be offloaded")
    for v in np.flatnonzero(o & s):
        out.append(f"value {v} is both saved and offloaded")
    if o.any() and host_bytes(problem, o) > problem.host_budget:
        out.append(f"offloaded values take {host_bytes(problem, o)} bytes of host memory, over "
                   f"the host budget of {problem.host_budget:.0f}")
    for v in np.flatnonzero(problem.must_save & ~s):
        out.append(f"value {v} is read by another region but not saved")
    for v in np.flatnonzero(s & ~problem.can_save):
        out.append(f"value {v} cannot be saved")
    for v in np.flatnonzero(r & ~problem.can_recompute):
        out.append(f"value {v} cannot be recomputed")
    for u, v in problem.edges:
        same = problem.region[u] == problem.region[v]
        if r[v] and not (s[u] or (same and (r[u] or o[u]))):
            out.append(f"value {v} is recomputed but its input {u} is not available")
    return out


def prune(problem: PolicyProblem, save: np.ndarray, recompute: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray]:
    """Drops saves and recomputes that nothing reads (a solver may leave them in)."""
    s, r, _ = prune_offload(problem, save, recompute, None)
    return s, r


def prune_offload(problem: PolicyProblem, save: np.ndarray, recompute: np.ndarray,
                  offload: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`prune` that also drops offloads nothing reads."""
    s = save.astype(bool).copy()
    o = _no_offload(problem, offload) & ~s
    r = recompute.astype(bool) & ~s & ~o
    same_region_readers: dict[int, list[int]] = {}
    readers: dict[int, list[int]] = {}
    region = problem.region.tolist()  # Python ints: indexing numpy scalars is slow
    for u, v in problem.edges.tolist():
        readers.setdefault(u, []).append(v)
        if region[u] == region[v]:
            same_region_readers.setdefault(u, []).append(v)
    # Readers come after their inputs (values are in program order): sweep backwards.
    for v in range(problem.num_values - 1, -1, -1):
        if r[v] and not problem.must_cover[v]:
            r[v] = any(r[w] for w in same_region_readers.get(v, ()))
    for v in np.flatnonzero(s):
        if not (problem.must_cover[v] or problem.must_save[v]):
            s[v] = any(r[w] for w in readers.get(int(v), ()))
    for v in np.flatnonzero(o):
        if not problem.must_cover[v]:
            o[v] = any(r[w] for w in same_region_readers.get(int(v), ()))
    return s, r, o


def _memory_unit(problem: PolicyProblem) -> float:
    return float(max(1, problem.held.max(initial=1), problem.transient.max(initial=1)))


def _cost_unit(problem: PolicyProblem) -> float:
    unit = max(1.0, float(problem.cost.max(initial=1.0)))
    if problem.offloading:
        unit = max(unit, float(problem.offload_cost[problem.can_offload].max(initial=1.0)))
    return unit


def _model(problem: PolicyProblem, budget: float | None) -> Milp:
    """Variables ``[save (V), recompute (V), held per region (R), peak (1)]``, then
    ``offload (V)`` when the problem allows offload."""
    V, R = problem.num_values, problem.num_regions
    offloading = problem.offloading
    reserving = problem.unshared is not None
    n = 2 * V + R + 1 + (V if offloading else 0)
    S, Rv, H, P, O = 0, V, 2 * V, 2 * V + R, 2 * V + R + 1
    HR = n  # with reserved buffers: held per region of the values that cannot share them
    n += R if reserving else 0
    rows, cols, vals, lo, hi = [], [], [], [], []

    def add_rows(row_ids: np.ndarray, col_ids: np.ndarray, coefs: np.ndarray) -> None:
        rows.append(row_ids), cols.append(col_ids), vals.append(coefs.astype(float))

    m = 0
    cover = np.flatnonzero(problem.must_cover)
    k = len(cover)
    add_rows(np.tile(m + np.arange(k), 2), np.concatenate([S + cover, Rv + cover]), np.ones(2 * k))
    if offloading:
        add_rows(m + np.arange(k), O + cover, np.ones(k))
    lo.append(np.ones(k)), hi.append(np.full(k, np.inf))
    m += k

    u, v = problem.edges[:, 0], problem.edges[:, 1]
    E = len(u)
    same = problem.region[u] == problem.region[v]
    e_rows = m + np.arange(E)
    add_rows(e_rows, Rv + v, np.ones(E))
    add_rows(e_rows, S + u, -np.ones(E))
    add_rows(e_rows[same], Rv + u[same], -np.ones(int(same.sum())))
    if offloading:  # an offloaded input is brought back for its own region's backward
        add_rows(e_rows[same], O + u[same], -np.ones(int(same.sum())))
    lo.append(np.full(E, -np.inf)), hi.append(np.zeros(E))
    m += E

    if offloading:  # keep, offload or neither: exclusive
        off = np.flatnonzero(problem.can_offload)
        add_rows(np.tile(m + np.arange(len(off)), 2), np.concatenate([S + off, O + off]),
                 np.ones(2 * len(off)))
        lo.append(np.full(len(off), -np.inf)), hi.append(np.ones(len(off)))
        m += len(off)

    # Memory rows in units of the largest value, objective in units of the largest cost:
    # coefficients near 1 keep the solver's tolerances meaningful (bytes reach 1e10).
    unit = _memory_unit(problem)
    vals_idx = np.arange(V)
    add_rows(m + problem.region, S + vals_idx, -problem.held / unit)
    add_rows(m + np.arange(R), H + np.arange(R), np.ones(R))
    lo.append(np.zeros(R)), hi.append(np.zeros(R))
    m += R

    backward, forward = (np.nonzero(w) for w in _windows(problem))
    stages = [
        (problem.base, backward, None, problem.transient, problem.offload_backward, H),
        (problem.forward_base, forward, problem.forward_held, None, problem.offload_forward, H),
    ]
    if reserving:
        unshared = problem.unshared.astype(float)
        add_rows(m + problem.region, S + vals_idx, -problem.held * unshared / unit)
        add_rows(m + np.arange(R), HR + np.arange(R), np.ones(R))
        lo.append(np.zeros(R)), hi.append(np.zeros(R))
        m += R
        stages += [
            (problem.reserved_base, backward, None, problem.transient,
             problem.offload_backward, HR),
            (problem.reserved_forward_base, forward,
             problem.forward_held * unshared, None, problem.offload_forward, HR),
        ]
    for stage_base, (tri_r, tri_c), own, transient, offloaded, held_at in stages:
        add_rows(m + tri_r, held_at + tri_c, np.ones(len(tri_r)))
        if own is not None:
            add_rows(m + problem.region, S + vals_idx, own.astype(float) / unit)
        if transient is not None:
            add_rows(m + problem.region, Rv + vals_idx, transient / unit)
        if offloading:
            add_rows(m + problem.region, O + vals_idx, offloaded.astype(float) / unit)
        base = stage_base / unit
        if budget is None:
            add_rows(m + np.arange(R), np.full(R, P), -np.ones(R))
            lo.append(np.full(R, -np.inf)), hi.append(-base)
        else:
            lo.append(np.full(R, -np.inf)), hi.append(budget / unit - base)
        m += R

    if offloading and math.isfinite(problem.host_budget):
        add_rows(np.full(V, m), O + vals_idx, problem.held / unit)
        # Tightened by more than the solver's feasibility tolerance: the budget is exact.
        lo.append(np.array([-np.inf])), hi.append(np.array([problem.host_budget / unit - 1e-6]))
        m += 1

    A = sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                      shape=(m, n))
    c = np.zeros(n)
    if budget is None:
        c[P] = 1.0
    else:
        c[Rv:Rv + V] = problem.cost / _cost_unit(problem)
        if offloading:
            c[O:O + V] = problem.offload_cost / _cost_unit(problem)
    var_lb = np.concatenate([problem.must_save.astype(float), np.zeros(V + R + 1)])
    var_ub = np.concatenate([problem.can_save.astype(float), problem.can_recompute.astype(float),
                             np.full(R + 1, np.inf)])
    integer = np.concatenate([np.ones(2 * V, bool), np.zeros(R + 1, bool)])
    if offloading:
        var_lb = np.concatenate([var_lb, np.zeros(V)])
        var_ub = np.concatenate([var_ub, problem.can_offload.astype(float)])
        integer = np.concatenate([integer, np.ones(V, bool)])
    if reserving:
        var_lb = np.concatenate([var_lb, np.zeros(R)])
        var_ub = np.concatenate([var_ub, np.full(R, np.inf)])
        integer = np.concatenate([integer, np.zeros(R, bool)])
    return Milp(c, A, np.concatenate(lo), np.concatenate(hi), var_lb, var_ub, integer)


def _result(problem: PolicyProblem, milp_result: MilpResult, bound_unit: float) -> PolicyResult:
    V = problem.num_values
    bound = milp_result.bound * bound_unit
    if milp_result.x is None:
        return PolicyResult(milp_result.status, None, None, np.inf, 0, bound, np.inf,
                            milp_result.wall_s)
    if not problem.offloading:
        save, recompute = prune(problem, milp_result.x[:V] > 0.5, milp_result.x[V:2 * V] > 0.5)
        cost, peak = evaluate(problem, save, recompute)
        return PolicyResult(milp_result.status, save, recompute, cost, peak, bound,
                            milp_result.gap, milp_result.wall_s)
    O = 2 * V + problem.num_regions + 1
    save, recompute, offload = prune_offload(problem, milp_result.x[:V] > 0.5,
                                             milp_result.x[V:2 * V] > 0.5,
                                             milp_result.x[O:O + V] > 0.5)
    cost, peak = evaluate(problem, save, recompute, offload)
    return PolicyResult(milp_result.status, save, recompute, cost, peak, bound,
                        milp_result.gap, milp_result.wall_s, offload)


def solve(problem: PolicyProblem, budget: int, *, time_limit_s: float = 60.0,
          relative_gap: float = 1e-4, backends: tuple[str, ...] = ("HIGHS", "SCIP"),
          progress: Progress | None = None) -> PolicyResult:
    """The least-recompute plan whose peak is at most ``budget`` bytes.

    The backends are tried in turn, sharing ``time_limit_s``, until one proves its plan
    optimal (within ``relative_gap``) or infeasibility; otherwise the cheapest plan found
    is returned with status ``FEASIBLE``. An ``INFEASIBLE`` result's ``peak`` is the
    smallest peak any plan reaches (the budget to ask for instead). (Measured on GPT-2-small: each of HiGHS and
    SCIP sometimes stalls on a budget the other solves in seconds.) When no backend found
    a plan but the budget is at least the smallest feasible peak, the min-peak plan is
    returned as a last resort.

    ``progress(elapsed_s, best, bound)`` is called while the backends search (see
    :func:`~autoremat_solvers.milp.solve_milp`) with the seconds since this call, the
    recompute cost of the best plan found so far and a lower bound on the least cost, and
    once at the end with the returned plan's cost when there is a plan. It does not change
    the result.
    """
    start = time.perf_counter()
    report = None if progress is None else _running_best(progress, start, _cost_unit(problem))
    result = _portfolio(problem, budget, time_limit_s, relative_gap, backends, report)
    if progress is not None and result.save is not None:
        progress(time.perf_counter() - start, result.cost, min(result.bound, result.cost))
    return result


def _running_best(progress: Progress, start: float, unit: float) -> Progress:
    """``progress`` fed by each MILP solve of the portfolio: seconds since ``start``, and the
    best objective and bound over all the solves so far, in cost units (the MILPs' are
    divided by ``unit``)."""
    best, bound = math.inf, -math.inf

    def report(elapsed_s: float, objective: float, lower: float) -> None:
        nonlocal best, bound
        best, bound = min(best, objective * unit), max(bound, lower * unit)
        progress(time.perf_counter() - start, best, min(bound, best))

    return report


def _portfolio(problem: PolicyProblem, budget: int, time_limit_s: float, relative_gap: float,
               backends: tuple[str, ...], progress: Progress | None) -> PolicyResult:
    start = time.perf_counter()
    best: PolicyResult | None = None
    share = time_limit_s / len(backends)
    for backend in backends:
        res = _solve_within_budget(problem, budget, share, relative_gap, backend, progress)
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
                                       offload=None, wall_s=time.perf_counter() - start)
        # Its bound and gap are about the peak: nothing is known about the least cost.
        best = dataclasses.replace(floor, bound=0.0, gap=1.0)
    return dataclasses.replace(best, status=MilpStatus.FEASIBLE,
                               wall_s=time.perf_counter() - start)


def _solve_within_budget(problem: PolicyProblem, budget: int, time_limit_s: float,
                         relative_gap: float, backend: str, progress: Progress | None
                         ) -> PolicyResult:
    margin = 0
    for _ in range(4):
        res = _result(problem, solve_milp(_model(problem, budget - margin), backend=backend,
                                          time_limit_s=time_limit_s, relative_gap=relative_gap,
                                          progress=progress),
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
