"""A tighter, smaller form of Checkmate's MILP, solved with highspy from a heuristic incumbent.

Same problem and the same optimum as :mod:`autoremat_solvers.checkmate_milp` (frontier-advancing
stages: stage ``t`` computes node ``t`` plus recomputations in ascending order; ``S[t, i]`` keeps
``i`` into stage ``t``; values are freed after their last use in a stage), with these changes,
each valid for *some* optimal schedule of the original model:

- **Liveness fixing.** ``last[i] = max(i, max over consumers j of last[j])`` is the last stage
  in which computing or holding ``i`` can serve anything; ``R[t, i]`` and ``S[t, i]`` exist only
  for ``i <= t <= last[i]``. Removing useless computations and storage never raises memory, so
  an optimal schedule stays. (On training graphs this fixes nothing: the chain of gradients
  ending at the last stage keeps every node live to the end, since recomputing a gradient is
  allowed. It only prunes dead side branches.)
- **No double copies.** ``R[t, i] + S[t, i] <= 1`` for ``i < t`` (recomputing a kept value only
  costs).
- **Frees as continuous upper-bounded variables.** ``FREE[t, (i, k)]`` (free ``i`` right after
  computing ``k`` in stage ``t``; ``k = i`` is the self edge) is continuous in ``[0, 1]`` and only
  bounded from above:

  - ``FREE[t, (i, k)] <= R[t, k]``;
  - ``S[t + 1, i] + sum_k FREE[t, (i, k)] <= R[t, i] + S[t, i]`` (a present value is kept or freed
    once; this row also replaces Checkmate's storage row ``S[t+1, i] <= R[t, i] + S[t, i]``);
  - ``sum_{k < j} FREE[t, (i, k)] + R[t, j] <= 1`` for each consumer ``j`` of ``i`` (no free
    before a later reader in the stage).

  For integral ``R, S`` this allows any ``FREE`` between 0 and Checkmate's exact one; freeing
  less only adds memory, so the optimum is unchanged, but the LP relaxation is tighter than
  Checkmate's hazard-count linearization and the MILP branches on ``R`` and ``S`` only.
- **Memory only at live positions.** ``U[t, k]`` exists only for ``k`` computable in stage ``t``;
  the recurrence steps from one such position to the next.

The MILP is built from numpy/scipy.sparse arrays and solved single-threaded with highspy
(HiGHS's own interface: time limit, gap, a MIP start). Before the solve, the fast heuristics
(Chen's and Griewank's baselines, the ``jax_policy`` adapter, and roundings of this model's LP
relaxation when ``lp_rounding`` is set) are replayed by the simulator; the cheapest schedule
that fits is converted to a full MIP start (``FREE`` and ``U`` derived from ``R`` and ``S``),
so the solver always holds an incumbent and its gap is meaningful. When every cost is an
integer, the optimality test also accepts ``incumbent - bound < 1``.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
import scipy.sparse as sp
from autoremat_ilp import Status

from autoremat_solvers import checkmate_milp
from autoremat_solvers._stages import schedule_from_storage
from autoremat_solvers.base import SolverResult
from autoremat_solvers.graph import ComputeGraph
from autoremat_solvers.schedule import Schedule, simulate

__all__ = ["TightModel", "build_tight_milp", "canonical_schedule", "liveness", "solve"]


def liveness(graph: ComputeGraph) -> np.ndarray:
    """``last[i]``: the last stage in which computing or holding ``i`` can serve a computation."""
    last = np.arange(graph.n)
    for i in reversed(range(graph.n)):
        for j in graph.succs[i]:
            last[i] = max(last[i], last[j])
    return last


def canonical_schedule(graph: ComputeGraph, schedule: Schedule) -> Schedule | None:
    """``schedule`` in the model's form, or ``None`` if it is not frontier-advancing.

    Needs ``n`` stages with stage ``t`` computing ``t`` and nothing above it. Drops
    recomputations of kept values, then, to a fixpoint, computations and kept values that
    the stage neither reads nor keeps further. Cost and memory never go up.
    """
    n = graph.n
    R, S = schedule.R.copy(), schedule.S.copy()
    if (
        R.shape != (n, n)
        or not R[np.arange(n), np.arange(n)].all()
        or np.triu(R, 1).any()
        or np.triu(S).any()
    ):
        return None
    R &= ~S
    R[np.arange(n), np.arange(n)] = True
    changed = True
    while changed:
        changed = False
        for t in reversed(range(n)):
            read = np.zeros(n, dtype=bool)
            for k in np.flatnonzero(R[t]):
                read[list(graph.preds[k])] = True
            keep_next = S[t + 1] if t + 1 < n else np.zeros(n, dtype=bool)
            useful = read | keep_next
            useful[t] = True
            newR, newS = R[t] & useful, S[t] & useful
            if (newR != R[t]).any() or (newS != S[t]).any():
                R[t], S[t] = newR, newS
                changed = True
    return Schedule(R, S)


class _Rows(checkmate_milp._Rows):
    """:class:`checkmate_milp._Rows` that hands out row indices, refuses columns of
    fixed-out variables, and merges duplicate entries."""

    def new(  # pyright: ignore[reportIncompatibleMethodOverride]
        self, k: int, lb: np.ndarray | float, ub: np.ndarray | float
    ) -> np.ndarray:
        """Reserves ``k`` rows; returns their indices (the base returns the first's)."""
        return super().new(k, lb, ub) + np.arange(k)

    def add(self, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray | float) -> None:
        cols = np.asarray(cols, dtype=np.int64)
        if (cols < 0).any():
            raise AssertionError("reference to a fixed-out variable")
        super().add(np.asarray(rows, dtype=np.int64), cols, vals)

    def matrix(self, n_vars: int) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray]:
        A, lb, ub = super().matrix(n_vars)
        A.sum_duplicates()
        return A, lb, ub


