"""The value graph of a program under one placement, built region by region."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import jax

from autoremat import _program, _sharding
from autoremat._graph import Constant, Graph, Region, Value
from autoremat._placement import Placement
from autoremat._program import Atom, Eqn, Program, Segment
from autoremat._trace._common import abstract, produced, source_of
from autoremat._trace._facts import ProgramFacts, program_facts
from autoremat._trace._memory import (
    cotangent_bytes,
    grad_bytes_by_region,
    gradient_buffers,
    in_flight_cotangent_bytes,
    work_bytes,
)
from autoremat._trace._residuals import (
    RegionAnswer,
    ask_jax,
    scan_step_fn,
    unnamed_recompute_flops,
)
from autoremat._trace._values import ValueFacts


def graph_of(program: Program, placement: Placement, facts: ProgramFacts | None = None
             ) -> tuple[tuple[Segment, ...], Graph]:
    """The regions and value graph of ``program`` under ``placement`` (see
    :func:`autoremat._program.split_regions`; its scans already split as it says).

    ``facts``: ``program_facts(program)``, shared by the graphs of several placements of
    ``program`` so that what does not depend on the placement is worked out once.
    """
    facts = program_facts(program) if facts is None else facts
    build = _Build.start(program, facts, _program.split_regions(program, placement))
    built: list[tuple[Region, RegionAnswer]] = []
    for r in build.regions:
        built.append(_segment(build, r) if r.kind == "segment" else _scan(build, r))
    _xs_slices_hold_their_input(build)
    _group_outputs_are_kept(build)
    _handed_on_values_are_released(build)
    graph = Graph(
        values=tuple(build.values[vid].value(program) for vid in sorted(build.values)),
        regions=tuple(_with_segment_work(build, r, region)
                      for r, (region, _) in zip(build.regions, built, strict=True)),
        arg_bytes=sum(map(program.value_bytes, program.args)),
        grad_bytes=sum(b for b, _ in build.gradients),
        step_flops=sum(answer.step_flops for _, answer in built),
        fixed_flops=sum(answer.fixed_flops for _, answer in built) + facts.split_flops,
        fingerprint=facts.fingerprint,
        layout=program.layout,
        placement=placement,
        grad_buffers=tuple(b for b, _ in build.gradients),
        grad_written=tuple(r for _, r in build.gradients),
        constants=_constants(build),
    )
    return build.regions, _sharding.per_device_flops(graph, program)


@dataclasses.dataclass(slots=True)
class _Placed:
    """A value under one placement: its program's facts, and what the placement decides."""

    facts: ValueFacts
    region: int
    saveable: bool
    multiplicity: int
    needed: bool = False
    needed_across: bool = False
    replays_barrier: bool = False
    replayed: bool = False
    released: int | None = None

    def value(self, program: Program) -> Value:
        """The :class:`Value`, a value of ``program``."""
        f = self.facts
        return Value(
            id=f.id, shape=f.shape, dtype=f.dtype, nbytes=f.nbytes,
            multiplicity=self.multiplicity,
            held_bytes=program.stacked_bytes(f.id, self.multiplicity),
            primitive=f.primitive, source=f.source,
            flops=f.flops, region=self.region, inputs=f.inputs, saveable=self.saveable,
            recomputable=f.recomputable, needed=self.needed, needed_across=self.needed_across,
            user_name=f.user_name, replays_barrier=self.replays_barrier,
            replayed=self.replayed, fused=f.fused, relayout=f.relayout,
            released=self.region if self.released is None else self.released)


