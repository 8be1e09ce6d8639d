"""Haiku's own ResNet (``hk.nets.ResNet``, bottleneck blocks, v1) as a classifier, under
Haiku's mixed precision (``jmp``: float32 parameters, bfloat16 compute, batch norm in
float32), as Haiku's ImageNet example runs it. The model is Haiku's, not rewritten here:
with a layer policy every bottleneck block (``hk.nets.ResNet.BlockV1``) is called through
``hk.remat`` under that policy, by a Haiku method interceptor. Functional form:
``hk.transform_with_state``; the batch-norm state (moving averages) is made once, and each
step normalizes by the batch's statistics (``is_training=True``) and drops the new state.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable
from typing import Any

import haiku as hk
import jax
import jax.numpy as jnp
import jmp

from bench.corpus._common import cross_entropy, dtype_name, registered


@dataclasses.dataclass(frozen=True)
class HaikuResNetConfig:
    """``hk.nets.ResNet(blocks_per_group, n_classes, channels_per_group=channels)`` on
    ``image_size`` square images; ``dtype`` is the compute dtype."""

    blocks_per_group: tuple[int, ...] = (2, 2, 2, 2)
    channels: tuple[int, ...] = (256, 512, 1024, 2048)
    image_size: int = 128
    n_classes: int = 10
    batch: int = 32
    dtype: Any = jnp.bfloat16


FULL = HaikuResNetConfig()
TINY = HaikuResNetConfig(blocks_per_group=(1, 1, 1, 1), channels=(16, 16, 32, 32),
                         image_size=16, n_classes=5, batch=4, dtype=jnp.float32)


def _forward(c: HaikuResNetConfig, layer_policy: Callable | None, images: jax.Array
             ) -> jax.Array:
    compute = jmp.Policy(param_dtype=jnp.float32, compute_dtype=c.dtype, output_dtype=c.dtype)
    norm = jmp.Policy(param_dtype=jnp.float32, compute_dtype=jnp.float32,
                      output_dtype=c.dtype)
    with hk.mixed_precision.push_policy(hk.nets.ResNet, compute), \
            hk.mixed_precision.push_policy(hk.BatchNorm, norm):
        model = hk.nets.ResNet(list(c.blocks_per_group), c.n_classes,
                               channels_per_group=list(c.channels))
        if layer_policy is None:
            return model(images, is_training=True)
        with hk.intercept_methods(functools.partial(_remat_blocks, layer_policy)):
            return model(images, is_training=True)


def _remat_blocks(policy: Callable, next_f: Callable, args: tuple, kwargs: dict,
                  context: hk.MethodContext) -> Any:
    """Calls every bottleneck block through ``hk.remat`` under ``policy``."""
    if not isinstance(context.module, hk.nets.ResNet.BlockV1) or context.method_name != "__call__":
        return next_f(*args, **kwargs)
    inputs, *static = args
    return hk.remat(lambda x: next_f(x, *static, **kwargs), policy=policy)(inputs)


@functools.cache
def _transformed(c: HaikuResNetConfig, layer_policy: Callable | None) -> hk.TransformedWithState:
    return hk.transform_with_state(functools.partial(_forward, c, layer_policy))


def _images(c: HaikuResNetConfig) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((c.batch, c.image_size, c.image_size, 3), c.dtype)


@functools.cache
def _state(c: HaikuResNetConfig) -> Any:
    """The batch norms' moving averages as Haiku initializes them (zeros and ones)."""
    shapes = jax.eval_shape(_transformed(c, None).init, jax.random.key(0), _images(c))[1]
    return hk.data_structures.map(
        lambda module, name, s: jnp.ones(s.shape, s.dtype) if "var" in module or "var" in name
        else jnp.zeros(s.shape, s.dtype), shapes)


def make_loss(c: HaikuResNetConfig, layer_policy: Callable | None = None) -> Callable:
    """``loss(params, batch)``: mean cross-entropy of the labels."""
    apply = _transformed(c, layer_policy).apply
    state = _state(c)

    def loss(params: Any, batch: dict[str, jax.Array]) -> jax.Array:
        logits, _ = apply(params, state, None, batch["images"])
        return cross_entropy(logits, batch["labels"])

    return loss


def init(c: HaikuResNetConfig, key: jax.Array) -> tuple[Any, dict[str, jax.Array]]:
    """Haiku's initializers for the parameters; normal images and random labels."""
    k_params, k_images, k_labels = jax.random.split(key, 3)
    images = jax.random.normal(k_images, _images(c).shape, c.dtype)
    params, _ = _transformed(c, None).init(k_params, images)
    labels = jax.random.randint(k_labels, (c.batch,), 0, c.n_classes)
    return params, {"images": images, "labels": labels}


def describe(c: HaikuResNetConfig) -> str:
    """Architecture, shapes and dtype."""
    return (f"Haiku hk.nets.ResNet v1, bottleneck blocks {list(c.blocks_per_group)}, "
            f"channels {list(c.channels)}, {c.image_size}x{c.image_size} images, "
            f"{c.n_classes}-class head, batch {c.batch}, {dtype_name(c.dtype)} compute "
            "(jmp), float32 parameters")


def models() -> list:
    """``haiku-resnet`` and ``haiku-resnet-tiny``."""
    return registered({"haiku-resnet": FULL, "haiku-resnet-tiny": TINY}, sys.modules[__name__])