@dataclasses.dataclass(frozen=True, eq=False)
class TightModel:
    """The MILP arrays and the variable maps (``-1`` where a variable is fixed out)."""

    c: np.ndarray
    A: sp.csr_matrix
    row_lb: np.ndarray
    row_ub: np.ndarray
    var_lb: np.ndarray
    var_ub: np.ndarray
    integer: np.ndarray
    r_idx: np.ndarray  # (n, n): column of R[t, i]
    s_idx: np.ndarray  # (n, n): column of S[t, i]
    u_idx: np.ndarray  # (n, n): column of U[t, k]
    free: np.ndarray  # (n_free, 3): t, i, k of each FREE column, in order
    f_off: int
    ram: np.ndarray  # scaled sizes
    budget: float  # scaled

    @property
    def n(self) -> int:
        return self.r_idx.shape[0]

    def matrices(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``R`` and ``S`` of a solution vector (fractional for an LP)."""
        R = np.where(self.r_idx >= 0, x[np.maximum(self.r_idx, 0)], 0.0)
        S = np.where(self.s_idx >= 0, x[np.maximum(self.s_idx, 0)], 0.0)
        return R, S

    def start_vector(self, graph: ComputeGraph, schedule: Schedule) -> np.ndarray | None:
        """A full solution vector for a canonical schedule, or ``None`` if the model rejects it."""
        R, S = schedule.R, schedule.S
        if (R & (self.r_idx < 0)).any() or (S & (self.s_idx < 0)).any():
            return None
        x = np.zeros(len(self.c))
        x[self.r_idx[R]] = 1.0
        x[self.s_idx[S]] = 1.0
        n = self.n
        t_f, i_f, k_f = self.free.T
        # The exact free: k computed, i not kept, no later reader of i computed in the stage.
        # (t, i): last computation in stage t reading i (or i itself)
        last_reader = np.full((n, n), -1)
        for t in range(n):
            for k in np.flatnonzero(R[t]):
                last_reader[t, k] = max(last_reader[t, k], k)
                for p in graph.preds[k]:
                    last_reader[t, p] = max(last_reader[t, p], k)
        keep_next = np.zeros((n, n), dtype=bool)
        keep_next[:-1] = S[1:]
        free = R[t_f, k_f] & ~keep_next[t_f, i_f] & (last_reader[t_f, i_f] == k_f)
        x[self.f_off + np.flatnonzero(free)] = 1.0
        # U by the recurrence, stage by stage.
        ram = self.ram
        freed_after = np.zeros((n, n))
        np.add.at(freed_after, (t_f[free], k_f[free]), ram[i_f[free]])
        for t in range(n):
            mem = float(ram[S[t]].sum())
            for k in np.flatnonzero(self.u_idx[t] >= 0):
                mem += ram[k] * R[t, k]
                x[self.u_idx[t, k]] = mem
                mem -= freed_after[t, k]
        if (x[self.u_idx[self.u_idx >= 0]] > self.budget * (1 + 1e-9) + 1e-9).any():
            return None
        return x


def build_tight_milp(
    graph: ComputeGraph, budget: float, *, integer: bool = True, useful_rows: bool = False
) -> TightModel:
    """Builds the model of the module docstring (``integer=False``: its LP relaxation)."""
    n = graph.n
    scale = max(1, max(graph.ram))
    ram = np.asarray(graph.ram, dtype=float) / scale
    budget_scaled = budget / scale
    last = liveness(graph)
    tt, ii = np.nonzero(
        np.tril(np.ones((n, n), dtype=bool)) & (np.arange(n)[:, None] <= last[None, :])
    )
    r_idx = np.full((n, n), -1, dtype=np.int64)
    r_idx[tt, ii] = np.arange(len(tt))
    n_r = len(tt)
    live_s = (np.arange(n)[:, None] > np.arange(n)[None, :]) & (
        np.arange(n)[:, None] <= last[None, :]
    )
    st, si = np.nonzero(live_s)
    s_idx = np.full((n, n), -1, dtype=np.int64)
    s_idx[st, si] = n_r + np.arange(len(st))
    u_off = n_r + len(st)
    u_idx = np.full((n, n), -1, dtype=np.int64)
    u_idx[tt, ii] = u_off + np.arange(len(tt))  # U at every live compute position
    f_off = u_off + len(tt)
    # FREE[t, (i, k)] for ext edges (i, k) (k = i: self edge) and t with R[t, k] live.
    ext = sorted({*graph.edges, *((k, k) for k in range(graph.n))}, key=lambda e: (e[1], e[0]))
    free_list = []
    for i, k in ext:
        for t in range(k, last[k] + 1):
            free_list.append((t, i, k))
    free = np.asarray(free_list, dtype=np.int64).reshape(-1, 3)
    free = free[np.lexsort((free[:, 1], free[:, 2], free[:, 0]))]  # by t, then k, then i
    n_vars = f_off + len(free)
    f_cols = f_off + np.arange(len(free))

    rows = _Rows()
    # Dependencies: R[t, k] - R[t, i] - S[t, i] <= 0 for edges (i, k) with R[t, k] live.
    dt, de = [], []
    edges = np.asarray(graph.edges, dtype=np.int64).reshape(-1, 2)
    for e, (_, k) in enumerate(edges.tolist()):
        ts = np.arange(k, last[k] + 1)
        dt.append(ts)
        de.append(np.full(len(ts), e))
    dt, de = np.concatenate(dt), np.concatenate(de)
    row = rows.new(len(dt), -np.inf, 0.0)
    rows.add(row, r_idx[dt, edges[de, 1]], 1.0)
    rows.add(row, r_idx[dt, edges[de, 0]], -1.0)
    has_s = s_idx[dt, edges[de, 0]] >= 0  # i == t cannot happen for an edge, so S exists when t > i
    rows.add(row[has_s], s_idx[dt, edges[de, 0]][has_s], -1.0)
    # No double copies: R[t, i] + S[t, i] <= 1.
    row = rows.new(len(st), -np.inf, 1.0)
    rows.add(row, r_idx[st, si], 1.0)
    rows.add(row, s_idx[st, si], 1.0)
    # Keep or free once: S[t+1, i] + sum_k FREE[t, (i, k)] - R[t, i] - S[t, i] <= 0,
    # for live R[t, i].
    pair_row = np.full((n, n), -1, dtype=np.int64)
    row = rows.new(len(tt), -np.inf, 0.0)
    pair_row[tt, ii] = row
    rows.add(row, r_idx[tt, ii], -1.0)
    has = s_idx[tt, ii] >= 0
    rows.add(row[has], s_idx[tt, ii][has], -1.0)
    nxt = tt + 1 < n
    nxt_s = np.where(nxt, s_idx[np.minimum(tt + 1, n - 1), ii], -1)
    has = nxt_s >= 0
    rows.add(row[has], nxt_s[has], 1.0)
    # (the storage row for S[t+1, i] whose R[t, i] is fixed out: S[t, i] is then fixed out as well
    # unless t <= last[i], which is the same liveness condition, so every live S[t+1, i] is covered)
    rows.add(pair_row[free[:, 0], free[:, 1]], f_cols, 1.0)
    # FREE[t, (i, k)] <= R[t, k].
    row = rows.new(len(free), -np.inf, 0.0)
    rows.add(row, f_cols, 1.0)
    rows.add(row, r_idx[free[:, 0], free[:, 2]], -1.0)
    # No free before a later reader: sum_{k < j} FREE[t, (i, k)] + R[t, j] <= 1 for edges (i, j).
    free_at = {}
    for col, (t, i, k) in enumerate(free.tolist()):
        free_at.setdefault((t, i), []).append((k, f_off + col))
    rr, cc = [], []
    count = 0
    for i, j in edges.tolist():
        for t in range(j, last[j] + 1):
            before = [col for k, col in free_at.get((t, i), []) if k < j]
            if not before:
                continue
            rr.append(np.full(len(before) + 1, count))
            cc.append(np.asarray(before + [int(r_idx[t, j])]))
            count += 1
    row = rows.new(count, -np.inf, 1.0)
    if count:
        rows.add(row[np.concatenate(rr)], np.concatenate(cc), 1.0)
    # Memory: U[t, k0] = ram S[t] + ram_k0 R[t, k0];
    # U[t, k'] = U[t, k] + ram_k' R[t, k'] - frees after k.
    row = rows.new(n, 0.0, 0.0)
    first_k = np.asarray([np.flatnonzero(u_idx[t] >= 0)[0] for t in range(n)])
    rows.add(row, u_idx[np.arange(n), first_k], 1.0)
    rows.add(row, r_idx[np.arange(n), first_k], -ram[first_k])
    rows.add(row[st], s_idx[st, si], -ram[si])
    # Consecutive live positions (t, k) -> (t, k'): tt/ii are sorted by t then i.
    same = tt[1:] == tt[:-1]
    pt, pk, qk = tt[:-1][same], ii[:-1][same], ii[1:][same]
    row = rows.new(len(pt), 0.0, 0.0)
    rows.add(row, u_idx[pt, qk], 1.0)
    rows.add(row, u_idx[pt, pk], -1.0)
    rows.add(row, r_idx[pt, qk], -ram[qk])
    step_row = np.full((n, n), -1, dtype=np.int64)
    step_row[pt, pk] = row
    # Frees after the stage's last position do not matter.
    has = step_row[free[:, 0], free[:, 2]] >= 0
    rows.add(step_row[free[:, 0], free[:, 2]][has], f_cols[has], ram[free[:, 1]][has])
    if useful_rows:
        # A computed or kept value is read in the stage or kept further (i < t).
        rr, cc, vv = [], [], []
        row = rows.new(len(st), -np.inf, 0.0)
        for r, t, i in zip(row.tolist(), st.tolist(), si.tolist(), strict=True):
            cols = [r_idx[t, i], s_idx[t, i]]
            vals = [1.0, 1.0]
            for j in graph.succs[i]:
                if j <= t and r_idx[t, j] >= 0:
                    cols.append(r_idx[t, j])
                    vals.append(-1.0)
            if t + 1 < n and s_idx[t + 1, i] >= 0:
                cols.append(s_idx[t + 1, i])
                vals.append(-1.0)
            rr += [r] * len(cols)
            cc += cols
            vv += vals
        rows.add(np.asarray(rr), np.asarray(cc), np.asarray(vv))

    A, row_lb, row_ub = rows.matrix(n_vars)
    c = np.zeros(n_vars)
    c[r_idx[tt, ii]] = np.asarray(graph.cost)[ii]
    var_lb = np.zeros(n_vars)
    var_lb[r_idx[np.arange(n), np.arange(n)]] = 1.0
    var_ub = np.ones(n_vars)
    var_ub[u_off:f_off] = budget_scaled
    is_int = np.zeros(n_vars, dtype=bool)
    is_int[:u_off] = integer
    return TightModel(
        c, A, row_lb, row_ub, var_lb, var_ub, is_int, r_idx, s_idx, u_idx, free, f_off, ram,
        budget_scaled,
    )


@dataclasses.dataclass(frozen=True)
class HighsOutcome:
    """What highspy returned: ``x`` (``None`` without a solution), objective, bound, status."""

    x: np.ndarray | None
    objective: float
    bound: float
    status: str
    wall_s: float


def _highs(
    model: TightModel,
    *,
    time_limit_s: float | None,
    relative_gap: float,
    start: np.ndarray | None,
    integral_costs: bool,
    options: dict | None = None,
    log: bool = False,
) -> HighsOutcome:
    import highspy

    h = highspy.Highs()
    h.setOptionValue("output_flag", bool(log))
    h.setOptionValue("threads", 1)
    h.setOptionValue("mip_rel_gap", float(relative_gap))
    if integral_costs:
        h.setOptionValue("mip_abs_gap", 1.0 - 1e-6)
    if time_limit_s is not None:
        h.setOptionValue("time_limit", float(max(time_limit_s, 0.01)))
    for key, value in (options or {}).items():
        h.setOptionValue(key, value)
    A = model.A.tocsc()
    lp = highspy.HighsLp()
    lp.num_col_ = A.shape[1]  # pyright: ignore[reportOptionalSubscript]
    lp.num_row_ = A.shape[0]  # pyright: ignore[reportOptionalSubscript]
    lp.col_cost_ = model.c
    lp.col_lower_ = model.var_lb
    lp.col_upper_ = model.var_ub
    lp.row_lower_ = model.row_lb
    lp.row_upper_ = model.row_ub
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = A.indptr.astype(np.int32)
    lp.a_matrix_.index_ = A.indices.astype(np.int32)
    lp.a_matrix_.value_ = np.asarray(A.data, dtype=np.float64)
    if model.integer.any():
        lp.integrality_ = [highspy.HighsVarType.kInteger if b else highspy.HighsVarType.kContinuous
                           for b in model.integer]
    h.passModel(lp)
    if start is not None:
        sol = highspy.HighsSolution()
        sol.col_value = start.tolist()
        sol.value_valid = True
        h.setSolution(sol)
    t0 = time.perf_counter()
    h.run()
    wall_s = time.perf_counter() - t0
    status = h.modelStatusToString(h.getModelStatus())
    info = h.getInfo()
    has_x = info.primal_solution_status == 2  # kSolutionStatusFeasible
    x = np.asarray(h.getSolution().col_value) if has_x else None
    objective = info.objective_function_value if has_x else math.inf
    bound = info.mip_dual_bound if model.integer.any() else objective
    if status == "Infeasible":
        bound = math.inf
    return HighsOutcome(x, objective, bound, status, wall_s)


def _candidates(
    graph: ComputeGraph,
    budget: float,
    lp_x: np.ndarray | None,
    model: TightModel | None,
    use_policy: bool,
    n_samples: int,
    seed: int,
) -> list[tuple[str, Schedule]]:
    from autoremat_solvers import policy_schedule
    from autoremat_solvers.baselines import BASELINES

    out: list[tuple[str, Schedule]] = []
    for name, fn in BASELINES.items():
        res = fn(graph, budget)
        if res.schedule is not None:
            out.append((name, res.schedule))
    if use_policy:
        res = policy_schedule.solve(graph, budget, 30.0)
        if res.schedule is not None:
            out.append(("jax_policy", res.schedule))
    if lp_x is not None and model is not None:
        _, S_frac = model.matrices(lp_x)
        rng = np.random.default_rng(seed)
        storages = [S_frac > 0.5, S_frac > 0.99, S_frac > 0.01] + [rng.random(S_frac.shape) < S_frac
                                                                   for _ in range(n_samples)]
        out += [("lp_rounding", schedule_from_storage(graph, S)) for S in storages]
    return out


def solve(
    graph: ComputeGraph,
    budget: float,
    time_limit_s: float | None = None,
    *,
    relative_gap: float = 1e-4,
    warm_start: bool = True,
    use_policy: bool = True,
    lp_rounding: bool = False,
    useful_rows: bool = False,
    n_samples: int = 16,
    seed: int = 0,
    highs_options: dict | None = None,
    log: bool = False,
    info: dict | None = None,
) -> SolverResult:
    """Solves the tight Checkmate MILP with highspy, warm-started from the best heuristic.

    Args:
      graph: the graph.
      budget: memory budget in bytes.
      time_limit_s: limit for the LP (``lp_rounding``) and the MILP together; model building and
        the heuristics are not counted (they take seconds).
      relative_gap: stop at this relative gap (with integral costs also at an absolute gap < 1).
      warm_start: give the MILP the cheapest fitting heuristic schedule as a MIP start.
      use_policy: include the ``jax_policy`` adapter among the heuristics.
      lp_rounding: also solve the LP relaxation first and round it (Checkmate's rounding).
      useful_rows: add ``R[t, i] + S[t, i] <= readers of i in stage t + S[t+1, i]`` (valid: a
        value computed or kept without use can be dropped).
      n_samples, seed: randomized roundings of the LP solution.
      highs_options: extra HiGHS options.
      log: print HiGHS's log.
      info: if given, filled with timings, model size, incumbent source and the root LP bound.

    Returns:
      The best schedule, its cost, and HiGHS's proven lower bound for the model (which has
      the same optimum as :mod:`autoremat_solvers.checkmate_milp`).
    """
    t_start = time.perf_counter()
    info = {} if info is None else info
    if budget < graph.memory_floor():
        return SolverResult.below_floor(time.perf_counter() - t_start)
    integral_costs = all(float(c).is_integer() for c in graph.cost)
    model = build_tight_milp(graph, budget, useful_rows=useful_rows)
    info.update(
        n_vars=len(model.c),
        n_int=int(model.integer.sum()),
        n_rows=model.A.shape[0],  # pyright: ignore[reportOptionalSubscript]
        nnz=model.A.nnz,
        build_s=time.perf_counter() - t_start,
    )
    deadline = None if time_limit_s is None else time.perf_counter() + time_limit_s
    lp_x = None
    lower = -math.inf
    if lp_rounding:
        lp_model = dataclasses.replace(model, integer=np.zeros_like(model.integer))
        lp = _highs(
            lp_model,
            time_limit_s=time_limit_s,
            relative_gap=0.0,
            start=None,
            integral_costs=False,
            log=log,
        )
        info.update(lp_s=lp.wall_s, lp_bound=lp.objective, lp_status=lp.status)
        if lp.status == "Infeasible":
            return SolverResult(
                None, Status.INFEASIBLE, math.inf, math.inf, time.perf_counter() - t_start
            )
        if lp.x is not None:
            lp_x = lp.x
            lower = lp.objective
    best: tuple[float, str, Schedule, np.ndarray] | None = None
    t_heur = time.perf_counter()
    if warm_start:
        for name, sched in _candidates(graph, budget, lp_x, model, use_policy, n_samples, seed):
            canon = canonical_schedule(graph, sched)
            if canon is None or not simulate(graph, canon, budget).ok:
                continue
            cost = simulate(graph, canon, budget).cost
            if best is not None and cost >= best[0]:
                continue
            x = model.start_vector(graph, canon)
            if x is not None:
                best = (cost, name, canon, x)
    info.update(
        heuristics_s=time.perf_counter() - t_heur,
        start_source=None if best is None else best[1],
        start_cost=None if best is None else best[0],
    )
    if best is not None and integral_costs and lower > -math.inf and best[0] - lower < 1.0 - 1e-6:
        return SolverResult(best[2], Status.OPTIMAL, best[0], lower, time.perf_counter() - t_start)
    remaining = None if deadline is None else deadline - time.perf_counter()
    res = _highs(
        model,
        time_limit_s=remaining,
        relative_gap=relative_gap,
        start=None if best is None else best[3],
        integral_costs=integral_costs,
        options=highs_options,
        log=log,
    )
    info.update(milp_s=res.wall_s, milp_status=res.status, milp_bound=res.bound)
    wall_s = time.perf_counter() - t_start
    if res.status == "Infeasible":
        return SolverResult(None, Status.INFEASIBLE, math.inf, math.inf, wall_s)
    schedule, cost = None, math.inf
    if res.x is not None:
        R, S = model.matrices(res.x)
        schedule = canonical_schedule(graph, Schedule(R > 0.5, S > 0.5))
        assert schedule is not None, "the MILP's solutions are in the model's form"
        cost = simulate(graph, schedule, budget).cost
    if best is not None and best[0] < cost:
        schedule, cost = best[2], best[0]
    if schedule is None:
        return SolverResult(None, Status.NO_SOLUTION, math.inf, max(lower, res.bound), wall_s)
    bound = min(max(lower, res.bound), cost)
    optimal = res.status == "Optimal" or cost - bound <= relative_gap * abs(cost) or (
        integral_costs and cost - bound < 1.0 - 1e-6)
    return SolverResult(
        schedule, Status.OPTIMAL if optimal else Status.FEASIBLE, cost, bound, wall_s
    )
