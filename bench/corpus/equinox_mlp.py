"""A deep MLP classifier in Equinox: ``eqx.nn.MLP`` (GELU hidden layers) with a head much
narrower than its hidden width.

The model is Equinox's own ``eqx.nn.MLP`` (unrolled layers), run per example under
``jax.vmap``. The forward pass goes through ``MLP.layers`` the way ``MLP.__call__`` does
(``activation(layer(x))`` for every layer but the last), so that with a layer policy each
hidden layer can be an ``eqx.filter_checkpoint`` under that policy. Functional form: the
parameters are the float arrays of ``eqx.partition(model, eqx.is_inexact_array)``, and the
loss ``eqx.combine``-s them with the static rest.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from bench.corpus._common import cross_entropy, dtype_name, is_float_leaf, registered


@dataclasses.dataclass(frozen=True)
class EqxMLPConfig:
    """``depth`` hidden layers of ``width``; inputs of ``d_in`` features."""

    d_in: int = 1024
    width: int = 2048
    depth: int = 8
    n_classes: int = 10
    batch: int = 8192
    dtype: Any = jnp.bfloat16


FULL = EqxMLPConfig()
TINY = EqxMLPConfig(d_in=16, width=32, depth=3, n_classes=4, batch=8, dtype=jnp.float32)


def _build(c: EqxMLPConfig, key: jax.Array) -> eqx.nn.MLP:
    return eqx.nn.MLP(c.d_in, c.n_classes, c.width, c.depth, activation=jax.nn.gelu,
                      dtype=c.dtype, key=key)



@functools.cache
def _static(c: EqxMLPConfig) -> Any:
    """The non-array part of the model (``eqx.partition``'s second half)."""
    return eqx.partition(eqx.filter_eval_shape(_build, c, jax.random.key(0)), is_float_leaf)[1]


def _hidden(layer: eqx.nn.Linear, activation: Callable, x: jax.Array) -> jax.Array:
    return activation(layer(x))


def forward(mlp: eqx.nn.MLP, x: jax.Array, layer_policy: Callable | None = None) -> jax.Array:
    """``mlp(x)`` for one example, every hidden layer checkpointed under ``layer_policy``."""
    hidden = _hidden if layer_policy is None else eqx.filter_checkpoint(_hidden,
                                                                        policy=layer_policy)
    for layer in mlp.layers[:-1]:
        # eqx.nn.MLP keeps one copy of a plain activation (jax.nn.gelu) for all layers.
        x = hidden(layer, mlp.activation, x)
    return mlp.layers[-1](x)


def make_loss(c: EqxMLPConfig, layer_policy: Callable | None = None) -> Callable:
    """``loss(params, batch)``: mean cross-entropy of the labels."""
    static = _static(c)

    def loss(params: Any, batch: dict[str, jax.Array]) -> jax.Array:
        mlp = eqx.combine(params, static)
        logits = jax.vmap(lambda x: forward(mlp, x, layer_policy))(batch["features"])
        return cross_entropy(logits, batch["labels"])

    return loss


def init(c: EqxMLPConfig, key: jax.Array) -> tuple[Any, dict[str, jax.Array]]:
    """Equinox's initializers for the parameters; normal features and random labels."""
    k_params, k_x, k_labels = jax.random.split(key, 3)
    params, _ = eqx.partition(_build(c, k_params), eqx.is_inexact_array)
    return params, {"features": jax.random.normal(k_x, (c.batch, c.d_in), c.dtype),
                    "labels": jax.random.randint(k_labels, (c.batch,), 0, c.n_classes)}


def describe(c: EqxMLPConfig) -> str:
    """Architecture, shapes and dtype."""
    return (f"Equinox eqx.nn.MLP, {c.depth} GELU hidden layers of width {c.width}, "
            f"input {c.d_in}, {c.n_classes}-class head, batch {c.batch} (jax.vmap), "
            f"{dtype_name(c.dtype)}")


def models() -> list:
    """``eqx-mlp`` and ``eqx-mlp-tiny``."""
    return registered({"eqx-mlp": FULL, "eqx-mlp-tiny": TINY}, sys.modules[__name__])
