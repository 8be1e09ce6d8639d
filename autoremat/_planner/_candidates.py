"""Stage 1: the candidate placements of a program, and the problem of each."""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections.abc import Callable, Sequence
from typing import TypedDict

import autoremat_ilp as ilp
import jax
import numpy as np

from autoremat import _program, _solve, _trace
from autoremat._graph import Graph
from autoremat._placement import Placement
from autoremat._plan import Plan
from autoremat._planner._options import PlanOptions

# A plan recomputing at most this part of the step's FLOPs saves all but cheap elementwise
# values, which the compiler fuses into the backward pass of the function as written.
NEAR_NO_REMAT = 0.01

# How far the model's peak may be from the compiler's (within 10% on the zoo's plans but
# for some at the no-remat end; see bench/results/).
MODEL_ERROR = 0.1


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A placement to solve, and the facts of the program it is traced on (the whole
    program, or the program with its scans split as the placement says)."""

    facts: _trace.ProgramFacts
    placement: Placement

    def problem(self, options: PlanOptions) -> tuple[Graph, ilp.Problem]:
        """The graph of this placement and its save/recompute (and offload) problem."""
        _, graph = _trace.graph_of(self.facts.program, self.placement, self.facts)
        return graph, _solve.problem_of(graph, options.op_times, options.offload)


def candidates(flat_fn: Callable, avals: Sequence[jax.ShapeDtypeStruct], options: PlanOptions
               ) -> list[Candidate]:
    """The placements the planner solves, in its order of preference: each of
    :func:`autoremat._trace.candidate_cuts` with scans whole, then with scans split into
    pieces (:func:`autoremat._program.scan_pieces_of`), then, as ``options`` ask, scans
    nested, and segments nested at the finest cuts and at the layers."""
    program = _trace.trace_program(flat_fn, avals, layout=options.resolved_layout)
    programs = [program]
    if any(pieces := _program.scan_pieces_of(program)):
        programs.append(_trace.split_program(program, avals, pieces))
    local = all(getattr(a, "sharding", None) is None for a in avals)
    facts = [_trace.program_facts(program, written=(flat_fn, avals) if local else None),
             *(_trace.program_facts(p, split_from=program) for p in programs[1:])]
    found = [Candidate(f, Placement(cuts, f.program.scan_pieces)) for f in facts
             for cuts in _trace.candidate_cuts(f.program)]
    finest = Placement(_trace.segment_cuts(program))
    if options.nested_scans and max(groups := _program.scan_groups_of(program), default=1) > 1:
        found.append(Candidate(facts[0], dataclasses.replace(finest, scan_groups=groups)))
    if options.nested_segments:
        for cuts in dict.fromkeys((finest.cuts, _trace.layer_cuts(program))):
            placement = Placement(cuts)
            segments = sum(r.kind == "segment" for r in _program.split_regions(program, placement))
            if segments >= 4:
                group = round(math.sqrt(segments))
                found.append(Candidate(facts[0], dataclasses.replace(placement,
                                                                     segment_group=group)))
    return found


def no_remat_peak(found: Sequence[Candidate], options: PlanOptions) -> int:
    """The peak of no remat: the least over the placements ``found`` (the model of a
    placement with larger regions holds more at once, though no remat is one step)."""
    placed = [(c.facts, *c.problem(options)) for c in found]
    return min(d.peak_bytes for _, _, d in no_remat_baselines(placed))


def runs_as_written(facts: _trace.ProgramFacts, graph: Graph) -> bool:
    """Whether the plan on ``graph`` that recomputes nothing is the function itself, with
    no checkpoint (:func:`no_remat_plan`): the placement runs the program as written
    (:attr:`Placement.restructures` it not) and the program is the function's own
    (:attr:`autoremat._trace.ProgramFacts.written`)."""
    return not graph.placement.restructures and facts.written is not None


def no_remat_decisions(facts: _trace.ProgramFacts, graph: Graph, problem: ilp.Problem
                       ) -> _solve.Decisions:
    """The decisions of the plan that recomputes nothing on ``graph``: as the compiler
    runs the function as written where the plan is the function
    (:func:`autoremat._solve.as_written`), else saving every value the backward reads
    (:func:`autoremat._solve.no_remat`)."""
    return (_solve.as_written if runs_as_written(facts, graph) else _solve.no_remat)(
        graph, problem)


def obvious_plans(found: Sequence[Candidate], options: PlanOptions,
                  no_remat: int | None = None) -> list[Plan]:
    """The plans a user tries by hand: no remat (:func:`as_written_plan`), and one remat
    per layer (:func:`per_layer_plan`) with the code around the layers in a checkpoint
    too, then as written. The compiler may put them below the model's floor plans, so a
    verified floor is compared with them. ``no_remat``: :func:`no_remat_peak` of
    ``found`` where the caller has it (otherwise each placement's problem is built
    again)."""
    no_remat = no_remat_peak(found, options) if no_remat is None else no_remat
    return [as_written_plan(found, options, no_remat),
            per_layer_plan(found, options, no_remat, around_as_written=False),
            per_layer_plan(found, options, no_remat)]


def per_layer_plan(found: Sequence[Candidate], options: PlanOptions, no_remat: int,
                   around_as_written: bool = True) -> Plan:
    """One remat per layer keeping only its input
    (``jax.checkpoint(layer, policy=nothing_saveable)`` on every layer, at
    :func:`autoremat._trace.layer_cuts`), on the program of ``found[0]`` (scans whole).
    ``around_as_written``: the code around the layers (embedding, head, loss) runs as
    written (:func:`autoremat._trace.layer_placement`), as a library's own remat per block
    leaves it; otherwise it is rematted too. On the TPU v5e compiler neither is always
    the lower (``python bench/per_layer.py``). ``no_remat``: :func:`no_remat_peak` of
    ``found``."""
    return with_saved_bytes_of_jax(_modelled_per_layer(found, options, no_remat,
                                                       around_as_written), found[0].facts)


#: A floor, and how a plan's peak is measured to be weighed against it.
Floor = tuple[int, Callable[[Plan], int]]


def modelled_peak(plan: Plan) -> int:
    """The model's peak of ``plan`` (``peak_bytes``)."""
    return plan.peak_bytes


