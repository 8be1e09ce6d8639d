"""A flattened, region-split view of a traced forward program, and its interpreter.

:func:`flatten` turns a closed jaxpr into a :class:`Program`: nested ``jit``,
``closed_call`` and existing ``checkpoint`` calls are inlined, every value gets an
integer id, and each top-level ``scan`` keeps its body as a :class:`ScanBody` so that
it can become one remat region per iteration. A ``shard_map`` keeps its body as a
:class:`ShardBody`, whose values (per-device shapes) are planned like any other: they are
named inside the body, and ``jax.checkpoint`` around the region saves them as per-device
residuals. :func:`region_fn` re-binds a region's equations through JAX, wrapping chosen
values in :func:`jax.ad_checkpoint.checkpoint_name` (an operation whose JVP reads its output,
as ``exp``'s does, gets that JVP reading the named output, so a name policy can save it); it
is shared by the tracer (to ask JAX which values the backward pass reads) and by the
rewriter (to emit the optimized function), so both see exactly the same program.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax._src import core as jax_core
from jax._src import source_info_util
from jax._src.ad_checkpoint import CheckpointName, name_p
from jax._src.interpreters import ad
from jax.ad_checkpoint import checkpoint_name
from jax.custom_derivatives import SymbolicZero

from autoremat import _layout
from autoremat._layout import Layout
from autoremat._placement import Placement

# Calls whose body is inlined into the caller. An existing checkpoint is dropped:
# its region is re-planned (outer policies win, so nesting ours inside would be ignored).
_INLINED = frozenset({"jit", "pjit", "closed_call", "core_call", "checkpoint", "remat2"})


@dataclasses.dataclass(frozen=True)
class Literal:
    """A constant operand of an equation."""

    value: Any
    aval: Any


Atom = int | Literal


@dataclasses.dataclass(frozen=True, eq=False)
class Eqn:
    """One primitive application: ``outs = primitive.bind(*ins, **params)``."""

    primitive: jax_core.Primitive
    params: Mapping[str, Any]
    ins: tuple[Atom, ...]
    outs: tuple[int, ...]
    source_info: Any
    ctx: Any
    scan_body: ScanBody | None = None  # set for top-level scans only
    shard_body: ShardBody | None = None  # set for shard_maps


@dataclasses.dataclass(frozen=True, eq=False)
class ScanBody:
    """The body of a top-level scan, flattened: one remat region per iteration."""

    consts: tuple[int, ...]
    carry_in: tuple[int, ...]
    xs_in: tuple[int, ...]
    eqns: tuple[Eqn, ...]
    carry_out: tuple[Atom, ...]
    ys_out: tuple[Atom, ...]


@dataclasses.dataclass(frozen=True, eq=False)
class ShardBody:
    """The body of a ``shard_map``, flattened: its values have per-device shapes."""

    ins: tuple[int, ...]
    eqns: tuple[Eqn, ...]
    outs: tuple[Atom, ...]


@dataclasses.dataclass(frozen=True, eq=False)
class Segment:
    """A region: a run of top-level equations (``kind="segment"``) or one scan."""

    index: int
    kind: str  # "segment" or "scan"
    eqns: tuple[Eqn, ...]
    inputs: tuple[int, ...]  # ids read here but produced elsewhere (args, other regions)
    outputs: tuple[int, ...]  # ids produced here and read later or returned
    group: int = 1  # a scan's iterations per nested checkpoint (see nest_group)
    nest: int = -1  # the nested group of segments it belongs to (see split_regions)
    written: bool = False  # run as written, in no checkpoint (see Placement.written)
    barrier: bool = True  # its inputs pass an optimization barrier (see Placement.barriers)


@dataclasses.dataclass(frozen=True, eq=False)
class Program:
    """A flattened forward program with integer value ids."""

    avals: Mapping[int, jax_core.ShapedArray]
    args: tuple[int, ...]
    consts: Mapping[int, Any]
    eqns: tuple[Eqn, ...]
    outs: tuple[Atom, ...]
    # The shardings inlined ``jit`` calls put on values (``in_shardings``/``out_shardings``).
    call_shardings: tuple[tuple[int, Any], ...] = ()
    # Per-device shapes by value id (see autoremat._sharding); absent ids have full shape.
    shapes: Mapping[int, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    # For a program made by :func:`split_scans`: the iterations of each piece its top-level
    # scans were split into, and the structure digest of the program it was split from.
    scan_pieces: tuple[tuple[int, ...], ...] = ()
    split_from: str | None = None
    # How values are laid out in memory (see autoremat._layout).
    layout: Layout = "dense"

    def value_shape(self, value_id: int) -> tuple[int, ...]:
        """The shape of the part of value ``value_id`` one device holds."""
        shape = self.shapes.get(value_id)
        return tuple(getattr(self.avals[value_id], "shape", ())) if shape is None else shape

    def value_bytes(self, value_id: int) -> int:
        """Bytes one device holds of value ``value_id``, under the program's layout."""
        return self._bytes[value_id]

    def stacked_bytes(self, value_id: int, count: int) -> int:
        """Bytes one device holds of ``count`` instances of value ``value_id`` stacked along
        a new leading dimension, as JAX stacks a scan's residuals (in tiles, the stacking
        dimension may be padded: ``6 x f32[512]`` take ``f32[8,512]``)."""
        if count == 1:
            return self.value_bytes(value_id)
        return nbytes(self.avals[value_id], self.layout, (count, *self.value_shape(value_id)))

    @functools.cached_property
    def _bytes(self) -> dict[int, int]:
        """:meth:`value_bytes` of every value, worked out once."""
        args = frozenset(self.args)
        return {i: nbytes(a, self.layout, self.value_shape(i), argument=i in args)
                for i, a in self.avals.items()}


