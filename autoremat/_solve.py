"""Solving: a :class:`Graph` and a budget to save/recompute decisions.

The graph is stated as an :class:`autoremat_ilp.Problem` (:func:`problem_of`, memory model
below) and solved as an integer program (HiGHS through highspy, then SCIP through OR-tools
if HiGHS proves nothing in its share of the time). The regions are fixed here;
:func:`autoremat.plan` solves each candidate placement of them
(:func:`autoremat._planner._candidates.candidates`) and keeps the cheapest.

Memory model. Regions are numbered in program order; the backward visits them in
reverse. At region ``i``'s stage the bytes in use are:

* forward stage: the arguments, the region's forward working set (bytes live in one pass
  through it, one iteration for a scan), every residual saved by regions ``0..i-1`` (a
  scan body's residuals times its length), and region ``i``'s saved values that would
  otherwise fuse away (all of them for a scan);
* backward stage: the arguments, the gradients made so far (of the arguments read in
  region ``i`` or later), the region's cotangents (those that materialize: elementwise
  chains fuse into the transposes that read them), the residuals saved by regions
  ``0..i`` but those handed on that a later region's backward released already (a
  block's output, which nothing in its block reads, is freed after the next block's
  backward: :attr:`autoremat._graph.Value.released`), and every value region ``i``
  recomputes whose output materializes (dots, convolutions, reductions, loops and calls;
  recomputed elementwise and data-movement values, and calls of only such ops, fuse into
  their consumers), all counted live together.

The rewriter makes the compiler keep to these stages: a segment's inputs pass through an
optimization barrier, whose transpose releases all their cotangents together, so a region's
backward (its weight gradients included) ends before earlier regions' backward starts.
Recomputing a value that reads the barrier's outputs replays the barrier, and JAX keeps all
of its operands: such a value is given every input of its segment as an input, so those
from other regions are saved.

Nested regions (placements, :attr:`autoremat._graph.Region.nest`; Chen et al. 2016,
https://arxiv.org/abs/1604.06174): a scan run as groups of ``k`` iterations, each group in
a checkpoint of its own that keeps only its carry, or consecutive segments run inside one
more checkpoint that keeps only their inputs. A nested scan's carries at the group starts
are held from its forward to the end of its backward whatever the plan, and what a group
of segments hands to later regions is saved as usual; every other saved value of a group
is made again when the group's backward starts and held only at its regions' backward
stages (``k`` instances at a time in a scan; the problem's ``nest``). Every plan
recomputes the group's forward once more (:func:`replay_cost`), and the values it
recomputes besides, again.

Gradient buffers (measured on TPU v5e): the compiler allocates the step's outputs, the
gradients, apart from its temporaries, for the whole step; a temporary shares an output's
buffer only if it fits in it and is dead before the output is written. So each stage
has further bounds: the arguments, *all* the gradients, the region's working set or
cotangents and its recomputed values, and the saved values larger than a gradient's
size, less the bytes of the gradients larger than that size written at the region's
backward or later (a region's saved values live to its backward, so a buffer an earlier
backward writes holds its gradient already), and, a buffer holding one value at a time,
again with each value that fits in a buffer and each buffer counted at most ``t`` bytes
for each size ``t`` of those values, those that fit in none whole
(:meth:`Graph.reserved_room`). A stage's bytes are the largest of the
bounds (on a 32-layer MLP whose 16 MiB hidden activations fit in none of its 8 MiB weight
gradients, plans recomputing 4-13% are within 1.4% of their device memory, where
capping those activations too put them 7-11% under; on a Flax transformer encoder
whose 4 MiB residual stream fits in its 8 MiB embedding gradient alone, counting the room
of the buffers a value fits in took its floor plan's predicted peak from 23% under the
compiler's to 10% under).

The model is conservative where the compiler's schedule is unknown (recomputed values
all live at once, a saved value counted from its region's forward to the end of its
backward) and optimistic where XLA's fusion decides (a long elementwise chain recomputed
for several consumers may be materialized once). :mod:`autoremat._measure` checks plans
against the real compiler.

Objective: the recompute FLOPs, plus, as tie-breaks, one unit per recomputed instance
and one per element moved by a recomputed data-movement op (a transpose recomputed from
a saved dot can make XLA compute the dot twice, once per layout).
"""

from __future__ import annotations

import dataclasses
import math

import autoremat_ilp as ilp
import numpy as np

