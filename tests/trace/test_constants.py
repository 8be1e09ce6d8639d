"""Constants the traced function closes over: a plan's ``saved_bytes`` are the bytes of the
residuals JAX keeps for it (arguments aside), constants counted as JAX keeps them."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import autoremat
from tests.models import saved_residuals

_EPS = jnp.float32(1e-6)  # a closed-over array, as penzai's RMSNorm epsilon
_ANGLES = np.linspace(0.0, 3.0, 32, dtype=np.float32)  # a numpy table, as RoPE's


def _normed_layers(ws, x):
    """Layers that read a closed-over scalar: each region that reads it keeps it."""
    for w in ws:
        h = x @ w
        x = jnp.tanh(h) * jax.lax.rsqrt(jnp.mean(h * h, -1, keepdims=True) + _EPS)
    return jnp.sum(x ** 2)


def _scanned_norm(ws, x):
    """A loop whose body reads a closed-over scalar: recomputing the body keeps it."""
    def body(x, w):
        h = x @ w
        return jnp.tanh(h) * jax.lax.rsqrt(jnp.mean(h * h, -1, keepdims=True) + _EPS), None
    return jnp.sum(jax.lax.scan(body, x, ws)[0] ** 2)


def _table_per_layer(ws, x):
    """Each layer makes a table from a numpy constant alone: the table has no cotangent,
    so JAX keeps nothing a cotangent of it would need."""
    for w in ws:
        x = jnp.tanh(x @ w) * (jnp.cos(jnp.asarray(_ANGLES)) + 1)
    return jnp.sum(x ** 2)


def _scanned_tables(ws, x):
    """A loop scanning over a numpy constant: its slices have no cotangent."""
    tables = np.stack([_ANGLES * (i + 1) for i in range(ws.shape[0])])

    def body(x, wt):
        w, t = wt
        return jnp.tanh(x @ w) * jnp.cos(t), None
    return jnp.sum(jax.lax.scan(body, x, (ws, tables))[0] ** 2)


def _args():
    keys = jax.random.split(jax.random.key(0), 2)
    return (jax.random.normal(keys[0], (4, _ANGLES.size, _ANGLES.size)) / 6,
            jax.random.normal(keys[1], (16, _ANGLES.size)))


def _kept(fn, args) -> list[tuple[int, str]]:
    """JAX's residuals of ``fn`` at ``args`` (arguments aside): (bytes, source) each."""
    return [(int(np.prod(a.shape)) * a.dtype.itemsize, src)
            for a, src in saved_residuals(fn, *args) if not src.startswith("from the argument")]


def _plan(fn, args, budget: str) -> autoremat.Plan:
    floor = autoremat.plan(fn, *args, budget="floor")
    if budget == "floor":
        return floor
    return autoremat.plan(fn, *args, budget=(floor.peak_bytes + floor.no_remat_peak_bytes) // 2)


def _assert_exact(fn, plan: autoremat.Plan, args) -> None:
    optimized = plan.apply(fn)
    assert plan.saved_bytes == sum(n for n, _ in _kept(optimized, args))
    for a, b in zip(jax.grad(optimized)(*args), jax.grad(fn)(*args), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("budget", ["floor", "middle"])
@pytest.mark.parametrize("fn", [_normed_layers, _scanned_norm], ids=["layers", "scan"])
def test_a_constant_jax_keeps_is_counted(fn, budget):
    """JAX keeps a closed-over array as a residual where a region's backward reads it (a
    segment's input barrier replayed, a value recomputed from it): the plan counts it."""
    args = _args()
    plan = _plan(fn, args, budget)
    if budget == "floor":  # recomputing reads the constant
        assert any(src == "from a constant" for _, src in _kept(plan.apply(fn), args))
    _assert_exact(fn, plan, args)


@pytest.mark.parametrize("budget", ["floor", "middle"])
@pytest.mark.parametrize("fn", [_table_per_layer, _scanned_tables], ids=["layers", "scan"])
def test_values_of_constants_alone_carry_no_cotangent(fn, budget):
    """A region's input made from constants alone is not differentiated when JAX is asked
    what the region's backward reads: the plan saves only what JAX keeps."""
    args = _args()
    _assert_exact(fn, _plan(fn, args, budget), args)
