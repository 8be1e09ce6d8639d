"""What JAX is asked about a region: the residuals of its VJP and its FLOPs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax._src import config as jax_config
from jax._src import core as jax_core

from autoremat import _program
from autoremat._cost import live_flops
from autoremat._layout import Layout
from autoremat._program import Eqn, Program, ScanBody, Segment
from autoremat._trace._common import abstract, is_float, produced
from autoremat._trace._effects import REPEATED_ON_RECOMPUTE, nested_eqns
from autoremat._trace._signature import Signature


@dataclasses.dataclass(frozen=True)
class RegionAnswer:
    """What JAX answered about a region (see :func:`ask_jax`).

    Attributes:
      needed: the positions in the region's :class:`Signature` of the values its VJP reads.
      inputs_read: the positions of the arguments of the function asked that its VJP reads.
      unplanned_bytes: bytes of the residuals that are not named values.
      step_flops: FLOPs of the region's forward and backward pass without remat.
      fixed_flops: FLOPs JAX recomputes in the region's backward pass saving every name.
    """

    needed: tuple[int, ...]
    inputs_read: tuple[int, ...]
    unplanned_bytes: int
    step_flops: int
    fixed_flops: int


class JaxAnswers:
    """What JAX answered about the regions of one program, by signature: regions that
    compute the same thing (repeated layers) are asked once (a cache)."""

    def __init__(self) -> None:
        self._answers: dict[str, RegionAnswer] = {}

    def __len__(self) -> int:
        return len(self._answers)

    def ask(self, signature: Signature, question: Callable[[], RegionAnswer]
            ) -> RegionAnswer:
        """The answer for regions signed ``signature``: ``question()``, called the first
        time."""
        answer = self._answers.get(signature.text)
        if answer is None:
            answer = self._answers[signature.text] = question()
        return answer


def ask_jax(program: Program, region: Segment, signature: Signature, checkpointed: Callable,
            operands: Sequence[int], frozen: Collection[int], fixed: Callable[[int], int]
            ) -> RegionAnswer:
    """Asks JAX about ``region`` of ``program``, signed ``signature``: the residuals of
    ``checkpointed`` (the region, every value named, in a checkpoint that may save every
    name) as a function of ``operands``, those at positions ``frozen`` not differentiated;
    the region's step FLOPs; and ``fixed(those FLOPs)``, what JAX recomputes saving every
    name."""
    names, args, unplanned = residuals(checkpointed, abstract(operands, program.avals), frozen)
    flops = step_flops(_program.region_fn(program, region, frozenset(), None),
                       abstract(region.inputs, program.avals))
    with jax_config.remat3(False):  # read like the residuals
        fixed_flops = fixed(flops)
    return RegionAnswer(
        needed=tuple(sorted(signature.positions[_program.value_id(n)] for n in names)),
        inputs_read=tuple(sorted(args)), unplanned_bytes=unplanned, step_flops=flops,
        fixed_flops=fixed_flops)


# The residual a remat region saves for a name is the name's output, sometimes behind
# these no-op markers.
_PASS_THROUGH = frozenset({"reduce_precision", "optimization_barrier", "name"})


def residuals(fn: Callable, avals: Sequence[jax.ShapeDtypeStruct],
              frozen: Collection[int] = ()) -> tuple[set[str], set[int], int]:
    """What ``fn``'s VJP keeps: (names, indices of arguments, bytes of anything else).

    The arguments at positions ``frozen`` are closed over, not differentiated: in the
    program they carry no cotangent (constants, and values made from constants alone), and
    differentiated, the VJP would read what their cotangents need.

    Read with ``jax_remat3`` off, where names are plain ``name`` equations; named values
    are saved the same way with it on (``tests/test_plan.py`` checks both).
    """
    with jax_config.remat3(False):
        closed = jax.make_jaxpr(lambda *a: jax.vjp(*_differentiated(fn, a, frozen))[1]
                                )(*avals)
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


def residuals_as_written(fn: Callable, avals: Sequence[jax.ShapeDtypeStruct]
                         ) -> tuple[jax_core.AbstractValue, ...]:
    """The residuals ``fn``'s VJP keeps, its arguments left out: what JAX saves for ``fn``
    run as written, without a checkpoint (a buffer once, each literal), as
    :func:`autoremat._rewrite.as_written` runs it: its traced program."""
    run = jax_core.jaxpr_as_fun(jax.make_jaxpr(fn)(*avals))
    jaxpr = jax.make_jaxpr(lambda *a: jax.vjp(run, *a)[1])(*avals).jaxpr
    literals = [v for v in jaxpr.outvars if isinstance(v, jax_core.Literal)]
    kept = {v for v in jaxpr.outvars if not isinstance(v, jax_core.Literal)} - set(jaxpr.invars)
    return tuple(v.aval for v in [*literals, *kept])


def saved_bytes_as_written(fn: Callable, avals: Sequence[jax.ShapeDtypeStruct],
                           layout: Layout) -> int:
    """Bytes of :func:`residuals_as_written`, each counted under ``layout`` as a plan counts
    the values it saves."""
    return residual_bytes(residuals_as_written(fn, avals), layout)


def residual_bytes(kept: Sequence[jax_core.AbstractValue], layout: Layout) -> int:
    """Bytes of the residuals ``kept`` under ``layout``."""
    return sum(_program.nbytes(aval, layout) for aval in kept)


def _differentiated(fn: Callable, args: Sequence[Any], frozen: Collection[int]
                    ) -> tuple[Any, ...]:
    """``jax.vjp``'s arguments for ``fn`` at ``args`` differentiated in those not at the
    positions ``frozen``: ``fn`` of those alone (closing over the others), then them."""
    moving = [k for k in range(len(args)) if k not in frozen]

    def part(*values: Any) -> Any:
        full = list(args)
        for k, v in zip(moving, values, strict=True):
            full[k] = v
        return fn(*full)

    return (part, *(args[k] for k in moving))


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