from autoremat._cost import moves_data, reads_operands_whole
from autoremat._graph import Graph
from autoremat._offload import OffloadConfig, offload_problem
from autoremat._op_times import OpTimes, recompute_costs


@dataclasses.dataclass(frozen=True)
class Decisions:
    """Which values a plan saves, recomputes and offloads, with its modelled figures
    (``offload_flops``: the offload cost, transfer time as recompute-equivalent FLOPs)."""

    saved: frozenset[int]
    recomputed: frozenset[int]
    peak_bytes: int
    saved_bytes: int
    recompute_flops: int
    status: str
    gap: float
    solve_seconds: float
    offloaded: frozenset[int] = frozenset()
    offloaded_bytes: int = 0
    offload_flops: int = 0


def problem_of(graph: Graph, op_times: OpTimes | None = None,
               offload: OffloadConfig | None = None) -> ilp.Problem:
    """The graph's save/recompute problem, with the memory model of the module doc, and
    with ``offload`` the offload choice too (:func:`autoremat._offload.offload_problem`;
    ``None``: no offload). Every caller builds its problem here.

    Recompute costs are FLOPs, or measured times where ``op_times`` has them (see
    :mod:`autoremat._op_times`)."""
    index = {v.id: k for k, v in enumerate(graph.values)}
    materialized = ~graph.array("fused", bool)
    moved = np.array([moves_data(v.primitive) * math.prod(v.shape) for v in graph.values],
                     dtype=np.int64)
    # Recomputing a value that reads a barrier's output replays the barrier, which reads
    # all of the region's inputs.
    barrier = [graph.regions[v.region].barrier_inputs if v.replays_barrier else ()
               for v in graph.values]
    edges = np.array([(index[u], k) for k, v in enumerate(graph.values)
                      for u in dict.fromkeys((*v.inputs, *barrier[k]))],
                     dtype=np.int64).reshape(-1, 2)
    nested = graph.nested()
    region, released = graph.array("region"), graph.array("released")
    released = np.where(released < 0, region, released)
    held = graph.array("held_bytes")
    in_scan = np.array([r.kind == "scan" for r in graph.regions])[graph.array("region")]
    reserved_base, reserved_forward_base = graph.reserved_base_bytes()
    masks, caps, room, fits = graph.reserved_room(held) if graph.grad_bytes else (None,) * 4
    problem = ilp.Problem(
        cost=((graph.recompute_flops() if op_times is None else
               recompute_costs(graph, op_times)) + graph.iterations() * (1 + moved)).astype(float),
        held=held,
        transient=graph.array("nbytes") * materialized,
        region=region,
        base=graph.backward_base_bytes(),
        forward_base=graph.forward_base_bytes(),
        # A saved value that materializes anyway is already in the forward working set; a
        # scan's saved values fill a stacked buffer allocated for the whole loop.
        # A nested region's saved values are made in its backward alone.
        forward_held=np.where((in_scan | ~materialized) & ~nested, held, 0),
        must_cover=graph.array("needed", bool),
        must_save=graph.array("needed_across", bool),
        can_save=graph.array("saveable", bool),
        can_recompute=graph.array("recomputable", bool),
        edges=edges,
        # The gradients' buffers are allocated for the whole step; a saved value shares
        # one only if it fits in it, as many as fit.
        reserved_base=reserved_base,
        reserved_forward_base=reserved_forward_base,
        unshared=masks,
        reserved_room=room,
        reserved_cap=caps,
        reserved_fit=fits,
        nest=np.array([r.nest for r in graph.regions]) if nested.any() else None,
        released=released if (released != region).any() else None,
    )
    return problem if offload is None else offload_problem(graph, problem, offload)


def replay_cost(graph: Graph, problem: ilp.Problem) -> float:
    """What every plan on ``graph`` adds to the step whatever it decides, in ``problem``'s
    cost units (FLOP-equivalents): the forward pass of its nested scans, run again group
    by group, and its fixed FLOPs (:attr:`Graph.fixed_flops`)."""
    return float(problem.cost[graph.replays()].sum()) + graph.fixed_flops


