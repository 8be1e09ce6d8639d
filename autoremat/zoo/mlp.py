"""A deep residual MLP classifier: ``x + W_o gelu(W_i rms_norm(x))`` per layer.

Inputs are feature vectors of width ``d_model``; a final RMSNorm and a linear head give
class logits. Activations stay in the parameter dtype (bf16 at full size). The two
projections carry MaxText's names ``mlpwi`` and ``mlpwo``. Layers are unrolled or
(``scan_layers``) scanned.

:data:`MLP` has 269.7M parameters and saves about 3.8 GiB of residuals for the backward
pass without remat; :data:`MLP_TINY` is for tests.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from autoremat.zoo import _layers

Params = dict[str, Any]

NAMES = ("mlpwi", "mlpwo")


@dataclasses.dataclass(frozen=True)
class MLPConfig:
    """Model and batch shapes."""

    n_layer: int = 32
    d_model: int = 1024
    d_hidden: int = 4096
    n_classes: int = 1000
    batch: int = 2048
    dtype: Any = jnp.bfloat16
    scan_layers: bool = False


MLP = MLPConfig()
MLP_TINY = MLPConfig(n_layer=4, d_model=32, d_hidden=64, n_classes=32, batch=64,
                     dtype=jnp.float32)


def describe(c: MLPConfig) -> str:
    """One line: layers, shapes and dtype."""
    return (f"residual MLP, {c.n_layer} {'scanned' if c.scan_layers else 'unrolled'} layers, "
            f"d {c.d_model}, hidden {c.d_hidden}, batch {c.batch}, {c.n_classes} classes, "
            f"{jnp.dtype(c.dtype).name}")


def param_shapes(c: MLPConfig) -> Params:
    """The parameter pytree as ``jax.ShapeDtypeStruct`` leaves (no memory allocated)."""
    layer = {"norm_g": (c.d_model,), "w_i": (c.d_model, c.d_hidden), "b_i": (c.d_hidden,),
             "w_o": (c.d_hidden, c.d_model), "b_o": (c.d_model,)}
    return _layers.as_shapes(
        {"layers": _layers.stacked(layer, c.n_layer, c.scan_layers),
         "final_norm_g": (c.d_model,), "head": (c.d_model, c.n_classes)}, c.dtype)


def batch_shapes(c: MLPConfig) -> dict[str, jax.ShapeDtypeStruct]:
    """Input features and integer class labels."""
    return {"features": jax.ShapeDtypeStruct((c.batch, c.d_model), c.dtype),
            "labels": jax.ShapeDtypeStruct((c.batch,), jnp.int32)}


def init_params(c: MLPConfig, key: jax.Array) -> Params:
    """Random parameters (normal, std 0.02; norm gains 1, biases 0)."""
    return _layers.init_params(param_shapes(c), key)


def init_batch(c: MLPConfig, key: jax.Array) -> dict[str, jax.Array]:
    """Standard normal features and random labels."""
    k1, k2 = jax.random.split(key)
    return {"features": jax.random.normal(k1, (c.batch, c.d_model)).astype(c.dtype),
            "labels": jax.random.randint(k2, (c.batch,), 0, c.n_classes)}


def block(p: Params, x: jax.Array) -> jax.Array:
    """One residual layer on ``x`` of shape ``(batch, d_model)``."""
    h = checkpoint_name(_layers.rms_norm(x, p["norm_g"]) @ p["w_i"] + p["b_i"], "mlpwi")
    return x + checkpoint_name(jax.nn.gelu(h) @ p["w_o"] + p["b_o"], "mlpwo")


def make_loss(c: MLPConfig, layer_policy: Callable | None = None) -> Callable:
    """``loss(params, batch) -> scalar`` mean cross-entropy.

    Args:
      c: the configuration.
      layer_policy: a ``jax.checkpoint`` policy applied to every layer, or None for no
        checkpoint.
    """

    def loss(params: Params, batch: dict[str, jax.Array]) -> jax.Array:
        x = _layers.run_layers(block, params["layers"], batch["features"], c.scan_layers,
                               layer_policy)
        x = _layers.rms_norm(x, params["final_norm_g"])
        return _layers.cross_entropy(x @ params["head"], batch["labels"])

    return loss
