"""Tracing: effects, unknown primitives, structure."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback

import autoremat
from autoremat import _rewrite, _trace


def _graph(fn, *args):
    flat_fn, _, avals, _ = _rewrite.flat_function(fn, args, {})
    return _trace.trace(flat_fn, avals)[2]


def test_debug_print_warns_that_it_runs_again_and_gradients_hold():
    def loss(w):
        h = jnp.tanh(w * 2.0)
        jax.debug.print("h {}", h.sum())
        return jnp.sum(jnp.sin(h))

    w = jnp.linspace(0.0, 1.0, 8)
    with pytest.warns(UserWarning, match="runs again"):
        plan = autoremat.plan(loss, w, budget=1.0)
    np.testing.assert_allclose(jax.grad(plan.apply(loss))(w), jax.grad(loss)(w), rtol=1e-6)


def test_io_callback_is_a_clear_error():
    def loss(w):
        y = io_callback(lambda a: a, jax.ShapeDtypeStruct(w.shape, w.dtype), w)
        return jnp.sum(y * w)

    with pytest.raises(autoremat.UnsupportedProgramError, match="io_callback at .*test_trace.py"):
        autoremat.plan(loss, jnp.ones(4), budget=1.0)


def test_scan_values_are_counted_per_iteration_and_invariants_once():
    def loss(w, xs):
        def body(c, x):
            mask = jnp.tril(jnp.ones((4, 4)))          # loop-invariant
            return jnp.tanh(c @ (w * mask) + x), None
        c, _ = jax.lax.scan(body, jnp.zeros(4), xs)
        return jnp.sum(c)

    g = _graph(loss, jnp.ones((4, 4)), jnp.ones((5, 4)))
    scan_region = next(r for r in g.regions if r.kind == "scan")
    assert scan_region.length == 5
    body = [v for v in g.values if v.region == scan_region.index and v.primitive == "tanh"]
    assert [v.multiplicity for v in body] == [5]
    invariant = [v for v in g.values if v.region == scan_region.index and v.shape == (4, 4)
                 and v.primitive == "mul"]
    assert invariant and all(v.multiplicity == 1 for v in invariant)


def test_flops_of_a_matmul_and_the_step():
    g = _graph(lambda w, x: jnp.sum(x @ w), jnp.ones((8, 16)), jnp.ones((4, 8)))
    dot = next(v for v in g.values if v.primitive == "dot_general")
    assert dot.flops == 2 * 4 * 16 * 8
    # forward dot, plus two dots in the backward pass (one per operand)
    assert g.step_flops >= 3 * dot.flops


def test_unknown_primitive_gets_a_warning_and_a_conservative_cost():
    from autoremat._cost import eqn_flops

    aval = jax.core.ShapedArray((10,), jnp.float32)
    with pytest.warns(UserWarning, match="no cost model for primitive 'mystery_op'"):
        assert eqn_flops("mystery_op", {}, [aval], [aval]) == 200


def test_cotangents_of_elementwise_chains_fuse_and_those_of_dots_materialize():
    x = jnp.ones((64, 256))

    def elementwise(x):  # three equations: one region
        return jnp.sum(jnp.exp(jnp.sin(x)))

    def matmuls(w, x):
        return jnp.sum((x @ w) @ w)

    g = _graph(elementwise, x)
    assert max(r.cotangent_bytes for r in g.regions) == 4  # the scalar output's alone
    g = _graph(matmuls, jnp.ones((256, 256)), x)
    # The cotangents of x @ w (read by a dot) and of x (read by a dot) exist.
    assert max(r.cotangent_bytes for r in g.regions) >= x.nbytes


def test_argument_gradients_appear_at_the_last_region_reading_them():
    def loss(ws, x):
        for w in ws:
            x = jnp.tanh(x @ w)
        return jnp.sum(x)

    ws = [jnp.ones((128, 128)) / 128 for _ in range(8)]
    g = _graph(loss, ws, jnp.ones((64, 128)))
    grads = [r.grad_bytes for r in g.regions]
    assert len(grads) > 2
    assert grads == sorted(grads, reverse=True)
    assert grads[0] == g.grad_bytes and grads[-1] < g.grad_bytes


@pytest.mark.parametrize("make_key", [jax.random.key, jax.random.PRNGKey])
def test_random_keys_inside_the_step_are_planned(make_key):
    def loss(w, x, key):
        h = jnp.tanh(x @ w)
        h = jnp.where(jax.random.bernoulli(key, 0.9, h.shape), h / 0.9, 0)
        return jnp.sum(jnp.tanh(h @ w) ** 2)

    w, x, key = jnp.ones((64, 64)) / 64, jnp.ones((128, 64)), make_key(0)
    plan = autoremat.plan(loss, w, x, key, budget=1.0)
    np.testing.assert_allclose(jax.grad(plan.apply(loss))(w, x, key), jax.grad(loss)(w, x, key),
                               rtol=1e-6)


def test_a_scan_counts_the_gradient_accumulators_of_a_constant_read_later():
    """Each loop sums the gradient of a weight it closes over in a buffer of its own, and
    the sums are added after the last: in a loop's backward, the accumulator of every
    later loop reading the weight is live beside its own."""

    def loop(w, x):
        return jax.lax.scan(lambda c, _: (jnp.tanh(c @ w), None), x, None, length=3)[0]

    w, x = jnp.ones((64, 64)), jnp.ones((8, 64))
    graph = _graph(lambda w, x: jnp.sum(loop(w, loop(w, loop(w, x)))), w, x)
    first, second, third = (r.cotangent_bytes for r in graph.regions if r.kind == "scan")
    assert (first - third, second - third) == (2 * w.nbytes, w.nbytes)
