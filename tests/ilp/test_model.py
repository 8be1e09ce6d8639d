"""The MILP: its column layout, its constraint families, and its stage rows against the
memory model."""

import dataclasses

import autoremat_ilp as ilp
import numpy as np
import pytest
from autoremat_ilp.model import ColumnLayout, cost_unit, memory_unit

from tests.ilp.examples import chain, keep_or_recompute, released, three_way, two_regions


def test_column_layout_hands_out_consecutive_blocks():
    layout = ColumnLayout()
    a = layout.block(np.zeros(2), 1.0, integer=True)
    b = layout.block(np.array([1.0]), np.inf, integer=False)
    assert a.tolist() == [0, 1] and b.tolist() == [2] and layout.n == 3
    lb, ub, integer = layout.bounds()
    assert lb.tolist() == [0, 0, 1] and ub.tolist() == [1, 1, np.inf]
    assert integer.tolist() == [True, True, False]


@pytest.mark.parametrize("problem, extra_columns", [
    (keep_or_recompute(), 0), (three_way(), 2), (two_regions(np.array([True, False])), 2)])
def test_variables_save_recompute_held_peak_then_offload_and_unshared(problem, extra_columns):
    V, R = problem.num_values, problem.num_regions
    model = ilp.build_model(problem, 15)
    x = model.variables
    assert model.milp.c.shape == (2 * V + R + 1 + extra_columns,)
    assert x.save.tolist() == list(range(V)) and x.recompute.tolist() == list(range(V, 2 * V))
    assert x.held.tolist() == list(range(2 * V, 2 * V + R)) and x.peak == 2 * V + R
    assert (x.offload is not None) == problem.offloading
    assert (x.held_unshared is not None) == (problem.unshared is not None)
    integer = model.milp.integer
    assert integer[x.save].all() and integer[x.recompute].all() and not integer[x.held].any()


def test_rows_one_family_after_another():
    problem = three_way()
    model = ilp.build_model(problem, 15)
    # cover (2), inputs (0 edges), save or offload (1), held (2), stages (2 + 2), host (1)
    assert model.milp.A.shape[0] == 2 + 0 + 1 + 2 + 4 + 1
    assert model.milp.row_lb[:2].tolist() == [1, 1]  # cover
    assert model.milp.row_ub[2] == 1  # save + offload <= 1
    assert model.milp.row_ub[-1] == pytest.approx(problem.host_budget / 10 - 1e-6)
    chained = ilp.build_model(chain(), 30)
    # cover (2), inputs (3), held (2), stages (4)
    assert chained.milp.A.shape[0] == 2 + 3 + 2 + 4


def test_objectives_cost_under_a_budget_else_the_peak():
    problem = three_way()
    cost = ilp.build_model(problem, 15)
    assert cost.unit == cost_unit(problem) == 100
    x = cost.variables
    assert cost.milp.c[x.recompute].tolist() == [1.0, 0.01]
    assert cost.milp.c[x.offload].tolist() == [0.03, 0.0]
    peak = ilp.build_model(problem, None)
    assert peak.unit == memory_unit(problem) == 10
    assert np.flatnonzero(peak.milp.c).tolist() == [peak.variables.peak]


def test_offload_allowed_but_nothing_offloadable_is_the_same_program():
    problem = chain()
    none = dataclasses.replace(problem, can_offload=np.zeros(problem.num_values, bool),
                               offload_cost=np.zeros(problem.num_values),
                               offload_forward=problem.held, offload_backward=problem.held,
                               host_budget=0.0)
    for budget in (30, None):
        a, b = ilp.build_model(problem, budget).milp, ilp.build_model(none, budget).milp
        assert (a.A != b.A).nnz == 0 and np.array_equal(a.c, b.c)
        assert np.array_equal(a.row_ub, b.row_ub) and np.array_equal(a.var_ub, b.var_ub)


def _plan_columns(model, problem, save, recompute, offload):
    """The MILP's columns for a plan (``peak`` 0)."""
    x, unit = model.variables, memory_unit(problem)
    cols = np.zeros(len(model.milp.c))
    cols[x.save], cols[x.recompute] = save, recompute

    def held(mask, region=problem.region):
        return np.bincount(region, problem.held * mask, problem.num_regions) / unit

    cols[x.held] = held(save)
    if x.offload is not None:
        cols[x.offload] = offload
    if x.held_unshared is not None:
        cols[x.held_unshared] = held(save & problem.unshared)
    if x.released is not None:
        cols[x.released] = held(save, problem.released)
    if x.released_unshared is not None:
        cols[x.released_unshared] = held(save & problem.unshared, problem.released)
    return cols


@pytest.mark.parametrize("problem", [
    chain(), dataclasses.replace(chain(), nest=np.array([0, 0])), three_way(),
    two_regions(np.array([True, False])), released(chain()),
    released(two_regions(np.array([True, False])))],
    ids=["chain", "nested", "offload", "reserved", "released", "released-reserved"])
def test_stage_rows_are_the_memory_model(problem):
    rng = np.random.default_rng(0)
    model = ilp.build_model(problem, None)
    milp, R = model.milp, problem.num_regions
    stages = 4 * R if problem.unshared is not None else 2 * R
    first = milp.A.shape[0] - stages - (1 if problem.offloading else 0)
    unit = memory_unit(problem)
    for _ in range(10):
        save, recompute = rng.random((2, problem.num_values)) < 0.5
        offload = (rng.random(problem.num_values) < 0.5) & ~save if problem.offloading else None
        cols = _plan_columns(model, problem, save, recompute, offload)
        rows = (milp.A @ cols - milp.row_ub)[first:first + stages] * unit
        modelled = rows.reshape(-1, 2 * R).max(axis=0)
        exact = ilp.stage_bytes(problem, save, recompute, offload).astype(float)
        np.testing.assert_allclose(modelled, exact, rtol=1e-9)
        # The held rows (equalities) hold for these columns.
        np.testing.assert_allclose((milp.A @ cols)[milp.row_lb == milp.row_ub], 0, atol=1e-9)
