"""The model zoo: registry, presets, tiny variants under layer policies and autoremat, and
the full-size models traced from shapes only."""

from __future__ import annotations

import collections
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.ad_checkpoint import saved_residuals

import autoremat
from autoremat import zoo
from autoremat.zoo import _layers

TINY = [n for n in zoo.ZOO if n.endswith("-tiny")]
FULL = [n for n in zoo.ZOO if not n.endswith("-tiny")]

# Full-size parameter counts, and the no-remat activations in GiB (the residuals JAX
# saves for the backward pass, arguments excluded) that the module docstrings state.
FULL_SIZES = {
    "gpt2-small": (124_475_904, 11.0),
    "gpt2-small-scan": (124_475_904, 11.0),
    "llama": (200_827_904, 12.4),
    "llama-unrolled": (200_827_904, 12.4),
    "llama-24-unrolled": (336_118_784, 24.25),
    "mlp": (269_657_088, 3.8),
    "resnet": (25_557_032, 4.75),
    "unet": (8_837_832, 4.6),
}

# Compiling dominates these tests' time; LLVM's optimizations do not change the results.
_FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def _compiled(fns: list, params: dict, batch: dict) -> list:
    """``[fn(params, batch) for fn in fns]`` as one compiled function."""
    return jax.jit(lambda p, b: [fn(p, b) for fn in fns],
                   compiler_options=_FAST_COMPILE)(params, batch)


class _Tiny(NamedTuple):
    model: zoo.ZooModel
    params: dict
    batch: dict
    loss: jax.Array  # without checkpoints
    grads: dict


@functools.cache
def _tiny(name: str) -> _Tiny:
    model = zoo.get(name)
    params, batch = model.init(jax.random.key(0))
    [(loss, grads)] = _compiled([jax.value_and_grad(model.make_loss())], params, batch)
    return _Tiny(model, params, batch, loss, grads)


def _name_preset(model: zoo.ZooModel) -> str | None:
    """The first MaxText preset that saves some of the model's names, if any."""
    return next((p for p in zoo.presets_for(model) if zoo.MAXTEXT_PRESETS[p]), None)


def _assert_trees_close(expected, actual) -> None:
    # Checkpointed and planned regions compile differently and reassociate float32 sums:
    # allow a few ulps of each gradient's largest entry.
    for e, a in zip(jax.tree.leaves(expected), jax.tree.leaves(actual), strict=True):
        scale = float(np.max(np.abs(e), initial=0.0))
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5 * scale)


def _residuals(fn, args) -> list[tuple[jax.core.AbstractValue, str]]:
    return [(aval, source) for aval, source in saved_residuals(fn, *args)
            if not source.startswith("from the argument") and source != "from a constant"]


def _residual_bytes(fn, args) -> int:
    return sum(math.prod(aval.shape) * aval.dtype.itemsize for aval, _ in _residuals(fn, args))


def test_registry_lookup_and_names():
    assert all(model.name == name for name, model in zoo.ZOO.items())
    assert {n.removesuffix("-tiny") for n in TINY} <= set(FULL)
    with pytest.raises(KeyError, match="known: .*llama-tiny"):
        zoo.get("llama-tinyy")
    maxtext_names = set().union(*zoo.MAXTEXT_PRESETS.values())
    for model in zoo.ZOO.values():
        assert set(model.names) <= maxtext_names, model.name
        assert "\n" not in model.description and "params" in model.description


def test_presets_apply_where_the_names_are():
    resnet, mlp = zoo.get("resnet-tiny"), zoo.get("mlp-tiny")
    assert zoo.presets_for(resnet) == ("full",)
    assert zoo.presets_for(mlp) == ("minimal_with_context", "minimal", "save_dot_except_mlpwi",
                                    "full")
    assert zoo.presets_for(zoo.get("llama")) == tuple(zoo.MAXTEXT_PRESETS)
    assert zoo.preset_policy("full", resnet) is jax.checkpoint_policies.nothing_saveable
    with pytest.raises(ValueError, match="applicable: full"):
        zoo.preset_policy("save_qkv_proj", resnet)
    with pytest.raises(KeyError, match="known: minimal_with_context"):
        zoo.preset_policy("save_everything", mlp)


