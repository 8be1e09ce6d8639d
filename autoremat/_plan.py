"""The public entry points: :func:`plan`, :func:`optimize` and the :class:`Plan` they make."""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from autoremat_solvers import policy as policy_model
from autoremat_solvers.milp import MilpStatus, Progress

from autoremat import (
    _layout,
    _maxtext,
    _measure,
    _policy_file,
    _program,
    _report,
    _rewrite,
    _solve,
    _trace,
)
from autoremat._budget import FLOOR, Budget, format_bytes, parse_budget
from autoremat._graph import Graph
from autoremat._layout import Layout
from autoremat._offload import OffloadConfig, offload_problem
from autoremat._op_times import OpTimes
from autoremat._placement import Placement


class InfeasibleBudgetError(ValueError):
    """No plan fits the budget. ``floor_bytes`` is the smallest budget that any plan fits."""

    def __init__(self, budget_bytes: int, floor_bytes: int):
        self.budget_bytes = budget_bytes
        self.floor_bytes = floor_bytes
        super().__init__(
            f"no remat plan fits a budget of {budget_bytes} bytes ({format_bytes(budget_bytes)}); "
            f"the smallest feasible budget is {floor_bytes} bytes ({format_bytes(floor_bytes)}). "
            "Raise the budget, shrink the batch, or shard the step.")


class BudgetNotVerifiedError(RuntimeError):
    """The closed loop (``verify``) ran out of rounds before the compiler's peak fit."""


# Lowered a little past the measured excess, so the next plan does not land on the edge.
_VERIFY_MARGIN = 2**20

# How far the model's peak may be from the compiler's (bench/results: within 10% on the
# zoo's plans but for some at the no-remat end): with ``verify``, the floor plans of the
# placements whose model floor is within it of the least are compiled.
_MODEL_ERROR = 0.1

# A candidate placement and the program it is traced on (whole, or with its scans split).
Candidate = tuple[_trace.ProgramFacts, Placement]


class SolverTimeoutError(RuntimeError):
    """The solver's time limit passed before it found any plan within the budget."""


