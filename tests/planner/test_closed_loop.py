"""Each rule of the closed loop (``autoremat._planner._closed_loop``), on a fake compiler."""

from __future__ import annotations

import dataclasses

import pytest

import autoremat
from autoremat._placement import Placement
from autoremat._planner._candidates import NEAR_NO_REMAT
from autoremat._planner._closed_loop import (
    LITTLE_RECOMPUTE,
    MARGIN_BYTES,
    ROOM_LEFT,
    ClosedLoop,
    verified_floor,
)
from autoremat._planner._search import Margins
from tests.models import MODELS

BUDGET = 100 * 2**20
A, B = Placement((1,)), Placement((2,))


@pytest.fixture(scope="module")
def base() -> autoremat.Plan:
    loss, args = MODELS["mlp"]()
    return autoremat.plan(loss, *args, budget=1.0)


def _plan(base, peak, flops, placement=A, saved=frozenset()):
    return dataclasses.replace(base, budget_bytes=BUDGET, peak_bytes=peak,
                               recompute_flops=flops, placement=placement, saved=saved)


def _loop(solve, compiled, verify_rounds=4, refine_rounds=0):
    return ClosedLoop(solve, compiled, "tpu-v5e", verify_rounds, refine_rounds)


def _below_the_model_floor(floor):
    """A solve for which every budget is below the model's floor, ``floor`` its floor plan."""
    def solve(budget, margins):
        if budget != "floor":
            raise autoremat.InfeasibleBudgetError(BUDGET, BUDGET + 1)
        return floor

    return solve


def _recording(peaks, compiled):
    """A compiler whose peak of a plan is ``peaks`` of its recompute FLOPs; appends each
    plan's recompute FLOPs to ``compiled``."""
    def compiled_peak(p):
        compiled.append(p.recompute_flops)
        return peaks[p.recompute_flops]

    return compiled_peak


def test_rounds_left_counts_verify_rounds_until_a_fit_then_refine_rounds(base):
    loop = _loop(None, None, verify_rounds=2, refine_rounds=1)
    assert loop.rounds_left()
    loop.tries = 2
    assert not loop.rounds_left()
    loop.budget_bytes = BUDGET
    loop.best = dataclasses.replace(_plan(base, BUDGET, 0), verified_peak_bytes=BUDGET)
    assert loop.rounds_left()
    loop.refines = 1
    assert not loop.rounds_left()