def decisions(graph: Graph, problem: ilp.Problem,
              result: ilp.Solution) -> Decisions:
    """Reads a solver result back onto the graph's value ids."""
    ids = graph.array("id")
    flops = graph.recompute_flops()
    offload = result.offload if result.offload is not None else np.zeros(len(ids), bool)
    # A solution offloads only where the problem allows it, which sets offload_cost.
    offload_flops = 0
    if offload.any():
        assert problem.offload_cost is not None
        offload_flops = int(problem.offload_cost[offload].sum())
    return Decisions(
        saved=frozenset(int(i) for i in ids[result.save]),
        recomputed=frozenset(int(i) for i in ids[result.recompute]),
        peak_bytes=result.peak,
        saved_bytes=int(problem.held[result.save & ~graph.nested()].sum())
        + sum(r.kept_bytes for r in graph.regions)
        + graph.constant_bytes(result.recompute | graph.replays()),
        recompute_flops=int(flops[result.recompute].sum() + flops[graph.replays()].sum()
                            + graph.fixed_flops),
        status=result.status.value,
        gap=result.gap,
        solve_seconds=result.wall_s,
        offloaded=frozenset(int(i) for i in ids[offload]),
        offloaded_bytes=ilp.host_bytes(problem, offload),
        offload_flops=offload_flops,
    )


def no_remat(graph: Graph, problem: ilp.Problem) -> Decisions:
    """The plan that saves every value the backward pass reads and recomputes nothing
    (only zero-cost reads of scan inputs are 'recomputed')."""
    return _fixed(graph, problem, *saving_all_masks(problem))


def saving_all_masks(problem: ilp.Problem) -> tuple[np.ndarray, np.ndarray]:
    """``(save, recompute)`` of :func:`no_remat`."""
    return (problem.must_save | (problem.must_cover & problem.can_save),
            problem.must_cover & ~problem.can_save)


def as_written(graph: Graph, problem: ilp.Problem) -> Decisions:
    """The plan that recomputes nothing (:func:`no_remat`), with the peak the compiler
    gives the function written without a checkpoint (whose barriers make it keep what
    JAX saves): that of :func:`as_written_masks`. Its peak against the compiler's,
    beside that of :func:`no_remat`, on the corpus and the zoo:
    ``bench/results/no-remat-default-compile/no-remat.md``.
    """
    nothing = no_remat(graph, problem)
    _, peak = ilp.evaluate(problem, *as_written_masks(graph, problem))
    return dataclasses.replace(nothing, peak_bytes=min(peak, nothing.peak_bytes))


def as_written_masks(graph: Graph, problem: ilp.Problem) -> tuple[np.ndarray, np.ndarray]:
    """``(save, recompute)``: what the compiler holds of the function written without a
    checkpoint, as a plan (:func:`fused_as_written` of :func:`saving_all_masks` in every
    region)."""
    return fused_as_written(graph, problem, *saving_all_masks(problem),
                            np.ones_like(problem.can_save))


