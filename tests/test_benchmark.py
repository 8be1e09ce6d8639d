"""Budget sweeps: budgets, the built-in frontier, and a sweep of a tiny model."""

from __future__ import annotations

import itertools

import pytest

import autoremat
from autoremat import _benchmark, zoo
from autoremat._planner import _search

MIB = 2**20


def test_budgets_span_the_range_in_whole_mib():
    budgets = _benchmark.budgets_between(1000 * MIB + 5, 5000 * MIB, 8)
    assert len(budgets) == 8
    assert budgets[0] >= 1000 * MIB + 5 and budgets[-1] == 5000 * MIB
    assert budgets == sorted(budgets) and all(b % MIB == 0 for b in budgets)
    # Small ranges keep byte resolution.
    assert _benchmark.budgets_between(100, 200, 3) == [100, 150, 200]


def _sweep(*rows: _benchmark.Row) -> _benchmark.Sweep:
    return _benchmark.Sweep("m", "unrolled", "tpu-v5e", 0, rows, {})


def _builtin(name: str, peak_mib: int, overhead: float) -> _benchmark.Row:
    return _benchmark.Row("builtin", name, real_peak_bytes=peak_mib * MIB,
                          compiler_overhead=overhead)


def _plan(peak_mib: int, overhead: float) -> _benchmark.Row:
    return _benchmark.Row("autoremat", "b", real_peak_bytes=peak_mib * MIB,
                          compiler_overhead=overhead)


def test_a_verified_sweep_starts_at_the_floors_real_peak_below_the_models():
    """penzai-llama-stack: its floor modelled at 368.55 MiB compiled at 221.3, under no
    remat's 348 MiB; its budgets started at the model's figure, above no remat."""
    assert _benchmark.lowest_budget(386 * MIB, 232 * MIB, verified=True) == 232 * MIB
    assert _benchmark.lowest_budget(386 * MIB, 232 * MIB, verified=False) == 386 * MIB
    assert _benchmark.lowest_budget(200 * MIB, 232 * MIB, verified=False) == 232 * MIB
    assert _benchmark.lowest_budget(200 * MIB, None, verified=True) == 200 * MIB


def test_frontier_is_the_mixing_line_between_adjacent_builtins():
    low, mid, high = _builtin("a", 1000, 0.20), _builtin("b", 2000, 0.04), _builtin("c", 4000, 0.0)
    off_hull = _builtin("d", 1500, 0.19)  # above the a-b line: not on the frontier
    sweep = _sweep(low, mid, high, off_hull)
    # Half way from a to b the mixture costs 12%.
    assert _benchmark.frontier_gap(sweep, _plan(1500, 0.10)) == pytest.approx(0.02)
    assert _benchmark.frontier_gap(sweep, _plan(1500, 0.15)) == pytest.approx(-0.03)
    # Beyond the largest built-in the best fitting one counts; below the smallest, none fits.
    assert _benchmark.frontier_gap(sweep, _plan(5000, 0.01)) == pytest.approx(-0.01)
    assert _benchmark.frontier_gap(sweep, _plan(900, 0.5)) == float("inf")


def test_a_budget_without_a_verified_plan_counts_as_not_fitting():
    budget = dict(budget_bytes=300 * MIB)
    sweep = _sweep(_builtin("no checkpoint", 400, 0.0), _builtin("nothing_saveable", 200, 0.2),
                   _benchmark.Row("autoremat", "floor", real_peak_bytes=190 * MIB),
                   _benchmark.Row("autoremat", "a", real_peak_bytes=290 * MIB,
                                  compiler_overhead=0.05, **budget),
                   _benchmark.Row("autoremat", "b", status=_benchmark.NOT_VERIFIED, **budget),
                   _benchmark.Row("autoremat", "c", status="infeasible", **budget))
    c = _benchmark.compare_with_hand(sweep)
    assert c is not None
    assert (c.budgets, c.fitted, c.below_line) == (2, 1, 1)
    assert "| 1/2 | 1/2 |" in _benchmark.hand_table([sweep])
    assert _benchmark.corpus_totals([sweep]).startswith(
        "Over 1 models: 1/2 budgets fit, 1/2 at or below the hand line")


def test_corpus_totals_give_the_distribution_of_the_models_error():
    row = lambda predicted, real: _benchmark.Row(  # noqa: E731
        "autoremat", "a", budget_bytes=400 * MIB, predicted_peak_bytes=predicted * MIB,
        real_peak_bytes=real * MIB, compiles=2)
    sweep = _sweep(_builtin("no checkpoint", 400, 0.0), _builtin("nothing_saveable", 200, 0.2),
                   _benchmark.Row("autoremat", "floor", real_peak_bytes=190 * MIB),
                   row(102, 100), row(90, 100), row(130, 100))
    totals = _benchmark.corpus_totals([sweep])
    assert "2.0 compiles per budget" in totals
    assert ("over 3 plans: median |error| 10.0%, 33% within 5%, 1 under the compiler, "
            "from -10.0% to +30.0%") in totals


def test_structure_names_what_a_placement_restructures():
    assert _benchmark.structure(autoremat.Placement(cuts=(3,))) == "-"
    assert _benchmark.structure(autoremat.Placement(scan_pieces=((), (1, 2, 3)))) == "split 1+2+3"
    assert _benchmark.structure(autoremat.Placement(scan_groups=(1, 4), segment_group=2)) == (
        "nested scan 4, nested segments 2")


def test_analytic_sweep_of_a_tiny_model_predicts_the_programs_flops():
    sweep = _benchmark.sweep(zoo.get("gpt2-small-scan-tiny"), target=None, num_budgets=3,
                             options=autoremat.PlanOptions(time_limit_s=60))
    names = [r.name for r in sweep.rows if r.kind == "builtin"]
    assert names == list(_benchmark.BUILTIN_POLICIES)
    assert {r.name for r in sweep.rows if r.kind == "maxtext"} >= {"save_qkv_proj", "minimal"}
    plans = [r for r in sweep.rows if r.kind == "autoremat"]
    assert plans[0].name == "floor" and len(plans) == 4
    assert all(r.status in ("optimal", "feasible") for r in plans)
    assert plans[0].budget_bytes == plans[1].budget_bytes == sweep.floor_bytes
    for r in plans:
        assert r.predicted_peak_bytes <= r.budget_bytes
        # The plan's own FLOP count agrees with the FLOPs of the program JAX emits for it.
        assert r.predicted_overhead == pytest.approx(r.program_overhead, abs=0.01)
    overheads = [r.predicted_overhead for r in plans]
    # More room recomputes no more, within the search's relative gap (at the floor's bytes
    # the search may return another placement's plan, up to OPTIMALITY_GAP dearer).
    for lower, higher in itertools.pairwise(overheads):
        assert higher <= lower * (1 + _search.OPTIMALITY_GAP)
    assert overheads[-1] < overheads[0]
    assert "| autoremat |" in _benchmark.table(sweep)