@dataclasses.dataclass(frozen=True, eq=False)
class _Build:
    """One graph being built: what its region builders read, and the values they mark.

    Attributes:
      readers: by value id, the regions whose top-level equations read it.
      values: by value id, every value the regions make, in program order.
      in_flight: by region, the bytes of cotangents live across its whole backward pass
        (:func:`autoremat._trace._memory.in_flight_cotangent_bytes`).
      gradients: ``(bytes, region writing it)`` of each argument gradient
        (:func:`autoremat._trace._memory.gradient_buffers`).
      grad_bytes: by region, the bytes of argument gradients at its backward stage.
      kept_constants: the program's constants the regions' backward passes read whatever
        the plan.
    """

    program: Program
    facts: ProgramFacts
    regions: tuple[Segment, ...]
    readers: Mapping[int, set[int]]
    values: dict[int, _Placed]
    in_flight: Sequence[int]
    gradients: Sequence[tuple[int, int]]
    grad_bytes: Sequence[int]
    kept_constants: set[int]

    @classmethod
    def start(cls, program: Program, facts: ProgramFacts, regions: tuple[Segment, ...]
              ) -> _Build:
        """A graph of ``regions`` to build, no value marked yet."""
        readers: dict[int, set[int]] = {}
        for r in regions:
            for e in r.eqns:
                for a in e.ins:
                    if isinstance(a, int):
                        readers.setdefault(a, set()).add(r.index)
        last_reader = {a: max(rs) for a, rs in readers.items()}
        values = {vid: _Placed(facts.values[vid], r.index, facts.values[vid].saveable,
                               facts.values[vid].multiplicity)
                  for r in regions for e in r.eqns for vid in facts.made[e]}
        gradients = gradient_buffers(program, len(regions), last_reader)
        return cls(program, facts, regions, readers, values,
                   in_flight_cotangent_bytes(regions, last_reader, facts.cotangent_size,
                                             facts.differentiable),
                   gradients, grad_bytes_by_region(gradients, len(regions)), set())

    def made(self, eqns: Iterable[Eqn]) -> Iterator[_Placed]:
        """The values the top-level equations ``eqns`` make."""
        return (self.values[vid] for e in eqns for vid in self.facts.made[e])

    def keep_across(self, ids: Iterable[Atom]) -> None:
        """Marks the values ``ids`` as read by another region, and the constants among
        them as kept (arguments aside)."""
        for vid in ids:
            if isinstance(vid, int) and vid in self.values:
                self.values[vid].needed_across = True
            elif isinstance(vid, int) and vid in self.program.consts:
                self.kept_constants.add(vid)


def _segment(build: _Build, r: Segment) -> tuple[Region, RegionAnswer]:
    """The region of segment ``r``, and what JAX answered about it."""
    program, facts = build.program, build.facts
    named = frozenset(produced(r.eqns))
    answer = _ask(build, r, lambda: _named_region_fn(program, r, named), r.inputs,
                  _fixed_flops(program, r, named))
    build.keep_across(r.inputs[k] for k in answer.inputs_read)
    barrier_inputs = _behind_barrier(build, r)
    if r.nest >= 0:
        # The group's checkpoint (its id is its first region) keeps its inputs; its forward
        # runs again.
        build.keep_across(i for i in r.inputs
                          if i in build.values and build.values[i].region < r.nest)
        for v in build.made(r.eqns):
            v.replayed = True
    cotangents = cotangent_bytes(r.eqns, set(r.outputs), facts.cotangent_size,
                                 facts.differentiable)
    # Its forward working set is set once every region is built (_with_segment_work).
    return Region(r.index, "segment", 1, 0, cotangents + build.in_flight[r.index],
                  build.grad_bytes[r.index], barrier_inputs, nest=r.nest), answer


def _with_segment_work(build: _Build, r: Segment, region: Region) -> Region:
    """``region`` with its forward working set, where ``r`` is a segment (a scan's is
    set already). It leaves out the inputs that other regions save: the values of
    regions not nested that some region reads across (a saved value counts at every
    later forward stage already; a nested group's saved values at none, see
    :func:`autoremat_ilp.memory.windows`)."""
    if r.kind != "segment":
        return region
    counted = [i for i in r.inputs if i not in build.values or not build.values[i].needed_across
               or build.regions[build.values[i].region].nest >= 0]
    work = work_bytes(r.eqns, counted, set(r.outputs), build.program.value_bytes,
                      build.facts.free)
    return dataclasses.replace(region, work_bytes=work)


def _scan(build: _Build, r: Segment) -> tuple[Region, RegionAnswer]:
    """The region of scan ``r`` (after the slicing of its inputs, for a piece of a split
    scan), and what JAX answered about one iteration of its body."""
    program = build.program
    *slices, scan = r.eqns
    for v in build.made(slices):
        v.saveable = False  # made again in the backward pass
    body, length = scan.scan_body, scan.params["length"]
    assert body is not None  # a scan region ends with a top-level scan
    outer_consts, _, _ = _program.scan_operands(scan, scan.ins)
    operands = [*body.consts, *body.carry_in, *body.xs_in]
    if slices:  # measured whole, in the checkpoint around the loop
        fixed = _fixed_flops(program, r, frozenset((*produced(body.eqns), *body.carry_in)))
    else:
        def loop_fixed(_: int) -> int:
            return length * _fixed_loop_flops(program, body, operands)

        fixed = loop_fixed
    answer = _ask(build, r, lambda: scan_step_fn(body, program.consts), operands, fixed)
    flat_ids = [*outer_consts, *body.carry_in, *body.xs_in]
    for vid in (flat_ids[k] for k in answer.inputs_read):
        if isinstance(vid, int) and vid in build.values and build.values[vid].region == r.index:
            build.values[vid].needed = True
        else:
            build.keep_across([vid])
    work, cotangents = _scan_bytes(build, r)
    return Region(r.index, "scan", length, work, cotangents + build.in_flight[r.index],
                  build.grad_bytes[r.index], group=r.group, kept_bytes=_nest_scan(build, r),
                  nest=r.index if r.group > 1 else -1, sliced=bool(slices),
                  unrolled=_program.unrolled_whole(scan.params)), answer


