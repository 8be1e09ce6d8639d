"""Value ids depend on the live program alone: a plan made on one trace of a function
applies to another trace whose dead equations and unread constants differ (a Keras
model's first trace computes hundreds of values, from constants, that later traces lack)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import autoremat
from autoremat import _program, _rewrite
from tests.models import saved_residuals

_SEED = np.arange(2, dtype=np.uint32)  # a constant only the first trace reads


def _first_trace_differs():
    """A 6-layer tanh MLP whose first trace also does dead work on a constant, as
    Keras's first call does."""
    traces = []

    def loss(ws, x):
        if not traces:
            for _ in range(50):
                jnp.asarray(_SEED) * 2  # dead: no output reads it
        traces.append(1)
        for w in ws:
            x = jnp.tanh(x @ w)
        return jnp.sum(x ** 2)

    keys = jax.random.split(jax.random.key(0), 2)
    return loss, (jax.random.normal(keys[0], (6, 32, 32)) / 6,
                  jax.random.normal(keys[1], (16, 32)))


def _program_of(loss, args):
    flat_fn, _, avals, _ = _rewrite.flat_function(loss, args, {})
    return _program.flatten(jax.make_jaxpr(flat_fn)(*avals))


def test_dead_equations_and_unread_constants_leave_the_ids_alone():
    loss, args = _first_trace_differs()
    first, later = _program_of(loss, args), _program_of(loss, args)
    assert not first.consts and not later.consts  # the constant is read by dead code only
    assert [e.outs for e in first.eqns] == [e.outs for e in later.eqns]
    assert sorted(first.avals) == list(range(len(first.avals)))  # no gaps


def test_a_plan_made_on_the_first_trace_saves_what_it_says_on_later_ones():
    loss, args = _first_trace_differs()
    plan = autoremat.plan(loss, *args, budget=0.5, verify=None)  # the function's first trace
    assert plan.recomputed and plan.saved
    kept = sum(int(np.prod(a.shape)) * a.dtype.itemsize
               for a, src in saved_residuals(plan.apply(loss), *args)
               if not src.startswith("from the argument"))
    assert kept == plan.saved_bytes
    np.testing.assert_allclose(jax.grad(plan.apply(loss))(*args), jax.grad(loss)(*args),
                               rtol=1e-5)
