"""Every solver's schedule survives the simulator; the MILP is the optimum."""

import functools
import math
import pathlib

import pytest
from autoremat_solvers import (
    SOLVERS,
    Status,
    chain_training_graph,
    load_graph_json,
    random_layered_training_graph,
    simulate,
)

SHARED = pathlib.Path(__file__).resolve().parents[3] / "shared" / "benchmarks" / "checkmate-graphs"
GRAPHS = {
    "chain8": chain_training_graph(8),
    "layered": random_layered_training_graph(5, 3, seed=3),
}
# Fractions between the memory floor and the checkpoint-all peak (the floor itself can
# make the MILP slow to prove infeasibility).
FRACTIONS = (0.5, 1.0)
TIME_LIMIT_S = 30.0


def _peak_all(g):
    return simulate(g, SOLVERS["checkpoint_all"](g, math.inf).schedule, math.inf).peak_ram


def _budget(g, frac):
    floor = g.memory_floor()
    return floor + frac * (_peak_all(g) - floor)


@functools.cache
def _solve(graph_name, solver, frac):
    g = GRAPHS[graph_name]
    return SOLVERS[solver](g, _budget(g, frac), TIME_LIMIT_S)


CASES = [(g, f) for g in GRAPHS for f in FRACTIONS]


@pytest.mark.parametrize("solver", sorted(SOLVERS))
@pytest.mark.parametrize(("graph_name", "frac"), CASES)
def test_schedule_passes_simulator(graph_name, frac, solver):
    g = GRAPHS[graph_name]
    res = _solve(graph_name, solver, frac)
    if res.schedule is None:
        assert res.status is Status.NO_SOLUTION and solver != "checkmate_milp"
        return
    sim = simulate(g, res.schedule, _budget(g, frac))
    assert sim.ok, sim.violations
    assert sim.cost == pytest.approx(res.claimed_cost)
    assert res.lower_bound <= sim.cost + 1e-6


@pytest.mark.parametrize(("graph_name", "frac"), CASES)
def test_milp_optimum_beats_every_solver(graph_name, frac):
    milp = _solve(graph_name, "checkmate_milp", frac)
    assert milp.status is Status.OPTIMAL
    for solver in SOLVERS:
        res = _solve(graph_name, solver, frac)
        if res.schedule is not None:
            assert milp.claimed_cost <= res.claimed_cost + 1e-6, solver
    lp = _solve(graph_name, "checkmate_lp_rounding", frac)
    assert lp.lower_bound <= milp.claimed_cost + 1e-6


@pytest.mark.parametrize("graph_name", sorted(GRAPHS))
def test_checkpoint_all_at_its_peak(graph_name):
    g = GRAPHS[graph_name]
    peak = _peak_all(g)
    for solver in ("checkpoint_all", "checkmate_milp"):
        res = SOLVERS[solver](g, peak, TIME_LIMIT_S)
        assert simulate(g, res.schedule, peak).cost == g.total_cost, solver


@pytest.mark.parametrize("solver", sorted(SOLVERS))
def test_below_floor_is_rejected(solver):
    g = GRAPHS["chain8"]
    res = SOLVERS[solver](g, g.memory_floor() - 1, TIME_LIMIT_S)
    assert res.schedule is None and res.status in (Status.INFEASIBLE, Status.NO_SOLUTION)


def test_chain_baseline_memory_ordering():
    g = chain_training_graph(16)
    peaks = {
        s: simulate(g, SOLVERS[s](g, math.inf).schedule, math.inf)
        for s in ("checkpoint_all", "chen_sqrtn", "griewank_logn")
    }
    assert (
        peaks["griewank_logn"].peak_ram
        < peaks["chen_sqrtn"].peak_ram
        < peaks["checkpoint_all"].peak_ram
    )
    assert peaks["checkpoint_all"].cost < peaks["chen_sqrtn"].cost < peaks["griewank_logn"].cost


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared Checkmate graphs absent")
def test_shared_vgg16_milp_at_90_percent():
    g = load_graph_json(SHARED / "VGG16__MLSys__256__224__224__3__train_nx.json")
    budget = 0.9 * _peak_all(g)
    res = SOLVERS["checkmate_milp"](g, budget, 60.0)
    assert res.status is Status.OPTIMAL
    sim = simulate(g, res.schedule, budget)
    assert sim.ok and sim.cost == res.claimed_cost < SOLVERS["chen_greedy"](g, budget).claimed_cost
    # Below the floor.
    assert SOLVERS["checkmate_milp"](g, 0.8 * _peak_all(g)).status is Status.INFEASIBLE
