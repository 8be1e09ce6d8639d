"""The plan found without a solver, which starts the MILP's search."""

import autoremat_ilp as ilp
import numpy as np
import pytest
from autoremat_ilp.greedy import fitted, greedy_start, region_plan

from autoremat import _rewrite, _solve, _trace, zoo
from autoremat._placement import Placement
from tests.ilp.examples import chain, keep_or_recompute, released


def _llama_problem() -> ilp.Problem:
    model = zoo.ZOO["llama-unrolled-tiny"]
    loss, args = model.make_loss(), (model.param_shapes(), model.batch_shapes())
    flat_fn, _, avals, _ = _rewrite.flat_function(loss, args, {})
    program = _trace.trace_program(flat_fn, avals)
    return _solve.problem_of(_trace.graph_of(program, Placement(_trace.layer_cuts(program)))[1])


def _region_peaks(problem: ilp.Problem) -> tuple[int, int]:
    """The peaks of recomputing every region and none (whole regions)."""
    R = problem.num_regions
    every = region_plan(problem, np.ones(R, dtype=bool))
    kept = region_plan(problem, np.zeros(R, dtype=bool))
    assert every is not None and kept is not None
    return ilp.evaluate(problem, *every)[1], ilp.evaluate(problem, *kept)[1]


def test_the_start_of_two_regions_recomputes_the_costlier_value_and_bounds_its_cost():
    (save, recompute), bound = greedy_start(keep_or_recompute(), 15)
    assert save.tolist() == [False, True] and recompute.tolist() == [True, False]
    assert ilp.evaluate(keep_or_recompute(), save, recompute) == (100.0, 10) and bound == 50.0


@pytest.mark.parametrize("make", [chain, keep_or_recompute, lambda: released(chain()),
                                  _llama_problem])
def test_a_greedy_plan_is_valid_and_fits_from_the_least_peak_of_its_regions_on(make):
    problem = make()
    lowest, highest = _region_peaks(problem)
    assert greedy_start(problem, min(lowest, highest) - 1).plan is None
    for budget in np.linspace(lowest, max(lowest, highest), 5).astype(int).tolist():
        plan, bound = greedy_start(problem, budget)
        assert plan is not None
        assert ilp.violations(problem, *plan) == []
        cost, peak = ilp.evaluate(problem, *plan)
        assert peak <= budget
        assert cost >= ilp.solve(problem, budget).cost >= bound - 1e-6 * abs(bound)
    plan = greedy_start(problem, highest).plan
    assert plan is not None and ilp.evaluate(problem, *plan)[0] == 0


@pytest.mark.parametrize("make", [chain, keep_or_recompute, lambda: released(chain()),
                                  _llama_problem])
def test_a_plan_of_fewer_bounds_fitted_to_all_is_valid_and_fits(make):
    problem = make()
    lowest, highest = _region_peaks(problem)
    # What the solver gets first: the problem without its lazy bounds, whose plans may
    # break them.
    loose = problem.with_bounds(~problem.lazy_bounds())
    assert fitted(problem, min(lowest, highest) - 1, problem.can_save) is None
    for budget in np.linspace(lowest, max(lowest, highest), 5).astype(int).tolist():
        found = ilp.solve(loose, budget)
        assert found.save is not None
        plan = fitted(problem, budget, found.save)
        assert plan is not None and ilp.violations(problem, *plan) == []
        cost, peak = ilp.evaluate(problem, *plan)
        assert peak <= budget and cost >= ilp.solve(problem, budget).cost
    plan = fitted(problem, highest, problem.can_save)
    assert plan is not None and ilp.evaluate(problem, *plan)[0] == 0
