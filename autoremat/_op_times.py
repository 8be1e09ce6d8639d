"""Measured operation times: recompute cost in time instead of FLOPs.

By default a recomputed value costs its FLOPs. FLOPs misjudge operations that are bound by
memory traffic or badly shaped for the hardware (a reduction, a gather, a small matmul),
so :func:`measure_op_times` times them instead: each distinct operation of the traced
forward program that materializes its output (dots, convolutions, reductions, gathers,
loops: see :func:`autoremat._cost.fusible`) is compiled alone for this process's default
backend and run ``repeats`` times; the median is kept. Elementwise and data-movement
operations keep their FLOP cost: recomputed, they fuse into the consumer that reads them
and cost next to nothing there, which timing them alone would not show (a fusion-aware
cost, as in He and Yu, MLSys 2023).

Planning with the times is deterministic: :func:`measure_op_times` returns plain data
(:class:`OpTimes`, saveable as JSON), and ``autoremat.plan(..., op_times=times)`` gives
the same plan for the same times. The times are scaled to FLOP-equivalents at the
program's measured rate (FLOPs over seconds of the timed operations), so plans stay
comparable with FLOP-costed ones and the objective's small tie-breaks stay small.

Example:
  >>> import jax, jax.numpy as jnp, autoremat
  >>> def loss(w, x):
  ...     for _ in range(4):
  ...         x = jnp.tanh(x @ w)
  ...     return jnp.sum(x ** 2)
  >>> w, x = jnp.ones((64, 64)) / 64, jnp.ones((32, 64))
  >>> times = autoremat.measure_op_times(loss, w, x)
  >>> p = autoremat.plan(loss, w, x, budget=0.5, op_times=times)
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from autoremat import _program, _rewrite, _trace
from autoremat._cost import fusible
from autoremat._graph import Graph
from autoremat._program import Eqn, Program


@dataclasses.dataclass(frozen=True)
class OpTimes:
    """Measured seconds of one run of the operations that make a program's values.

    Attributes:
      fingerprint: the program's structure digest (``Plan.graph.fingerprint``); times
        apply only to the program they were measured on.
      backend: the JAX backend they were measured on (``"cpu"``, ``"gpu"``, ``"tpu"``).
      seconds: value id to the seconds its operation takes once (one iteration of a
        scan), an operation's time split evenly among its outputs.

    Example:
      >>> import jax, jax.numpy as jnp, autoremat
      >>> loss = lambda w, x: jnp.sum(jnp.tanh(jnp.tanh(x @ w) @ w) ** 2)
      >>> w, x = jnp.ones((64, 64)) / 64, jnp.ones((32, 64))
      >>> times = autoremat.measure_op_times(loss, w, x, repeats=1)
      >>> autoremat.OpTimes.from_json(times.to_json()) == times
      True
    """

    fingerprint: str
    backend: str
    seconds: Mapping[int, float]

    def to_json(self) -> dict[str, Any]:
        """The times as JSON-ready data."""
        return {"fingerprint": self.fingerprint, "backend": self.backend,
                "seconds": {str(k): v for k, v in sorted(self.seconds.items())}}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> OpTimes:
        """Times from :meth:`to_json`'s data."""
        return cls(doc["fingerprint"], doc["backend"],
                   {int(k): float(v) for k, v in doc["seconds"].items()})


