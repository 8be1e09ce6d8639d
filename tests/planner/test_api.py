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
from tests.models import MODELS


def _loss(w, x, activations):
    for name in activations:
        x = (jnp.tanh if name == "tanh" else jnp.sin)(x @ w)
    return jnp.sum(x ** 2)


def _gelu_layers(width: int, rows: int):
    """Eight GELU layers of ``width`` on ``rows`` rows: the loss and its arguments."""
    def loss(ws, x):
        for w in ws:
            x = jax.nn.gelu(x @ w)
        return jnp.sum(x ** 2)

    return loss, ([jnp.ones((width, width)) / width for _ in range(8)], jnp.ones((rows, width)))


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
    loss, (ws, x) = _gelu_layers(64, 256)
    options = autoremat.PlanOptions(verify=None, nested_segments=True)
    flat_fn, _, avals, _ = _api._rewrite.flat_function(loss, (ws, x), {})
    found = _candidates.candidates(flat_fn, avals, options)
    contenders = _api._floor_contenders(found, options)
    nested = [p for p in contenders if p.placement.nests]
    # Solved floors (one remat per layer, also among them, passes no barriers).
    plain = [p for p in contenders if not p.placement.nests and p.placement.barriers]
    assert nested and plain
    assert min(p.peak_bytes for p in nested) < min(p.peak_bytes for p in plain)


def test_a_nested_fallback_that_fits_with_room_is_refined_among_the_nested_placements(
        monkeypatch):
    # A compiler that puts nested plans at half the model's peak and the others at twice:
    # below the model's floor of the placements without nesting, the nested floor fits
    # with room left, and the refining round solves the nested placements by its error.
    loss, (ws, x) = _gelu_layers(256, 8192)
    compiled = []

    def compiled_peak(p):
        compiled.append(p)
        return p.peak_bytes // 2 if p.placement.nests else 2 * p.peak_bytes

    loop = _api.ClosedLoop
    monkeypatch.setattr(_api, "ClosedLoop",
                        lambda solve, _, *a, **k: loop(solve, compiled_peak, *a, **k))
    with pytest.raises(autoremat.InfeasibleBudgetError) as info:
        autoremat.plan(loss, ws, x, budget=1, verify=None, layout="dense")
    budget = info.value.floor_bytes - 1  # below the model's floor without nesting
    plan = autoremat.plan(loss, ws, x, budget=budget, verify="tpu-v5e", layout="dense")
    fallback = next(p for p in compiled if p.placement.nests)
    assert fallback.peak_bytes // 2 < 0.9 * budget  # it fit, with room left
    assert plan.placement.nests and plan is not fallback
    assert plan.recompute_flops < fallback.recompute_flops
    assert plan.verified_peak_bytes == plan.peak_bytes // 2 <= budget
    assert compiled.index(fallback) < len(compiled) - 1


def test_a_budget_one_byte_below_the_floor_is_infeasible_and_says_the_floor():
    # The solver's plans there sit at the floor, within its feasibility tolerance of the
    # budget: each is solved lower until none is found.
    loss, (ws, x) = _gelu_layers(256, 8192)
    with pytest.raises(autoremat.InfeasibleBudgetError) as info:
        autoremat.plan(loss, ws, x, budget=1, verify=None, layout="dense")
    floor = info.value.floor_bytes
    with pytest.raises(autoremat.InfeasibleBudgetError) as info:
        autoremat.plan(loss, ws, x, budget=floor - 1, verify=None, layout="dense")
    assert info.value.floor_bytes == floor
    plan = autoremat.plan(loss, ws, x, budget=floor, verify=None, layout="dense")
    assert plan.peak_bytes <= floor


@pytest.mark.parametrize("name", ["mlp", "gpt2_scanned", "cnn", "control_flow"])
def test_at_its_floor_a_model_plans_and_a_byte_below_says_the_floor(name):
    loss, args = MODELS[name]()
    with pytest.raises(autoremat.InfeasibleBudgetError) as info:
        autoremat.plan(loss, *args, budget=1, verify=None)
    floor = info.value.floor_bytes
    assert autoremat.plan(loss, *args, budget=floor, verify=None).peak_bytes <= floor
    with pytest.raises(autoremat.InfeasibleBudgetError) as info:
        autoremat.plan(loss, *args, budget=floor - 1, verify=None)
    assert info.value.floor_bytes == floor
