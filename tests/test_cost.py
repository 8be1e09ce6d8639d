"""FLOP costs of primitives (``autoremat._cost``)."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp

from autoremat import _cost


def test_prng_stack_and_unstack_have_costs_and_do_not_warn():
    def fn(key, x):
        keys = jax.random.split(jax.random.fold_in(key, 3), 4)
        noise = jax.vmap(lambda k: jax.random.normal(k, x.shape[1:]))(keys)
        return jnp.sum(jnp.stack([jnp.sum(r) for r in jax.lax.unstack(x + noise)]))

    jaxpr = jax.make_jaxpr(fn)(jax.random.key(0), jnp.ones((4, 8)))
    names = {e.primitive.name for e in jaxpr.jaxpr.eqns}
    assert {"random_split", "random_fold_in", "stack", "unstack"} <= names
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        flops = _cost.live_flops(jaxpr.jaxpr)
    assert 0 < flops < 10 * 4 * 8 * 10  # the additions and sums, not the 10-per-element guess