def measure_op_times(fn: Callable, *args: Any, repeats: int = 5, **kwargs: Any) -> OpTimes:
    """Times the operations of ``fn(*args, **kwargs)`` whose outputs materialize.

    Args:
      fn: the function to plan.
      *args, **kwargs: example arguments (arrays or ``jax.ShapeDtypeStruct``; only shapes
        and dtypes are used: operations run on synthetic inputs).
      repeats: timed runs per distinct operation (after one warm-up run); the median is kept.

    Returns:
      :class:`OpTimes` for ``autoremat.plan(..., op_times=...)``.

    Example:
      >>> import jax, jax.numpy as jnp, autoremat
      >>> loss = lambda w, x: jnp.sum(jnp.tanh(jnp.tanh(x @ w) @ w) ** 2)
      >>> w, x = jnp.ones((64, 64)) / 64, jnp.ones((32, 64))
      >>> times = autoremat.measure_op_times(loss, w, x, repeats=1)
      >>> plan = autoremat.plan(loss, w, x, budget="floor", op_times=times)
    """
    flat_fn, _, avals, _ = _rewrite.flat_function(fn, args, kwargs)
    program = _trace.trace_program(flat_fn, avals)
    timed: dict[str, float] = {}
    seconds: dict[int, float] = {}
    for eqn in _timed_eqns(program):
        in_avals = [program.avals[a] if isinstance(a, int) else a.aval for a in eqn.ins]
        if any(jax.dtypes.issubdtype(a.dtype, jax.dtypes.extended)  # pyright: ignore[reportPrivateImportUsage]
               for a in in_avals):
            continue  # random keys: no synthetic input; the value keeps its FLOP cost
        key = f"{eqn.primitive.name} {sorted(eqn.params.items())!r} {in_avals!r}"
        if key not in timed:
            timed[key] = _time_eqn(eqn, in_avals, repeats)
        for out in eqn.outs:
            seconds[out] = timed[key] / len(eqn.outs)
    return OpTimes(_program.fingerprint_of(program), jax.default_backend(), seconds)


def recompute_costs(graph: Graph, times: OpTimes) -> np.ndarray:
    """Each value's recompute cost in FLOP-equivalents: measured seconds times the
    program's measured rate where timed, FLOPs elsewhere (see the module doc).

    Raises:
      ValueError: ``times`` were measured on another program.
    """
    if times.fingerprint != graph.fingerprint:
        raise ValueError(
            f"these op_times were measured for another program (structure "
            f"{times.fingerprint}, this one {graph.fingerprint}): measure them with "
            "autoremat.measure_op_times for this function and these argument shapes.")
    flops = graph.recompute_flops().astype(float)
    iterations = graph.iterations()
    measured = np.array([times.seconds.get(v.id, np.nan) for v in graph.values]) * iterations
    timed = ~np.isnan(measured)
    rate = flops[timed].sum() / max(measured[timed].sum(), 1e-12)
    return np.where(timed, np.nan_to_num(measured) * rate, flops)


def _timed_eqns(program: Program) -> list[Eqn]:
    """The equations whose recomputation is timed: materializing ones, also inside
    top-level scan bodies (the scans themselves are never recomputed whole)."""
    eqns: list[Eqn] = []
    for eqn in program.eqns:
        body = eqn.scan_body.eqns if eqn.scan_body is not None else (eqn,)
        eqns.extend(e for e in body if e.scan_body is None and not fusible(e.primitive.name))
    return eqns


def _time_eqn(eqn: Eqn, in_avals: Sequence[Any], repeats: int) -> float:
    """Median seconds of ``eqn`` compiled alone on synthetic inputs of ``in_avals``."""
    positions = [k for k, a in enumerate(eqn.ins) if isinstance(a, int)]
    constants = {k: a.value for k, a in enumerate(eqn.ins) if not isinstance(a, int)}

    def run(*arrays: Any) -> list[Any]:
        vals = {**constants, **dict(zip(positions, arrays, strict=True))}
        return _program._bind(eqn, [vals[k] for k in range(len(eqn.ins))])

    inputs = [_synthetic(in_avals[k]) for k in positions]
    compiled = jax.jit(run).lower(*inputs).compile()
    jax.block_until_ready(compiled(*inputs))
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*inputs))
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def _synthetic(aval: Any) -> jax.Array:
    """An input of ``aval``'s shape and dtype: zeros for integers and booleans (valid
    indices), halves for floating point."""
    if jnp.issubdtype(aval.dtype, jnp.inexact):
        return jnp.full(aval.shape, 0.5, aval.dtype)
    return jnp.zeros(aval.shape, aval.dtype)