@dataclasses.dataclass(frozen=True)
class Plan:
    """A remat plan for one function and one set of argument shapes.

    Attributes:
      saved: ids of the values kept as residuals (the rest the backward reads is recomputed).
      recomputed: ids of the values recomputed in the backward pass.
      budget_bytes: the budget the plan was solved for.
      peak_bytes: the predicted peak bytes of the whole gradient computation.
      saved_bytes: bytes of residuals kept between the forward and backward pass
        (arguments not included).
      recompute_flops: FLOPs the plan adds to the step: recomputed in the backward pass
        (what JAX recomputes whatever the plan included), and a split scan's gradient
        sums (``graph.fixed_flops``).
      step_flops: FLOPs of the forward and backward pass without remat.
      no_remat_peak_bytes: the predicted peak when every value the backward reads is saved.
      status: ``"optimal"``, or ``"feasible"`` when the time limit stopped the solver
        (see ``gap``).
      gap: relative gap between the plan's recompute cost and the solver's lower bound.
      placement: where the remat regions are (:class:`autoremat.Placement`).
      solve_seconds: time spent in the solver.
      verified_peak_bytes: the real compiler's peak for the step, when the plan was made
        with ``verify`` (``None`` otherwise).
      verify_target: the target it was compiled for (``None`` without ``verify``).
      graph: the traced value graph (not part of equality or hashing).
      offloaded: ids of the values offloaded to host memory (planned with ``offload``).
      offloaded_bytes: host bytes the offloaded values take.
      offload_flops: the modelled cost of their transfers, as FLOPs at the target's peak
        rate (see :class:`autoremat.OffloadConfig`).
      offload: the offload configuration the plan was made with (``None``: no offload).
      layout: how its bytes are counted: ``"dense"`` or ``"tpu"`` (see :func:`plan`).
    """

    saved: frozenset[int]
    recomputed: frozenset[int]
    budget_bytes: int
    peak_bytes: int
    saved_bytes: int
    recompute_flops: int
    step_flops: int
    no_remat_peak_bytes: int
    status: str
    gap: float
    placement: Placement
    solve_seconds: float = dataclasses.field(compare=False)
    graph: Graph = dataclasses.field(compare=False, repr=False)
    verified_peak_bytes: int | None = None
    verify_target: str | None = None
    offloaded: frozenset[int] = frozenset()
    offloaded_bytes: int = 0
    offload_flops: int = 0
    offload: OffloadConfig | None = None
    layout: Layout = "dense"

    @property
    def overhead(self) -> float:
        """Recomputed FLOPs over the FLOPs of the step without remat."""
        return self.recompute_flops / max(1, self.step_flops)

    @property
    def modeled_overhead(self) -> float:
        """Recomputed FLOPs plus the offload cost (``offload_flops``) over the FLOPs of the
        step without remat: the modelled step-time overhead."""
        return (self.recompute_flops + self.offload_flops) / max(1, self.step_flops)

    @property
    def policy(self) -> Callable:
        """The ``jax.checkpoint`` policy that saves this plan's named values.

        It acts on the names :meth:`apply` places; use it with functions made by
        :meth:`apply`, never around them (the outer checkpoint policy would win).
        """
        return _program.policy_for(self.saved, self.offloaded)

    def apply(self, fn: Callable) -> Callable:
        """``fn`` rewritten to follow this plan (same signature, outputs and gradients).

        Raises:
          PlanMismatchError: when called with arguments whose program differs from the one
            the plan was made for.
        """
        return _rewrite.rewrite(fn, self.saved, self.graph.fingerprint, self.placement,
                                self.offloaded)

    def report(self, max_rows: int = 40) -> str:
        """A readable table of the plan's decisions, largest first, with its totals."""
        return _report.report(self, max_rows=max_rows)

    def save(self, path: str | os.PathLike) -> None:
        """Writes the plan to a policy file (JSON), for :func:`load_plan` and
        ``autoremat report``.

        """
        _policy_file.PolicyFile.from_plan(self).write(path)

    def plot_memory(self, path: str | os.PathLike, *, title: str | None = None) -> None:
        """Draws the modelled memory in use at each region's forward and backward stage,
        this plan against no remat, with the budget (PNG or SVG by ``path``'s suffix;
        needs matplotlib: ``pip install "autoremat[plots]"``)."""
        from autoremat import _plots  # matplotlib is optional

        _plots.memory_timeline(self, path, title=title)

    def maxtext_config(self) -> dict[str, str]:
        """What the plan does with each name the user's code gives tensors
        (:func:`jax.ad_checkpoint.checkpoint_name`), as MaxText's ``remat_policy: custom``
        states it: ``"device"``, ``"offload"`` or ``"remat"``, or ``"mixed"`` when the plan
        treats the name's tensors differently in different layers (see
        :mod:`autoremat._maxtext`)."""
        return _maxtext.config(self)

    def save_maxtext(self, path: str | os.PathLike) -> None:
        """Writes :meth:`maxtext_config` as a MaxText configuration (YAML with
        ``remat_policy: custom``); ``"mixed"`` names are written as ``remat``, with a comment.

        Raises:
          ValueError: no tensor of the function carries a name.
        """
        _maxtext.write(self, path)

    @property
    def name_policy(self) -> Callable:
        """The ``jax.checkpoint`` policy over the user's own names that
        :meth:`maxtext_config` states: ``save_only_these_names`` of its ``"device"`` names
        (and ``save_and_offload_only_these_names`` when some are ``"offload"``).

        Use it around the user's layers instead of :meth:`apply`. It keeps what the plan
        keeps when the plan keeps named tensors only and treats each name alike in every
        layer; otherwise it approximates the plan.
        """
        return _maxtext.name_policy(self)


def _resolve_budget(budget: Budget, graph: Graph, no_remat_peak: int) -> int:
    parsed = parse_budget(budget)
    if isinstance(parsed, int):
        return parsed
    return graph.fixed_bytes + int(parsed * (no_remat_peak - graph.fixed_bytes))


def _lower_bound(problem: policy_model.PolicyProblem) -> int:
    """A peak no plan goes below: what every plan holds (the values it must save and the
    bytes in use whatever the plan), nothing recomputed."""
    nothing = np.zeros(problem.num_values, dtype=bool)
    return int(policy_model.stage_bytes(problem, problem.must_save, nothing).max())


# However long tracing took, each placement's solve gets at least this part of its equal
# share of the time limit, so that a program slow to trace still gets a plan searched for.
_MIN_SOLVER_SHARE = 0.25


def solver_share(time_limit_s: float, elapsed_s: float, left: int, placements: int) -> float:
    """Seconds the solver gets for the next of the ``left`` placements still to solve (of
    ``placements``), ``elapsed_s`` after planning started: an equal part of what is left
    of ``time_limit_s``, but at least ``_MIN_SOLVER_SHARE`` of an equal part of all of it.
    """
    return max((time_limit_s - elapsed_s) / left, _MIN_SOLVER_SHARE * time_limit_s / placements)