def flatten(closed: jax_core.ClosedJaxpr) -> Program:
    """Flattens ``closed`` into a :class:`Program` (see the module docstring)."""
    counter = itertools.count()
    avals: dict[int, jax_core.ShapedArray] = {}
    consts: dict[int, Any] = {}
    call_shardings: list[tuple[int, Any]] = []

    def fresh(aval: jax_core.AbstractValue) -> int:
        i = next(counter)
        # Tokens too: readers of a value's shape ask for it with getattr.
        avals[i] = aval  # pyright: ignore[reportArgumentType]
        return i

    def walk(jaxpr: jax_core.Jaxpr, const_vals: Sequence[Any], in_atoms: Sequence[Atom],
             top: bool, out: list[Eqn]) -> list[Atom]:
        env: dict[Any, Atom] = dict(zip(jaxpr.invars, in_atoms, strict=True))
        for var, val in zip(jaxpr.constvars, const_vals, strict=True):
            env[var] = cid = fresh(var.aval)
            consts[cid] = val

        def read(v: Any) -> Atom:
            return Literal(v.val, v.aval) if isinstance(v, jax_core.Literal) else env[v]

        for eqn in jaxpr.eqns:
            ins = [read(v) for v in eqn.invars]
            name = eqn.primitive.name
            if name in _INLINED:
                sub = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
                assert sub is not None  # every inlined call carries its jaxpr
                sub_jaxpr, sub_consts = ((sub.jaxpr, sub.consts) if hasattr(sub, "consts")
                                         else (sub, ()))
                sub_outs = walk(sub_jaxpr, sub_consts, ins, top, out)
                env.update(zip(eqn.outvars, sub_outs, strict=True))
                call_shardings.extend(_call_shardings(eqn.params, ins, sub_outs))
                continue
            outs = tuple(fresh(v.aval) for v in eqn.outvars)
            env.update(zip(eqn.outvars, outs, strict=True))
            body = _flatten_scan_body(eqn, fresh, walk) if (top and name == "scan") else None
            shard_body = _flatten_shard_body(eqn, fresh, walk) if name == "shard_map" else None
            primitive, params = eqn.primitive, eqn.params
            if name == "call_hi_primitive" and isinstance(params["_prim"], CheckpointName):
                # ``checkpoint_name`` with ``jax_remat3`` on: the same identity, as ``name``.
                primitive, params = name_p, {"name": params["_prim"].params["name"]}
            out.append(Eqn(primitive, params, tuple(ins), outs, eqn.source_info,
                           eqn.ctx, body, shard_body))
        return [read(v) for v in jaxpr.outvars]

    args = tuple(fresh(v.aval) for v in closed.jaxpr.invars)
    eqns: list[Eqn] = []
    outs = walk(closed.jaxpr, closed.consts, args, True, eqns)
    live = _live(eqns, outs)
    ids = _renumbering(args, live, outs)
    return Program({ids[i]: a for i, a in avals.items() if i in ids},
                   tuple(ids[a] for a in args), {ids[i]: c for i, c in consts.items() if i in ids},
                   tuple(_renumbered(e, ids) for e in live), _atoms(outs, ids),
                   tuple((ids[i], s) for i, s in call_shardings if i in ids))


def _renumbering(args: Sequence[int], eqns: Sequence[Eqn], outs: Sequence[Atom]
                 ) -> dict[int, int]:
    """New ids for the values of the live program, in the order of the old ones, without
    gaps: the ids of a value then depend on the live program alone, not on the dead
    equations and unread constants of its trace (a Keras model's first trace has 116
    unread constants, and its ids ran to 2955 against 889 for later traces), so that a
    plan made on one trace applies to another."""
    used = {*args, *(a for a in outs if isinstance(a, int))}

    def visit(es: Sequence[Eqn]) -> None:
        for e in es:
            used.update(a for a in (*e.ins, *e.outs) if isinstance(a, int))
            if e.scan_body is not None:
                b = e.scan_body
                used.update(a for a in (*b.consts, *b.carry_in, *b.xs_in, *b.carry_out,
                                        *b.ys_out) if isinstance(a, int))
                visit(b.eqns)
            if e.shard_body is not None:
                used.update(a for a in (*e.shard_body.ins, *e.shard_body.outs)
                            if isinstance(a, int))
                visit(e.shard_body.eqns)

    visit(eqns)
    return {old: new for new, old in enumerate(sorted(used))}