def _ask(build: _Build, r: Segment, checkpointed: Callable[[], Callable],
         operands: Sequence[int], fixed: Callable[[int], int]) -> RegionAnswer:
    """What JAX answers about region ``r`` (see :func:`ask_jax`; ``checkpointed()`` makes
    the function asked), asked once for regions of one signature; marks the values its
    VJP reads as needed. The operands that carry no cotangent in the program are not
    differentiated."""
    frozen = frozenset(k for k, a in enumerate(operands) if a not in build.facts.differentiable)
    signature = build.facts.texts.sign(r, frozen)
    answer = build.facts.answers.ask(signature, lambda: ask_jax(
        build.program, r, signature, checkpointed(), operands, frozen, fixed))
    _warn_unplanned(answer.unplanned_bytes, r)
    for vid in signature.ids(answer.needed):
        build.values[vid].needed = True
    return answer


def _named_region_fn(program: Program, r: Segment, named: frozenset[int]) -> Callable:
    """The region as :func:`autoremat._program.region_fn` runs it, in a checkpoint that
    may save every name in ``named``; a region run as written in one without an input
    barrier: JAX reads what its backward needs, each as the name of a value (unnamed, as
    written, it may keep another of the same size: ``2 * x`` for ``x ** 2``)."""
    policy = _program.policy_for(named)
    if r.written:
        return jax.checkpoint(_program.region_fn(program, r, named, None), policy=policy)
    return _program.region_fn(program, r, named, policy)


def _fixed_flops(program: Program, r: Segment, named: frozenset[int]) -> Callable[[int], int]:
    """What JAX recomputes in ``r`` saving every name in ``named``, beyond the region's
    plain step FLOPs (the argument)."""
    return lambda flops: unnamed_recompute_flops(
        _named_region_fn(program, r, named), flops, abstract(r.inputs, program.avals), r.eqns)


def _fixed_loop_flops(program: Program, body: _program.ScanBody, operands: Sequence[int]
                      ) -> int:
    """What JAX recomputes in one iteration of a scan's ``body`` saving every name,
    measured in a loop: inside a scan's body, JAX recomputes values that it saves when the
    body is differentiated alone (those of a nested scan)."""
    return unnamed_recompute_flops(scan_step_fn(body, program.consts, in_loop=True),
                                   scan_step_fn(body, program.consts, in_loop=True, named=False),
                                   abstract(operands, program.avals), body.eqns)


def _behind_barrier(build: _Build, r: Segment) -> tuple[int, ...]:
    """The values of other regions that pass through segment ``r``'s input barrier (none
    without one); marks the values made from them as replaying it."""
    if not _program.has_input_barrier(r):
        return ()
    inputs = set(r.inputs)
    for e in r.eqns:
        if any(a in inputs for a in e.ins if isinstance(a, int)):
            for v in build.made([e]):
                v.replays_barrier = True
    return tuple(a for a in r.inputs if a in build.values)


def _scan_bytes(build: _Build, r: Segment) -> tuple[int, int]:
    """Scan region ``r``'s forward working set and the bytes of its cotangents and gradient
    accumulators (those of other regions in flight aside)."""
    program, facts = build.program, build.facts
    *slices, scan = r.eqns
    body = scan.scan_body
    assert body is not None  # a scan region ends with a top-level scan
    outer_consts, _, _ = _program.scan_operands(scan, scan.ins)
    kept = {a for a in (*body.carry_out, *body.ys_out) if isinstance(a, int)}
    work = work_bytes(body.eqns, [*body.carry_in, *body.xs_in], kept, program.value_bytes,
                      facts.free | set(body.consts) | set(body.xs_in))
    cotangents = cotangent_bytes(body.eqns, kept, facts.cotangent_size, facts.differentiable)
    # The loop sums the gradient of each differentiable constant in a buffer of its
    # size; each later region that reads the constant too made its own, and XLA adds
    # them up only after the last (measured on TPU v5e, with loops reading the stacked
    # weights of GPT-2-small, 162 MiB, as constants in pieces 1+2+4+5: three
    # accumulators live in the second piece).
    accumulators = sum(program.value_bytes(c) * sum(k > r.index for k in build.readers[c])
                       for c in dict.fromkeys(outer_consts)
                       if isinstance(c, int) and c in facts.differentiable)
    # A loop slicing its inputs holds the slices through its forward pass and makes
    # them again for its backward pass, where it sums their cotangents.
    sliced = [o for e in slices for o in e.outs]
    work += sum(map(program.value_bytes, sliced))
    accumulators += sum(program.value_bytes(o) * (1 + (o in facts.differentiable))
                        for o in sliced)
    return work, cotangents + accumulators