def per_layer_floor(found: Sequence[Candidate], options: PlanOptions, no_remat: int,
                    below: Sequence[Floor]) -> Plan | None:
    """:func:`per_layer_plan`, with the code around the layers as written or in
    checkpoints too, whichever the model puts lower (as written on a tie), where, for
    one of the floors ``below`` (the solved plans' floor, each with how a plan's peak is
    measured against it), the model puts that floor less than ``MODEL_ERROR`` of this
    plan's activation memory under it (:func:`within_model_error`), and it recomputes
    more than ``NEAR_NO_REMAT`` (nearer no remat, the function as written stands for
    it); ``None`` otherwise. The model holds the code as written as the compiler fuses
    it, which no solved plan is, so this plan can be below their floor; where the model
    cannot tell them apart, the plan a user writes by hand is the safer (a Flax Linen
    encoder: a solved floor modelled 6% under it, compiled 25% over it; a Flax Linen CNN:
    a solved floor modelled at 141 MiB compiled at 149, one remat per layer with the code
    around in checkpoints modelled at 140.9 compiled at 124.3, as written at 156.9 and
    128.1). JAX's bytes are counted for it only where it is returned (a trace of the
    whole step)."""
    layered = min((_modelled_per_layer(found, options, no_remat, around_as_written=around)
                   for around in (True, False)), key=modelled_peak)
    assert layered.graph is not None  # a modelled plan has its graph
    fixed = layered.graph.fixed_bytes
    if near_no_remat(layered) or not any(within_model_error(floor, measure(layered), fixed)
                                         for floor, measure in below):
        return None
    return with_saved_bytes_of_jax(layered, found[0].facts)


def unshared_peak(plan: Plan, options: PlanOptions) -> int:
    """``plan``'s peak where no saved value shares the gradients' buffers
    (:func:`autoremat._solve.unshared`): a bound that solved plans and one remat per layer
    are modelled alike under (nnx-transformer and keras-transformer on TPU v5e: their
    solved floors 6.4% and 2.8% over the compiler, one remat per layer 7.8% and 8.3%;
    with the sharing, -14.5% and -17.9% against +0.5% and +1.5%)."""
    graph = plan.graph
    assert graph is not None  # a modelled plan has its graph
    problem = _solve.unshared(_solve.problem_of(graph, options.op_times, options.offload))
    ids = graph.array("id")
    mask = lambda values: np.isin(ids, list(values))  # noqa: E731
    offload = mask(plan.offloaded) if plan.offloaded else None
    return _solve.evaluate(graph, problem, mask(plan.saved), mask(plan.recomputed), offload)[1]