def _atoms(atoms: Sequence[Atom], ids: Mapping[int, int]) -> tuple[Atom, ...]:
    return tuple(ids[a] if isinstance(a, int) else a for a in atoms)


def _renumbered(e: Eqn, ids: Mapping[int, int]) -> Eqn:
    """Equation ``e`` with its value ids mapped by ``ids``."""
    nums = lambda values: tuple(ids[v] for v in values)
    body, shard = e.scan_body, e.shard_body
    return dataclasses.replace(
        e, ins=_atoms(e.ins, ids), outs=nums(e.outs),
        scan_body=None if body is None else ScanBody(
            nums(body.consts), nums(body.carry_in), nums(body.xs_in),
            tuple(_renumbered(b, ids) for b in body.eqns), _atoms(body.carry_out, ids),
            _atoms(body.ys_out, ids)),
        shard_body=None if shard is None else ShardBody(
            nums(shard.ins), tuple(_renumbered(b, ids) for b in shard.eqns),
            _atoms(shard.outs, ids)))


def fingerprint_of(program: Program) -> str:
    """A digest of the structure of the user's program (of the one ``program`` was split
    from, for a split program): its primitives and value types."""
    if program.split_from is not None:
        return program.split_from
    h = hashlib.sha256()
    for e in program.eqns:
        h.update(e.primitive.name.encode())
        for o in e.outs:
            h.update(str(program.avals[o]).encode())
        if e.scan_body is not None:
            for b in e.scan_body.eqns:
                h.update(b.primitive.name.encode())
    return h.hexdigest()[:16]


def scan_pieces(length: int) -> tuple[int, ...]:
    """The pieces :func:`split_scans` splits a loop of ``length`` iterations into: 1, 2,
    4, ... iterations and the rest, so that any number of iterations from 0 to ``length``
    is the total of some of them (a plan can treat any number of iterations one way and
    the rest another) with few pieces (``log2(length) + 1``)."""
    pieces: list[int] = []
    while sum(pieces) + 2 ** len(pieces) <= length:
        pieces.append(2 ** len(pieces))
    rest = length - sum(pieces)
    return (*pieces, rest) if rest else tuple(pieces)


def scan_pieces_of(program: Program) -> tuple[tuple[int, ...], ...]:
    """How :func:`split_scans` splits each top-level scan of ``program``: a forward scan
    of 4 iterations or more into :func:`scan_pieces`; others stay whole (``()``)."""
    return tuple(scan_pieces(e.params["length"])
                 if e.params["length"] >= 4 and not e.params["reverse"] else ()
                 for e in program.eqns if e.scan_body is not None)


def scan_groups_of(program: Program) -> tuple[int, ...]:
    """How each top-level scan of ``program`` is nested when it is: a forward scan in
    groups of :func:`nest_group` iterations; others not (1)."""
    return tuple(1 if e.params["reverse"] else nest_group(e.params["length"])
                 for e in program.eqns if e.scan_body is not None)


def split_scans(program: Program, scan_pieces: Sequence[tuple[int, ...]],
                avals: Sequence[Any]) -> Program:
    """``program`` with its ``k``-th top-level scan run as consecutive scans of
    ``scan_pieces[k]`` iterations (whole where that is ``()``), traced again at ``avals``.

    Each piece is a region of its own with its own decisions, so a plan can treat some
    iterations of a loop one way and the rest another, as unrolled code can. A piece
    scans its slice of the loop's inputs, sliced in the piece's region (see
    :func:`split_regions`), so that the backward pass slices the stacked inputs (the
    layers' weights) again rather than keeping copies, and the gradient of each piece's
    slice is its own. Measured on GPT-2-small scanned in pieces 1+2+4+5 (TPU v5e): slices
    made before the region lived to the backward pass (162 MiB); a loop reading its
    iteration's slice of the whole input summed the gradient in a buffer of the whole
    input's size, in every piece (3 buffers live at once) and adding it at every iteration
    (1.0 GFLOP). The pieces' results are concatenated.
    """
    scans = [e for e in program.eqns if e.scan_body is not None]
    # Not strict: a placement made by hand may list fewer scans; the rest stay whole.
    pieces_of = {e: p for e, p in zip(scans, scan_pieces, strict=False) if p}

    def fn(*args: Any) -> list:
        env: dict[int, Any] = dict(zip(program.args, args, strict=True))
        for eqn in program.eqns:
            if eqn in pieces_of:
                invals = [_read(a, env, program.consts) for a in eqn.ins]
                env.update(zip(eqn.outs, _run_scan_pieces(eqn, invals, program.consts,
                                                          pieces_of[eqn]), strict=True))
            else:
                _run_eqns([eqn], env, program.consts, frozenset(), None)
        return [_read(a, env, program.consts) for a in program.outs]

    split = flatten(jax.make_jaxpr(fn)(*avals))
    return dataclasses.replace(split, scan_pieces=tuple(scan_pieces),
                               split_from=fingerprint_of(program))


