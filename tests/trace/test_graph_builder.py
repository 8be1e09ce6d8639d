"""The value graph of a placement (``_trace._graph_builder``)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from autoremat import _rewrite, _solve, _trace
from autoremat._placement import Placement


def _square_then_project(w, x):
    h = jnp.sin(x @ w)
    return jnp.sum(((h * h) @ w) * h)


def test_a_segment_counts_an_input_another_region_saves_once():
    w, x = jnp.ones((32, 32)) / 32, jnp.ones((16, 32))
    flat_fn, _, avals, _ = _rewrite.flat_function(_square_then_project, (w, x), {})
    program = _trace.trace_program(flat_fn, avals)
    cut = next(k for k, e in enumerate(program.eqns) if e.primitive.name == "mul")
    _, graph = _trace.graph_of(program, Placement((cut,)))
    (h,) = [v for v in graph.values if v.primitive == "sin"]
    assert h.region == 0 and h.needed_across  # the square's backward reads it: saved
    # The second region's forward makes the projection (the products fuse into their
    # readers); h, live beside it, counts where it is held.
    assert graph.regions[1].work_bytes == 16 * 32 * 4
    # The plain bound (the gradients' buffers as the backward writes them).
    problem = dataclasses.replace(_solve.problem_of(graph), unshared=None)
    save = graph.array("needed_across", bool)  # h alone; the rest recomputed
    recompute = graph.array("needed", bool) & ~save
    forward = _solve.ilp.stage_bytes(problem, save, recompute)[len(graph.regions) + 1]
    assert forward == graph.arg_bytes + h.nbytes + 16 * 32 * 4