def _problem_of(candidate: Candidate, op_times: OpTimes | None, offload: OffloadConfig | None
                ) -> tuple[Graph, policy_model.PolicyProblem]:
    """The graph of one placement and its save/recompute (and offload) problem."""
    facts, placement = candidate
    _, graph = _trace.graph_of(facts.program, placement, facts)
    problem = _solve.to_problem(graph, op_times)
    if offload is not None:
        problem = offload_problem(graph, problem, offload)
    return graph, problem


def _plan_of(graph: Graph, d: _solve.Decisions, budget_bytes: int, no_remat_peak: int,
             offload: OffloadConfig | None) -> Plan:
    """The :class:`Plan` of decisions ``d`` on ``graph``."""
    return Plan(saved=d.saved, recomputed=d.recomputed, budget_bytes=budget_bytes,
                peak_bytes=d.peak_bytes, saved_bytes=d.saved_bytes,
                recompute_flops=d.recompute_flops, step_flops=graph.step_flops,
                no_remat_peak_bytes=no_remat_peak, status=d.status, gap=d.gap,
                placement=graph.placement, solve_seconds=d.solve_seconds, graph=graph,
                offloaded=d.offloaded, offloaded_bytes=d.offloaded_bytes,
                offload_flops=d.offload_flops, offload=offload, layout=graph.layout)


def _floor_plans(candidates: Sequence[Candidate], share: Callable[[int], float],
                 op_times: OpTimes | None, offload: OffloadConfig | None, within: float = 0.0
                 ) -> list[Plan]:
    """Plans for ``budget="floor"``: for each placement whose least peak is within
    ``within`` (a fraction) of the least over the placements, lowest first, the plan at
    its least peak whose stages are lowest when no saved value is taken to share the
    gradients' buffers (the least-recompute plan at the floor spends that bound's slack
    on saving small values, which the compiler did not always fit: GPT-2-small, TPU v5e),
    then the least recompute. A plan is ``"optimal"`` when every solve was proven."""
    lowest = []
    for k, candidate in enumerate(candidates):
        graph, problem = _problem_of(candidate, op_times, offload)
        lowest.append((graph, problem, policy_model.solve_min_peak(
            problem, time_limit_s=share(len(candidates) + 2 - k))))
    found = sorted((r.peak, k) for k, (_, _, r) in enumerate(lowest) if r.save is not None)
    if not found:
        raise SolverTimeoutError("the solver found no plan for the floor budget; raise "
                                 "time_limit_s.")
    chosen = [(peak, k) for peak, k in found if peak <= found[0][0] * (1 + within)]
    plans = []
    for i, (peak, k) in enumerate(chosen):
        left = 2 * (len(chosen) - i)  # solves left: two per floor plan
        graph, problem, floor = lowest[k]
        unpacked = dataclasses.replace(problem, unshared=None)
        low = policy_model.solve_min_peak(unpacked, time_limit_s=share(left))
        result = policy_model.solve(unpacked, low.peak, time_limit_s=share(left - 1))
        solves = [r for _, _, r in lowest] + [low, result]
        if result.save is None or policy_model.evaluate(
                problem, result.save, result.recompute, result.offload)[1] > peak:
            result = policy_model.solve(problem, peak, time_limit_s=share(left - 1))
            solves.append(result)
        if result.save is None:  # the time limit stopped both: the least-peak plan stands
            result = floor
        proven = all(r.status is MilpStatus.OPTIMAL for r in solves)
        result = dataclasses.replace(
            result, peak=policy_model.evaluate(problem, result.save, result.recompute,
                                               result.offload)[1],
            status=MilpStatus.OPTIMAL if proven else MilpStatus.FEASIBLE,
            gap=0.0 if proven else result.gap)
        d = _solve.decisions(graph, problem, result)
        no_remat = _solve.no_remat(graph, problem).peak_bytes
        plans.append(dataclasses.replace(_plan_of(graph, d, d.peak_bytes, no_remat, offload),
                                         solve_seconds=sum(r.wall_s for r in solves)))
    return plans


def _candidates(flat_fn: Callable, avals: Sequence[jax.ShapeDtypeStruct], layout: Layout,
                nested_scans: bool, nested_segments: bool) -> list[Candidate]:
    """The placements :func:`plan_flat` solves, in its order of preference."""
    program = _trace.trace_program(flat_fn, avals, layout=layout)
    programs = [program]
    if any(pieces := _program.scan_pieces_of(program)):
        programs.append(_trace.split_program(program, avals, pieces))
    facts = [_trace.program_facts(p, split_from=None if p is program else program)
             for p in programs]
    candidates: list[Candidate] = [
        (f, Placement(cuts, f.program.scan_pieces)) for f in facts
        for cuts in _trace.candidate_cuts(f.program)]
    finest = Placement(_trace.segment_cuts(program))
    groups = _program.scan_groups_of(program)
    if nested_scans and max(groups, default=1) > 1:
        candidates.append((facts[0], dataclasses.replace(finest, scan_groups=groups)))
    if nested_segments:
        segments = sum(r.kind == "segment" for r in _program.split_regions(program, finest))
        if segments >= 4:
            candidates.append((facts[0], dataclasses.replace(
                finest, segment_group=round(math.sqrt(segments)))))
    return candidates


