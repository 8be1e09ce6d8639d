"""The entry points (``autoremat._planner._api``)."""

from __future__ import annotations

import dataclasses
import math
import warnings

import autoremat_ilp as ilp
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import autoremat
from autoremat._planner import _api, _candidates


def _loss(w, x, activations):
    for name in activations:
        x = (jnp.tanh if name == "tanh" else jnp.sin)(x @ w)
    return jnp.sum(x ** 2)


def test_optimize_plans_once_per_unhashable_static_value(monkeypatch):
    made = []
    real = _api.plan_with
    monkeypatch.setattr(_api, "plan_with", lambda *a: made.append(1) or real(*a))
    optimized = autoremat.optimize(_loss, budget=1.0, static_argnums=2)
    w, x = jnp.ones((16, 16)) / 16, jnp.ones((8, 16))
    for activations in (["tanh", "sin"], ["tanh", "sin"], ["sin", "sin", "tanh"]):
        got = jax.grad(optimized)(w, x, activations)
        np.testing.assert_allclose(got, jax.grad(_loss)(w, x, activations), rtol=1e-5)
    assert len(made) == 2  # lists are unhashable: found again by equality


def test_nnx_module_with_a_list_attribute():
    nnx = pytest.importorskip("flax.nnx")
    from autoremat.integrations import flax_nnx

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.lin = nnx.Linear(16, 16, rngs=rngs)
            self.activations = ["silu", "linear"]  # as MaxText's MLP blocks have

        def __call__(self, x):
            return nnx.silu(self.lin(x))

    model, x = Block(nnx.Rngs(0)), jnp.ones((8, 16))
    loss = lambda m, x: jnp.sum(m(x) ** 2)
    optimized = flax_nnx.optimize(loss, budget=1.0)
    assert float(optimized(model, x)) == pytest.approx(float(loss(model, x)), rel=1e-6)
    assert float(optimized(model, x)) == pytest.approx(float(loss(model, x)), rel=1e-6)


def test_a_solve_the_time_limit_stopped_warns_that_the_plan_may_differ_between_runs():
    stopped = ilp.Solution(ilp.Status.FEASIBLE, None, None, math.inf, 0, 0.0, 1.0, 1.0,
                           timed_out=True)
    with pytest.warns(UserWarning, match="may differ between runs"):
        assert _candidates.checked(stopped) is stopped
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the node limit, or a proof: the same on any machine
        _candidates.checked(dataclasses.replace(stopped, timed_out=False))


@pytest.mark.parametrize("error", [autoremat.InfeasibleBudgetError(2**20, 2**21),
                                   autoremat.SolverTimeoutError("no plan in 30 s")])
def test_the_verified_floor_stands_where_no_plan_under_it_is_found(error):
    w, x = jnp.ones((16, 16)) / 16, jnp.ones((8, 16))
    loss = lambda w, x: _loss(w, x, ["tanh"])
    floor = dataclasses.replace(autoremat.plan(loss, w, x, budget="floor"),
                                verified_peak_bytes=2**20, verify_compiles=3)

    def solve(budget, margins):
        raise error

    chosen = _api._under_the_verified_floor(floor, [floor], solve, lambda p: 0)
    assert chosen is floor


def test_floor_contenders_weigh_the_nested_placements_apart():
    # Eight layers: the nested placements' model floor is far below the others', and
    # each kind keeps its own floor plans among the plans a verified floor compiles.
    ws = [jnp.ones((64, 64)) / 64 for _ in range(8)]
    x = jnp.ones((256, 64))

    def loss(ws, x):
        for w in ws:
            x = jax.nn.gelu(x @ w)
        return jnp.sum(x ** 2)

    options = autoremat.PlanOptions(verify=None, nested_segments=True)
    flat_fn, _, avals, _ = _api._rewrite.flat_function(loss, (ws, x), {})
    found = _candidates.candidates(flat_fn, avals, options)
    contenders = _api._floor_contenders(found, options)
    nested = [p for p in contenders if p.placement.nests]
    # Solved floors (one remat per layer, also among them, passes no barriers).
    plain = [p for p in contenders if not p.placement.nests and p.placement.barriers]
    assert nested and plain
    assert min(p.peak_bytes for p in nested) < min(p.peak_bytes for p in plain)
