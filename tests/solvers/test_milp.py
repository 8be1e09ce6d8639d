"""The MILP front end: HiGHS through highspy or OR-tools, and progress reports."""

import math

import pytest
from autoremat_solvers import (
    checkmate_milp,
    milp,
    random_layered_training_graph,
    simulate,
)
from autoremat_solvers.baselines import BASELINES
from autoremat_solvers.milp import MilpStatus, solve_milp

GRAPH = random_layered_training_graph(5, 3, seed=3)


def _model() -> milp.Milp:
    """Checkmate's MILP halfway between the memory floor and the checkpoint-all peak."""
    peak = simulate(GRAPH, BASELINES["checkpoint_all"](GRAPH, math.inf).schedule,
                    math.inf).peak_ram
    floor = GRAPH.memory_floor()
    return checkmate_milp.build_checkmate_milp(GRAPH, floor + 0.5 * (peak - floor)).milp


def test_highs_through_highspy_and_through_ortools_reach_the_same_optimum(monkeypatch):
    pytest.importorskip("highspy")
    model = _model()
    direct = solve_milp(model, relative_gap=1e-6)
    monkeypatch.setattr(milp, "_highspy", lambda: None)
    ortools = solve_milp(model, relative_gap=1e-6)
    assert direct.status is ortools.status is MilpStatus.OPTIMAL
    assert direct.objective == pytest.approx(ortools.objective, rel=1e-6)


@pytest.mark.parametrize("backend", ["HIGHS", "SCIP"])
def test_progress_reports_best_above_bound_and_ends_with_the_result(backend):
    calls = []
    result = solve_milp(_model(), backend=backend, progress=lambda *a: calls.append(a))
    assert result.status is MilpStatus.OPTIMAL
    assert calls and calls[-1][1:] == (result.objective, result.bound)
    for elapsed, best, bound in calls:
        assert elapsed >= 0 and math.isfinite(best) and best >= bound
    if backend == "HIGHS" and milp._highspy() is not None:
        assert len(calls) > 1  # reported while searching, not only at the end


def test_an_exception_in_progress_stops_the_solve_and_is_raised():
    def stop(*_):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        solve_milp(_model(), progress=stop)