def _run_scan_pieces(eqn: Eqn, invals: list, consts: Mapping[int, Any],
                     pieces: Sequence[int]) -> list:
    assert eqn.scan_body is not None  # a top-level scan
    const_vals, carry, xs = scan_operands(eqn, invals)
    fn = scan_body_fn(eqn.scan_body, consts, frozenset())
    step = lambda c, x: fn(const_vals, c, x)
    ys_pieces, start = [], 0
    for length in pieces:
        part = [jax.lax.slice_in_dim(x, start, start + length) for x in xs]
        carry, ys = jax.lax.scan(step, carry, part, length=length, unroll=eqn.params["unroll"])
        ys_pieces.append(ys)
        start += length
    return [*carry, *(jax.lax.concatenate(list(ys), 0) for ys in zip(*ys_pieces, strict=True))]


def _call_shardings(params: Mapping[str, Any], ins: Sequence[Atom], outs: Sequence[Atom]
                    ) -> list[tuple[int, Any]]:
    """``(value id, sharding)`` for the operands and results a ``jit`` call shards."""
    # A call without shardings stated has none: the operands pair with nothing.
    pairs = [*zip(ins, params.get("in_shardings", ()), strict=False),
             *zip(outs, params.get("out_shardings", ()), strict=False)]
    return [(a, s) for a, s in pairs
            if isinstance(a, int) and isinstance(s, jax.sharding.Sharding)]


def _live(eqns: Sequence[Eqn], outs: Sequence[Atom]) -> tuple[Eqn, ...]:
    """``eqns`` without those whose outputs nothing reads (JAX drops them too when
    differentiating). Equations without outputs, such as debug prints, stay."""
    read = {a for a in outs if isinstance(a, int)}
    kept = []
    for e in reversed(eqns):
        if e.outs and not read.intersection(e.outs):
            continue
        kept.append(e)
        read.update(a for a in e.ins if isinstance(a, int))
    return tuple(reversed(kept))


def _flatten_scan_body(eqn: Any, fresh: Callable, walk: Callable) -> ScanBody:
    body = eqn.params["jaxpr"]
    n_consts, n_carry = eqn.params["num_consts"], eqn.params["num_carry"]
    ids = [fresh(v.aval) for v in body.jaxpr.invars]
    body_eqns: list[Eqn] = []
    outs = walk(body.jaxpr, body.consts, ids, False, body_eqns)
    return ScanBody(
        consts=tuple(ids[:n_consts]),
        carry_in=tuple(ids[n_consts:n_consts + n_carry]),
        xs_in=tuple(ids[n_consts + n_carry:]),
        eqns=tuple(body_eqns),
        carry_out=tuple(outs[:n_carry]),
        ys_out=tuple(outs[n_carry:]),
    )


def _flatten_shard_body(eqn: Any, fresh: Callable, walk: Callable) -> ShardBody:
    body = eqn.params["jaxpr"]
    ids = [fresh(v.aval) for v in body.invars]
    body_eqns: list[Eqn] = []
    outs = walk(body, (), ids, False, body_eqns)
    return ShardBody(ins=tuple(ids), eqns=tuple(body_eqns), outs=tuple(outs))


