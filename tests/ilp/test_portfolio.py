"""Solving: the least-cost plan under a budget, the least peak, the backends in turn."""

import dataclasses

import autoremat_ilp as ilp
import numpy as np
import pytest
from autoremat_ilp import portfolio
from autoremat_ilp.greedy import greedy_start
from autoremat_ilp.memory import reserved_peaks
from autoremat_ilp.milp import solve_milp

from tests.ilp.examples import chain, keep_or_recompute, one_buffer_capped, three_way, two_regions


def test_a_saved_value_that_fits_no_reserved_buffer_is_recomputed_instead():
    problem = two_regions(np.array([True, False]))
    without = two_regions(None)
    assert ilp.solve(without, 160, time_limit_s=10).save.all()
    result = ilp.solve(problem, 160, time_limit_s=10)
    assert not result.save[0] and result.peak == 120  # 70 + 50 recomputed
    assert result.peak == ilp.evaluate(problem, result.save, result.recompute)[1]


def test_three_way_choice():
    # Kept, value 0 stays through region 1's stages; offloaded (cost 3) it takes device
    # memory only in region 0's forward and backward stages.
    problem, three = keep_or_recompute(), three_way()
    assert ilp.solve(problem, 20).cost == 0  # keep both: region 1 backward at 20
    assert ilp.solve(problem, 15).cost == 100  # value 0 must be recomputed
    t = ilp.solve(three, 15)  # or offloaded: region 0 forward at 5 + 10
    assert t.cost == 3 and t.offload.tolist() == [True, False]
    assert t.save.tolist() == [False, True] and t.peak == 15
    assert ilp.violations(three, t.save, t.recompute, t.offload) == []
    assert ilp.stage_bytes(three, t.save, t.recompute, t.offload).tolist() == [
        10, 10, 15, 5]
    # The transfers' device bytes count: below 15 offload does not fit.
    assert ilp.solve(three, 10).cost == 100
    # A host budget below the value's bytes rules offload out.
    assert ilp.solve(dataclasses.replace(three, host_budget=9.0), 15).cost == 100
    assert ilp.violations(three, t.save, t.recompute, np.array([True, True])) == [
        "value 1 cannot be offloaded", "value 1 is both saved and offloaded",
        "offloaded values take 20 bytes of host memory, over the host budget of 10"]


@pytest.mark.parametrize("backends", [("HIGHS",), ("SCIP",), ("HIGHS", "SCIP")])
def test_every_backend_finds_the_least_cost_plan(backends):
    # The backward also reads value 0 (8 bytes, cost 1): saved, it is held through region
    # 1's backward (20 + 8 + 4 + 1 = 33); recomputed, only in region 0's (10 + 4 + 8).
    problem = dataclasses.replace(chain(), must_cover=np.array([True, True, False, True]))
    full = ilp.solve(problem, 33, backends=backends)
    assert full.status is ilp.Status.OPTIMAL and full.cost == 0 and full.peak == 33
    tight = ilp.solve(problem, 32, backends=backends)
    assert tight.status is ilp.Status.OPTIMAL and tight.cost == 1 and tight.peak == 25
    assert tight.recompute.tolist() == [True, False, False, False]
    assert ilp.violations(problem, tight.save, tight.recompute) == []


@pytest.mark.parametrize("backends", [("HIGHS",), ("SCIP",)])
def test_a_cutoff_below_the_least_cost_says_so_and_one_at_it_finds_the_plan(backends):
    problem = dataclasses.replace(chain(), must_cover=np.array([True, True, False, True]))
    at = ilp.solve(problem, 32, backends=backends, cutoff=1.0)
    assert at.status is ilp.Status.OPTIMAL and at.cost == 1
    below = ilp.solve(problem, 32, backends=backends, cutoff=0.5)
    assert below.status is ilp.Status.CUT_OFF and below.save is None
    # Where the relaxation's bound is above the cutoff, no backend runs.
    assert ilp.solve(problem, 32, backends=backends, cutoff=0.0).status is ilp.Status.CUT_OFF
    # Below the floor as well: a cutoff does not look for the least peak.
    assert ilp.solve(problem, 1, backends=backends, cutoff=0.5).status is ilp.Status.CUT_OFF


def test_an_infeasible_budget_reports_the_least_peak():
    problem = chain()
    low = ilp.solve_min_peak(problem)
    assert low.status is ilp.Status.OPTIMAL and low.bound == low.peak
    assert ilp.violations(problem, low.save, low.recompute) == []
    result = ilp.solve(problem, low.peak - 1)
    assert result.status is ilp.Status.INFEASIBLE and result.save is None
    assert result.peak == low.peak
    assert ilp.solve(problem, low.peak).status is ilp.Status.OPTIMAL


def test_progress_reports_costs_and_ends_with_the_plan():
    calls = []
    result = ilp.solve(three_way(), 15, progress=lambda *a: calls.append(a))
    assert calls and calls[-1][1] == result.cost == 3
    for elapsed, best, bound in calls:
        assert elapsed >= 0 and best >= bound


def test_a_lazy_bound_the_start_holds_at_the_budget_is_in_the_first_milp(monkeypatch):
    """Recomputing both values, the start holds 20 bytes in the capped bound; at a budget
    of 20 that bound goes into the first MILP. Left out, that MILP saves both (20 bytes
    in the uncapped bound, 30 in the capped one), and a second MILP is needed."""
    problem = one_buffer_capped(np.array([10, 10]))
    start = greedy_start(problem, 20)
    assert start.plan is not None and reserved_peaks(problem, *start.plan) == [10, 20]
    milps = []

    def counted(milp, **kwargs):
        milps.append(milp.A.shape[0])
        return solve_milp(milp, **kwargs)

    monkeypatch.setattr(portfolio, "solve_milp", counted)
    result = ilp.solve(problem, 20, backends=("HIGHS",), start=start)
    assert result.peak == ilp.evaluate(problem, result.save, result.recompute)[1] <= 20
    assert len(milps) == 1
    # Far above what the start holds, the bound is left out, and no plan breaks it.
    milps.clear()
    assert ilp.solve(problem, 30, backends=("HIGHS",)).cost == 0
    assert len(milps) == 1
