"""Moccasin's CP-SAT interval model: matches the MILP optimum, fits the budget exactly."""

import math

import pytest
from autoremat_solvers import (
    SOLVERS,
    Status,
    chain_training_graph,
    moccasin_cpsat,
    random_layered_training_graph,
    simulate,
)
from autoremat_solvers._stages import schedule_from_sequence, sequence_of
from autoremat_solvers.graph import ComputeGraph
from autoremat_solvers.moccasin_cpsat import Quantization

TIME_LIMIT_S = 60.0  # generous: CP-SAT is slow on a loaded machine


def _budget(g, frac):
    floor = g.memory_floor()
    peak = simulate(g, SOLVERS["checkpoint_all"](g, math.inf).schedule, math.inf).peak_ram
    return floor + frac * (peak - floor)


# Budgets at which two computations per node suffice for the MILP's optimum.
CASES = [
    (chain_training_graph(8), 0.5),
    (chain_training_graph(8), 1.0),
    (random_layered_training_graph(5, 3, seed=3), 0.25),
    (random_layered_training_graph(5, 3, seed=3), 0.5),
]


@pytest.mark.parametrize(("g", "frac"), CASES)
def test_matches_milp_optimum_and_passes_simulator(g, frac):
    budget = _budget(g, frac)
    milp = SOLVERS["checkmate_milp"](g, budget, TIME_LIMIT_S)
    res = moccasin_cpsat.solve(g, budget, TIME_LIMIT_S)
    assert milp.status is Status.OPTIMAL and res.status is Status.OPTIMAL
    sim = simulate(g, res.schedule, budget)
    assert sim.ok, sim.violations
    # Integer costs: quantization is exact here.
    assert sim.cost == res.claimed_cost == milp.claimed_cost
    assert res.lower_bound <= sim.cost


def test_below_floor_is_infeasible():
    g = random_layered_training_graph(5, 3, seed=3)
    res = moccasin_cpsat.solve(g, g.memory_floor() - 1, TIME_LIMIT_S)
    assert res.status is Status.INFEASIBLE and res.schedule is None


def test_memory_quantized_up_still_fits():
    # Sizes with no useful common divisor: 1 byte of resolution per 50 -> lossy units.
    g = ComputeGraph(
        cost=(1.0, 3.0, 1.0, 1.0),
        ram=(101, 57, 203, 99),
        preds=((), (0,), (1,), (0, 2)),
        backward=(False,) * 4,
        names=tuple("abcd"),
    )
    q = Quantization.of(g, 400, mem_resolution=4, cost_resolution=10)
    assert q.mem_unit == 50 and q.ram_units == (3, 2, 5, 2) and q.capacity == 8
    assert all(u * q.mem_unit >= r for u, r in zip(q.ram_units, g.ram, strict=True))
    for budget in (400, 420):
        res = moccasin_cpsat.solve(g, budget, TIME_LIMIT_S, mem_resolution=4)
        if res.schedule is not None:
            assert simulate(g, res.schedule, budget).ok


def test_sequence_round_trip():
    g = chain_training_graph(4)
    sched = SOLVERS["chen_sqrtn"](g, math.inf).schedule
    seq = sequence_of(sched)
    again = schedule_from_sequence(g, seq)
    assert sequence_of(again) == seq
    sim, sim_again = simulate(g, sched, math.inf), simulate(g, again, math.inf)
    assert sim_again.ok and sim_again.cost == sim.cost and sim_again.peak_ram <= sim.peak_ram
