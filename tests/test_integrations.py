"""The framework integrations on tiny models: same gradients, non-trivial plans."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import autoremat

nnx = pytest.importorskip("flax.nnx")
linen = pytest.importorskip("flax.linen")
eqx = pytest.importorskip("equinox")
optax = pytest.importorskip("optax")

from autoremat.integrations import equinox as ar_eqx
from autoremat.integrations import flax_nnx
from autoremat.integrations import optax as ar_optax

D, LAYERS, BATCH = 16, 3, 32


def _close(expected, actual):
    for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(actual), strict=True):
        scale = float(np.max(np.abs(a), initial=0.0))
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5 * scale)
    assert jax.tree.structure(expected) == jax.tree.structure(actual)


def _mid_budget(make_plan) -> int:
    """Halfway between the smallest feasible budget and the no-remat peak."""
    with pytest.raises(autoremat.InfeasibleBudgetError) as info:
        make_plan(1)
    return (info.value.floor_bytes + make_plan(1.0).budget_bytes) // 2


def _nontrivial(plan: autoremat.Plan) -> None:
    assert plan.peak_bytes <= plan.budget_bytes < plan.no_remat_peak_bytes
    assert plan.saved and plan.recomputed and plan.recompute_flops > 0


def _data(seed: int = 0) -> tuple[jax.Array, jax.Array]:
    kx, ky = jax.random.split(jax.random.key(seed))
    return jax.random.normal(kx, (BATCH, D)), jax.random.normal(ky, (BATCH, 1))


# Flax NNX: layers made with nnx.vmap and run under nnx.scan, each under nnx.remat.

class NnxBlock(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.up = nnx.Linear(D, 4 * D, rngs=rngs)
        self.down = nnx.Linear(4 * D, D, rngs=rngs)

    def __call__(self, x):
        return x + self.down(jnp.tanh(self.up(x)))


class NnxModel(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, norm: bool = False):
        @nnx.split_rngs(splits=LAYERS)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def make(rngs):
            return NnxBlock(rngs)

        self.blocks = make(rngs)
        self.norm = nnx.BatchNorm(D, rngs=rngs) if norm else None
        self.head = nnx.Linear(D, 1, rngs=rngs)

    def __call__(self, x):
        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
        @nnx.remat
        def body(x, block):
            return block(x)

        x = body(x, self.blocks)
        if self.norm is not None:
            x = self.norm(x)
        return self.head(x)


def nnx_loss(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


def test_nnx_scanned_layers():
    model, (x, y) = NnxModel(nnx.Rngs(0)), _data()
    budget = _mid_budget(lambda b: flax_nnx.plan(nnx_loss, model, x, y, budget=b))
    plan = flax_nnx.plan(nnx_loss, model, x, y, budget=budget)
    _nontrivial(plan)
    assert [r.kind for r in plan.graph.regions].count("scan") == 1
    assert plan.graph.regions[[r.kind for r in plan.graph.regions].index("scan")].length == LAYERS

    expected = nnx.value_and_grad(nnx_loss)(model, x, y)
    _close(expected, nnx.value_and_grad(flax_nnx.apply(plan, nnx_loss))(model, x, y))
    fast = flax_nnx.optimize(nnx_loss, budget=budget)
    _close(expected, nnx.jit(nnx.value_and_grad(fast))(model, x, y))


def test_nnx_state_updates_are_written_back():
    x, y = _data()
    plain, planned = NnxModel(nnx.Rngs(0), norm=True), NnxModel(nnx.Rngs(0), norm=True)
    fast = flax_nnx.optimize(nnx_loss, budget=0.9)
    for _ in range(2):
        expected = nnx.value_and_grad(nnx_loss)(plain, x, y)
        _close(expected, nnx.value_and_grad(fast)(planned, x, y))
    mean = planned.norm.mean[...]
    assert float(jnp.abs(mean).max()) > 0
    _close(nnx.state(plain, nnx.BatchStat), nnx.state(planned, nnx.BatchStat))


# Flax Linen: model.apply is the pure function; nn.scan over nn.remat blocks.

class LinenBlock(linen.Module):
    @linen.compact
    def __call__(self, x, _):
        return x + linen.Dense(D)(jnp.tanh(linen.Dense(4 * D)(x))), None


class LinenModel(linen.Module):
    @linen.compact
    def __call__(self, x, train: bool = True):
        layers = linen.scan(linen.remat(LinenBlock), variable_axes={"params": 0},
                            split_rngs={"params": True}, length=LAYERS)
        x, _ = layers()(x, None)
        x = linen.BatchNorm(use_running_average=not train)(x)
        return linen.Dense(1)(x)


def test_linen_apply():
    model, (x, y) = LinenModel(), _data()
    variables = model.init(jax.random.key(1), x)

    def loss_fn(params, batch_stats, x, y):
        out, updates = model.apply({"params": params, "batch_stats": batch_stats}, x,
                                   mutable=["batch_stats"])
        return jnp.mean((out - y) ** 2), updates

    args = (variables["params"], variables["batch_stats"], x, y)
    budget = _mid_budget(lambda b: autoremat.plan(loss_fn, *args, budget=b))
    plan = autoremat.plan(loss_fn, *args, budget=budget)
    _nontrivial(plan)
    assert "scan" in [r.kind for r in plan.graph.regions]
    grad = lambda f: lambda *a: jax.value_and_grad(f, has_aux=True)(*a)
    expected = grad(loss_fn)(*args)
    _close(expected, grad(plan.apply(loss_fn))(*args))
    _close(expected, jax.jit(grad(autoremat.optimize(loss_fn, budget=budget)))(*args))


# Equinox: a list of layers (unhashable in the module) and a function field.

class EqxModel(eqx.Module):
    layers: list
    head: eqx.nn.Linear
    activation: object

    def __init__(self, key):
        self.activation = jnp.sin
        keys = jax.random.split(key, 2 * LAYERS + 1)
        self.layers = [(eqx.nn.Linear(D, 4 * D, key=keys[2 * i]),
                        eqx.nn.Linear(4 * D, D, key=keys[2 * i + 1])) for i in range(LAYERS)]
        self.head = eqx.nn.Linear(D, 1, key=keys[-1])

    def __call__(self, x):
        for up, down in self.layers:
            x = x + jax.vmap(down)(self.activation(jax.vmap(up)(x)))
        return jax.vmap(self.head)(x)


def eqx_loss(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


def test_equinox_filter_value_and_grad():
    model, (x, y) = EqxModel(jax.random.key(2)), _data()
    budget = _mid_budget(lambda b: ar_eqx.plan(eqx_loss, model, x, y, budget=b))
    plan = ar_eqx.plan(eqx_loss, model, x, y, budget=budget)
    _nontrivial(plan)
    expected = eqx.filter_value_and_grad(eqx_loss)(model, x, y)
    _close(expected, eqx.filter_value_and_grad(ar_eqx.apply(plan, eqx_loss))(model, x, y))
    fast = ar_eqx.optimize(eqx_loss, budget=budget)
    _close(expected, eqx.filter_jit(eqx.filter_value_and_grad(fast))(model, x, y))


# Optax: the optimizer state counts against the budget.

def _mlp_params(key):
    keys = jax.random.split(key, LAYERS)
    return [{"w": jax.random.normal(k, (D, D)) / 4, "b": jnp.zeros(D)} for k in keys]


def mlp_loss(params, x, y):
    for layer in params:
        x = jnp.sin(x @ layer["w"] + layer["b"])
    return jnp.mean((x.sum(-1, keepdims=True) - y) ** 2)


def test_optax_step_counts_the_optimizer_state():
    params, (x, y) = _mlp_params(jax.random.key(3)), _data()
    adam = optax.adam(1e-2)
    opt_state = adam.init(params)
    state_bytes = ar_optax.tree_bytes(opt_state)
    assert state_bytes >= 2 * ar_optax.tree_bytes(params)  # Adam's two moments

    loss_budget = _mid_budget(lambda b: autoremat.plan(mlp_loss, params, x, y, budget=b))
    step = ar_optax.TrainStep(mlp_loss, adam, budget=loss_budget + state_bytes)
    plan = step.plan(params, opt_state, x, y)
    assert plan.budget_bytes == loss_budget  # what is left of the budget after the state
    _nontrivial(plan)
    # Without the state the same budget needs no remat at all.
    alone = autoremat.plan(mlp_loss, params, x, y, budget=loss_budget + state_bytes)
    assert alone.recompute_flops == 0 < plan.recompute_flops

    def plain_step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(mlp_loss)(params, x, y)
        updates, opt_state = adam.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    expected, actual = (params, opt_state), (params, opt_state)
    jitted = jax.jit(step)
    for _ in range(3):
        expected = jax.jit(plain_step)(*expected[:2], x, y)
        actual = jitted(*actual[:2], x, y)
        _close(expected, actual)


def test_optax_infeasible_floor_includes_the_optimizer_state():
    params, (x, y) = _mlp_params(jax.random.key(3)), _data()
    with pytest.raises(autoremat.InfeasibleBudgetError) as info:
        autoremat.plan(mlp_loss, params, x, y, budget=1)
    loss_floor = info.value.floor_bytes
    adam = optax.adam(1e-2)
    opt_state = adam.init(params)
    step = ar_optax.TrainStep(mlp_loss, adam, budget=loss_floor)  # fits the loss alone
    with pytest.raises(autoremat.InfeasibleBudgetError) as info:
        step(params, opt_state, x, y)
    assert info.value.floor_bytes == loss_floor + ar_optax.tree_bytes(opt_state)
    assert step.loss_budget(opt_state) == max(1, loss_floor - ar_optax.tree_bytes(opt_state))
    assert ar_optax.TrainStep(mlp_loss, adam, budget=0.5).loss_budget(opt_state) == 0.5


def test_optax_floor_budget_plans_the_loss_at_its_floor():
    params, (x, y) = _mlp_params(jax.random.key(3)), _data()
    adam = optax.adam(1e-2)
    opt_state = adam.init(params)
    step = ar_optax.TrainStep(mlp_loss, adam, budget="floor")
    assert step.loss_budget(opt_state) == "floor"
    assert (step.plan(params, opt_state, x, y).peak_bytes
            == autoremat.plan(mlp_loss, params, x, y, budget="floor").peak_bytes)
