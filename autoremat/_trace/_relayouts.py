"""Reshapes the TPU compiler runs as copies: those that split or merge a convolution
output's feature dimension.

The compiler stores a convolution's output with its feature dimension minor, whatever its
logical position. A reshape that splits or merges that dimension is then no bitcast: the
compiler copies the array to a new layout. In code run as written (no checkpoint), it
keeps that copy for the backward pass, not the convolution's output that the copy's
elementwise chain starts from. Measured on TPU v5e (libtpu 0.0.42.1): an Equinox CNN,
channels-first under ``jax.vmap``, whose group norms reshape ``bf16[32,64,32,32]``
convolution outputs, cast to float32, to ``f32[32,8,8,32,32]``; without remat the compiler
keeps each copy (32 MiB a norm in the first stage). Its floor plan, which recomputes the
norms, compiles as the model has it without counting the copies: there they are remade
in the backward pass and short-lived.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from autoremat._cost import fuses
from autoremat._program import Eqn, Program


def relayouts(program: Program) -> frozenset[int]:
    """The ids of ``program``'s values made by a reshape that splits or merges the feature
    dimension of a convolution's output (followed through elementwise and data-movement
    ops that keep it a dimension of its own)."""
    feature: dict[int, int] = {}  # value id -> the position of its feature dimension
    found: set[int] = set()
    _follow(program.eqns, program.avals, feature, found)
    return frozenset(found)


def _follow(eqns: Sequence[Eqn], avals: Mapping, feature: dict[int, int],
            found: set[int]) -> None:
    for e in eqns:
        if e.scan_body is not None:
            _follow(e.scan_body.eqns, avals, feature, found)
        elif e.shard_body is not None:
            _follow(e.shard_body.eqns, avals, feature, found)
        elif e.primitive.name == "conv_general_dilated":
            feature[e.outs[0]] = e.params["dimension_numbers"].out_spec[1]
        else:
            carried = [a for a in e.ins if isinstance(a, int) and a in feature]
            if carried and len(e.outs) == 1:
                a = carried[0]
                f = _feature_of(e, tuple(avals[a].shape), tuple(avals[e.outs[0]].shape),
                                feature[a])
                if f is None and e.primitive.name == "reshape":
                    found.add(e.outs[0])
                elif f is not None:
                    feature[e.outs[0]] = f


def _feature_of(e: Eqn, shape: tuple[int, ...], out_shape: tuple[int, ...], f: int
                ) -> int | None:
    """Where equation ``e``'s output has the feature dimension ``f`` of its operand of
    ``shape`` (``None``: nowhere, or not as a dimension of its own)."""
    name = e.primitive.name
    if name == "reshape":
        if 0 in shape:
            return None
        into = next(outs for ins, outs in reshape_groups(shape, out_shape) if f in ins)
        kept = len(into) == 1 and out_shape[into[0]] == shape[f]
        return into[0] if kept else None
    if name == "squeeze":
        dims = set(e.params["dimensions"])
        return None if f in dims else f - sum(d < f for d in dims)
    if name == "broadcast_in_dim":
        return e.params["broadcast_dimensions"][f]
    if name == "transpose":
        return list(e.params["permutation"]).index(f)
    return f if fuses(name, e.params) and out_shape == shape else None


def reshape_groups(shape: Sequence[int], out_shape: Sequence[int]
                   ) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """A reshape's dimensions in groups ``(dims of shape, dims of out_shape)`` of equal
    products, in order; a dimension of size 1 between groups is a group of its own.

    >>> reshape_groups((32, 64, 32, 32), (32, 8, 8, 32, 32))
    [((0,), (0,)), ((1,), (1, 2)), ((2,), (3,)), ((3,), (4,))]
    >>> reshape_groups((8, 1, 6), (48,))
    [((0, 1, 2), (0,))]
    """
    groups: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    i = j = 0
    while i < len(shape) or j < len(out_shape):
        if i < len(shape) and shape[i] == 1 and (j == len(out_shape) or out_shape[j] != 1):
            groups.append(((i,), ()))
            i += 1
        elif j < len(out_shape) and out_shape[j] == 1 and (i == len(shape) or shape[i] != 1):
            groups.append(((), (j,)))
            j += 1
        else:
            ins, outs = [i], [j]
            size, out_size = shape[i], out_shape[j]
            i, j = i + 1, j + 1
            while size != out_size:
                if size < out_size:
                    ins.append(i)
                    size *= shape[i]
                    i += 1
                else:
                    outs.append(j)
                    out_size *= out_shape[j]
                    j += 1
            groups.append((tuple(ins), tuple(outs)))
    return groups