def _nest_scan(build: _Build, r: Segment) -> int:
    """The bytes the group checkpoints of nested scan ``r`` keep (0: not nested); marks
    what its body makes as replayed, ``r.group`` instances of a value saved per iteration.
    """
    if r.group <= 1:
        return 0
    scan = r.eqns[-1]
    length = scan.params["length"]
    outs = set(scan.outs)
    for v in build.made([scan]):
        if v.facts.id not in outs:
            v.replayed = True
            if v.multiplicity == length:
                v.multiplicity = r.group
    # A group's checkpoint keeps its carry and, to slice its inputs, its group number
    # (int32); what the body saves is made again in the group's backward.
    _, init, xs = _program.scan_operands(scan, scan.ins)
    return length // r.group * (4 * bool(xs) + sum(build.program.value_bytes(c)
                                                   for c in init if isinstance(c, int)))


def _xs_slices_hold_their_input(build: _Build) -> None:
    """An xs slice is a view of the scan's input: reading it holds the whole input, kept
    from the forward pass unless the scan's region made it."""
    for v in build.values.values():
        if v.facts.primitive == "xs_in" and v.needed:
            for vid in v.facts.inputs:
                held = build.values.get(vid)
                if held is not None and held.region == v.region:
                    held.needed = True
                else:
                    build.keep_across([vid])


def _group_outputs_are_kept(build: _Build) -> None:
    """What a nested group of segments hands to regions outside it is kept from the
    forward, as an output of the group's checkpoint: it is not replayed."""
    nest_of = [r.nest for r in build.regions]
    for vid, v in build.values.items():
        if v.needed_across and v.replayed and build.regions[v.region].kind == "segment" \
                and any(nest_of[k] != nest_of[v.region] for k in build.readers.get(vid, ())):
            v.replayed = False


def _handed_on_values_are_released(build: _Build) -> None:
    """A segment's value that nothing in the segment reads, its backward pass included
    (a block's output), and that later segments read is freed, saved, once the first of
    their backward passes has run (:attr:`autoremat._graph.Value.released`); outside
    nested groups."""
    read_within = {u for v in build.values.values() for u in v.facts.inputs
                   if u in build.values and build.values[u].region == v.region}
    segment = [r.kind == "segment" and r.nest < 0 for r in build.regions]
    for vid, v in build.values.items():
        later = [k for k in build.readers.get(vid, ()) if k > v.region]
        if (later and segment[v.region] and not v.needed and vid not in read_within
                and all(build.regions[k].nest < 0 for k in later)):
            v.released = min(later)


def _constants(build: _Build) -> tuple[Constant, ...]:
    """The program's constants that JAX may keep as residuals, one per array (JAX closes
    over an array once however many equations read it): those the backward passes read
    whatever the plan, and those recomputing a value reads (directly, or by replaying its
    segment's input barrier, which keeps every input)."""
    consts = build.program.consts
    readers: dict[int, list[int]] = {}
    for r in build.regions:
        barrier = [c for c in r.inputs if c in consts] if _program.has_input_barrier(r) else []
        for v in build.made(r.eqns):
            for c in (*v.facts.constants, *(barrier if v.replays_barrier else ())):
                readers.setdefault(c, []).append(v.facts.id)
    arrays: dict[int, list[int]] = {}
    for c in sorted({*build.kept_constants, *readers}):
        arrays.setdefault(id(consts[c]), []).append(c)
    return tuple(Constant(cs[0], build.program.value_bytes(cs[0]),
                          not build.kept_constants.isdisjoint(cs),
                          tuple(dict.fromkeys(v for c in cs for v in readers.get(c, ()))))
                 for cs in arrays.values())


def _warn_unplanned(nbytes: int, region: Segment) -> None:
    if nbytes:
        warnings.warn(f"JAX keeps {nbytes} bytes of residuals in the region starting at "
                      f"{source_of(region.eqns[0])} that are not named values; autoremat "
                      "cannot plan or count them, so the predicted peak may be low by that "
                      "much.", stacklevel=5)