def split_regions(program: Program, placement: Placement = Placement()
                  ) -> tuple[Segment, ...]:
    """Splits the top-level equations into regions as ``placement`` says.

    ``placement.cuts`` are equation indices where a new segment starts; every top-level
    scan is a region of its own whatever the cuts, with the slices of its scanned inputs
    made just before it (:func:`scan_input_slices`). ``placement.scan_groups``: per
    top-level scan, its iterations per nested checkpoint (1 or absent: not nested; see
    :func:`nest_group`). ``placement.segment_group``: each run of consecutive segments is
    nested in groups of that many (a last group of one is not nested; 1: none nested),
    each group's id (``Segment.nest``) the index of its first segment.
    ``placement.written``: the regions run in no checkpoint (``Segment.written``).
    ``placement.barriers``: whether segments pass their inputs through a barrier
    (``Segment.barrier``).
    """
    groups: list[tuple[str, list[Eqn]]] = []
    cut_set = set(placement.cuts)
    slices = scan_input_slices(program)
    in_scan_region = {j for i, s in slices.items() for j in range(i - len(s), i)}
    for i, eqn in enumerate(program.eqns):
        if eqn.scan_body is not None:
            groups.append(("scan", [*slices.get(i, ()), eqn]))
        elif i in in_scan_region:
            continue
        elif not groups or groups[-1][0] == "scan" or i in cut_set:
            groups.append(("segment", [eqn]))
        else:
            groups[-1][1].append(eqn)

    used_after: list[set[int]] = [set() for _ in groups]
    later: set[int] = {a for a in program.outs if isinstance(a, int)}
    for g in range(len(groups) - 1, -1, -1):
        used_after[g] = set(later)
        for eqn in groups[g][1]:
            later.update(a for a in eqn.ins if isinstance(a, int))

    regions = []
    nests = iter(placement.scan_groups)
    for g, (kind, eqns) in enumerate(groups):
        produced = [o for e in eqns for o in e.outs]
        produced_set = set(produced)
        inputs = dict.fromkeys(a for e in eqns for a in e.ins
                               if isinstance(a, int) and a not in produced_set)
        outputs = tuple(o for o in produced if o in used_after[g])
        group = next(nests, 1) if kind == "scan" else 1
        regions.append(Segment(g, kind, tuple(eqns), tuple(inputs), outputs, group,
                               written=g in placement.written, barrier=placement.barriers))
    size = placement.segment_group
    if size <= 1:
        return tuple(regions)
    runs = itertools.groupby(regions, key=lambda r: r.kind)
    chunks = [run[k:k + size] for kind, rs in runs if kind == "segment"
              for run in [list(rs)] for k in range(0, len(run), size)]
    nest = {r.index: chunk[0].index for chunk in chunks if len(chunk) > 1 for r in chunk}
    return tuple(dataclasses.replace(r, nest=nest.get(r.index, -1)) for r in regions)


def scan_input_slices(program: Program) -> dict[int, tuple[Eqn, ...]]:
    """For each top-level scan (by equation index), the ``slice`` equations just before it
    whose results only it reads, as scanned inputs (those :func:`split_scans` makes). They
    belong to the scan's region: the region's checkpoint makes them again in the backward
    pass instead of keeping them."""
    readers: dict[int, list[tuple[Eqn, bool]]] = {}
    for e in program.eqns:
        xs = set(scan_operands(e, e.ins)[2]) if e.scan_body is not None else set()
        for a in e.ins:
            if isinstance(a, int):
                readers.setdefault(a, []).append((e, a in xs))
    outs = {a for a in program.outs if isinstance(a, int)}
    found: dict[int, tuple[Eqn, ...]] = {}
    for i, eqn in enumerate(program.eqns):
        if eqn.scan_body is None:
            continue
        start = i
        while start > 0 and (e := program.eqns[start - 1]).primitive.name == "slice" and all(
                o not in outs and readers.get(o) == [(eqn, True)] for o in e.outs):
            start -= 1
        if start < i:
            found[i] = program.eqns[start:i]
    return found