def test_a_plan_that_fits_far_below_the_budget_recomputing_much_gets_one_more_round(base):
    loop = _loop(None, None, refine_rounds=0)
    loop.budget_bytes, loop.tries = BUDGET, 1
    costly = int(2 * LITTLE_RECOMPUTE * base.step_flops)
    roomy = int((1 - ROOM_LEFT) * BUDGET) - 1
    for flops, peak, more in ((costly, roomy, True), (costly, roomy + 2, False),
                              (int(LITTLE_RECOMPUTE * base.step_flops) // 2, roomy, False)):
        loop.best = dataclasses.replace(_plan(base, BUDGET, flops), verified_peak_bytes=peak)
        loop.refines = 0
        assert loop.rounds_left() is more
        loop.refines = 1
        assert not loop.rounds_left()


def test_learn_counts_the_compile_and_keeps_the_largest_error(base):
    loop = _loop(None, None)
    loop.learn(_plan(base, 90, 0), 95)
    loop.learn(_plan(base, 90, 0), 92)
    assert (loop.tries, loop.refines, loop.errors[A], loop.lowest_peak) == (2, 0, 5, 92)
    loop.best = _plan(base, 90, 0)
    loop.learn(_plan(base, 90, 0), 99)
    assert (loop.tries, loop.refines, loop.errors[A]) == (2, 1, 9)


def test_fitted_keeps_the_cheapest_and_sets_margins_from_the_errors(base):
    loop = _loop(None, None)
    loop.budget_bytes = BUDGET
    loop.errors = {A: -3 * MARGIN_BYTES, B: 2 * MARGIN_BYTES}
    loop.fitted(_plan(base, BUDGET, 10), BUDGET - 1)
    assert loop.best.verified_peak_bytes == BUDGET - 1 and loop.best.verify_target == "tpu-v5e"
    # Looser than the model where the compiler came out below it; unknown placements by
    # the largest error seen.
    assert loop.margins[A] == -2 * MARGIN_BYTES
    assert loop.unknown_margin == 3 * MARGIN_BYTES
    loop.fitted(_plan(base, BUDGET, 20), BUDGET - 2)  # costlier: not kept
    assert loop.best.recompute_flops == 10


def test_exceeded_lowers_the_placement_by_the_excess_and_more_each_round(base):
    loop = _loop(None, None)
    loop.budget_bytes, loop.tries = BUDGET, 1
    loop.errors = {A: 4 * MARGIN_BYTES}
    loop.exceeded(_plan(base, BUDGET - 2 * MARGIN_BYTES, 0), BUDGET + 2 * MARGIN_BYTES)
    first = loop.margins[A]
    assert first >= 4 * MARGIN_BYTES + MARGIN_BYTES  # at least the model's error for it
    assert loop.unknown_margin == 5 * MARGIN_BYTES
    loop.tries = 2
    loop.exceeded(_plan(base, BUDGET - 2 * MARGIN_BYTES, 0), BUDGET + MARGIN_BYTES // 10)
    # The second round steps by at least 0.5% of the budget, twice over.
    assert loop.margins[A] >= first + 2 * (BUDGET // 200)


def test_exceeded_while_refining_goes_halfway_back_to_what_the_error_allows(base):
    loop = _loop(None, None)
    loop.budget_bytes, loop.best = BUDGET, _plan(base, BUDGET, 0)
    loop.errors, loop.margins = {A: 4 * MARGIN_BYTES}, {A: 0}
    loop.exceeded(_plan(base, BUDGET, 0), BUDGET + MARGIN_BYTES)
    assert loop.margins[A] == (0 + 4 * MARGIN_BYTES + MARGIN_BYTES) // 2


def test_plan_round_stops_refining_when_nothing_cheaper_is_left(base):
    cheap = _plan(base, BUDGET, 5)
    fit = lambda flops: dataclasses.replace(_plan(base, BUDGET, flops),  # noqa: E731
                                            verified_peak_bytes=BUDGET)  # as fitted() keeps it
    loop = _loop(lambda budget, margins: cheap, lambda p: BUDGET)
    loop.budget_bytes, loop.best = BUDGET, fit(5)
    assert loop.plan_round(BUDGET) is None  # not cheaper than the best
    loop.best = fit(9)
    assert loop.plan_round(BUDGET) == (cheap, BUDGET)
    assert loop.plan_round(BUDGET) is None  # already compiled


def test_plan_round_below_the_model_floor_compiles_the_floor_plan(base):
    solve = _below_the_model_floor(_plan(base, BUDGET, 50))
    floor = solve("floor", Margins())
    assert _loop(solve, lambda p: BUDGET - 5).plan_round(BUDGET) == (floor, BUDGET - 5)
    loop = _loop(solve, lambda p: BUDGET + 7)
    loop.lowest_peak = BUDGET + 3  # an earlier round came out lower
    with pytest.raises(autoremat.InfeasibleBudgetError) as info:
        loop.plan_round(BUDGET)
    assert info.value.floor_bytes == BUDGET + 3


def test_plan_round_below_the_model_floor_then_compiles_the_fallbacks(base):
    # Distinct decisions (each saves something else), compiled once each.
    floor, no_remat, per_layer = (_plan(base, BUDGET, f, saved=frozenset({f}))
                                  for f in (50, 0, 40))
    peaks = {50: BUDGET + 9, 0: BUDGET + 2, 40: BUDGET - 1}
    loop = dataclasses.replace(_loop(_below_the_model_floor(floor),
                                     lambda p: peaks[p.recompute_flops]),
                               fallbacks=lambda: [no_remat, per_layer])
    assert loop.plan_round(BUDGET) == (per_layer, BUDGET - 1)
    assert loop.tries == 2 and loop.lowest_peak == BUDGET - 1  # no remat, then it
    peaks[40] = BUDGET + 5
    with pytest.raises(autoremat.InfeasibleBudgetError) as info:
        dataclasses.replace(loop, tries=0, lowest_peak=None, compiled=set()).plan_round(BUDGET)
    assert info.value.floor_bytes == BUDGET + 2
    peaks[50] = BUDGET
    assert dataclasses.replace(loop, tries=0, compiled=set()).plan_round(BUDGET) == (floor, BUDGET)


def test_below_the_model_floor_the_fallbacks_are_compiled_in_order_of_recompute(base):
    """Flax NNX transformer, 106 MiB on TPU v5e: the nested floor fits recomputing 30.5%,
    and so does one remat per layer, recomputing 25.4%."""
    floor, nested, per_layer, no_remat = (_plan(base, BUDGET, f, saved=frozenset({f}))
                                          for f in (50, 60, 40, 0))
    peaks = {50: BUDGET + 9, 60: BUDGET - 2, 40: BUDGET - 1, 0: BUDGET + 2, 70: BUDGET - 3}
    compiled = []
    solve, compiled_peak = _below_the_model_floor(floor), _recording(peaks, compiled)
    loop = dataclasses.replace(_loop(solve, compiled_peak),
                               fallbacks=lambda: [nested, per_layer, no_remat])
    assert loop.plan_round(BUDGET) == (per_layer, BUDGET - 1)
    assert compiled == [0, 40]  # in order of recompute up to the first that fits
    compiled.clear()
    costlier = _plan(base, BUDGET, 70, saved=frozenset({70}))
    loop = dataclasses.replace(_loop(solve, compiled_peak),
                               fallbacks=lambda: [costlier, nested, no_remat])
    assert loop.plan_round(BUDGET) == (nested, BUDGET - 2)
    assert compiled == [0, 50, 60]  # none recomputing more than the one that fits


def test_below_the_model_floor_each_fallback_is_compiled_once_the_floor_plan_among_them(base):
    floor, per_layer = (_plan(base, BUDGET, f, saved=frozenset({f})) for f in (50, 40))
    compiled = []
    compiled_peak = _recording({50: BUDGET + 9, 40: BUDGET + 1}, compiled)
    loop = dataclasses.replace(_loop(_below_the_model_floor(floor), compiled_peak),
                               fallbacks=lambda: [floor, per_layer])
    with pytest.raises(autoremat.InfeasibleBudgetError):
        loop.plan_round(BUDGET)
    assert compiled == [40, 50]


def test_run_converges_on_a_compiler_that_reads_high(base):
    """The compiler puts every plan 3 MiB above the model; the loop lowers the model's
    budget until a plan fits."""
    asked: list[Margins] = []

    def solve(budget, margins):
        asked.append(margins)
        return _plan(base, BUDGET - margins.of(A), BUDGET - margins.of(A))

    plan = _loop(solve, lambda p: p.peak_bytes + 3 * MARGIN_BYTES).run(BUDGET)
    assert plan.verified_peak_bytes <= BUDGET == plan.budget_bytes
    assert asked[0] == Margins() and len(asked) <= 4


def test_a_refining_round_aims_by_the_secant_through_the_best_and_the_plan_above_it(base):
    """The compiler's error differs between plans (the zoo's MLP on TPU v5e: +12% on a plan
    near the budget, +6% on the one that fit): by the largest error of the placement, a
    refining round would solve the plan that fit again; the secant through the two
    compiled plans finds a cheaper one that fits."""
    def solve(budget, margins):
        peak = budget - margins.of(A)
        # Less memory, more recompute; each plan its own decisions.
        return _plan(base, peak, 2 * BUDGET - peak, saved=frozenset({peak}))

    def compiled_peak(p):
        return int(p.peak_bytes * (1.12 if p.peak_bytes > 0.95 * BUDGET else 1.06))

    fitted = _loop(solve, compiled_peak).run(BUDGET)
    refined = _loop(solve, compiled_peak, refine_rounds=1).run(BUDGET)
    assert fitted.verify_compiles == 2 and refined.verify_compiles == 3
    assert refined.verified_peak_bytes <= BUDGET
    assert refined.recompute_flops < fitted.recompute_flops


def test_run_without_a_fit_says_how_far_it_got(base):
    loop = _loop(lambda b, m: _plan(base, BUDGET, 0), lambda p: 2 * BUDGET, verify_rounds=2)
    with pytest.raises(autoremat.BudgetNotVerifiedError, match="after 2 compiles") as info:
        loop.run(BUDGET)
    assert info.value.floor_bytes == 2 * BUDGET  # the lowest compiled
    assert isinstance(info.value, autoremat.InfeasibleBudgetError)


def test_run_out_of_rounds_compiles_the_floor_plan_and_the_fallbacks(base):
    """The model's plans near its floor all compile above a budget that its floor plan, or
    a plan a user tries by hand, fits (penzai's LayerStack at its verified floor)."""
    floor = _plan(base, BUDGET // 2, 50, saved=frozenset({50}))
    per_layer = _plan(base, BUDGET, 40, saved=frozenset({40}))
    peaks = {0: BUDGET + 3, 50: BUDGET + 1, 40: BUDGET - 1}
    solve = lambda budget, margins: floor if budget == "floor" else _plan(base, BUDGET, 0)
    loop = dataclasses.replace(_loop(solve, lambda p: peaks[p.recompute_flops],
                                     verify_rounds=2), fallbacks=lambda: [per_layer])
    plan = loop.run(BUDGET)
    assert plan.recompute_flops == 40 and plan.verified_peak_bytes == BUDGET - 1
    assert plan.verify_compiles == 3  # two rounds, the fallback (before the floor plan)
    peaks[40] = BUDGET + 1
    peaks[50] = BUDGET
    loop = dataclasses.replace(loop, tries=0, best=None, lowest_peak=None, compiled=set())
    assert loop.run(BUDGET).recompute_flops == 50


def test_out_of_rounds_the_plan_under_twice_the_largest_error_comes_before_the_floor(base):
    """The model's error differs several times over between plans (a Llama-style decoder
    of 12 unrolled layers at 3870 MiB on TPU v5e): when no round's plan fits, the plan for
    the budget less twice the largest error is compiled before the floor plan, which
    recomputes far more."""
    floor = _plan(base, BUDGET // 2, 50, saved=frozenset({50}))
    error = 10 * 2**20

    def solve(budget, margins):
        if budget == "floor":
            return floor
        return _plan(base, budget - 1, 1 if budget == BUDGET else 5, saved=frozenset({budget}))

    compiled = []
    peaks = {1: BUDGET + error - 1, 5: BUDGET - 3 * error, 50: BUDGET // 2}
    loop = _loop(solve, _recording(peaks, compiled), verify_rounds=1)
    plan = loop.run(BUDGET)
    assert compiled == [1, 5] and plan.recompute_flops == 5
    assert plan.peak_bytes == BUDGET - 2 * error - MARGIN_BYTES - 1
    assert plan.verify_compiles == 2

    def timing_out(budget, margins):
        if budget not in ("floor", BUDGET):
            raise autoremat.SolverTimeoutError("no plan within the time limit")
        return solve(budget, margins)

    compiled.clear()
    plan = _loop(timing_out, _recording(peaks, compiled), verify_rounds=1).run(BUDGET)
    assert compiled == [1, 50] and plan.recompute_flops == 50  # then the floor plan


def test_no_plan_is_compiled_twice_for_one_budget(base):
    """A round's plan among the fallbacks, and the function as written compiled among them
    before a fallback fit, are not compiled again (each would count as a compile)."""
    rounds, floor, per_layer = (_plan(base, BUDGET, f, saved=frozenset({f}))
                                for f in (60, 50, 40))
    as_written = dataclasses.replace(_plan(base, BUDGET, 0), no_remat=True)
    peaks = {60: BUDGET + 3, 50: BUDGET + 1, 0: BUDGET + 2, 40: BUDGET - 1}
    compiled = []
    solve = lambda budget, margins: floor if budget == "floor" else rounds  # noqa: E731
    loop = dataclasses.replace(_loop(solve, _recording(peaks, compiled), verify_rounds=1),
                               fallbacks=lambda: [rounds, as_written, per_layer],
                               no_remat=lambda peak: as_written)
    plan = loop.run(BUDGET)
    assert plan.recompute_flops == 40 and compiled == [60, 0, 40]
    assert plan.verify_compiles == 3


def test_verified_floor_is_the_lowest_compiled(base):
    floors = [_plan(base, 10, 0, A), _plan(base, 11, 0, B)]
    chosen = verified_floor(floors, lambda p: {A: 30, B: 20}[p.placement], "tpu-v5e")
    assert chosen.placement == B and chosen.verified_peak_bytes == 20


def test_verified_floor_recomputes_least_among_the_lowest_compiled(base):
    floors = [_plan(base, 10, 50, A), _plan(base, 11, 40, B), _plan(base, 12, 40, A)]
    chosen = verified_floor(floors, lambda p: 20, "tpu-v5e")
    assert chosen.peak_bytes == 11 and chosen.recompute_flops == 40


def test_a_fitting_plan_that_recomputes_little_gives_way_to_no_remat_where_that_fits_too(base):
    """Near no remat the compiler may fit the function as written, which the model puts
    far above the budget (nnx-transformer at its no-remat peak: a plan recomputing 0.16%
    of the step compiled instead; linen-cnn at its no-remat peak: one recomputing 7.5%)."""
    little = int(NEAR_NO_REMAT * base.step_flops)
    some = int(LITTLE_RECOMPUTE * base.step_flops)
    none = _plan(base, 3 * BUDGET, 0, B)
    peaks = {little: BUDGET - 5, some: BUDGET - 5, 2 * some: BUDGET - 5, 0: BUDGET - 1}
    made = []

    def run(flops):
        fits = _plan(base, BUDGET, flops)
        loop = dataclasses.replace(_loop(lambda b, m: fits, lambda p: peaks[p.recompute_flops]),
                                   no_remat=lambda peak: made.append(peak) or none)
        return loop.run(BUDGET)

    for flops in (little, some):
        plan = run(flops)
        assert plan.recompute_flops == 0 and plan.verified_peak_bytes == BUDGET - 1
        assert plan.verify_compiles == 2
    assert run(2 * some).recompute_flops == 2 * some and len(made) == 2  # not tried
    made.clear()
    # A plan near no remat compiled above the budget: tried at once, before a costlier one.
    near, fits = _plan(base, BUDGET, little), _plan(base, BUDGET - 9, 10 * little)
    peaks[little] = BUDGET + 50
    loop = dataclasses.replace(
        _loop(lambda b, m: near if m == Margins() else fits, lambda p: peaks[p.recompute_flops]),
        no_remat=lambda peak: made.append(peak) or none)
    plan = loop.run(BUDGET)
    assert plan.recompute_flops == 0 and plan.verify_compiles == 2 and len(made) == 1
    made.clear()
    peaks[little] = BUDGET - 5
    peaks[0] = BUDGET + 1
    plan = run(little)  # compiled, does not fit: the plan that recomputes stands
    assert plan.recompute_flops == little and plan.verify_compiles == 2 and len(made) == 1


def test_a_fitting_plan_that_leaves_room_gives_way_to_no_remat_where_that_fits_too(base):
    """A plan recomputing much fits well under the budget where the model puts the
    function as written far above it (keras-cnn at its no-remat peak of 89 MiB: a plan
    recomputing 11% compiled at 61 MiB)."""
    costly = int(2 * LITTLE_RECOMPUTE * base.step_flops)  # above it: only the room counts
    none = _plan(base, 3 * BUDGET, 0, B)
    roomy = int((1 - ROOM_LEFT) * BUDGET) - 1
    peaks = {0: BUDGET}

    def run(peak):
        peaks[costly] = peak
        loop = dataclasses.replace(
            _loop(lambda b, m: _plan(base, BUDGET, costly), lambda p: peaks[p.recompute_flops]),
            no_remat=lambda _: none)
        return loop.run(BUDGET)

    plan = run(roomy)
    assert plan.recompute_flops == 0 and plan.verified_peak_bytes == BUDGET
    assert plan.verify_compiles == 2
    plan = run(roomy + 2)  # little room left: the function as written is not compiled
    assert plan.recompute_flops == costly and plan.verify_compiles == 1


def test_a_fitting_plan_gives_way_to_a_cheaper_one_by_hand_that_fits_too(base):
    """One remat per layer is compiled once a costlier plan fits, where the model's
    errors so far allow it to fit (linen-cnn at 140.9 MiB: a plan recomputing 33.13%
    compiled at 124.3 MiB, where its hand baseline, recomputing 32.97%, fits at 128.1)."""
    costly = int(0.3 * base.step_flops)
    fits = _plan(base, BUDGET, costly)  # compiled 10 MiB under the model
    near = _plan(base, BUDGET + 9 * 2**20, costly - 2, B)  # within that error
    far = _plan(base, BUDGET + 11 * 2**20, costly - 1, B)  # beyond it
    dearer = _plan(base, BUDGET - 2**20, costly + 1, B)
    peaks = {costly: BUDGET - 10 * 2**20, costly - 2: BUDGET - 1, costly - 1: BUDGET - 1,
             costly + 1: BUDGET - 1}

    def run(*by_hand):
        compiled = []
        loop = dataclasses.replace(
            _loop(lambda b, m: fits, lambda p: compiled.append(p) or peaks[p.recompute_flops]),
            by_hand=lambda _: by_hand)
        return loop.run(BUDGET), compiled

    plan, compiled = run(far, dearer, near)
    assert plan.recompute_flops == costly - 2 and plan.verified_peak_bytes == BUDGET - 1
    assert [p.recompute_flops for p in compiled] == [costly, costly - 2]
    assert plan.verify_compiles == 2
    peaks[costly - 2] = BUDGET + 1  # compiled, does not fit: the solved plan stands
    plan, compiled = run(near)
    assert plan.recompute_flops == costly and len(compiled) == 2


def test_a_nested_fallback_that_fits_far_below_the_budget_is_refined_among_nested_placements(
        base):
    """eqx-mlp at 355 MiB on TPU v5e: below the model's floor of the placements without
    nesting, its nested floor fits at 270.3 MiB recomputing 48.9%; solved again among the
    nested placements by that plan's error, a plan recomputing 33.4% fits at 332.2 MiB."""
    step = base.step_flops
    nested = dataclasses.replace(A, segment_group=2)
    floor = _plan(base, BUDGET + 50, int(0.5 * step), saved=frozenset({1}))
    nested_floor = _plan(base, BUDGET - 10, int(0.45 * step), nested, frozenset({2}))
    refined = _plan(base, BUDGET + 20, int(0.3 * step), nested, frozenset({3}))
    peaks = {floor.recompute_flops: BUDGET + 5, nested_floor.recompute_flops: BUDGET // 2,
             refined.recompute_flops: BUDGET - 3}
    asked = []

    def solve_nesting(budget, margins):
        asked.append(budget - margins.of(nested))  # the model budget it solves
        return refined

    loop = dataclasses.replace(
        _loop(_below_the_model_floor(floor), lambda p: peaks[p.recompute_flops]),
        fallbacks=lambda: [nested_floor], solve_nesting=solve_nesting)
    plan = loop.run(BUDGET)
    assert plan.recompute_flops == refined.recompute_flops
    assert plan.verified_peak_bytes == BUDGET - 3 and plan.verify_compiles == 2  # not the floor
    # Solved by the nested floor's error: the compiler put it 40% of the budget lower.
    assert asked == [BUDGET - (BUDGET // 2 - (BUDGET - 10) + MARGIN_BYTES)]


def test_a_refining_round_the_time_limit_stops_keeps_the_plan_that_fit(base):
    def solve(budget, margins):
        raise autoremat.SolverTimeoutError("no plan within the time limit")

    loop = _loop(solve, lambda p: BUDGET)
    loop.budget_bytes = BUDGET
    loop.best = dataclasses.replace(_plan(base, BUDGET, 5), verified_peak_bytes=BUDGET)
    assert loop.plan_round(BUDGET) is None
    loop.best = None
    with pytest.raises(autoremat.SolverTimeoutError):
        loop.plan_round(BUDGET)