def test_grouped_query_attention_equals_attention_over_repeated_heads():
    q, k, v = (jax.random.normal(key, shape) for key, shape in zip(
        jax.random.split(jax.random.key(0), 3), [(2, 5, 8, 4), (2, 5, 2, 4), (2, 5, 2, 4)],
        strict=True))  # (batch, seq, heads, head_dim)
    attention = jax.jit(_layers.attention, static_argnums=3)
    for causal in (True, False):
        repeated = attention(q, jnp.repeat(k, 4, axis=2), jnp.repeat(v, 4, axis=2), causal)
        np.testing.assert_allclose(attention(q, k, v, causal), repeated, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("preset", sorted(zoo.MAXTEXT_PRESETS))
@pytest.mark.parametrize("name", ["gpt2-small-tiny", "llama-unrolled-tiny"])
def test_preset_keeps_its_names_in_every_layer(name, preset):
    model = zoo.get(name)
    args = (model.param_shapes(), model.batch_shapes())
    kept = collections.Counter(
        source.split("'")[1]
        for _, source in _residuals(model.make_loss(zoo.preset_policy(preset, model)), args)
        if source.startswith("named '"))
    # mlpwo only enters the residual sum, whose backward reads nothing: never kept.
    expected = {n: len(args[0]["layers"]) for n in zoo.MAXTEXT_PRESETS[preset]
                if n in model.names and n != "mlpwo"}
    assert kept == expected


@pytest.mark.parametrize("name", TINY)
def test_layer_policies_keep_loss_and_gradients(name):
    tiny = _tiny(name)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(tiny.params))
    assert np.isfinite(tiny.loss)
    assert all(np.isfinite(g).all() for g in jax.tree.leaves(tiny.grads))
    policies = [jax.checkpoint_policies.nothing_saveable,
                jax.checkpoint_policies.dots_with_no_batch_dims_saveable]
    if _name_preset(tiny.model):
        policies.append(zoo.preset_policy(_name_preset(tiny.model), tiny.model))
    for loss, grads in _compiled([jax.value_and_grad(tiny.model.make_loss(policy))
                                  for policy in policies], tiny.params, tiny.batch):
        np.testing.assert_allclose(loss, tiny.loss, rtol=1e-6)
        _assert_trees_close(tiny.grads, grads)


@pytest.mark.parametrize("name", TINY)
def test_plan_at_three_quarters_of_the_activations_keeps_gradients(name):
    tiny = _tiny(name)
    loss = tiny.model.make_loss()
    plan = autoremat.plan(loss, tiny.params, tiny.batch, budget=0.75)
    assert plan.peak_bytes <= plan.budget_bytes
    optimized = plan.apply(loss)
    [grads] = _compiled([jax.grad(optimized)], tiny.params, tiny.batch)
    _assert_trees_close(tiny.grads, grads)
    assert plan.saved_bytes == _residual_bytes(optimized, (tiny.params, tiny.batch))


@pytest.mark.parametrize("name, budget", [("llama-tiny", 0.5), ("resnet-tiny", 1.0)])
def test_plan_replaces_the_layer_checkpoints(name, budget):
    tiny = _tiny(name)
    preset = _name_preset(tiny.model) or "full"
    checkpointed = tiny.model.make_loss(zoo.preset_policy(preset, tiny.model))
    plan = autoremat.plan(checkpointed, tiny.params, tiny.batch, budget=budget)
    plain = autoremat.plan(tiny.model.make_loss(), tiny.params, tiny.batch, budget=budget)
    # The same decisions: the checkpoints are inlined and re-planned. (Not the same
    # step_flops, which counts the recomputation the checkpoints would have done.)
    assert (plan.saved, plan.recomputed, plan.peak_bytes) == (
        plain.saved, plain.recomputed, plain.peak_bytes)
    [grads] = _compiled([jax.grad(plan.apply(checkpointed))], tiny.params, tiny.batch)
    _assert_trees_close(tiny.grads, grads)


@pytest.mark.parametrize("name", FULL)
def test_full_size_shapes_parameters_and_activations(name):
    model = zoo.get(name)
    args = (model.param_shapes(), model.batch_shapes())
    out = jax.eval_shape(model.make_loss(), *args)
    assert (out.shape, out.dtype) == ((), jnp.float32)
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(args[0]))
    n_params, activation_gib = FULL_SIZES[name]
    assert sum(math.prod(x.shape) for x in jax.tree.leaves(args[0])) == n_params
    assert f"{n_params / 1e6:.1f}M params" in model.description
    assert _residual_bytes(model.make_loss(), args) / 2**30 == pytest.approx(activation_gib,
                                                                            rel=0.05)


def test_plan_full_size_scanned_llama_from_shapes():
    model = zoo.get("llama")
    plan = autoremat.plan(model.make_loss(), model.param_shapes(), model.batch_shapes(),
                          budget=0.5)
    assert plan.peak_bytes <= plan.budget_bytes < plan.no_remat_peak_bytes