def nest_group(length: int) -> int:
    """Iterations per nested checkpoint for a loop of ``length`` (Chen et al. 2016,
    https://arxiv.org/abs/1604.06174): the divisor of ``length`` nearest its square root
    (the smaller on a tie), 1 when it has none between 2 and ``length / 2``."""
    divisors = [k for k in range(2, length // 2 + 1) if length % k == 0]
    return min(divisors, key=lambda k: (abs(k - math.sqrt(length)), k), default=1)


def _bind(eqn: Eqn, invals: Sequence[Any], named: Collection[int] = frozenset()
          ) -> list[Any]:
    """``eqn``'s outputs on ``invals``, those in ``named`` named (:func:`value_name`)."""
    params = eqn.primitive.get_bind_params(eqn.params)
    name_stack = source_info_util.current_name_stack() + eqn.source_info.name_stack
    with source_info_util.user_context(eqn.source_info.traceback, name_stack=name_stack), \
            eqn.ctx.manager:
        if eqn.outs and eqn.outs[0] in named and _jvp_reads_output(eqn, invals):
            return [_bind_named_output(eqn.primitive, params, invals,
                                       value_name(eqn.outs[0]))]
        ans = eqn.primitive.bind(*invals, **params)
    return _name(eqn.outs, list(ans) if eqn.primitive.multiple_results else [ans], named)


def _name(ids: Sequence[int], vals: Sequence[Any], named: Collection[int]) -> list[Any]:
    return [checkpoint_name(v, value_name(i)) if i in named else v
            for i, v in zip(ids, vals, strict=True)]


def _jvp_reads_output(eqn: Eqn, invals: Sequence[Any]) -> bool:
    """Whether ``eqn``'s JVP reads its output, as ``exp``'s and ``tanh``'s do (rules
    registered with ``ad.defjvp2``; ``convert_element_type``'s reads only its dtype), on
    inexact inputs not all literals (an operation on literals alone has no tangent)."""
    rule = ad.primitive_jvps.get(eqn.primitive)
    return (isinstance(rule, functools.partial) and rule.func is ad.standard_jvp2
            and any(isinstance(a, int) for a in eqn.ins)
            and eqn.primitive is not jax.lax.convert_element_type_p
            and all(jax.numpy.issubdtype(jax.numpy.result_type(x), jax.numpy.inexact)
                    for x in invals))


def _bind_named_output(primitive: Any, params: dict, invals: Sequence[Any], name: str) -> Any:
    """``checkpoint_name(primitive.bind(*invals), name)``, differentiated by the
    primitive's own JVP rules but with the named output as their ``ans``.

    Bound plainly, the rules read the output from before the name, which a name policy
    cannot save: JAX would save the named inputs and recompute the primitive instead.
    """
    rule = ad.primitive_jvps[primitive]
    assert isinstance(rule, functools.partial)  # ad.defjvp2's (see _jvp_reads_output)
    rules = rule.args[0]

    def bind(*xs: Any) -> Any:
        return checkpoint_name(primitive.bind(*xs, **params), name)

    def jvp(primals: Sequence[Any], tangents: Sequence[Any]) -> tuple[Any, Any]:
        ans = bind(*primals)
        outs = [rule(t, ans, *primals, **params) for rule, t in zip(rules, tangents, strict=True)
                if rule is not None and not isinstance(t, SymbolicZero)]
        return ans, functools.reduce(ad.add_tangents, outs, jax.numpy.zeros_like(ans))

    fn = jax.custom_jvp(bind)
    fn.defjvp(jvp, symbolic_zeros=True)
    return fn(*invals)


def value_name(value_id: int) -> str:
    """The ``checkpoint_name`` autoremat gives value ``value_id``."""
    return f"autoremat.v{value_id}"


def value_id(name: str) -> int:
    """The inverse of :func:`value_name`."""
    return int(name.removeprefix("autoremat.v"))


def is_value_name(name: str) -> bool:
    """Whether ``name`` is one :func:`value_name` makes (not a name of the user's)."""
    return name.startswith("autoremat.v") and name.removeprefix("autoremat.v").isdigit()


def policy_for(saved: Collection[int], offloaded: Collection[int] = ()) -> Callable:
    """The ``jax.checkpoint`` policy that saves exactly the named values ``saved`` on the
    device and ``offloaded`` in host memory (pinned host; see :mod:`autoremat._offload`)."""
    if not offloaded:
        return jax.checkpoint_policies.save_only_these_names(*map(value_name, sorted(saved)))
    return jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[value_name(v) for v in sorted(saved)],
        names_which_can_be_offloaded=[value_name(v) for v in sorted(offloaded)],
        offload_src="device", offload_dst="pinned_host")


def _read(a: Atom, env: Mapping[int, Any], consts: Mapping[int, Any]) -> Any:
    if isinstance(a, Literal):
        return a.value
    return env[a] if a in env else consts[a]


def _run_eqns(eqns: Sequence[Eqn], env: dict[int, Any], consts: Mapping[int, Any],
              named: frozenset[int], scan_policy: Callable | None, group: int = 1) -> None:
    for eqn in eqns:
        invals = [_read(a, env, consts) for a in eqn.ins]
        if eqn.scan_body is not None:
            outs = _name(eqn.outs, _run_scan(eqn, invals, consts, named, scan_policy, group),
                         named)
        elif eqn.shard_body is not None:
            outs = _name(eqn.outs, _run_shard_map(eqn, invals, consts, named), named)
        else:
            outs = _bind(eqn, invals, named)
        env.update(zip(eqn.outs, outs, strict=True))


def scan_body_fn(body: ScanBody, consts: Mapping[int, Any], named: frozenset[int]
                 ) -> Callable[[list, list, list], tuple[list, list]]:
    """``(consts, carry, xs) -> (carry, ys)`` for one iteration, naming ``named``, the
    carry it starts from included (a checkpoint around the loop saves a carry only by its
    name)."""

    def fn(const_vals: list, carry: list, xs: list) -> tuple[list, list]:
        env = dict(zip(body.consts, const_vals, strict=True))
        env.update(zip(body.carry_in, _name(body.carry_in, carry, named), strict=True))
        env.update(zip(body.xs_in, xs, strict=True))
        _run_eqns(body.eqns, env, consts, named, None)
        return ([_read(a, env, consts) for a in body.carry_out],
                [_read(a, env, consts) for a in body.ys_out])

    return fn


def scan_operands(eqn: Eqn, operands: Sequence[Any]) -> tuple[list, list, list]:
    """A scan's operands split into its constants, initial carry and scanned inputs."""
    n_consts, n_carry = eqn.params["num_consts"], eqn.params["num_carry"]
    ops = list(operands)
    return ops[:n_consts], ops[n_consts:n_consts + n_carry], ops[n_consts + n_carry:]


def _run_scan(eqn: Eqn, invals: list, consts: Mapping[int, Any], named: frozenset[int],
              policy: Callable | None, group: int = 1) -> list:
    p = eqn.params
    assert eqn.scan_body is not None  # a top-level scan
    const_vals, init, xs = scan_operands(eqn, invals)
    fn = scan_body_fn(eqn.scan_body, consts, named)
    step = lambda carry, x: fn(const_vals, carry, x)
    if group > 1:
        carry, ys = _nested_scan(step, policy, init, xs, p["length"], group)
        return [*carry, *ys]
    unroll = p["unroll"]
    if policy is not None:
        # XLA inlines a loop of one iteration, then merges what is not kept with the
        # forward pass. A fully unrolled loop, inlined, gets its recomputation scheduled
        # early, every iteration's at once (penzai's LayerStack: its floor plan compiled
        # at the hand remat's peak, far above the model's): it runs rolled.
        step = jax.checkpoint(step, policy=policy, prevent_cse=p["length"] == 1)
        unroll = 1 if unrolled_whole(p) else unroll
    carry, ys = jax.lax.scan(step, init, xs, length=p["length"], reverse=p["reverse"],
                             unroll=unroll)
    return [*carry, *ys]


def _nested_scan(step: Callable, policy: Callable | None, init: list, xs: list, length: int,
                 group: int) -> tuple[list, list]:
    """A forward scan of ``step`` as a scan over groups of ``group`` iterations, each group
    a ``jax.checkpoint`` that keeps only its carry: the backward runs a group's iterations
    again (each in a checkpoint under ``policy``, which then saves for that group alone)
    before their backward. A group loops over its slice of ``xs``, cut inside the group's
    checkpoint. Measured on the zoo's Llama-style model's nested floor plan (TPU v5e):
    1611 MiB; an inner loop indexing the whole of ``xs`` sums its gradient in a buffer of
    its own beside the outer loop's (1804 MiB); unrolled iterations let XLA recompute
    consecutive layers at once (1729 MiB). A reshape of ``xs`` into groups before the
    loop would be a residual of its own."""
    if policy is not None:
        step = jax.checkpoint(step, policy=policy, prevent_cse=False)

    def run_group(carry: list, g: jax.Array) -> tuple[list, list]:
        sliced = [jax.lax.dynamic_slice_in_dim(x, g * group, group) for x in xs]
        return jax.lax.scan(step, carry, sliced, length=group)

    nested = jax.checkpoint(run_group, policy=jax.checkpoint_policies.nothing_saveable,
                            prevent_cse=False)
    # Iteration numbers as constants: an iota made in the step would be a residual.
    carry, ys = jax.lax.scan(nested, init, np.arange(length // group, dtype=np.int32))
    return carry, [y.reshape(length, *y.shape[2:]) for y in ys]


def _run_shard_map(eqn: Eqn, invals: list, consts: Mapping[int, Any],
                   named: frozenset[int]) -> list:
    """Runs a ``shard_map`` again through :func:`jax.shard_map`, naming body values."""
    body, p = eqn.shard_body, eqn.params
    assert body is not None  # a shard_map

    def fn(*local: Any) -> tuple:
        env = dict(zip(body.ins, local, strict=True))
        _run_eqns(body.eqns, env, consts, named, None)
        return tuple(_read(a, env, consts) for a in body.outs)

    mapped = jax.shard_map(fn, mesh=p["mesh"], in_specs=p["in_specs"],
                           out_specs=p["out_specs"], axis_names=p["newly_manual_axes"],
                           check_vma=p["check_vma"])
    return list(mapped(*invals))


def unrolled_whole(params: Mapping[str, Any]) -> bool:
    """Whether a scan with ``params`` is unrolled whole (``unroll`` at least its length:
    penzai's ``LayerStack``, a piece of one iteration): JAX lowers it to straight-line
    code."""
    return params["unroll"] >= params["length"]


def has_input_barrier(region: Segment) -> bool:
    """Whether :func:`region_fn` passes the region's inputs through an optimization barrier:
    a segment in a checkpoint does where its placement has barriers
    (``Placement.barriers``), unless it holds a ``shard_map`` (behind a barrier, JAX keeps
    a ``shard_map``'s input once more as its residual)."""
    return (region.kind == "segment" and not region.written and region.barrier
            and all(e.shard_body is None for e in region.eqns))


def region_fn(program: Program, region: Segment, named: frozenset[int],
              policy: Callable | None) -> Callable[..., list]:
    """The region as a function of its inputs returning its outputs.

    A segment is wrapped in ``jax.checkpoint(policy=policy)``, its inputs behind one
    optimization barrier (none where it holds a ``shard_map``); a scan gets the checkpoint
    on its body (one region per iteration), nested in one per group of iterations where
    ``region.group > 1``, and one around the loop where the region slices its inputs.
    With ``policy=None``, or for a region run as written (``region.written``), nothing is
    wrapped.
    """
    policy = None if region.written else policy

    def fn(*inputs: Any) -> list:
        env = dict(zip(region.inputs, inputs, strict=True))
        _run_eqns(region.eqns, env, program.consts, named, policy, region.group)
        return [env[o] for o in region.outputs]

    if policy is None or (region.kind == "scan" and len(region.eqns) == 1):
        return fn
    if not has_input_barrier(region):
        return jax.checkpoint(fn, policy=policy)

    def segment(*inputs: Any) -> list:
        # Transposed, the barrier hands out the cotangents of all the region's inputs at
        # once: the region's backward (weight gradients included) ends before the backward of
        # the regions before it starts, as the memory model's stages assume. Without it XLA
        # scheduled a language-model head's weight gradient after every layer's backward,
        # keeping the logits it reads live throughout.
        return fn(*_input_barrier(list(inputs)))

    return jax.checkpoint(segment, policy=policy)


@jax.custom_jvp
def _input_barrier(inputs: list) -> list:
    """``jax.lax.optimization_barrier(inputs)``, whose tangents (and so cotangents) pass
    through a barrier of their own only where they are not symbolic zeros.

    The primitive's JVP instantiates zero tangents: behind it, the backward pass would
    compute cotangents of inputs nobody differentiates (a ResNet's input images).
    """
    return jax.lax.optimization_barrier(inputs)


@functools.partial(_input_barrier.defjvp, symbolic_zeros=True)
def _input_barrier_jvp(primals: tuple, tangents: tuple) -> tuple[list, list]:
    (inputs,), (tangents_in,) = primals, tangents
    moved = iter(jax.lax.optimization_barrier(
        [t for t in tangents_in if not isinstance(t, SymbolicZero)]))
    return (jax.lax.optimization_barrier(inputs),
            [t if isinstance(t, SymbolicZero) else next(moved) for t in tangents_in])


def run_program(program: Program, regions: Sequence[Segment], named: frozenset[int],
                policy: Callable | None, args: Sequence[Any]) -> list:
    """Runs the whole program region by region on flat ``args``; a nested group of
    segments (``Segment.nest``) in one more ``jax.checkpoint`` that keeps only its inputs."""
    env: dict[int, Any] = dict(zip(program.args, args, strict=True))
    for nest, run in itertools.groupby(regions, key=lambda r: r.nest):
        for members in ([list(run)] if nest >= 0 else [[r] for r in run]):
            fn, inputs, outputs = _group_fn(program, members, named, policy)
            if nest >= 0 and policy is not None:
                fn = jax.checkpoint(fn, policy=jax.checkpoint_policies.nothing_saveable)
            values = fn(*(_read(i, env, program.consts) for i in inputs))
            env.update(zip(outputs, values, strict=True))
    return [_read(a, env, program.consts) for a in program.outs]


def _group_fn(program: Program, regions: Sequence[Segment], named: frozenset[int],
              policy: Callable | None) -> tuple[Callable[..., list], list[int], list[int]]:
    """Consecutive regions as one function: ``(fn, inputs, outputs)``."""
    if len(regions) == 1:
        (region,) = regions
        return region_fn(program, region, named, policy), list(region.inputs), list(
            region.outputs)
    made = {o for r in regions for o in r.outputs}
    inputs = list(dict.fromkeys(i for r in regions for i in r.inputs if i not in made))
    outputs = [o for r in regions for o in r.outputs]

    def fn(*values: Any) -> list:
        env = dict(zip(inputs, values, strict=True))
        for region in regions:
            env.update(zip(region.outputs, region_fn(program, region, named, policy)(*(
                _read(i, env, program.consts) for i in region.inputs)), strict=True))
        return [env[o] for o in outputs]

    return fn, inputs, outputs


def nbytes(aval: jax_core.AbstractValue, layout: Layout = "dense",
           shape: Sequence[int] | None = None, *, argument: bool = False) -> int:
    """Bytes of one instance of ``aval`` (0 for tokens and other non-arrays) under
    ``layout``, of ``shape`` when given (a shard's), else of the aval's; ``argument``:
    an argument of the step (see :mod:`autoremat._layout`)."""
    dtype = getattr(aval, "dtype", None)
    aval_shape = getattr(aval, "shape", None)
    if aval_shape is None or dtype is None:
        return 0
    # Extended dtypes (PRNG keys) are not numpy dtypes but know their size.
    known = isinstance(dtype, np.dtype) or jax.dtypes.issubdtype(  # pyright: ignore[reportPrivateImportUsage]
        dtype, jax.dtypes.extended)
    itemsize = dtype.itemsize if known else np.dtype(dtype).itemsize
    return _layout.array_bytes(aval_shape if shape is None else shape, itemsize, layout,
                               argument=argument)