def floor_plans_flat(flat_fn: Callable, avals: Sequence[jax.ShapeDtypeStruct], within: float,
                     *, time_limit_s: float = 60.0, offload: OffloadConfig | None = None,
                     op_times: OpTimes | None = None, layout: Layout = "dense",
                     nested_scans: bool = False, nested_segments: bool = False) -> list[Plan]:
    """The floor plans of the placements :func:`plan_flat` considers whose least peak is
    within ``within`` (a fraction) of the least, lowest first (see :func:`_floor_plans`)."""
    start = time.perf_counter()
    candidates = _candidates(flat_fn, avals, layout, nested_scans, nested_segments)
    share = lambda left: solver_share(time_limit_s, time.perf_counter() - start, left,
                                      len(candidates))
    return _floor_plans(candidates, share, op_times, offload, within)


def plan_flat(flat_fn: Callable, avals: Sequence[jax.ShapeDtypeStruct], budget: Budget, *,
              time_limit_s: float = 60.0, backends: tuple[str, ...] = ("HIGHS", "SCIP"),
              offload: OffloadConfig | None = None, progress: Progress | None = None,
              op_times: OpTimes | None = None,
              margins: Mapping[Placement, int] | None = None, default_margin: int = 0,
              layout: Layout = "dense", nested_scans: bool = False,
              nested_segments: bool = False) -> Plan:
    """:func:`plan` for a function of flat array arguments returning a flat list.

    Each candidate placement (:func:`autoremat._trace.placements`: region boundaries,
    and top-level scans whole or split into pieces; with ``nested_scans``, at the finest
    boundaries, forward scans nested in groups of :func:`autoremat._program.nest_group`
    iterations) is solved
    in turn, with an equal part of what tracing and the solves before it left of
    ``time_limit_s`` (:func:`solver_share`); the plan that costs least (recompute, a nested
    scan's forward run again included, and offload, in the solver's units: FLOPs or
    measured times; then the lower peak, then the earlier placement: scans whole before
    split before nested, finer before coarser) is returned. It is ``"optimal"`` only when
    every placement was solved to optimality or ruled out; otherwise its gap is to the
    least lower bound of the placements the time limit stopped. ``margins`` lowers the
    budget a placement is solved for by its margin (the closed loop's correction for
    how far the compiler's peak of that placement's plans came out above the model's);
    placements without one are lowered by ``default_margin``. ``layout`` sizes the values
    (see :func:`plan`). ``budget="floor"`` gives the lowest of :func:`floor_plans_flat`.
    """
    start = time.perf_counter()
    candidates = _candidates(flat_fn, avals, layout, nested_scans, nested_segments)
    share = lambda left: solver_share(time_limit_s, time.perf_counter() - start, left,
                                      len(candidates))
    if parse_budget(budget) == FLOOR:
        return _floor_plans(candidates, share, op_times, offload)[0]
    best: Plan | None = None
    best_key = (math.inf, 0)  # (cost in the solver's units, peak) of ``best``
    lower = math.inf  # the least lower bound on the cost of placements left unproven
    floors: list[int] = []
    below: list[tuple[policy_model.PolicyProblem, int]] = []
    spent = 0.0
    budget_bytes = 0
    for k, candidate in enumerate(candidates):
        graph, problem = _problem_of(candidate, op_times, offload)
        baseline = _solve.no_remat(graph, problem)
        if k == 0:
            budget_bytes = _resolve_budget(budget, graph, baseline.peak_bytes)
        margin = (margins or {}).get(graph.placement, default_margin)
        replay = _solve.replay_cost(graph, problem)
        if budget_bytes - margin >= baseline.peak_bytes:
            # Saving everything fits, and recomputes nothing that can be saved: optimal.
            d, cost = baseline, replay
        elif budget_bytes - margin < _lower_bound(problem):
            below.append((problem, margin))
            continue
        else:
            result = policy_model.solve(problem, budget_bytes - margin,
                                        time_limit_s=share(len(candidates) - k),
                                        backends=backends, progress=progress)
            spent += result.wall_s
            if result.status is MilpStatus.INFEASIBLE:
                floors.append(result.peak + margin)
                continue
            if result.status is not MilpStatus.OPTIMAL:
                lower = min(lower, result.bound + replay)
            if result.status is MilpStatus.NO_SOLUTION:
                continue
            d, cost = _solve.decisions(graph, problem, result), result.cost + replay
        found = _plan_of(graph, d, budget_bytes, baseline.peak_bytes, offload)
        if (cost, found.peak_bytes) < best_key:
            best, best_key = found, (cost, found.peak_bytes)
        if cost == 0:
            break
    if best is not None:
        if lower < best_key[0]:
            gap = max(best.gap, (best_key[0] - max(0.0, lower)) / best_key[0])
            best = dataclasses.replace(best, status="feasible", gap=gap)
        return dataclasses.replace(best, solve_seconds=spent)
    if len(floors) + len(below) == len(candidates):
        lowest = [(policy_model.solve_min_peak(p, time_limit_s=share(len(below) - k)), m)
                  for k, (p, m) in enumerate(below)]
        floors += [r.peak + m for r, m in lowest if r.save is not None]
        if floors:
            raise InfeasibleBudgetError(budget_bytes, min(floors))
    raise SolverTimeoutError(
        f"the solver found no plan within {time_limit_s} s for a budget of "
        f"{format_bytes(budget_bytes)}; raise time_limit_s or the budget.")


