"""What JAX is asked about a region: the residuals of its VJP and its FLOPs."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax._src import config as jax_config
from jax._src import core as jax_core

from autoremat import _program
from autoremat._cost import live_flops
from autoremat._program import Atom, Eqn, ScanBody, Segment
from autoremat._trace._common import is_float, produced
from autoremat._trace._effects import REPEATED_ON_RECOMPUTE, nested_eqns

# The residual a remat region saves for a name is the name's output, sometimes behind
# these no-op markers.
_PASS_THROUGH = frozenset({"reduce_precision", "optimization_barrier", "name"})


def residuals(fn: Callable, avals: Sequence[jax.ShapeDtypeStruct]
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


def step_flops(fn: Callable, avals: Sequence[jax.ShapeDtypeStruct]) -> int:
    """FLOPs of ``fn``'s forward and backward pass, counted on its jaxpr (dead equations
    dropped)."""

    def step(*args: Any) -> Any:
        out, vjp = jax.vjp(fn, *args)
        return out, vjp(jax.tree.map(lambda o: jax.numpy.ones_like(o) if is_float(o) else
                                     np.zeros(np.shape(o), jax.dtypes.float0), out))

    return live_flops(jax.make_jaxpr(step)(*avals).jaxpr)


def signature(region: Segment, avals: dict, texts: dict[Eqn, str]
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


def scan_step_fn(body: ScanBody, consts: Mapping[int, Any], *, in_loop: bool = False,
                  named: bool = True) -> Callable:
    """One iteration of a scan's body as a function of its flat operands (constants,
    carry, slices), every value it makes named, in a ``jax.checkpoint`` that may save
    every name (``named=False``: plain); ``in_loop``: run as a scan of length 1."""
    names = frozenset(produced(body.eqns))
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


def unnamed_recompute_flops(checkpointed: Callable, plain: Callable | int,
                             avals: Sequence[jax.ShapeDtypeStruct], eqns: Sequence[Eqn]
                             ) -> int:
    """FLOPs JAX recomputes in the backward pass of ``checkpointed`` (region ``eqns``
    saving every name) beyond ``plain`` (the region without checkpoint, or its step's
    FLOPs): what no plan can save. Not measured (0) where a debug print or callback would
    run again: JAX 0.10 fails transposing such a checkpoint alone (``KeyError``)."""
    if any(e.primitive.name in REPEATED_ON_RECOMPUTE for e, _ in nested_eqns(eqns)):
        return 0
    plain_flops = step_flops(plain, avals) if callable(plain) else plain
    return max(0, step_flops(checkpointed, avals) - plain_flops)


def _split(flat: Sequence[Any], groups: Sequence[Sequence[int]]) -> list[list[Any]]:
    out, k = [], 0
    for g in groups:
        out.append(list(flat[k:k + len(g)]))
        k += len(g)
    return out
