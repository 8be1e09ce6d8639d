"""A scan JAX unrolls whole (``unroll`` at least its length, penzai's ``LayerStack``) is
planned as the straight-line code the compiler gets (``_program.unrolled_whole``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import autoremat
from autoremat import _program, _rewrite, _trace
from tests.models import saved_residuals


def _stack(unroll: int | bool, reverse: bool = False):
    """Six tanh layers in a scan that also stacks each layer's mean."""

    def loss(ws, x):
        def layer(h, w):
            h = jnp.tanh(h @ w)
            return h, h.mean(0)

        h, means = jax.lax.scan(layer, x, ws, unroll=unroll, reverse=reverse)
        return jnp.sum(h ** 2) + jnp.sum(means * jnp.arange(6.0)[:, None])

    keys = jax.random.split(jax.random.key(0), 2)
    return loss, (jax.random.normal(keys[0], (6, 32, 32)) / 6,
                  jax.random.normal(keys[1], (16, 32)))


def _program_of(loss, args):
    flat_fn, _, avals, _ = _rewrite.flat_function(loss, args, {})
    return _trace.trace_program(flat_fn, avals)


@pytest.mark.parametrize("reverse", [False, True])
def test_a_scan_unrolled_whole_is_straight_line_code_computing_the_same(reverse):
    loss, args = _stack(unroll=True, reverse=reverse)
    program = _program_of(loss, args)
    assert not any(e.primitive.name == "scan" for e in program.eqns)
    regions = _program.split_regions(program)
    out = _program.run_program(program, regions, frozenset(), None, jax.tree.leaves(args))
    np.testing.assert_allclose(out[0], loss(*args), rtol=1e-6)
    # Its iterations are the layers, each a remat region of one remat per layer.
    assert len(_trace.layer_cuts(program)) == 6


def test_a_scan_unrolled_in_part_stays_a_loop():
    program = _program_of(*_stack(unroll=2))
    assert [e.primitive.name for e in program.eqns].count("scan") == 1


def test_plans_of_a_scan_unrolled_whole_keep_the_gradients_and_save_what_they_say():
    loss, args = _stack(unroll=True)
    floor = autoremat.plan(loss, *args, budget="floor")
    plan = autoremat.plan(loss, *args, budget=(floor.peak_bytes + floor.no_remat_peak_bytes) // 2)
    for p in (floor, plan):
        kept = [r for r, src in saved_residuals(p.apply(loss), *args)
                if not src.startswith("from the argument")]
        assert sum(r.size * r.dtype.itemsize for r in kept) == p.saved_bytes
        for a, b in zip(jax.grad(p.apply(loss))(*args), jax.grad(loss)(*args), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