def fused_as_written(graph: Graph, problem: ilp.Problem, save: np.ndarray,
                     recompute: np.ndarray, written: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
    """``(save, recompute)`` where the values ``written`` (a mask), saved, are code run
    without a checkpoint: XLA recomputes the values of a segment's elementwise and
    data-movement chains inside the backward fusions reading them, and keeps instead the
    values the chains start from (the results of dots, reductions, calls;
    :func:`_fused_chains`): the former are recomputed, the latter saved. What another
    region reads is kept (the compiler did not fuse a U-Net's skips into its decoder)."""
    save, recompute = save.copy(), recompute.copy()
    through, starts, chain = _fused_chains(graph, problem)
    away = save & written & through & ~graph.array("needed_across", bool)
    for k in np.flatnonzero(away):
        save[list(starts[k])] = True
        recompute[list(chain[k])] = True
    save &= ~away
    return save, recompute & ~save


def _fused_chains(graph: Graph, problem: ilp.Problem
                  ) -> tuple[np.ndarray, list[frozenset[int]], list[frozenset[int]]]:
    """``(through, starts, chain)`` over the graph's values: whether XLA, running the
    function as written, fuses the value into its readers, recomputing it from
    ``starts`` (the values its elementwise chain reads that are not fused so) through
    ``chain`` (the fused values between, itself included). Fused so: an elementwise or
    data-movement value of a segment or of a scan unrolled whole
    (:attr:`autoremat._graph.Region.unrolled`), not a copy to a new layout
    (:attr:`autoremat._graph.Value.relayout`), that may be recomputed, that no other scan
    and no convolution reads (:func:`autoremat._cost.reads_operands_whole`), that does not
    replay its segment's input barrier (:attr:`autoremat._graph.Value.replays_barrier`),
    and whose chain starts at saveable values; so :func:`as_written_masks` is a plan of
    the graph, and no least-peak plan is above it."""
    index = {v.id: k for k, v in enumerate(graph.values)}
    segment = [r.kind == "segment" or r.unrolled for r in graph.regions]
    read_whole = {index[u] for v in graph.values
                  if reads_operands_whole(v.primitive) or not segment[v.region]
                  for u in v.inputs}
    through = np.zeros(len(graph.values), dtype=bool)
    starts: list[frozenset[int]] = []
    chain: list[frozenset[int]] = []
    for k, v in enumerate(graph.values):
        inputs = [index[u] for u in v.inputs]
        # A chain stops at the region's inputs: what another region reads is kept.
        fused_in = [j for j in inputs if through[j] and graph.values[j].region == v.region]
        starts.append(frozenset().union(*(starts[j] if j in fused_in else {j} for j in inputs)))
        chain.append(frozenset({k}).union(*(chain[j] for j in fused_in)))
        through[k] = (v.fused and not v.relayout and segment[v.region] and k not in read_whole
                      and not v.replays_barrier
                      and bool(problem.can_recompute[k])
                      and all(problem.can_save[j] for j in starts[k]))
    return through, starts, chain


def remat_all(graph: Graph, problem: ilp.Problem) -> Decisions:
    """The plan that saves only what it must (what other regions read, and what cannot be
    recomputed) and recomputes the rest: one ``jax.checkpoint(policy=nothing_saveable)``
    per region, what a user writes by hand with the regions at the layers. The regions
    the placement runs as written (:attr:`autoremat._placement.Placement.written`) save
    what their backward reads (:func:`saving_all_masks`)."""
    written = _written(graph, problem)
    kept, forced = saving_all_masks(problem)
    save = problem.must_save | (problem.can_save & ~problem.can_recompute) | (kept & written)
    recompute = (problem.can_recompute & ~written & ~save) | (forced & written)
    u, v = problem.edges.T
    across = recompute[v] & (problem.region[u] != problem.region[v]) & problem.can_save[u]
    save[u[across]] = True  # a region's recompute reads another region's values saved
    save, recompute, _ = ilp.prune(problem, save, recompute & ~save)
    return _fixed(graph, problem, save, recompute)


def _written(graph: Graph, problem: ilp.Problem) -> np.ndarray:
    """Whether each value is made in a region the placement runs as written."""
    return np.isin(problem.region, list(graph.placement.written))


def _fixed(graph: Graph, problem: ilp.Problem, save: np.ndarray, recompute: np.ndarray
           ) -> Decisions:
    """The decisions of a plan not solved for, with its figures."""
    cost, peak = evaluate(graph, problem, save, recompute)
    result = ilp.Solution(ilp.Status.OPTIMAL, save, recompute, cost, peak, cost, 0.0, 0.0)
    return decisions(graph, problem, result)


def unshared(problem: ilp.Problem) -> ilp.Problem:
    """``problem`` where no saved value shares the gradients' buffers: one further stage
    bound, every value counted whole, no room (``ilp.Problem.reserved_bounds``). A solved
    plan can lean on that sharing where the compiler does not follow (nnx-transformer's
    floor plan, TPU v5e: 166.8 MiB modelled, 207.6 unshared, 195.1 compiled)."""
    if problem.unshared is None:
        return problem
    return dataclasses.replace(problem, unshared=np.ones((1, problem.num_values), bool),
                               reserved_room=np.zeros(1, np.int64), reserved_cap=None,
                               reserved_fit=None)


def evaluate(graph: Graph, problem: ilp.Problem, save: np.ndarray, recompute: np.ndarray,
             offload: np.ndarray | None = None) -> tuple[float, int]:
    """``(cost, peak)`` of a plan's masks: :func:`autoremat_ilp.evaluate`'s, the peak, where
    the placement runs regions as written, the lower of that and the peak of what the
    compiler holds of them (:func:`fused_as_written`)."""
    cost, peak = ilp.evaluate(problem, save, recompute, offload)
    if not graph.placement.written:
        return cost, peak
    fused = fused_as_written(graph, problem, save, recompute, _written(graph, problem))
    return cost, min(peak, ilp.evaluate(problem, *fused, offload)[1])
