"""The simulator accepts valid schedules and rejects broken ones."""

import numpy as np
import pytest
from autoremat_solvers import Schedule, chain_training_graph, simulate
from autoremat_solvers.graph import ComputeGraph

# 0 -> 1 -> 2, each value 10 bytes, costs 1, 2, 4.
LINE = ComputeGraph(
    cost=(1.0, 2.0, 4.0),
    ram=(10, 10, 10),
    preds=((), (0,), (1,)),
    backward=(False,) * 3,
    names=("a", "b", "c"),
)


def _schedule(R, S):
    return Schedule(np.array(R, dtype=bool), np.array(S, dtype=bool))


def test_valid_line_schedule():
    sched = _schedule([[1, 0, 0], [0, 1, 0], [0, 0, 1]], [[0, 0, 0], [1, 0, 0], [0, 1, 0]])
    sim = simulate(LINE, sched, budget=20)
    assert sim.ok, sim.violations
    assert sim.cost == 7.0
    assert sim.peak_ram == 20


def test_single_stage_frees_after_last_use():
    sim = simulate(LINE, _schedule([[1, 1, 1]], [[0, 0, 0]]), budget=20)
    assert sim.ok and sim.peak_ram == 20


def test_rejects_value_not_computed():
    # Stage 1 computes 2 but 1 was never computed.
    sched = _schedule([[1, 0, 0], [0, 0, 1]], [[0, 0, 0], [1, 0, 0]])
    sim = simulate(LINE, sched, budget=100)
    assert not sim.ok
    assert any("without its inputs [1]" in v for v in sim.violations)


def test_rejects_dropped_value():
    # 0 is not kept into stage 1, so computing 1 there lacks its input.
    sched = _schedule([[1, 0, 0], [0, 1, 1]], [[0, 0, 0], [0, 0, 0]])
    assert not simulate(LINE, sched, budget=100).ok


def test_rejects_keeping_value_not_in_memory():
    sched = _schedule([[1, 0, 0], [0, 1, 1]], [[0, 0, 0], [1, 1, 0]])
    sim = simulate(LINE, sched, budget=100)
    assert any("keeps value 1" in v for v in sim.violations)


def test_rejects_over_budget():
    sim = simulate(LINE, _schedule([[1, 1, 1]], [[0, 0, 0]]), budget=19)
    assert not sim.ok
    assert any("budget" in v for v in sim.violations)


def test_rejects_missing_output():
    sim = simulate(LINE, _schedule([[1, 1, 0]], [[0, 0, 0]]), budget=100)
    assert not sim.ok and "outputs never computed" in sim.violations[-1]


def test_recomputation_counts_cost():
    # Stage 1 recomputes 0 to get 1; stage 2 keeps only 1.
    sched = _schedule([[1, 0, 0], [1, 1, 0], [0, 0, 1]], [[0, 0, 0], [0, 0, 0], [0, 1, 0]])
    sim = simulate(LINE, sched, budget=20)
    assert sim.ok and sim.cost == 8.0


def test_shape_mismatch():
    g = chain_training_graph(2)
    assert not simulate(g, _schedule([[1, 1, 1]], [[0, 0, 0]]), budget=1e9).ok


def test_schedule_shapes_must_match():
    with pytest.raises(ValueError):
        Schedule(np.zeros((2, 3), dtype=bool), np.zeros((3, 3), dtype=bool))
