"""Per-device sizes of a sharded program's values, so that budgets are per device.

A training step sharded over a mesh holds a shard of each value on every device; what a
device's memory must fit is its shards. :func:`localize` gives every value of a
:class:`~autoremat._program.Program` its per-device shape (``Program.shapes``), from what
the program and its arguments say about shardings. A value's sharding is a spec: per
dimension, the mesh axes that split it (per-device extent ``ceil(size / prod(axes))``).

Where a sharding comes from, most exact first:

* **Explicit axes** (``jax.sharding.AxisType.Explicit``): every aval carries its sharding
  (``aval.sharding.spec``); it is exact and wins over everything below.
* **shard_map**: the body's values have per-device shapes already; the outputs are
  sharded as ``out_specs`` say.
* **Arguments**: the ``sharding`` of a ``jax.Array`` or ``jax.ShapeDtypeStruct`` leaf
  (a :class:`jax.sharding.NamedSharding`; other kinds count as replicated).
* **Constraints**: ``jax.lax.with_sharding_constraint`` (exact for its result) and the
  ``in_shardings``/``out_shardings`` of a ``jax.jit`` inside the function.
* **Propagation** (automatic axes) in program order, as GSPMD does in the common cases:
  elementwise ops take the spec of their most split operand of the result's shape (not
  a mix of operands' dimensions: GSPMD picks one operand's sharding);
  ``broadcast_in_dim``, ``reshape`` (a merged or split group of dimensions keeps the
  split of its major dimension, on the first dimension it divides), ``transpose``,
  ``squeeze``, reductions (reduced dimensions dropped), slices and pads (resized
  dimensions replicated) and ``gather`` (indices' dimensions and kept operand
  dimensions) map the operand's spec; ``dot_general`` keeps the batch and free
  dimensions' axes of its operands and drops the contracted ones (their partial sums
  are all-reduced). A mesh axis splits at most one dimension (a later repeat is
  dropped). Calls and loops this module does not look into (``custom_vjp``, ``cond``,
  ``while``, ``sort``, ...) are treated as elementwise over the operands with the
  result's shape.
* **Unknown**: any other result is **replicated** (full size, conservative), unless a
  sharding constraint is applied to it (or to the elementwise chain that follows
  it) or it is an input of a ``shard_map``: GSPMD propagates shardings backwards from
  constraints too, so it takes that constraint's sharding (the least split of several).

A constraint on a value whose sharding is known keeps the larger per-device size of the
two. In a scan, a carry takes its initial value's spec (or the body's result's, when
that is less split), and a sliced input the scanned array's spec without its leading
dimension. This is a model of GSPMD, not GSPMD: :func:`autoremat.measure_step` compiles
the sharded step to check it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from autoremat import _program
from autoremat._cost import fusible, manual_devices
from autoremat._graph import Graph
from autoremat._program import Atom, Eqn, Program

Spec = tuple[tuple[str, ...], ...]

_ELEMENTWISE_LIKE = frozenset({
    "name", "convert_element_type", "copy", "reduce_precision", "optimization_barrier",
    "stop_gradient", "select_n", "clamp", "integer_pow", "cumsum", "cumprod", "cummax",
    "cummin", "cumlogsumexp", "sort", "custom_jvp_call", "custom_vjp_call",
    "custom_vjp_call_jaxpr", "cond", "while", "dynamic_update_slice", "pvary",
})
_RESIZING = frozenset({"slice", "dynamic_slice", "pad", "concatenate", "split", "rev"})
_REDUCING = frozenset({"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and",
                       "reduce_or", "reduce_xor", "argmax", "argmin"})


def leaf_sharding(x: Any, aval: Any) -> jax.sharding.Sharding | None:
    """The sharding to plan argument leaf ``x`` (abstract value ``aval``) with: its own
    :class:`NamedSharding` over more than one device, or its aval's explicit sharding;
    ``None`` when it has neither (then it is traced unsharded, as before)."""
    sharding = aval.sharding if _explicit(aval) else getattr(x, "sharding", None)
    if isinstance(sharding, NamedSharding) and sharding.mesh.size > 1:
        return sharding
    return None


def _explicit(aval: Any) -> bool:
    sharding = getattr(aval, "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    return bool(mesh is not None and mesh.axis_names
                and AxisType.Explicit in tuple(mesh.axis_types))


@dataclasses.dataclass
class _Specs:
    """Specs found so far: by value id, whether each is a guess, and the axes' sizes."""

    program: Program
    specs: dict[int, Spec] = dataclasses.field(default_factory=dict)
    guessed: set[int] = dataclasses.field(default_factory=set)
    axis_sizes: dict[str, int] = dataclasses.field(default_factory=dict)
    fixed: dict[int, tuple[int, ...]] = dataclasses.field(default_factory=dict)  # shard_map bodies

    def add_mesh(self, mesh: Any) -> None:
        for name, size in zip(mesh.axis_names, mesh.axis_sizes, strict=True):
            self.axis_sizes.setdefault(name, size)

    def of(self, sharding: Any, ndim: int) -> Spec | None:
        """``sharding`` as a spec of ``ndim`` dimensions (None: not a named sharding)."""
        if not isinstance(sharding, NamedSharding):
            return None
        self.add_mesh(sharding.mesh)
        return _normalize(sharding.spec, ndim)

    def shape(self, i: int) -> tuple[int, ...]:
        return tuple(self.program.avals[i].shape) if _is_array(self.program.avals[i]) else ()

    def spec(self, a: Atom) -> Spec | None:
        return self.specs.get(a) if isinstance(a, int) else None

    def local_shape(self, i: int) -> tuple[int, ...]:
        """The shape of value ``i``'s shard on one device."""
        shape = self.shape(i)
        spec = self.specs.get(i)
        if not spec:
            return shape
        return tuple(-(-d // math.prod(self.axis_sizes.get(a, 1) for a in axes))
                     for d, axes in zip(shape, spec, strict=True))

    def local_bytes(self, i: int) -> int:
        """Dense bytes of value ``i``'s shard on one device."""
        return _program.nbytes(self.program.avals[i], shape=self.local_shape(i))

    def set(self, i: int, spec: Spec, guess: bool = False) -> None:
        aval = self.program.avals[i]
        if _explicit(aval):
            spec, guess = self.explicit_spec(aval), False
        self.specs[i] = _dedupe(spec)
        if guess:
            self.guessed.add(i)
        else:
            self.guessed.discard(i)

    def explicit_spec(self, aval: Any) -> Spec:
        """The spec an explicitly sharded aval states (over its explicit axes)."""
        mesh = aval.sharding.mesh
        explicit = {n for n, t in zip(mesh.axis_names, mesh.axis_types, strict=True)
                    if t == AxisType.Explicit}
        self.of(aval.sharding, len(aval.shape))
        spec = _normalize(aval.sharding.spec, len(aval.shape))
        return tuple(tuple(a for a in axes if a in explicit) for axes in spec)

    def constrain(self, i: int, spec: Spec) -> None:
        """Applies a constraint: a guess takes it, a known spec keeps the larger size."""
        if i in self.guessed or i not in self.specs:
            self.set(i, spec)
            return
        before = self.local_bytes(i)
        kept = self.specs[i]
        self.specs[i] = _dedupe(spec)
        if self.local_bytes(i) < before:
            self.specs[i] = kept


def localize(program: Program, arg_shardings: Sequence[Any]) -> Program:
    """``program`` with the per-device shapes of its values (see the module docstring).

    Args:
      program: the flattened program.
      arg_shardings: per flat argument, its sharding (:func:`leaf_sharding`) or None.

    Returns:
      ``program`` with ``shapes`` set, or unchanged when nothing in it is sharded.
    """
    s = _Specs(program)
    follows = _following_constraints(program, s)
    for i, sharding in zip(program.args, arg_shardings, strict=True):
        spec = s.of(sharding, len(s.shape(i)))
        s.set(i, spec if spec is not None else _replicated(s.shape(i)),
              guess=spec is None)
    for i in program.consts:
        s.set(i, _replicated(s.shape(i)))
    calls: dict[int, list[Spec]] = {}
    for i, sharding in program.call_shardings:
        spec = s.of(sharding, len(s.shape(i)))
        if spec is not None:
            calls.setdefault(i, []).append(spec)
    for i in program.args:
        for spec in calls.get(i, ()):
            s.constrain(i, spec)
    _propagate(program.eqns, s, follows, calls)
    if not s.axis_sizes and not s.fixed:
        return program
    shapes = {i: s.fixed[i] if i in s.fixed else s.local_shape(i) for i in program.avals}
    return dataclasses.replace(program, shapes=shapes)


def _following_constraints(program: Program, s: _Specs) -> dict[int, list[Spec]]:
    """For each value that a sharding constraint or a ``shard_map`` reads, the specs they
    ask for (looked through elementwise chains back to where the chain starts)."""
    found: dict[int, list[Spec]] = {}

    def visit(eqns: Sequence[Eqn]) -> None:
        for e in eqns:
            if e.primitive.name == "sharding_constraint" and isinstance(e.ins[0], int):
                spec = s.of(e.params["sharding"], len(s.shape(e.ins[0])))
                if spec is not None:
                    found.setdefault(e.ins[0], []).append(spec)
            if e.shard_body is not None:
                s.add_mesh(e.params["mesh"])
                for a, p in zip(e.ins, e.params["in_specs"], strict=True):
                    if isinstance(a, int):
                        found.setdefault(a, []).append(_normalize(p, len(s.shape(a))))
            if e.scan_body is not None:
                visit(e.scan_body.eqns)

    visit(program.eqns)
    # Back through elementwise chains: GSPMD propagates a constraint up them.
    producer = {o: e for e in _all_eqns(program.eqns) for o in e.outs}
    todo = list(found)
    while todo:
        i = todo.pop()
        e = producer.get(i)
        if e is None or len(e.outs) != 1 or not (
                e.primitive.name in _ELEMENTWISE_LIKE or fusible(e.primitive.name)):
            continue
        for a in e.ins:
            if isinstance(a, int) and s.shape(a) == s.shape(i) and a not in found:
                found[a] = list(found[i])
                todo.append(a)
    return found


def _all_eqns(eqns: Sequence[Eqn]) -> Iterable[Eqn]:
    for e in eqns:
        yield e
        if e.scan_body is not None:
            yield from _all_eqns(e.scan_body.eqns)


def _propagate(eqns: Sequence[Eqn], s: _Specs, follows: Mapping[int, list[Spec]],
               calls: Mapping[int, list[Spec]]) -> None:
    for e in eqns:
        if e.scan_body is not None:
            _scan(e, s, follows, calls)
            continue
        if e.shard_body is not None:
            _shard_map(e, s)
            continue
        outs = _rule(e, s)
        for o, (spec, guess) in zip(e.outs, outs, strict=True):
            s.set(o, spec, guess)
            if guess and o in follows:
                s.set(o, max(follows[o], key=lambda sp, o=o: _size_with(s, o, sp)))
            for spec in calls.get(o, ()):
                s.constrain(o, spec)


def _size_with(s: _Specs, i: int, spec: Spec) -> int:
    kept = s.specs.get(i)
    s.specs[i] = spec
    size = s.local_bytes(i)
    if kept is None:
        del s.specs[i]
    else:
        s.specs[i] = kept
    return size


def _scan(e: Eqn, s: _Specs, follows: Mapping[int, list[Spec]],
          calls: Mapping[int, list[Spec]]) -> None:
    body = e.scan_body
    assert body is not None  # a top-level scan
    outer = dict(zip(("consts", "carry", "xs"), _program.scan_operands(e, e.ins), strict=True))
    for inner, a in zip(body.consts, outer["consts"], strict=True):
        s.set(inner, s.spec(a) or _replicated(s.shape(inner)), a in s.guessed)
    for inner, a in zip(body.xs_in, outer["xs"], strict=True):
        spec = s.spec(a)
        s.set(inner, spec[1:] if spec else _replicated(s.shape(inner)), a in s.guessed)
    for inner, a in zip(body.carry_in, outer["carry"], strict=True):
        s.set(inner, s.spec(a) or _replicated(s.shape(inner)), a in s.guessed)
    for _ in range(2):  # again when a carry leaves the body less split than it came in
        _propagate(body.eqns, s, follows, calls)
        grown = [(c, o) for c, o in zip(body.carry_in, body.carry_out, strict=True)
                 if isinstance(o, int) and s.local_bytes(o) > s.local_bytes(c)]
        for c, o in grown:
            s.set(c, s.specs[o], o in s.guessed)
        if not grown:
            break
    n_carry = len(body.carry_in)
    for o, c in zip(e.outs[:n_carry], body.carry_in, strict=True):
        s.set(o, s.specs[c], c in s.guessed)
    for o, y in zip(e.outs[n_carry:], body.ys_out, strict=True):
        spec = s.spec(y) or _replicated(s.shape(o)[1:])
        s.set(o, ((), *spec), isinstance(y, int) and y in s.guessed)


def _shard_map(e: Eqn, s: _Specs) -> None:
    """Outputs as ``out_specs`` say; body values at their own (per-device) size."""
    body = e.shard_body
    assert body is not None  # a shard_map
    s.add_mesh(e.params["mesh"])
    for o, p in zip(e.outs, e.params["out_specs"], strict=True):
        s.set(o, _normalize(p, len(s.shape(o))))
    manual = set(e.params["newly_manual_axes"])
    for b in [*body.ins, *(o for be in _all_eqns(body.eqns) for o in be.outs)]:
        aval = s.program.avals[b]
        if _explicit(aval):
            s.set(b, tuple(tuple(a for a in axes if a not in manual)
                           for axes in s.explicit_spec(aval)))
            s.fixed[b] = s.local_shape(b)
        else:
            s.fixed[b] = s.shape(b)


def _rule(e: Eqn, s: _Specs) -> list[tuple[Spec, bool]]:
    """``(spec, guessed)`` of each result of ``e`` (see the module docstring)."""
    name, p = e.primitive.name, e.params
    shapes = [s.shape(o) for o in e.outs]
    operands = [(s.spec(a), a in s.guessed if isinstance(a, int) else False,
                 s.shape(a) if isinstance(a, int) else tuple(np.shape(a.value)))
                for a in e.ins]
    known = [(sp, g, sh) for sp, g, sh in operands if sp is not None]
    guess = bool(known) and all(g for _, g, _ in known)
    if not known:
        return [(_replicated(sh), False) for sh in shapes]
    first, _, first_shape = operands[0]
    if name == "sharding_constraint":
        spec = s.of(p["sharding"], len(shapes[0]))
        if spec is not None:
            free = p["unconstrained_dims"]
            return [(tuple(x if d not in free or first is None else first[d]
                           for d, x in enumerate(spec)), False)]
    if name == "broadcast_in_dim" and first is not None:
        out: list[tuple[str, ...]] = [()] * len(shapes[0])
        for src, dst in enumerate(p["broadcast_dimensions"]):
            if first_shape[src] == shapes[0][dst]:
                out[dst] = first[src]
        return [(tuple(out), guess)]
    if name == "reshape" and first is not None:
        return [(_reshape(first, first_shape, shapes[0], s.axis_sizes), guess)]
    if name == "transpose" and first is not None:
        return [(tuple(first[d] for d in p["permutation"]), guess)]
    if name == "squeeze" and first is not None:
        dims = {d % len(first) for d in p["dimensions"]}
        return [(tuple(x for d, x in enumerate(first) if d not in dims), guess)]
    if name in _REDUCING and first is not None:
        axes = set(p["axes"])
        return [(tuple(x for d, x in enumerate(first) if d not in axes), guess)]
    if name in _RESIZING and first is not None:
        return [(tuple(x if a == b else ()
                       for x, a, b in zip(first, first_shape, sh, strict=True)), guess)
                for sh in shapes]
    if name == "dot_general":
        return [(_dot(p["dimension_numbers"], operands), guess)]
    if name == "gather":
        return [(_gather(p, operands, shapes[0]), guess)]
    if name in _ELEMENTWISE_LIKE or fusible(name) or any(
            sh == out for _, _, sh in known for out in shapes):
        return [(_elementwise_spec(known, sh, s.axis_sizes), guess) for sh in shapes]
    return [(_replicated(sh), True) for sh in shapes]


def _elementwise_spec(known: Sequence[tuple[Spec, bool, tuple[int, ...]]],
                      shape: tuple[int, ...], axis_sizes: Mapping[str, int]) -> Spec:
    """The spec of the most split operand of the result's shape; without one (every
    operand broadcasts), per dimension the most split axes among operands of that
    extent."""
    ways = lambda spec: math.prod(axis_sizes.get(a, 1) for axes in spec for a in axes)
    same = [sp for sp, _, sh in known if sh == shape]
    if same:
        return max(same, key=ways)
    out = []
    for d, n in enumerate(shape):
        options = [sp[d] for sp, _, sh in known if len(sh) == len(shape) and sh[d] == n]
        out.append(max(options, key=len, default=()))
    return tuple(out)


def _dot(dimension_numbers: Any, operands: Sequence[tuple[Spec | None, bool, tuple]]) -> Spec:
    (lc, rc), (lb, rb) = dimension_numbers
    (ls, _, lshape), (rs, _, rshape) = operands[:2]
    ls = ls or _replicated(lshape)
    rs = rs or _replicated(rshape)
    batch = [ls[a] or rs[b] for a, b in zip(lb, rb, strict=True)]
    lfree = [ls[d] for d in range(len(lshape)) if d not in lc and d not in lb]
    rfree = [rs[d] for d in range(len(rshape)) if d not in rc and d not in rb]
    return (*batch, *lfree, *rfree)


def _gather(p: Mapping[str, Any], operands: Sequence[tuple[Spec | None, bool, tuple]],
            shape: tuple[int, ...]) -> Spec:
    (os_, _, oshape), (ix, _, ishape) = operands[:2]
    dn = p["dimension_numbers"]
    os_ = os_ or _replicated(oshape)
    ix = ix or _replicated(ishape)
    kept = [d for d in range(len(oshape))
            if d not in dn.collapsed_slice_dims and d not in dn.operand_batching_dims]
    index_dims = iter(ix[:-1])
    offset = iter(os_[d] if p["slice_sizes"][d] == oshape[d] else () for d in kept)
    return tuple(next(offset, ()) if d in dn.offset_dims else next(index_dims, ())
                 for d in range(len(shape)))


def _reshape(spec: Spec, shape: Sequence[int], new: Sequence[int],
             axis_sizes: Mapping[str, int]) -> Spec:
    """Groups of dimensions with equal products map to each other; a group keeps the
    split of its major dimension (the others must be unsplit) on the first result
    dimension of the group that it divides. Where that is not the major one, GSPMD
    reshards to keep the split (``[b, s, 3 * h * d]`` split over heads becomes
    ``[b, s, 3, h, d]`` split over ``h``: XLA's SPMD partitioner does so for GPT-2)."""
    out: list[tuple[str, ...]] = [()] * len(new)
    i = j = 0
    while i < len(shape) and j < len(new):
        group_in, group_out = [i], [j]
        pi, pj = shape[i], new[j]
        while pi != pj and i < len(shape) and j < len(new):
            if pi < pj and i + 1 < len(shape):
                i += 1
                pi *= shape[i]
                group_in.append(i)
            elif j + 1 < len(new):
                j += 1
                pj *= new[j]
                group_out.append(j)
            else:
                break
        if pi != pj:
            break
        src = [k for k in group_in if shape[k] > 1] or group_in
        major = spec[src[0]]
        ways = math.prod(axis_sizes.get(a, 1) for a in major)
        dst = next((k for k in group_out if new[k] > 1 and new[k] % ways == 0), None)
        if dst is not None and all(not spec[k] for k in src[1:]):
            out[dst] = major
        i += 1
        j += 1
    return tuple(out)


def _normalize(spec: Any, ndim: int) -> Spec:
    entries = tuple(spec) if spec is not None else ()
    out = []
    for d in range(ndim):
        x = entries[d] if d < len(entries) else None
        if x is None or x is PartitionSpec.UNCONSTRAINED:
            out.append(())
        else:
            out.append((x,) if isinstance(x, str) else tuple(x))
    return tuple(out)


def _dedupe(spec: Spec) -> Spec:
    seen: set[str] = set()
    out = []
    for axes in spec:
        out.append(tuple(a for a in axes if a not in seen))
        seen.update(axes)
    return tuple(out)


def _replicated(shape: Sequence[int]) -> Spec:
    return tuple(() for _ in shape)


def _is_array(aval: Any) -> bool:
    return getattr(aval, "shape", None) is not None


def per_device_flops(graph: Graph, program: Program) -> Graph:
    """``graph`` with FLOPs per device: each value's recompute FLOPs scaled by its
    per-device share (a ``shard_map`` body's values are per device already), and the
    step's FLOPs by the same overall ratio, so that the objective and the overhead are
    the time one device spends (and the fixed FLOPs too). Unchanged for an unsharded program."""
    if not program.shapes:
        return graph
    devices = {o: manual_devices(e.params) for e in _all_eqns(program.eqns)
               if e.shard_body is not None
               for o in (*e.shard_body.ins, *(x for b in _all_eqns(e.shard_body.eqns)
                                              for x in b.outs))}
    values, local, total = [], 0, 0
    for v in graph.values:
        full = math.prod(v.shape)
        n = devices.get(v.id)
        flops = (v.flops if n is not None or not full
                 else v.flops * math.prod(program.value_shape(v.id)) // full)
        values.append(dataclasses.replace(v, flops=flops))
        local += flops
        total += v.flops * (n or 1)
    scale = lambda f: f * local // total if total else f
    return dataclasses.replace(graph, values=tuple(values), step_flops=scale(graph.step_flops),
                               fixed_flops=scale(graph.fixed_flops))