def plan(fn: Callable, *args: Any, budget: Budget, time_limit_s: float = 60.0,
         backends: tuple[str, ...] = ("HIGHS", "SCIP"), verify: str | None = None,
         verify_rounds: int = 4, refine_rounds: int = 0, offload: OffloadConfig | None = None,
         progress: Progress | None = None, op_times: OpTimes | None = None,
         layout: Layout = "dense", nested_scans: bool = False, nested_segments: bool = False,
         **kwargs: Any) -> Plan:
    """Plans remat for ``fn(*args, **kwargs)`` under ``budget``.

    Args:
      fn: the function to differentiate (for example a loss). Its gradient with respect
        to any of its floating-point arguments follows the plan.
      *args, **kwargs: example arguments, arrays or ``jax.ShapeDtypeStruct`` leaves in
        any pytree; only shapes, dtypes and shardings are used. Leaves sharded over a
        mesh (a ``NamedSharding``) make the plan per device (see
        :mod:`autoremat._sharding`).
      budget: peak bytes of the whole gradient computation: an int, a string with a unit
        (``"6GiB"``, ``"512MiB"``, ``"2GB"``), a float in (0, 1], the fraction of the
        no-remat activation memory (on top of arguments and gradients), or ``"floor"``:
        the least peak the model allows, with the plan there that keeps the most room
        (the least-recompute plan at that budget spends every stage's slack on saving
        values the compiler may not fit beside the peak); with ``verify``, of the
        placements whose floor the model puts within 10% of the least (at most
        ``verify_rounds`` of them, lowest first), the floor plan the compiler puts
        lowest. For a sharded step, the bytes of one device (as are all of the plan's
        figures).
      time_limit_s: stop planning after about this long with the best plan found (its
        status is then ``"feasible"`` and ``gap`` bounds how far from optimal it may be).
        Tracing and building the problems count: the solver gets what they leave, though
        never less than a quarter of an equal share of the limit per placement. It can
        run over by the solver's own setup, and by that floor when tracing alone takes
        most of the limit. Since the time left depends on the machine and its load, a
        plan the limit stopped may differ between runs with the same function, shapes
        and budget; a limit the solver ends within (status ``"optimal"``), or a saved
        plan (:meth:`Plan.save`, :func:`load_plan`), makes it reproducible. With
        ``verify``, each round (one plan, one compile) has its own limit.
      backends: MIP backends tried in turn within the time limit, from ``"HIGHS"``,
        ``"SCIP"`` and ``"CBC"`` (HiGHS through highspy, the others through OR-tools).
      verify: a target of :mod:`autoremat._measure` (``"tpu-v5e"``, ``"tpu-v4"``, ...,
        ``"gpu"``): the closed loop. The planned step is compiled for the target; while the
        compiler's peak exceeds the budget, the model's budget is lowered by the excess
        and the plan solved again, so that a returned plan fits on the real compiler
        (``Plan.verified_peak_bytes``). Each round is one compile (seconds to a minute).
      verify_rounds: the most compiles the closed loop makes before a plan fits.
      refine_rounds: with ``verify``, the most compiles spent, once a plan fits, on
        cheaper plans: each placement is solved again for the budget the compiler's
        errors on it allow (looser where its peak came out below the model's, halfway
        back where that was too loose; placements not compiled by the largest error
        seen), and the plan that fits with the least recompute is returned. It stops
        early when the solve gives no cheaper plan not compiled yet. A refined plan's
        ``peak_bytes`` (the model's) may exceed the budget; its ``verified_peak_bytes``
        does not. Default 0: the first plan that fits.
      offload: an :class:`autoremat.OffloadConfig` lets the plan offload residuals to host
        memory as a third choice besides saving and recomputing, under its host budget,
        priced by its transfer time (``Plan.offloaded``). ``None`` (default): no offload.
      progress: ``progress(elapsed_s, best, bound)``, called while the solver searches
        (with HiGHS through highspy; other backends only report their final result): the
        seconds since the solve started, the objective of the best plan found so far (the
        FLOPs it recomputes, plus small tie-breaks and the cost of its offloads, see
        :mod:`autoremat._solve`) and the solver's lower bound on it (``-inf`` before it has
        one). Each solve (one per candidate placement of regions, and per closed-loop
        round) reports on its own and ends with its final figures. It does not change the
        plan. Not called when the budget fits the plan that recomputes nothing.
      op_times: measured operation times (:func:`autoremat.measure_op_times`): the plan
        then minimizes recompute time, materializing operations costed by their measured
        time and fused elementwise ones by their FLOPs. ``None`` (default): FLOPs.
        ``Plan.recompute_flops`` counts FLOPs either way.
      layout: how a value's bytes are counted. ``"dense"`` (default): its data, elements
        times item size. ``"tpu"``: its tiled TPU layout, the minor dimension padded to a
        multiple of 128 and the second-minor to a multiple of up to 8, every array at
        least 512 bytes (see :mod:`autoremat._layout`). It is a property of the target,
        not of the program: on TPU v5e 64-channel convolution activations take twice
        their data. Measured on the zoo's ResNet and U-Net (``bench/accuracy.py``), it
        took the model's error on plans at the floor and a third of the way to no remat
        from -11.6/-11.5% and -20.9/-26.8% to +3.9/+10.0% and -1.1/+2.0%, but near no
        remat it over-predicts by 26% (it pads every saved copy of an activation).
      nested_scans: also consider each forward top-level scan nested: run as groups of
        about sqrt(length) iterations, each group in a checkpoint that keeps only its
        carry, the backward running a group's forward again (Chen et al. 2016,
        https://arxiv.org/abs/1604.06174; ``Plan.scan_groups``). It lowers the floor
        below one checkpoint per iteration at the cost of one more forward pass of the
        loop, so it is chosen only where every plan without it recomputes more (below
        the floor of one checkpoint per iteration, in practice). Off by default: on the
        TPU v5e compiler it lowers GPT-2-small scanned's floor to 1340 MiB (from 1371
        without, split in pieces; ``nothing_saveable`` 1419; the model says 1395 against
        1351 without, so only ``budget="floor"`` with ``verify`` finds it) but not the
        Llama-style model's (1611 MiB against 1569 without; the model says 1549, and over-predicts
        the floor without nesting); use it with ``verify``.
      nested_segments: also consider the finest placement's segments nested: consecutive
        segments in groups of about sqrt(their number), each group in one more
        checkpoint that keeps only its inputs, its forward run again when its backward
        starts (``Plan.segment_group``). Off by default, like ``nested_scans``: on the
        TPU v5e compiler it lowers the zoo U-Net's floor to 935 MiB (from 1167 without,
        1003 for ``nothing_saveable``; with ``layout="tpu"``), where the model says 810.

    Returns:
      A :class:`Plan`.

    Raises:
      ValueError: the budget is malformed or not positive, or ``layout`` is not one of
        ``"dense"`` and ``"tpu"``.
      InfeasibleBudgetError: no plan fits; the message states the smallest budget that does
        (with ``verify``, the lowest compiler peak among the plans compiled: the model's
        lowest plan, which is returned instead when it fits, and those of earlier rounds).
      SolverTimeoutError: the time limit passed before any plan was found.
      BudgetNotVerifiedError: with ``verify``, no plan fit on the compiler within
        ``verify_rounds`` compiles.
      CompilerUnavailableError: ``verify`` names a compiler this machine lacks.

    Example:
      >>> import jax, jax.numpy as jnp, autoremat
      >>> def loss(w, x):
      ...     for _ in range(4):
      ...         x = jnp.tanh(x @ w)
      ...     return jnp.sum(x ** 2)
      >>> w, x = jnp.ones((64, 64)) / 64, jnp.ones((32, 64))
      >>> p = autoremat.plan(loss, w, x, budget=0.5)
      >>> grads = jax.grad(p.apply(loss))(w, x)
    """
    flat_fn, _, avals, _ = _rewrite.flat_function(fn, args, kwargs)
    solve = functools.partial(plan_flat, flat_fn, avals, time_limit_s=time_limit_s,
                              backends=backends, offload=offload, progress=progress,
                              op_times=op_times, layout=layout, nested_scans=nested_scans,
                              nested_segments=nested_segments)
    if verify is None:
        return solve(budget)
    bound = functools.partial(fn, **kwargs)
    argnums = _measure.float_argnums(args)
    real_peak = lambda p: _measure.measure_step(p.apply(bound), *args, target=verify,
                                                argnums=argnums).peak_bytes
    if parse_budget(budget) == FLOOR:
        # The model's floor is the least it allows, but its error differs between
        # placements: the floor plans of those within that error of the least are compiled.
        floors = floor_plans_flat(flat_fn, avals, _MODEL_ERROR, time_limit_s=time_limit_s,
                                  offload=offload, op_times=op_times, layout=layout,
                                  nested_scans=nested_scans,
                                  nested_segments=nested_segments)[:max(1, verify_rounds)]
        peak, k = min((real_peak(p), k) for k, p in enumerate(floors))
        return dataclasses.replace(floors[k], budget_bytes=max(floors[k].budget_bytes, peak),
                                   verified_peak_bytes=peak, verify_target=verify)
    model_budget: Budget = budget
    target_bytes = None
    # Per placement, how far below the budget its plans are solved: the model's error on
    # the compiler differs between placements (a split scan's gradient buffers are laid
    # out by XLA's scheduler, which the model follows only roughly).
    # Placements not compiled yet are lowered by the largest excess of the compiler's peak
    # over the model's seen so far: otherwise each round would pick the placement whose
    # error is still unknown (GPT-2-small unrolled at 1.9 GiB ran out of rounds so).
    margins: dict[Placement, int] = {}
    unknown_margin = 0
    errors: dict[Placement, int] = {}  # per placement, the largest compiler peak - model's
    compiled: set[tuple] = set()
    lowest_real = None  # the lowest compiler peak of the plans compiled so far
    best: Plan | None = None  # the plan that fit with the least recompute
    tries = refines = 0  # compiles before a plan fit, and after
    while (tries < verify_rounds) if best is None else (refines < refine_rounds):
        try:
            result = solve(model_budget, margins=margins, default_margin=unknown_margin)
        except InfeasibleBudgetError as e:
            if best is not None:
                break
            # Below the model's floor: its floor plan (the one keeping the most room) may
            # still fit on the compiler. The compiler's peak is not monotone in the
            # model's, so a plan compiled in an earlier round may have come out lower: the
            # floor reported is the lower.
            target_bytes = target_bytes or e.budget_bytes
            result = solve(FLOOR)
            peak = real_peak(result)
            if peak > target_bytes:
                raise InfeasibleBudgetError(target_bytes, min(peak, lowest_real or peak)
                                            ) from None
        else:
            target_bytes = target_bytes or result.budget_bytes
            decided = (result.placement, result.saved, result.recomputed, result.offloaded)
            if best is not None and (decided in compiled or
                                     _recompute_cost(result) >= _recompute_cost(best)):
                break  # nothing cheaper left to try
            compiled.add(decided)
            peak = real_peak(result)
        if best is None:
            tries += 1
        else:
            refines += 1
        lowest_real = min(peak, lowest_real or peak)
        key = result.placement
        errors[key] = max(errors.get(key, peak - result.peak_bytes), peak - result.peak_bytes)
        if peak <= target_bytes:
            if best is None or _recompute_cost(result) < _recompute_cost(best):
                best = dataclasses.replace(result, budget_bytes=target_bytes,
                                           verified_peak_bytes=peak, verify_target=verify)
            # Refining: each placement is solved for the budget its errors so far allow,
            # looser where the compiler came out below the model.
            model_budget = target_bytes
            margins[key] = errors[key] + _VERIFY_MARGIN
            unknown_margin = max(errors.values()) + _VERIFY_MARGIN
            continue
        model_budget = target_bytes
        used = margins.get(key, unknown_margin) + (target_bytes - result.budget_bytes)
        unknown_margin = max(unknown_margin, errors[key] + _VERIFY_MARGIN)
        if best is not None and used < errors[key]:
            # Refining, a loosened budget was too loose for this placement: try halfway
            # to what its largest error allows (another plan of it may fit in between).
            margins[key] = (used + errors[key] + _VERIFY_MARGIN) // 2
            continue
        # That placement is solved lower by the excess but at least 0.5% of the budget,
        # more each round (the compiler's peak moves in steps: a plan a few MiB lower can
        # come out the same), and at least by as much as the compiler's peak exceeded
        # the model's for it.
        step = (tries if best is None else refines) * max(peak - target_bytes,
                                                          target_bytes // 200)
        margins[key] = max(used + step, errors[key]) + _VERIFY_MARGIN
    if best is not None:
        return best
    raise BudgetNotVerifiedError(
        f"after {verify_rounds} compiles for {verify} the step still peaks at "
        f"{format_bytes(peak)} against a budget of {format_bytes(target_bytes)} (the lowest "
        f"plan compiled peaked at {format_bytes(lowest_real)}); raise verify_rounds or the "
        "budget.")


def _recompute_cost(p: Plan) -> int:
    """What a plan adds to the step: its recomputed FLOPs and its offloads' cost."""
    return p.recompute_flops + p.offload_flops


def optimize(fn: Callable, budget: Budget, *, static_argnums: int | Sequence[int] = (),
             time_limit_s: float = 60.0, backends: tuple[str, ...] = ("HIGHS", "SCIP"),
             offload: OffloadConfig | None = None, layout: Layout = "dense",
             nested_scans: bool = False, nested_segments: bool = False) -> Callable:
    """``fn`` with automatic remat under ``budget``: same signature, same gradients.

    The plan is made the first time the function is called (or traced) with a given
    structure, shapes and dtypes of arguments and values of the static arguments, and
    reused after. See :func:`plan` for the budget forms, ``layout``, ``nested_scans``,
    ``nested_segments`` and errors.

    Do not wrap the result in another ``jax.checkpoint``: the outer policy would win.

    Example:
      >>> loss = autoremat.optimize(loss_fn, budget="6GiB")          # doctest: +SKIP
      >>> grads = jax.jit(jax.grad(loss))(params, batch)             # doctest: +SKIP
    """
    parse_budget(budget)
    _layout.check(layout)
    static = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
    cache: dict[Any, Callable] = {}
    lock = threading.Lock()

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        n = len(args)
        static_pos = tuple(sorted({i % n for i in static if -n <= i < n}))
        static_vals = tuple(args[i] for i in static_pos)
        dynamic = tuple(a for i, a in enumerate(args) if i not in static_pos)

        def bound(*dyn: Any, **kw: Any) -> Any:
            it = iter(dyn)
            full = [static_vals[static_pos.index(i)] if i in static_pos else next(it)
                    for i in range(n)]
            return fn(*full, **kw)

        leaves, tree = jax.tree.flatten((dynamic, kwargs))
        key = (tree, tuple(_rewrite.leaf_aval(x) for x in leaves),
               static_pos, static_vals)
        with lock:
            apply = cache.get(key)
            if apply is None:
                p = plan(bound, *dynamic, budget=budget, time_limit_s=time_limit_s,
                         backends=backends, offload=offload, layout=layout,
                         nested_scans=nested_scans, nested_segments=nested_segments,
                         **kwargs)
                apply = cache[key] = p.apply(bound)
        return apply(*dynamic, **kwargs)

    return wrapped


def load_plan(path: str | os.PathLike, fn: Callable, *args: Any, **kwargs: Any) -> Plan:
    """The plan saved at ``path`` (by :meth:`Plan.save`), for ``fn(*args, **kwargs)``.

    ``fn`` is traced again and each of the file's decisions found among its values; the
    plan saves and recomputes the same values as the saved plan, and its figures are
    predicted afresh, under the file's layout.

    Args:
      path: the policy file.
      fn: the function the plan was made for.
      *args, **kwargs: example arguments as for :func:`plan` (only shapes and dtypes).

    Raises:
      OSError: the file cannot be read.
      autoremat.PolicyFileError: the file is not a valid policy file; the message names
        the field.
      autoremat.PolicyMismatchError: the file does not match ``fn`` and these argument
        shapes; the message lists the differences.
    """
    policy = _policy_file.PolicyFile.read(path)
    flat_fn, _, avals, _ = _rewrite.flat_function(fn, args, kwargs)
    _, _, graph = _trace.trace(flat_fn, avals, policy.placement, policy.layout)
    d = policy.match(graph, where=os.fspath(path))
    no_remat = _solve.no_remat(graph, _solve.to_problem(graph)).peak_bytes
    return dataclasses.replace(_plan_of(graph, d, policy.budget_bytes, no_remat, policy.offload),
                               verified_peak_bytes=policy.verified_peak_bytes,
                               verify_target=policy.target)
