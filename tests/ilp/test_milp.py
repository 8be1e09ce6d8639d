"""The MILP front end: HiGHS through highspy or OR-tools, and progress reports (on
Checkmate's MILP of a small graph, a model that takes the solvers a few steps)."""

import math

import autoremat_solvers
import pytest
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