def _modelled_per_layer(found: Sequence[Candidate], options: PlanOptions, no_remat: int,
                        around_as_written: bool) -> Plan:
    """:func:`per_layer_plan` with the saved bytes the model counts."""
    placement = _trace.layer_placement(found[0].facts.program, around_as_written)
    graph, problem = Candidate(found[0].facts, placement).problem(options)
    d = dataclasses.replace(_solve.remat_all(graph, problem), status="feasible")
    return plan_of(graph, d, d.peak_bytes, no_remat, options)


def with_saved_bytes_of_jax(plan: Plan, facts: _trace.ProgramFacts) -> Plan:
    """``plan``, whose placement may run code as written (``Placement.written``), with
    the bytes JAX keeps for it where it does: there JAX keeps what its own rules read,
    not always the named values the plan saves (a broadcast a log-softmax's backward
    reads), so the bytes are JAX's, counted in the plan's layout as its own values are.
    Unchanged where the program is not the function's own
    (:attr:`autoremat._trace.ProgramFacts.written`)."""
    if not plan.placement.written or facts.written is None:
        return plan
    flat_fn, avals = facts.written
    return dataclasses.replace(plan, saved_bytes=_trace.saved_bytes_as_written(
        plan.apply(flat_fn), avals, plan.layout))


def as_written_plan(found: Sequence[Candidate], options: PlanOptions, no_remat: int) -> Plan:
    """The plan that recomputes nothing, the function as written where it can be
    (:func:`no_remat_plan`), on the placement of ``found`` whose model of it holds least
    (:func:`least_no_remat`). ``no_remat``: its ``no_remat_peak_bytes``,
    :func:`no_remat_peak` of ``found``."""
    facts, graph, baseline = least_no_remat(
        [(c.facts, *c.problem(options)) for c in found])
    baseline = dataclasses.replace(baseline, status="feasible")
    return no_remat_plan(facts, graph, baseline, baseline.peak_bytes, no_remat, options)


def least_no_remat(placed: Sequence[tuple[_trace.ProgramFacts, Graph, ilp.Problem]]
                   ) -> tuple[_trace.ProgramFacts, Graph, _solve.Decisions]:
    """Of placements ``(facts, graph, problem)`` (the first with scans whole), the one
    whose plan recomputing nothing is the function as written (:func:`runs_as_written`)
    with the least modelled peak, and that plan's :func:`no_remat_decisions`: the
    placements run one step, and finer regions count the bytes live at once more
    closely. The first placement where none runs as written."""
    written = [p for p in placed if runs_as_written(p[0], p[1])] or placed[:1]
    return min(((f, g, no_remat_decisions(f, g, p)) for f, g, p in written),
               key=lambda fgd: fgd[2].peak_bytes)


def no_remat_baselines(placed: Sequence[tuple[_trace.ProgramFacts, Graph, ilp.Problem]]
                       ) -> list[tuple[_trace.ProgramFacts, Graph, _solve.Decisions]]:
    """Per placement ``(facts, graph, problem)``, where its plan recomputing nothing is
    made and its decisions: for those that run as written, the function as written on
    the one modelling it lowest (:func:`least_no_remat`, the same step); for the others,
    saving every value the backward reads on their own graph."""
    written = least_no_remat(placed)
    return [written if runs_as_written(f, g) else (f, g, _solve.no_remat(g, p))
            for f, g, p in placed]


def no_remat_plan(facts: _trace.ProgramFacts, graph: Graph, baseline: _solve.Decisions,
                  budget_bytes: int, no_remat_peak: int, options: PlanOptions) -> Plan:
    """The plan that recomputes nothing on ``graph`` (of the program of ``facts``;
    ``baseline``: its :func:`no_remat_decisions`). Where it :func:`runs_as_written`, it is
    the function itself (:attr:`Plan.no_remat`): no checkpoint, whose barriers would cost
    the compiler fusion, and the residuals JAX keeps for it (in the graph's layout),
    whatever the regions would save."""
    plan = plan_of(graph, baseline, budget_bytes, no_remat_peak, options)
    if not runs_as_written(facts, graph) or (
            saved_bytes := facts.saved_bytes_as_written(graph.layout)) is None:
        return plan
    return dataclasses.replace(plan, no_remat=True, recompute_flops=0, saved_bytes=saved_bytes)


