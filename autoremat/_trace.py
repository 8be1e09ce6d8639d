"""Tracing: a function and abstract arguments to a :class:`Graph` of intermediate values.

The forward program is traced with :func:`jax.make_jaxpr`, flattened
(:mod:`autoremat._program`) and split into remat regions: each top-level ``scan`` is one
region per iteration (or, split into pieces by :func:`autoremat._program.split_scans`,
each piece is), and the unrolled code between scans is cut into segments where few
bytes cross (see :func:`segment_cuts`), so that recomputation happens close to where the
backward pass uses it.

Which values the backward pass reads is not guessed from a table: for every region JAX
itself is asked. Every value of the region is named, the region is wrapped in a
``jax.checkpoint`` that may save every name, and the residuals of its VJP are read off.
With names, each operation's backward reads only its (named) inputs, or its named
output where its JVP reads the output (``exp``, ``tanh``; see
:func:`autoremat._program.region_fn`), so this set does not depend on the plan; the plan
only decides whether each read value is saved or recomputed
(``shared/notes/remat-facts.md`` §1). What JAX recomputes even so (values no name
reaches) is measured the same way and counted in every plan
(:attr:`autoremat._graph.Graph.fixed_flops`).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax._src import config as jax_config
from jax._src import core as jax_core
from jax._src import source_info_util

from autoremat import _layout, _program, _sharding
from autoremat._cost import eqn_flops, fuses_cotangent, fusible, live_flops
from autoremat._errors import UnsupportedProgramError
from autoremat._graph import Graph, Region, Value
from autoremat._layout import Layout
from autoremat._placement import Placement
from autoremat._program import Atom, Eqn, Program, ScanBody, Segment

# The residual a remat region saves for a name is the name's output, sometimes behind
# these no-op markers.
_PASS_THROUGH = frozenset({"reduce_precision", "optimization_barrier", "name"})


def segment_cuts(program: Program) -> tuple[int, ...]:
    """Equation indices at which unrolled code starts a new segment.

    A cut can go where the bytes of earlier values still to be read are within 1.5x of
    the least such crossing in the middle 80% of the program: a layer boundary, where
    only the residual stream crosses. Cuts are then thinned so that each segment produces
    at least half of ``total produced bytes / sqrt(#equations)``. Scans always get regions
    of their own.
    """
    eqns = program.eqns
    n = len(eqns)
    if n < 4:
        return ()
    produced = np.zeros(n, np.int64)
    crossing = np.zeros(n + 1, np.int64)  # crossing[p]: bytes made before p, read at/after p
    born: dict[int, int] = {}
    last_use: dict[int, int] = {}
    for i, e in enumerate(eqns):
        for a in e.ins:
            if isinstance(a, int) and a in born:
                last_use[a] = i
        for o in e.outs:
            born[o] = i
            produced[i] += program.value_bytes(o)
    for o, i in born.items():
        if o in last_use:
            crossing[i + 1] += program.value_bytes(o)
            crossing[last_use[o] + 1] -= program.value_bytes(o)
    crossing = np.cumsum(crossing)
    lo, hi = max(1, n // 10), max(2, n - n // 10)
    threshold = 1.5 * max(1, int(crossing[lo:hi].min()))
    min_size = 0.5 * produced.sum() / math.sqrt(n)
    acc = np.concatenate([[0], np.cumsum(produced)])
    cuts: list[int] = []
    for p in range(1, n):
        if crossing[p] <= threshold and acc[p] - acc[cuts[-1] if cuts else 0] >= min_size \
                and acc[n] - acc[p] >= min_size:
            cuts.append(p)
    return tuple(cuts)


def candidate_cuts(program: Program) -> tuple[tuple[int, ...], ...]:
    """Candidate region boundaries (:attr:`Placement.cuts`), finest first.

    The finest is :func:`segment_cuts`. Coarser ones keep every second of its cuts
    (both phases): where a layer is cut in two (attention | MLP), one of them cuts only
    at layer boundaries. Each region boundary is saved for the backward pass, so fewer
    regions save fewer copies of what crosses; larger regions recompute more at once.
    The planner solves each and keeps the cheapest plan that fits.
    """
    finest = segment_cuts(program)
    found = [finest]
    for phase in (0, 1):
        coarse = finest[phase::2]
        if len(finest) >= 3 and coarse not in found:
            found.append(coarse)
    return tuple(found)


def _residuals(fn: Callable, avals: Sequence[jax.ShapeDtypeStruct]
               ) -> tuple[set[str], set[int], int]:
    """What ``fn``'s VJP keeps: (names, indices of arguments, bytes of anything else).

    Read with ``jax_remat3`` off, where names are plain ``name`` equations; named values
    are saved the same way with it on (``tests/test_plan.py`` checks both).
    """
    with jax_config.remat3(False):
        closed = jax.make_jaxpr(lambda *a: jax.vjp(fn, *a)[1])(*avals)
    jaxpr = closed.jaxpr
    producer = {v: e for e in jaxpr.eqns for v in e.outvars}
    arg_index = {v: i for i, v in enumerate(jaxpr.invars)}
    names: set[str] = set()
    args: set[int] = set()
    other = 0
    for var in jaxpr.outvars:
        if isinstance(var, jax_core.Literal):
            continue
        name, var = _origin(var, producer)
        if name is not None:
            names.add(name)
        elif var in arg_index:
            args.add(arg_index[var])
        else:
            other += _program.nbytes(var.aval)
    return names, args, other


def _origin(var: Any, producer: dict) -> tuple[str | None, Any]:
    """The name behind the residual ``var`` (or None) and the variable it comes from,
    looking through no-op markers and into ``shard_map`` bodies (JAX saves a body's
    per-device values as extra outputs of the ``shard_map``)."""
    outer: list[tuple[Any, dict]] = []  # the shard_maps entered, and their producers
    while True:
        eqn = producer.get(var)
        if eqn is None and outer and var in outer[-1][0].params["jaxpr"].invars:
            eqn, producer = outer.pop()
            var = eqn.invars[eqn.params["jaxpr"].invars.index(var)]
            continue
        if eqn is None or isinstance(var, jax_core.Literal):
            return None, var
        if eqn.primitive.name == "name":
            return eqn.params["name"], var
        if eqn.primitive.name in _PASS_THROUGH:
            var = eqn.invars[0]
        elif eqn.primitive.name == "shard_map":
            body = eqn.params["jaxpr"]
            outer.append((eqn, producer))
            var = body.outvars[eqn.outvars.index(var)]
            producer = {v: e for e in body.eqns for v in e.outvars}
        else:
            return None, var


def _step_flops(fn: Callable, avals: Sequence[jax.ShapeDtypeStruct]) -> int:
    """FLOPs of ``fn``'s forward and backward pass, counted on its jaxpr (dead equations
    dropped)."""

    def step(*args: Any) -> Any:
        out, vjp = jax.vjp(fn, *args)
        return out, vjp(jax.tree.map(lambda o: jax.numpy.ones_like(o) if _is_float(o) else
                                     np.zeros(np.shape(o), jax.dtypes.float0), out))

    return live_flops(jax.make_jaxpr(step)(*avals).jaxpr)


def _work_bytes(eqns: Sequence[Eqn], inputs: Sequence[int], kept: set[int],
                value_bytes: Callable[[int], int], free: set[int]) -> int:
    """Peak bytes live in one pass over ``eqns``, each value freed after its last read.

    Values in ``kept`` (read after the region) live to the end. Other outputs of
    elementwise and data-movement ops are taken to be fused into their consumers, as XLA
    does, and cost nothing. Residuals are not counted here: the memory model adds saved
    and recomputed values itself.
    """
    last: dict[int, int] = {}
    for i, e in enumerate(eqns):
        for a in e.ins:
            if isinstance(a, int):
                last[a] = i
    fused = {o for e in eqns if fusible(e.primitive.name) for o in e.outs if o not in kept}
    size = lambda i: 0 if i in free or i in fused else value_bytes(i)
    live = {i for i in inputs if i in last}
    cur = peak = sum(size(i) for i in live)
    for i, e in enumerate(eqns):
        for o in e.outs:
            cur += size(o)
            live.add(o)
        peak = max(peak, cur)
        for a in {a for a in e.ins if isinstance(a, int)}:
            if last.get(a) == i and a not in kept and a in live:
                live.discard(a)
                cur -= size(a)
    return peak


def _cotangent_bytes(eqns: Sequence[Eqn], later: set[int], value_bytes: Callable[[int], int],
                     differentiable: set[int]) -> int:
    """Peak bytes of cotangents live in one backward pass over ``eqns`` (in reverse).

    A value's cotangent exists from the backward of its last reader to that of its
    producer. It is materialized when some reader's transpose is a dot, convolution, loop
    or call, or when it arrives from another region (``later``); otherwise it is an
    elementwise expression that XLA fuses into the transposes that read it.
    """
    materialized = set(later) | {a for e in eqns if not fuses_cotangent(e.primitive.name)
                                 for a in e.ins if isinstance(a, int)}
    # A cotangent that must outlive a materializing transpose (a dot's, a convolution's)
    # between its last reader and its producer cannot fuse into both sides: it exists.
    barriers = np.cumsum([not fuses_cotangent(e.primitive.name) for e in eqns])
    made = {o: i for i, e in enumerate(eqns) for o in e.outs}
    last = {a: i for i, e in enumerate(eqns) for a in e.ins if isinstance(a, int)}
    materialized |= {a for a, i in last.items() if a in differentiable
                     and i and barriers[i - 1] > (barriers[made[a]] if a in made else 0)}
    size = lambda i: value_bytes(i) if i in materialized else 0
    live = {o for o in later if o in differentiable}
    cur = peak = sum(size(i) for i in live)
    for e in reversed(eqns):
        for a in {a for a in e.ins if isinstance(a, int) and a in differentiable} - live:
            live.add(a)
            cur += size(a)
        peak = max(peak, cur)
        for o in set(e.outs) & live:
            live.discard(o)
            cur -= size(o)
    return peak


def _cotangent_holders(eqns: Sequence[Eqn], value_bytes: Callable[[int], int],
                       out: dict[int, int] | None = None) -> dict[int, int]:
    """Bytes the cotangent of each concatenated value holds: the concatenation's. Its
    cotangent is a slice of the concatenation's, which XLA fuses into the slice's
    reader, keeping the whole buffer (measured on TPU v5e: a U-Net's skip cotangents hold
    the skip and the upsampled decoder input together)."""
    out = {} if out is None else out
    for e in eqns:
        if e.primitive.name == "concatenate":
            for a in e.ins:
                if isinstance(a, int):
                    out[a] = max(out.get(a, 0), *(value_bytes(o) for o in e.outs))
        if e.scan_body is not None:
            _cotangent_holders(e.scan_body.eqns, value_bytes, out)
        if e.shard_body is not None:
            _cotangent_holders(e.shard_body.eqns, value_bytes, out)
    return out


def _in_flight_cotangent_bytes(regions: Sequence[Segment], last_reader: dict[int, int],
                               value_bytes: Callable[[int], int], differentiable: set[int]
                               ) -> list[int]:
    """Bytes of cotangents live across each region's whole backward pass: those of values
    made in an earlier region and read in a later one but not in it (a long skip
    connection). The cotangent starts at the backward of the last region reading the
    value and is summed until that of the region making it (measured on TPU v5e: a U-Net's
    concatenated skips' cotangents are held from the decoder's backward to the
    encoder's)."""
    made = {o: r.index for r in regions for o in r.outputs if o in differentiable}
    out = [0] * len(regions)
    for r in regions:
        reads = set(r.inputs)
        for o, p in made.items():
            if p < r.index < last_reader.get(o, -1) and o not in reads:
                out[r.index] += value_bytes(o)
    return out


def _differentiable(program: Program) -> set[int]:
    """Values that carry a cotangent: floating-point values computed from floating-point
    arguments (a scan body's carries and slices count when floating-point)."""
    out = {a for a in program.args if _is_float(program.avals[a])}

    def visit(eqns: Sequence[Eqn]) -> None:
        for e in eqns:
            if e.scan_body is not None:
                body = e.scan_body
                out.update(i for i in (*body.carry_in, *body.xs_in) if _is_float(program.avals[i]))
                out.update(c for c, o in zip(body.consts, e.ins) if o in out)
                visit(body.eqns)
            if e.shard_body is not None:
                out.update(b for b, o in zip(e.shard_body.ins, e.ins) if o in out)
                visit(e.shard_body.eqns)
            if e.primitive.name != "stop_gradient" and any(a in out for a in e.ins
                                                           if isinstance(a, int)):
                out.update(o for o in e.outs if _is_float(program.avals[o]))

    visit(program.eqns)
    return out


def _grad_bytes_by_region(program: Program, num_regions: int, last_reader: dict[int, int]
                          ) -> list[int]:
    """Bytes of argument gradients that exist at each region's backward stage: an
    argument's gradient appears at the backward of the last region reading it
    (``last_reader``)."""
    grads = [(last_reader.get(a, num_regions), program.value_bytes(a))
             for a in program.args if _is_float(program.avals[a])]
    return [sum(b for r, b in grads if r >= i) for i in range(num_regions)]


def _source(eqn: Eqn) -> str:
    frame = source_info_util.user_frame(eqn.source_info.traceback)
    if frame is not None:
        return f"{frame.file_name}:{frame.start_line}"
    return source_info_util.summarize(eqn.source_info) or "?"


def _avals(ids: Sequence[int], avals: dict) -> list[jax.ShapeDtypeStruct]:
    return [jax.ShapeDtypeStruct(avals[i].shape, avals[i].dtype,
                                 sharding=_sharding.leaf_sharding(None, avals[i]))
            for i in ids]


def _is_float(aval: Any) -> bool:
    return hasattr(aval, "dtype") and jax.numpy.issubdtype(aval.dtype, jax.numpy.inexact)


def _signature(region: Segment, avals: dict, texts: dict[Eqn, str]
               ) -> tuple[str, dict[int, int]]:
    """A text equal for regions that compute the same thing on inputs of the same
    shapes, and each value's position in it (inputs first, then outputs in order).
    ``texts``: each equation's text after its operands, kept between calls."""
    local = {v: k for k, v in enumerate(region.inputs)}
    parts = [";".join(str(avals[v]) for v in region.inputs)]

    def atom(a: Atom) -> str:
        if isinstance(a, int):
            return f"%{local[a]}" if a in local else f"#{a}"
        return f"{a.aval}={a.value!r}"

    def visit(eqns: Sequence[Eqn]) -> None:
        for e in eqns:
            for o in e.outs:
                local.setdefault(o, len(local))
            if e not in texts:
                texts[e] = (f"{sorted(e.params.items())!r}->"
                            f"{','.join(str(avals[o]) for o in e.outs)}")
            parts.append(f"{e.primitive.name}({','.join(map(atom, e.ins))}){texts[e]}")
            if e.scan_body is not None:
                body = e.scan_body
                for v in (*body.consts, *body.carry_in, *body.xs_in):
                    local.setdefault(v, len(local))
                visit(body.eqns)
            if e.shard_body is not None:
                for v in e.shard_body.ins:
                    local.setdefault(v, len(local))
                visit(e.shard_body.eqns)

    visit(region.eqns)
    parts.append(",".join(atom(o) for o in region.outputs))
    return "\n".join(parts), local


# Effects JAX cannot differentiate through: a clear error instead of one from deep inside.
_NOT_DIFFERENTIABLE = frozenset({"pure_callback"})
# Effects jax.checkpoint refuses in a remat region, even inside a custom_vjp.
_NOT_RECOMPUTABLE = frozenset({"io_callback"})
# Effects that run again whenever their region is recomputed.
_REPEATED_ON_RECOMPUTE = frozenset({"debug_print", "debug_callback"})
# Calls differentiated by the user's own rule.
_CUSTOM_RULES = frozenset({"custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr"})


def _nested_eqns(eqns: Sequence[Any], in_rule: bool = False) -> Any:
    """``(equation, in_rule)`` for ``eqns`` and the equations of their sub-programs (scan,
    while and cond bodies, calls); ``in_rule``: inside a ``custom_jvp``/``custom_vjp``
    function, which its own rule differentiates."""
    for e in eqns:
        yield e, in_rule
        inner = in_rule or e.primitive.name in _CUSTOM_RULES
        for sub in jax_core.jaxprs_in_params(e.params):
            yield from _nested_eqns(sub.eqns, inner)


def _check_effects(eqns: Sequence[Eqn]) -> None:
    for e, in_rule in _nested_eqns(eqns):
        name = e.primitive.name
        if name in _NOT_RECOMPUTABLE:
            raise UnsupportedProgramError(
                f"{name} at {_source(e)} is a side effect that jax.checkpoint cannot replay "
                "in the backward pass (even inside a jax.custom_vjp), so its step cannot be "
                "planned; move it out of the differentiated function.")
        if name in _NOT_DIFFERENTIABLE and not in_rule:
            raise UnsupportedProgramError(
                f"{name} at {_source(e)} has no derivative in JAX, so its step cannot be "
                "planned; wrap it in jax.custom_vjp, or move it out of the differentiated "
                "function.")
        if name in _REPEATED_ON_RECOMPUTE:
            warnings.warn(f"{name} at {_source(e)} runs again when autoremat recomputes its "
                          "region in the backward pass.", stacklevel=4)


def _warn_unplanned(nbytes: int, region: Segment) -> None:
    if nbytes:
        source = _source(region.eqns[0])
        warnings.warn(f"JAX keeps {nbytes} bytes of residuals in the region starting at "
                      f"{source} that are not named values; autoremat cannot plan or count "
                      "them, so the predicted peak may be low by that much.", stacklevel=4)


def trace_program(flat_fn: Callable, avals: Sequence[jax.ShapeDtypeStruct],
                  scan_pieces: Sequence[tuple[int, ...]] = (), layout: Layout = "dense"
                  ) -> Program:
    """The flattened forward program of ``flat_fn`` (flat array arguments to a flat list
    of outputs), checked for side effects a remat region cannot replay, its top-level
    scans split into ``scan_pieces`` (see :func:`split_program`), its values sized under
    ``layout`` (see :mod:`autoremat._layout`).

    Raises:
      ValueError: ``layout`` is not one of :data:`autoremat._layout.LAYOUTS`.
    """
    layout = _layout.check(layout)
    program = _program.flatten(jax.make_jaxpr(flat_fn)(*avals))
    _check_effects(program.eqns)
    return split_program(dataclasses.replace(program, layout=layout), avals, scan_pieces)


def split_program(program: Program, avals: Sequence[jax.ShapeDtypeStruct],
                  scan_pieces: Sequence[tuple[int, ...]]) -> Program:
    """``program`` (traced at ``avals``) with its top-level scans split into
    ``scan_pieces`` (:func:`autoremat._program.split_scans`; none when every entry is
    ``()``), with per-device shapes from the avals' shardings (:mod:`autoremat._sharding`),
    under ``program``'s layout.
    """
    if any(scan_pieces):
        split = _program.split_scans(program, scan_pieces, avals)
        program = dataclasses.replace(split, layout=program.layout)
    return _sharding.localize(program, [getattr(a, "sharding", None) for a in avals])


def trace(flat_fn: Callable, avals: Sequence[jax.ShapeDtypeStruct],
          placement: Placement | None = None, layout: Layout = "dense"
          ) -> tuple[Program, tuple[Segment, ...], Graph]:
    """Traces ``flat_fn`` (flat array arguments to a flat list of outputs).

    Args:
      flat_fn: the function.
      avals: its arguments' shapes and dtypes.
      placement: where its regions are (see :func:`placements`); when None, cut at
        :func:`segment_cuts`, scans whole.
      layout: how values are sized (see :mod:`autoremat._layout`).

    Returns:
      The flattened program, its regions, and the value graph.
    """
    whole = trace_program(flat_fn, avals, layout=layout)
    if placement is None:
        placement = Placement(cuts=segment_cuts(whole))
    program = split_program(whole, avals, placement.scan_pieces)
    facts = program_facts(program, split_from=whole if placement.splits_scans else None)
    return (program, *graph_of(program, placement, facts))


@dataclasses.dataclass(frozen=True, eq=False)
class ProgramFacts:
    """What the graphs of one program share whatever the placement (see :func:`graph_of`).

    Attributes:
      program: the program.
      fields: each value's :class:`Value` fields but ``region`` and ``needed``, by id.
      made: the ids each top-level equation makes (those of a scan's body and of a
        ``shard_map``'s included).
      free: the ids of the arguments and constants.
      differentiable: the values that carry a cotangent (:func:`_differentiable`).
      holders: bytes the cotangent of each concatenated value holds
        (:func:`_cotangent_holders`).
      fingerprint: the program's :func:`autoremat._program.fingerprint_of`.
      texts: what a region's signature writes for each equation after its operands,
        filled as regions are signed (see :func:`_signature`).
      residuals: by region signature, what JAX was asked of the region: the positions of
        the values its VJP reads, those of the inputs it reads, the bytes of unnamed
        residuals, its step's FLOPs and the FLOPs JAX recomputes saving every name;
        filled as regions are asked.
      split_flops: for a program whose scans are split into pieces, the FLOPs its step
        (without remat) spends beyond the whole scans' (summing the gradients of the
        pieces' inputs).
    """

    program: Program
    fields: Mapping[int, Mapping[str, Any]]
    made: Mapping[Eqn, tuple[int, ...]]
    free: frozenset[int]
    differentiable: set[int]
    holders: Mapping[int, int]
    fingerprint: str
    texts: dict[Eqn, str] = dataclasses.field(default_factory=dict)
    residuals: dict[str, tuple[tuple[int, ...], set[int], int, int, int]] = dataclasses.field(
        default_factory=dict)
    split_flops: int = 0

    def cotangent_size(self, value_id: int) -> int:
        """Bytes the cotangent of value ``value_id`` holds."""
        return max(self.program.value_bytes(value_id), self.holders.get(value_id, 0))


def program_facts(program: Program, split_from: Program | None = None) -> ProgramFacts:
    """The :class:`ProgramFacts` of ``program``, whose scans were split from those of
    ``split_from`` (None: not split)."""
    free = frozenset(program.args) | frozenset(program.consts)
    fields, made = _value_fields(program, free)
    split_flops = 0 if split_from is None else max(
        0, _program_step_flops(program) - _program_step_flops(split_from))
    return ProgramFacts(program, fields, made, free, _differentiable(program),
                        _cotangent_holders(program.eqns, program.value_bytes),
                        _program.fingerprint_of(program), split_flops=split_flops)


def _program_step_flops(program: Program) -> int:
    """FLOPs of ``program``'s forward and backward pass without remat."""
    regions = _program.split_regions(program)
    return _step_flops(lambda *args: _program.run_program(program, regions, frozenset(), None,
                                                          args),
                       _avals(program.args, program.avals))


def _value_fields(program: Program, free: frozenset[int]
                  ) -> tuple[dict[int, dict[str, Any]], dict[Eqn, tuple[int, ...]]]:
    """Each value's :class:`Value` fields but ``region`` and ``needed``, and the ids each
    top-level equation makes."""
    fields: dict[int, dict[str, Any]] = {}
    order: list[int] = []

    def add(vid: int, mult: int, primitive: str, source: str, flops: int,
            inputs: Sequence[Atom], saveable: bool, recomputable: bool) -> None:
        aval = program.avals[vid]
        order.append(vid)
        fields[vid] = {
            "id": vid, "shape": tuple(aval.shape), "dtype": str(aval.dtype), "nbytes": program.value_bytes(vid),
            "multiplicity": mult, "primitive": primitive, "source": source, "flops": flops,
            "inputs": tuple(dict.fromkeys(a for a in inputs if isinstance(a, int) and a not in free)),
            "saveable": saveable, "recomputable": recomputable}

    def add_eqns(eqns: Sequence[Eqn], mult: int, alias: dict[int, Atom]) -> None:
        for e in eqns:
            ins = [alias.get(a, a) if isinstance(a, int) else a for a in e.ins]
            if e.shard_body is not None:
                add_shard_map(e, ins, mult, alias)
                continue
            in_avals = [program.avals[a] if isinstance(a, int) else a.aval
                        for a in e.ins]
            flops = eqn_flops(e.primitive.name, e.params, in_avals, [program.avals[o] for o in e.outs])
            top_scan = e.scan_body is not None
            source = _source(e)
            for o in e.outs:
                add(o, mult, e.primitive.name, source, flops // max(1, len(e.outs)),
                    ins, saveable=True, recomputable=not top_scan)
            if e.primitive.name == "name" and not _program.is_value_name(e.params["name"]):
                fields[e.outs[0]]["user_name"] = e.params["name"]

    def add_shard_map(e: Eqn, ins: Sequence[Atom], mult: int, alias: dict[int, Atom]) -> None:
        """A ``shard_map``'s body values (per device), and its results, computed from the
        body's for free (recomputing one re-runs the body's share of the work)."""
        body = e.shard_body
        inner = {**alias, **dict(zip(body.ins, ins))}
        add_eqns(body.eqns, mult, inner)
        source = _source(e)
        for o, b in zip(e.outs, body.outs):
            add(o, mult, e.primitive.name, source, 0,
                [inner.get(b, b)] if isinstance(b, int) else [], saveable=True,
                recomputable=True)

    def add_scan(scan: Eqn) -> None:
        body, length = scan.scan_body, scan.params["length"]
        outer_consts, _, outer_xs = _program.scan_operands(scan, scan.ins)
        add_eqns([scan], 1, {})
        source = _source(scan)
        for c in body.carry_in:
            add(c, length, "carry_in", source, 0, (), saveable=True, recomputable=False)
        for x, outer in zip(body.xs_in, outer_xs):
            add(x, length, "xs_in", source, 0, (outer,), saveable=False, recomputable=True)
        add_eqns(body.eqns, length, dict(zip(body.consts, outer_consts)))
        # JAX hoists residuals computed from loop invariants alone: saved once, not per step.
        invariant = set(body.consts)
        for e in body.eqns:
            if all(not isinstance(a, int) or a in invariant or a in free for a in e.ins):
                invariant.update(e.outs)
                for o in e.outs:
                    fields[o]["multiplicity"] = 1

    made: dict[Eqn, tuple[int, ...]] = {}
    for e in program.eqns:
        first = len(order)
        if e.scan_body is None:
            add_eqns([e], 1, {})
        else:
            add_scan(e)
        made[e] = tuple(order[first:])
    return fields, made


def graph_of(program: Program, placement: Placement, facts: ProgramFacts | None = None
             ) -> tuple[tuple[Segment, ...], Graph]:
    """The regions and value graph of ``program`` under ``placement`` (see
    :func:`autoremat._program.split_regions`; its scans already split as it says).

    ``facts``: ``program_facts(program)``, shared by the graphs of several placements of
    ``program`` so that what does not depend on the placement is worked out once.
    """
    facts = program_facts(program) if facts is None else facts
    regions = _program.split_regions(program, placement)
    free, differentiable = facts.free, facts.differentiable
    readers: dict[int, set[int]] = {}
    for r in regions:
        for e in r.eqns:
            for a in e.ins:
                if isinstance(a, int):
                    readers.setdefault(a, set()).add(r.index)
    last_reader = {a: max(rs) for a, rs in readers.items()}
    grad_bytes = _grad_bytes_by_region(program, len(regions), last_reader)
    cotangent_size = facts.cotangent_size
    in_flight = _in_flight_cotangent_bytes(regions, last_reader, cotangent_size,
                                           differentiable)

    records = {vid: {**facts.fields[vid], "region": r.index, "needed": False}
               for r in regions for e in r.eqns for vid in facts.made[e]}
    region_infos = []
    needed_across: set[int] = set()

    step_flops = fixed_flops = 0

    def mark_needed(make_fn: Callable[[], Callable], input_ids: Sequence[int],
                    region: Segment, fixed_fn: Callable[[int], int]) -> set[int]:
        """Marks the values the VJP of ``make_fn()`` reads; returns the positions of inputs
        it reads. Repeated layers are asked of JAX once (by their signature), as is what
        it recomputes saving every name (``fixed_fn(the region's plain step FLOPs)``)."""
        nonlocal step_flops, fixed_flops
        signature, local = _signature(region, program.avals, facts.texts)
        if signature not in facts.residuals:
            names, arg_pos, unplanned = _residuals(make_fn(), _avals(input_ids, program.avals))
            needed = tuple(sorted(local[_program.value_id(n)] for n in names))
            plain = _program.region_fn(program, region, frozenset(), None)
            flops = _step_flops(plain, _avals(region.inputs, program.avals))
            with jax_config.remat3(False):  # read like the residuals
                fixed = fixed_fn(flops)
            facts.residuals[signature] = needed, arg_pos, unplanned, flops, fixed
        needed, arg_pos, unplanned, flops, fixed = facts.residuals[signature]
        _warn_unplanned(unplanned, region)
        by_position = {k: v for v, k in local.items()}
        for k in needed:
            records[by_position[k]]["needed"] = True
        step_flops += flops
        fixed_flops += fixed
        return arg_pos

    def named_region_fn(r: Segment, named: frozenset[int]) -> Callable:
        return _program.region_fn(program, r, named, _program.policy_for(named))

    def whole_region_fixed_fn(r: Segment, named: frozenset[int]) -> Callable[[int], int]:
        """What JAX recomputes in ``r`` saving every name in ``named``, beyond the region's
        plain step FLOPs."""
        return lambda flops: _unnamed_recompute_flops(
            named_region_fn(r, named), flops, _avals(r.inputs, program.avals), r.eqns)

    for r in regions:
        if r.kind == "segment":
            named = frozenset(_produced(r.eqns))
            make_fn = lambda r=r, named=named: named_region_fn(r, named)
            arg_pos = mark_needed(make_fn, r.inputs, r, whole_region_fixed_fn(r, named))
            needed_across.update(r.inputs[k] for k in arg_pos)
            barrier_inputs: tuple[int, ...] = ()
            if _program.has_input_barrier(r):
                inputs = set(r.inputs)
                barrier_inputs = tuple(a for a in r.inputs if a in records)
                for e in r.eqns:
                    if any(a in inputs for a in e.ins if isinstance(a, int)):
                        for vid in facts.made[e]:
                            records[vid]["replays_barrier"] = True
            work = _work_bytes(r.eqns, r.inputs, set(r.outputs), program.value_bytes, free)
            cotangents = _cotangent_bytes(r.eqns, set(r.outputs), cotangent_size,
                                          differentiable)
            if r.nest >= 0:
                # The group's checkpoint (its id is its first region) keeps its inputs;
                # its forward runs again.
                needed_across.update(i for i in r.inputs if i in records
                                     and records[i]["region"] < r.nest)
                for vid in (v for e in r.eqns for v in facts.made[e]):
                    records[vid]["replayed"] = True
            region_infos.append(Region(r.index, "segment", 1, work,
                                       cotangents + in_flight[r.index], grad_bytes[r.index],
                                       barrier_inputs, nest=r.nest))
            continue
        *slices, scan = r.eqns
        for vid in (v for e in slices for v in facts.made[e]):
            records[vid]["saveable"] = False  # made again in the backward pass
        body, length = scan.scan_body, scan.params["length"]
        outer_consts, _, _ = _program.scan_operands(scan, scan.ins)
        operands = [*body.consts, *body.carry_in, *body.xs_in]
        # Measured in a loop: JAX recomputes values inside a scan's body that it saves
        # when the body is differentiated alone (those of a nested scan). A loop that
        # slices its inputs is measured whole, in the checkpoint around it.
        if slices:
            fixed_fn = whole_region_fixed_fn(
                r, frozenset((*_produced(body.eqns), *body.carry_in)))
        else:
            fixed_fn = lambda _, body=body, operands=operands, length=length: length * (
                _unnamed_recompute_flops(
                    _scan_step_fn(body, program.consts, in_loop=True),
                    _scan_step_fn(body, program.consts, in_loop=True, named=False),
                    _avals(operands, program.avals), body.eqns))
        arg_pos = mark_needed(lambda body=body: _scan_step_fn(body, program.consts),
                              operands, r, fixed_fn)
        flat_ids = [*outer_consts, *body.carry_in, *body.xs_in]
        for k in arg_pos:
            vid = flat_ids[k]
            if isinstance(vid, int) and vid in records and records[vid]["region"] == r.index:
                records[vid]["needed"] = True
            elif isinstance(vid, int):
                needed_across.add(vid)
        kept = {a for a in (*body.carry_out, *body.ys_out) if isinstance(a, int)}
        work = _work_bytes(body.eqns, [*body.carry_in, *body.xs_in], kept, program.value_bytes,
                           free | set(body.consts) | set(body.xs_in))
        cotangents = _cotangent_bytes(body.eqns, kept, cotangent_size, differentiable)
        # The loop sums the gradient of each differentiable constant in a buffer of its
        # size; each later region that reads the constant too made its own, and XLA adds
        # them up only after the last (measured on TPU v5e, with loops reading the stacked
        # weights of GPT-2-small, 162 MiB, as constants in pieces 1+2+4+5: three
        # accumulators live in the second piece).
        accumulators = sum(program.value_bytes(c) * sum(k > r.index for k in readers[c])
                           for c in dict.fromkeys(outer_consts)
                           if isinstance(c, int) and c in differentiable)
        # A loop slicing its inputs holds the slices through its forward pass and makes
        # them again for its backward pass, where it sums their cotangents.
        sliced = [o for e in slices for o in e.outs]
        work += sum(map(program.value_bytes, sliced))
        accumulators += sum(program.value_bytes(o) * (1 + (o in differentiable)) for o in sliced)
        kept = 0
        if r.group > 1:
            # A group's checkpoint keeps its carry and, to slice its inputs, its group
            # number (int32); what the body saves is made again in the group's backward,
            # for its iterations.
            _, init, xs = _program.scan_operands(scan, scan.ins)
            kept = length // r.group * (4 * bool(xs) + sum(program.value_bytes(c)
                                                           for c in init if isinstance(c, int)))
            outs = set(scan.outs)
            for vid in facts.made[scan]:
                if vid not in outs:
                    records[vid]["replayed"] = True
                    if records[vid]["multiplicity"] == length:
                        records[vid]["multiplicity"] = r.group
        region_infos.append(Region(r.index, "scan", length, work,
                                   cotangents + accumulators + in_flight[r.index],
                                   grad_bytes[r.index], group=r.group, kept_bytes=kept,
                                   nest=r.index if r.group > 1 else -1, sliced=bool(slices)))

    # An xs slice is a view of the scan's input: reading it holds the whole input, kept
    # from the forward pass unless the scan's region made it.
    for rec in records.values():
        if rec["primitive"] == "xs_in" and rec["needed"]:
            for vid in rec["inputs"]:
                if vid in records and records[vid]["region"] == rec["region"]:
                    records[vid]["needed"] = True
                else:
                    needed_across.add(vid)
    # What a nested group of segments hands to regions outside it is kept from the
    # forward, as an output of the group's checkpoint.
    nest_of = [r.nest for r in regions]
    for vid in needed_across:
        rec = records.get(vid)
        if rec is not None and rec.get("replayed") and regions[rec["region"]].kind == "segment" \
                and any(nest_of[k] != nest_of[rec["region"]] for k in readers.get(vid, ())):
            rec["replayed"] = False
    values = tuple(Value(**records[vid], needed_across=vid in needed_across)
                   for vid in sorted(records))
    graph = Graph(
        values=values,
        regions=tuple(region_infos),
        arg_bytes=sum(map(program.value_bytes, program.args)),
        grad_bytes=sum(program.value_bytes(a) for a in program.args
                       if _is_float(program.avals[a])),
        step_flops=step_flops,
        fixed_flops=fixed_flops + facts.split_flops,
        fingerprint=facts.fingerprint,
        layout=program.layout,
        placement=placement,
        largest_grad_bytes=max((program.value_bytes(a) for a in program.args
                                if _is_float(program.avals[a])), default=0),
    )
    return regions, _sharding.per_device_flops(graph, program)


