"""The tight Checkmate MILP (highspy, warm start).

Same optimum as the plain MILP, valid schedules.
"""

import math

import numpy as np
import pytest
from autoremat_solvers import (
    BASELINES,
    SOLVERS,
    ComputeGraph,
    Status,
    chain_training_graph,
    checkmate_tight,
    random_layered_training_graph,
    simulate,
)

TIME_LIMIT_S = 30.0


def _budget(g, frac):
    floor = g.memory_floor()
    peak = simulate(g, SOLVERS["checkpoint_all"](g, math.inf).schedule, math.inf).peak_ram
    return floor + frac * (peak - floor)


CASES = [
    (chain_training_graph(8), 0.5),
    (chain_training_graph(8), 1.0),
    (random_layered_training_graph(5, 3, seed=3), 0.2),
    (random_layered_training_graph(5, 3, seed=3), 0.5),
    (random_layered_training_graph(6, 3, seed=1), 0.5),
]


@pytest.mark.parametrize(("g", "frac"), CASES)
def test_same_optimum_as_plain_milp(g, frac):
    budget = _budget(g, frac)
    plain = SOLVERS["checkmate_milp"](g, budget, TIME_LIMIT_S)
    assert plain.status is Status.OPTIMAL
    for kwargs in ({}, {"warm_start": False}, {"lp_rounding": True}, {"useful_rows": True}):
        res = checkmate_tight.solve(g, budget, TIME_LIMIT_S, **kwargs)
        assert res.status is Status.OPTIMAL, kwargs
        sim = simulate(g, res.schedule, budget)
        assert sim.ok, sim.violations
        assert sim.cost == res.claimed_cost == plain.claimed_cost, kwargs
        assert res.lower_bound <= sim.cost + 1e-6


@pytest.mark.parametrize(
    "g", [chain_training_graph(6), random_layered_training_graph(5, 3, seed=3)]
)
def test_heuristic_schedules_are_feasible_starts(g):
    """Every fitting baseline schedule maps to a point satisfying all rows of the model."""
    budget = _budget(g, 1.0)
    model = checkmate_tight.build_tight_milp(g, budget)
    n_checked = 0
    for solve in BASELINES.values():
        res = solve(g, budget)
        if res.schedule is None:
            continue
        canon = checkmate_tight.canonical_schedule(g, res.schedule)
        sim = simulate(g, canon, budget)
        assert sim.ok and sim.cost <= simulate(g, res.schedule, budget).cost
        x = model.start_vector(g, canon)
        assert x is not None
        Ax = model.A @ x
        assert (Ax >= model.row_lb - 1e-7).all() and (Ax <= model.row_ub + 1e-7).all()
        assert (x >= model.var_lb - 1e-9).all() and (x <= model.var_ub + 1e-9).all()
        assert model.c @ x == pytest.approx(sim.cost)
        n_checked += 1
    assert n_checked


def test_liveness_fixes_out_dead_pairs():
    # 0 -> 1 (an output) and 0 -> 2: nothing after stage 1 can use node 1.
    g = ComputeGraph(
        cost=(1.0, 1.0, 1.0),
        ram=(1, 1, 1),
        preds=((), (0,), (0,)),
        backward=(False,) * 3,
        names=("a", "b", "c"),
    )
    assert checkmate_tight.liveness(g).tolist() == [2, 1, 2]
    model = checkmate_tight.build_tight_milp(g, 3)
    assert model.r_idx[2, 1] < 0 and model.s_idx[2, 1] < 0 and model.r_idx[2, 0] >= 0
    # On a training graph the chain of gradients keeps every node live to the end.
    chain = chain_training_graph(4)
    assert (checkmate_tight.liveness(chain) == chain.n - 1).all()


def test_below_floor_is_infeasible():
    g = random_layered_training_graph(5, 3, seed=3)
    res = checkmate_tight.solve(g, g.memory_floor() - 1, TIME_LIMIT_S)
    assert res.status is Status.INFEASIBLE and res.schedule is None


def test_warm_start_gives_an_incumbent_at_a_zero_limit():
    g = random_layered_training_graph(6, 3, seed=1)
    budget = _budget(g, 0.5)
    info = {}
    res = checkmate_tight.solve(g, budget, 1e-3, info=info)
    assert info["start_source"] is not None
    assert res.schedule is not None and simulate(g, res.schedule, budget).ok
    assert np.isfinite(res.claimed_cost)
