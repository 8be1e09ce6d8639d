"""Stage 3: plans for ``budget="floor"``, the least memory the model allows."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import autoremat_ilp as ilp

from autoremat import _solve
from autoremat._errors import SolverTimeoutError
from autoremat._graph import Graph
from autoremat._plan import Plan
from autoremat._planner._candidates import (
    Candidate,
    SolverClock,
    checked,
    modelled_peak,
    no_remat_baselines,
    no_remat_plan,
    per_layer_floor,
    plan_of,
    runs_as_written,
    unshared_peak,
    within_model_error,
)
from autoremat._planner._options import PlanOptions

# The least-peak solve of one placement: its graph, problem and result.
_Lowest = tuple[Graph, ilp.Problem, ilp.Solution]


def floor_plans(candidates: Sequence[Candidate], options: PlanOptions, clock: SolverClock,
                within: float = 0.0) -> list[Plan]:
    """For each placement whose least peak is within ``within`` (a fraction) of the least
    over the placements, lowest first, its floor plan (:func:`_floor_plan`); first, one
    remat per layer where the model holds it lower or cannot tell it from them, as
    modelled or where no saved value shares the gradients' buffers (the solver leans on
    that sharing where the compiler does not follow:
    :func:`autoremat._planner._candidates.per_layer_floor`,
    :func:`autoremat._planner._candidates.unshared_peak`), and before it the function
    as written where the model holds it no higher than the first plan after, or holds
    every plan after less than ``MODEL_ERROR`` of its activation memory lower
    (:func:`autoremat._planner._candidates.within_model_error`): the compiler fuses in
    it what no checkpointed plan can (:func:`autoremat._solve.as_written`), so it is
    the safer plan where the model cannot tell them apart (an Equinox MLP of eight
    2048-wide layers, under the TPU compile options autoremat used before 2026-12-05:
    one remat per layer modelled 5% below it, compiled 8% above it).

    Raises:
      SolverTimeoutError: the time limit passed before any least-peak plan was found.
    """
    lowest: list[_Lowest] = []
    for k, candidate in enumerate(candidates):
        graph, problem = candidate.problem(options)
        lowest.append((graph, problem, checked(ilp.solve_min_peak(
            problem, **clock.limits(len(candidates) + 2 - k)))))
    found = sorted((r.peak, k) for k, (_, _, r) in enumerate(lowest) if r.save is not None)
    if not found:
        raise SolverTimeoutError("the solver found no plan for the floor budget; raise "
                                 "time_limit_s.")
    chosen = [(peak, k) for peak, k in found if peak <= found[0][0] * (1 + within)]
    solves = [r for _, _, r in lowest]
    baselines = no_remat_baselines(
        [(c.facts, g, p) for c, (g, p, _) in zip(candidates, lowest, strict=True)])
    no_remat = min(d.peak_bytes for _, _, d in baselines)
    facts, graph, nothing = next((b for b in baselines if runs_as_written(b[0], b[1])),
                                 baselines[0])
    floors = [_floor_plan(lowest[k], peak, solves, no_remat, options, clock,
                          left=2 * (len(chosen) - i))
              for i, (peak, k) in enumerate(chosen)]
    unshared = functools.partial(unshared_peak, options=options)
    layered = per_layer_floor(candidates, options, no_remat, below=[
        (floors[0].peak_bytes, modelled_peak), (min(map(unshared, floors)), unshared)])
    if layered is not None:
        floors.insert(0, layered)
    lowest_peak = min(f.peak_bytes for f in floors)
    if nothing.peak_bytes > floors[0].peak_bytes and not within_model_error(
            lowest_peak, nothing.peak_bytes, graph.fixed_bytes):
        return floors
    nothing = dataclasses.replace(nothing, status="feasible")
    return [no_remat_plan(facts, graph, nothing, nothing.peak_bytes, no_remat, options),
            *floors]


def _floor_plan(lowest: _Lowest, peak: int, solves: Sequence[ilp.Solution],
                no_remat: int, options: PlanOptions, clock: SolverClock, left: int) -> Plan:
    """The plan at a placement's least peak whose stages are lowest when no saved value is
    taken to share the gradients' buffers (the least-recompute plan at the floor spends
    that bound's slack on saving small values, which the compiler did not always fit:
    GPT-2-small, TPU v5e), then the least recompute. It is ``"optimal"`` when every solve
    (``solves`` and its own) was proven. ``no_remat``: the least no-remat peak over the
    placements."""
    graph, problem, floor = lowest
    unpacked = dataclasses.replace(problem, unshared=None)
    low = checked(ilp.solve_min_peak(unpacked, **clock.limits(left)))
    result = checked(ilp.solve(unpacked, low.peak, **clock.limits(left - 1)))
    solves = [*solves, low, result]
    if result.save is None or _evaluated_peak(problem, result) > peak:
        result = checked(ilp.solve(problem, peak, **clock.limits(left - 1)))
        solves.append(result)
    if result.save is None:  # the time limit stopped both: the least-peak plan stands
        result = floor
    proven = all(r.status is ilp.Status.OPTIMAL for r in solves)
    result = dataclasses.replace(
        result, peak=_evaluated_peak(problem, result),
        status=ilp.Status.OPTIMAL if proven else ilp.Status.FEASIBLE,
        gap=0.0 if proven else result.gap)
    d = _solve.decisions(graph, problem, result)
    return dataclasses.replace(plan_of(graph, d, d.peak_bytes, no_remat, options),
                               solve_seconds=sum(r.wall_s for r in solves))


def _evaluated_peak(problem: ilp.Problem, result: ilp.Solution) -> int:
    """The peak of ``result``'s decisions under ``problem`` (a result with a plan)."""
    assert result.save is not None and result.recompute is not None  # set together
    return ilp.evaluate(problem, result.save, result.recompute, result.offload)[1]