def _scan_step_fn(body: ScanBody, consts: Mapping[int, Any], *, in_loop: bool = False,
                  named: bool = True) -> Callable:
    """One iteration of a scan's body as a function of its flat operands (constants,
    carry, slices), every value it makes named, in a ``jax.checkpoint`` that may save
    every name (``named=False``: plain); ``in_loop``: run as a scan of length 1."""
    names = frozenset(_produced(body.eqns))
    step = _program.scan_body_fn(body, consts, names if named else frozenset())
    if named:
        step = jax.checkpoint(step, policy=_program.policy_for(names), prevent_cse=False)
    groups = (body.consts, body.carry_in, body.xs_in)

    def fn(*flat: Any) -> Any:
        const_vals, carry, xs = _split(flat, groups)
        if not in_loop:
            return step(const_vals, carry, xs)
        carry, ys = jax.lax.scan(lambda c, x: step(const_vals, c, x), carry,
                                 [x[None] for x in xs], length=1)
        return carry, [y[0] for y in ys]

    return fn


def _unnamed_recompute_flops(checkpointed: Callable, plain: Callable | int,
                             avals: Sequence[jax.ShapeDtypeStruct], eqns: Sequence[Eqn]
                             ) -> int:
    """FLOPs JAX recomputes in the backward pass of ``checkpointed`` (region ``eqns``
    saving every name) beyond ``plain`` (the region without checkpoint, or its step's
    FLOPs): what no plan can save. Not measured (0) where a debug print or callback would
    run again: JAX 0.10 fails transposing such a checkpoint alone (``KeyError``)."""
    if any(e.primitive.name in _REPEATED_ON_RECOMPUTE for e, _ in _nested_eqns(eqns)):
        return 0
    plain_flops = _step_flops(plain, avals) if callable(plain) else plain
    return max(0, _step_flops(checkpointed, avals) - plain_flops)


def _produced(eqns: Sequence[Eqn]) -> list[int]:
    """Ids ``eqns`` produce, those of ``shard_map`` bodies included."""
    return [o for e in eqns
            for o in (*e.outs, *(_produced(e.shard_body.eqns) if e.shard_body else ()))]


def _split(flat: Sequence[Any], groups: Sequence[Sequence[int]]) -> list[list[Any]]:
    out, k = [], 0
    for g in groups:
        out.append(list(flat[k:k + len(g)]))
        k += len(g)
    return out

