"""The plan per user checkpoint name: MaxText's ``remat_policy: custom`` configuration and
the ``jax.checkpoint`` policy over the user's names."""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

import autoremat
from autoremat import zoo
from tests.models import saved_residuals


def _loss_and_args(name: str) -> tuple:
    model = zoo.get(name)
    return model.make_loss(), (model.param_shapes(), model.batch_shapes())


@functools.cache
def _zoo_plan(name: str, budget: float | str) -> autoremat.Plan:
    """The zoo model's plan at ``budget``: bytes, a fraction, or ``"floor"``."""
    loss, args = _loss_and_args(name)
    if budget == "floor":
        with pytest.raises(autoremat.InfeasibleBudgetError) as info:
            autoremat.plan(loss, *args, budget=1)
        budget = info.value.floor_bytes
    return autoremat.plan(loss, *args, budget=budget)


def _named(plan: autoremat.Plan, name: str) -> list:
    return [v for v in plan.graph.values if v.user_name == name]


def _residual_bytes(fn, args) -> int:
    return sum(math.prod(aval.shape) * aval.dtype.itemsize
               for aval, source in saved_residuals(fn, *args)
               if not source.startswith("from the argument") and source != "from a constant")


def test_the_tracer_records_the_users_names_and_not_autoremats():
    plan = _zoo_plan("gpt2-small-tiny", 1.0)
    names = collections.Counter(v.user_name for v in plan.graph.values if v.user_name)
    assert names == {n: 4 for n in zoo.get("gpt2-small-tiny").names}
    assert all(v.primitive == "name" for v in plan.graph.values if v.user_name)
    # A function the plan rewrote names every value it saves: those names are not the user's.
    loss, args = _loss_and_args("gpt2-small-tiny")
    again = autoremat.plan(plan.apply(loss), *args, budget=1.0)
    assert collections.Counter(v.user_name for v in again.graph.values if v.user_name) == names


def test_no_remat_keeps_every_name_on_the_device():
    plan = _zoo_plan("gpt2-small-tiny", 1.0)
    assert plan.maxtext_config() == dict.fromkeys(zoo.get("gpt2-small-tiny").names, "device")


def test_a_plan_that_saves_a_name_says_device_for_it():
    plan = _zoo_plan("gpt2-small-tiny", 0.7)
    assert plan.recompute_flops > 0
    context = _named(plan, "context")
    assert all(v.id in plan.saved for v in context)
    config = plan.maxtext_config()
    assert config["context"] == "device"
    # qkv_proj's layers are kept as the q, k and v views the attention reads.
    assert not any(v.id in plan.recomputed for v in _named(plan, "qkv_proj"))
    assert config["qkv_proj"] == "device"


def test_the_floor_recomputes_most_named_tensors_and_config_says_where():
    plan = _zoo_plan("gpt2-small-scan-tiny", "floor")
    named = [v for v in plan.graph.values if v.user_name]
    assert sum(v.id in plan.recomputed for v in named) > len(named) / 2
    # The floor splits the layer scan (pieces differ), so some names are "mixed".
    for name, choice in plan.maxtext_config().items():
        recomputed = {v.id in plan.recomputed for v in _named(plan, name)}
        assert recomputed == {"remat": {True}, "device": {False}, "mixed": {True, False}}[choice]


def test_a_choice_that_differs_between_layers_is_mixed_with_counts(tmp_path):
    plan = _zoo_plan("gpt2-small-tiny", 1.0)
    first = _named(plan, "qkv_proj")[0]
    (source,) = first.inputs
    # Recomputing only the name (free) while its tensor is kept recomputes nothing.
    renamed = dataclasses.replace(plan, recomputed=frozenset({first.id}))
    assert renamed.maxtext_config()["qkv_proj"] == "device"
    mixed = dataclasses.replace(plan, recomputed=frozenset({first.id, source}))
    assert mixed.maxtext_config()["qkv_proj"] == "mixed"
    path = tmp_path / "remat.yml"
    mixed.save_maxtext(path)
    text = path.read_text()
    assert "qkv_proj: remat  # mixed (device 3, remat 1 of its 4 tensors)" in text
    assert "MaxText sets one choice for every layer" in text
    assert yaml.safe_load(text) == {"remat_policy": "custom", "qkv_proj": "remat",
                                    "context": "device", "out_proj": "device",
                                    "mlpwi": "device", "mlpwo": "device"}