def plan_of(graph: Graph, d: _solve.Decisions, budget_bytes: int, no_remat_peak: int,
            options: PlanOptions) -> Plan:
    """The :class:`Plan` of decisions ``d`` on ``graph``."""
    return Plan(saved=d.saved, recomputed=d.recomputed, budget_bytes=budget_bytes,
                peak_bytes=d.peak_bytes, saved_bytes=d.saved_bytes,
                recompute_flops=d.recompute_flops, step_flops=graph.step_flops,
                no_remat_peak_bytes=no_remat_peak, status=d.status, gap=d.gap,
                placement=graph.placement, solve_seconds=d.solve_seconds, graph=graph,
                offloaded=d.offloaded, offloaded_bytes=d.offloaded_bytes,
                offload_flops=d.offload_flops, offload=options.offload, layout=graph.layout)


# However long tracing took, each placement's solve gets at least this part of its equal
# share of the time limit, so that a program slow to trace still gets a plan searched for.
_MIN_SOLVER_SHARE = 0.25


class SolveLimits(TypedDict):
    """The limits of one solve: keywords of :func:`autoremat_ilp.solve` and
    :func:`autoremat_ilp.solve_min_peak`."""

    time_limit_s: float
    node_limit: int | None


@dataclasses.dataclass(frozen=True)
class SolverClock:
    """How the time limit is shared among the solves of ``placements`` placements, from
    ``start`` (a :func:`time.perf_counter` reading), each solve also stopped after
    ``node_limit`` nodes."""

    time_limit_s: float
    placements: int
    start: float = dataclasses.field(default_factory=time.perf_counter)
    node_limit: int | None = None

    @classmethod
    def of(cls, options: PlanOptions, placements: int, start: float | None = None
           ) -> SolverClock:
        """The clock of ``options``' limits, from ``start`` (default: now)."""
        return cls(options.time_limit_s, placements,
                   time.perf_counter() if start is None else start, options.node_limit)

    def limits(self, left: int, ranked: bool = False) -> SolveLimits:
        """The limits of the next of ``left`` solves (``ranked``: see :func:`solver_share`)."""
        return {"time_limit_s": self.share(left, ranked), "node_limit": self.node_limit}

    def share(self, left: int, ranked: bool = False) -> float:
        """Seconds the solver gets for the next of ``left`` solves still to run (see
        :func:`solver_share`)."""
        return solver_share(self.time_limit_s, time.perf_counter() - self.start, left,
                            self.placements, ranked)


def checked(result: ilp.Solution) -> ilp.Solution:
    """``result``, with a warning when the time limit, not the node limit, stopped its
    search: the plan may then differ on another machine or under another load."""
    if result.timed_out:
        warnings.warn("the solver's time limit stopped a search before its node limit, so "
                      "this plan may differ between runs (it depends on the machine's speed "
                      "and load); for a reproducible plan raise time_limit_s or lower "
                      "node_limit, or save the plan (Plan.save).", stacklevel=3)
    return result


def solver_share(time_limit_s: float, elapsed_s: float, left: int, placements: int,
                 ranked: bool = False) -> float:
    """Seconds the solver gets for the next of the ``left`` placements still to solve (of
    ``placements``), ``elapsed_s`` after planning started: an equal part of what is left of
    the limit, or where the solves are ``ranked`` (the likeliest to win first), what is
    left less the least share of each solve after it; at least the least share,
    ``_MIN_SOLVER_SHARE`` of an equal part of the whole limit."""
    least = _MIN_SOLVER_SHARE * time_limit_s / placements
    rest = time_limit_s - elapsed_s
    return max(rest - (left - 1) * least if ranked else rest / left, least)


def within_model_error(peak: int, reference: int, fixed: int) -> bool:
    """Whether the activation memory of ``peak`` (less the arguments and gradients,
    ``fixed``, which the model counts exactly) is at most ``MODEL_ERROR`` below that of
    ``reference``."""
    return peak - fixed >= (1 - MODEL_ERROR) * (reference - fixed)


def near_no_remat(plan: Plan) -> bool:
    """Whether ``plan`` recomputes (and offloads) at most ``NEAR_NO_REMAT`` of the step."""
    return plan.modeled_overhead <= NEAR_NO_REMAT
