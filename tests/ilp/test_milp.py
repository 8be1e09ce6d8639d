"""The MILP front end: HiGHS through highspy or OR-tools, progress reports and limits (on
Checkmate's MILP of a small graph, a model that takes the solvers a few steps)."""

import math

import autoremat_solvers
import numpy as np
import pytest
import scipy.sparse as sp
from autoremat_ilp import Milp, Status, solve_milp
from autoremat_solvers import (
    checkmate_milp,
    random_layered_training_graph,
    simulate,
)
from autoremat_solvers.baselines import BASELINES

GRAPH = random_layered_training_graph(5, 3, seed=3)


def _model() -> Milp:
    """Checkmate's MILP halfway between the memory floor and the checkpoint-all peak."""
    peak = simulate(GRAPH, BASELINES["checkpoint_all"](GRAPH, math.inf).schedule,
                    math.inf).peak_ram
    floor = GRAPH.memory_floor()
    return checkmate_milp.build_checkmate_milp(GRAPH, floor + 0.5 * (peak - floor)).milp


def test_highs_and_scip_reach_the_same_optimum():
    model = _model()
    highs = solve_milp(model, relative_gap=1e-6)
    scip = solve_milp(model, backend="SCIP", relative_gap=1e-6)
    assert highs.status is scip.status is Status.OPTIMAL
    assert highs.objective == pytest.approx(scip.objective, rel=1e-6)


@pytest.mark.parametrize("backend", ["HIGHS", "SCIP"])
def test_a_cutoff_keeps_the_solutions_at_or_below_it(backend):
    model = _model()
    best = solve_milp(model, backend=backend, relative_gap=1e-6)
    assert solve_milp(model, backend=backend, relative_gap=1e-6,
                      cutoff=best.objective * (1 + 1e-6)).objective == pytest.approx(
                          best.objective, rel=1e-6)
    assert solve_milp(model, backend=backend, cutoff=best.objective - 0.01).status is \
        Status.INFEASIBLE


@pytest.mark.parametrize("backend", ["HIGHS", "SCIP"])
def test_progress_reports_best_above_bound_and_ends_with_the_result(backend):
    calls = []
    result = solve_milp(_model(), backend=backend, progress=lambda *a: calls.append(a))
    assert result.status is Status.OPTIMAL
    assert calls and calls[-1][1:] == (result.objective, result.bound)
    for elapsed, best, bound in calls:
        assert elapsed >= 0 and math.isfinite(best) and best >= bound
    if backend == "HIGHS":
        assert len(calls) > 1  # reported while searching, not only at the end


def test_an_exception_in_progress_stops_the_solve_and_is_raised():
    def stop(*_):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        solve_milp(_model(), progress=stop)


def test_one_status_for_the_milp_and_the_research_solvers():
    assert autoremat_solvers.Status is Status
    result = autoremat_solvers.SOLVERS["checkmate_milp"](GRAPH, math.inf)
    assert result.status is Status.OPTIMAL


def _knapsack(n: int) -> Milp:
    """A strongly correlated 0-1 knapsack (values = weights + 1000): HiGHS branches."""
    w = np.random.default_rng(0).integers(1000, 10000, n).astype(float)
    return Milp(c=-(w + 1000), A=sp.csr_matrix(w[None]), row_lb=np.array([-np.inf]),
                row_ub=np.array([w.sum() / 2]), var_lb=np.zeros(n), var_ub=np.ones(n),
                integer=np.ones(n, dtype=bool))


def test_a_node_limit_stops_the_search_at_the_same_solution_whatever_the_time_limit():
    model = _knapsack(30)
    short, long = (solve_milp(model, node_limit=5, time_limit_s=t) for t in (10.0, 100.0))
    assert short.status is long.status is Status.FEASIBLE  # stopped before proving it
    assert not short.timed_out and not long.timed_out
    assert np.array_equal(short.x, long.x)
    full = solve_milp(model)
    assert full.status is Status.OPTIMAL and not full.timed_out
    assert full.objective <= short.objective and short.bound <= full.objective + 1e-6


@pytest.mark.parametrize("backend", ["HIGHS", "SCIP"])
def test_a_time_limit_that_stops_the_search_says_so(backend):
    result = solve_milp(_model(), backend=backend, time_limit_s=1e-3)
    assert result.status is not Status.OPTIMAL and result.timed_out