def _scanned_named_mlp(policy=None):
    """Layers under ``scan`` whose backward pass reads named tensors only (and the carry)."""

    def layer(x, w):
        h = jax.ad_checkpoint.checkpoint_name(x @ w[0], "mlpwi")
        a = jax.ad_checkpoint.checkpoint_name(jnp.sin(h), "act")
        return jax.ad_checkpoint.checkpoint_name(a @ w[1], "mlpwo"), None

    if policy is not None:
        layer = jax.checkpoint(layer, policy=policy, prevent_cse=False)
    return lambda w, x: jnp.sum(jax.lax.scan(layer, x, w)[0] ** 2)


def test_the_name_policy_keeps_what_a_plan_over_named_tensors_keeps(tmp_path):
    loss = _scanned_named_mlp()
    # 3 layers: a loop this short is never split into pieces (whose plans can differ, which
    # one policy for every layer cannot say: see the "mixed" test above).
    args = (jax.ShapeDtypeStruct((3, 2, 64, 64), jnp.float32),
            jax.ShapeDtypeStruct((32, 64), jnp.float32))
    top = autoremat.plan(loss, *args, budget=1.0)
    with pytest.raises(autoremat.InfeasibleBudgetError) as info:
        autoremat.plan(loss, *args, budget=1)
    floor = info.value.floor_bytes
    configs = []
    for budget in (floor, (floor + top.budget_bytes) // 2):
        plan = autoremat.plan(loss, *args, budget=budget)
        plan.save_maxtext(tmp_path / "remat.yml")
        assert "carry no name" not in (tmp_path / "remat.yml").read_text()
        assert _residual_bytes(_scanned_named_mlp(plan.name_policy), args) == plan.saved_bytes
        configs.append(plan.maxtext_config())
    assert configs[0] == {"mlpwi": "remat", "act": "remat", "mlpwo": "device"}
    assert configs[1] == dict.fromkeys(configs[1], "device")
    # Without remat the plan also keeps each layer's weight slices, which names cannot say.
    top.save_maxtext(tmp_path / "remat.yml")
    assert "The plan also keeps 2 tensors that carry no name" in (
        tmp_path / "remat.yml").read_text()


def test_a_function_without_names_has_no_maxtext_configuration(tmp_path):
    plan = autoremat.plan(lambda w, x: jnp.sum(jnp.tanh(x @ w) ** 2), jnp.ones((8, 8)),
                          jnp.ones((4, 8)), budget=1.0)
    assert plan.maxtext_config() == {}
    with pytest.raises(ValueError, match="no tensor .* carries a checkpoint_name"):
        plan.save_maxtext(tmp_path / "remat.yml")
    assert not (tmp_path / "remat.yml").exists()


def test_names_are_read_with_jax_remat3_on_too():
    """With ``jax_remat3`` a name is a ``call_hi_primitive``: still a free, fused name."""
    old = jax.config.jax_remat3
    jax.config.update("jax_remat3", True)
    try:
        loss = _scanned_named_mlp()
        args = (jnp.ones((3, 2, 16, 16)) / 16, jnp.ones((8, 16)))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "no cost model for primitive" warning
            plan = autoremat.plan(loss, *args, budget=1.0)
        assert collections.Counter(v.user_name for v in plan.graph.values if v.user_name) == {
            "mlpwi": 1, "act": 1, "mlpwo": 1}  # in the body of the scan
        assert all(v.primitive == "name" and v.flops == 0
                   for v in plan.graph.values if v.user_name)
        for g0, g1 in zip(jax.grad(loss)(*args), jax.grad(plan.apply(loss))(*args), strict=True):
            np.testing.assert_allclose(g1, g0, rtol=1e-6)
    finally:
        jax.config.update("jax_remat3", old)
