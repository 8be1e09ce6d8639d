"""A ResNet-style image classifier with bottleneck blocks (ResNet-50 layout), NHWC.

Stem: 7x7 stride-2 convolution, batch norm, ReLU and 3x3 stride-2 max pooling. Then
stages of bottleneck blocks (1x1, 3x3, 1x1 convolutions, four times expansion), the
first block of every stage after the first striding by 2 in its 3x3 convolution and
every first block projecting its shortcut with a 1x1 convolution. Global average pooling
and a linear head end it. Batch norm is the training-mode kind over the batch, without
running statistics. Activations stay in the parameter dtype (bf16 at full size). There
are no attention or MLP projections, so no MaxText names.

:data:`RESNET50` has ResNet-50's 25.6M parameters and, at batch 32, saves about 4.75 GiB
of residuals for the backward pass without remat; :data:`RESNET_TINY` is for tests.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from autoremat.zoo import _layers

Params = dict[str, Any]

NAMES: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class ResNetConfig:
    """Model and batch shapes. Stage ``i`` has ``stage_sizes[i]`` blocks of inner width
    ``width * 2**i``."""

    stage_sizes: tuple[int, ...] = (3, 4, 6, 3)
    width: int = 64
    n_classes: int = 1000
    image_size: int = 224
    batch: int = 32
    dtype: Any = jnp.bfloat16


RESNET50 = ResNetConfig()
RESNET_TINY = ResNetConfig(stage_sizes=(1, 1), width=8, n_classes=10, image_size=32, batch=4,
                           dtype=jnp.float32)

_EXPANSION = 4


def describe(c: ResNetConfig) -> str:
    """One line: blocks, shapes and dtype."""
    return (f"ResNet-style CNN, bottleneck stages {'-'.join(map(str, c.stage_sizes))} "
            f"({sum(c.stage_sizes)} unrolled blocks), width {c.width}, "
            f"{c.image_size}x{c.image_size}x3 NHWC, batch {c.batch}, {c.n_classes} classes, "
            f"batch norm, {jnp.dtype(c.dtype).name}")


def _blocks(c: ResNetConfig) -> list[tuple[int, int, int]]:
    """``(in_channels, inner_width, stride)`` of every block, in order."""
    out, cin = [], c.width
    for i, n in enumerate(c.stage_sizes):
        w = c.width * 2**i
        for j in range(n):
            out.append((cin, w, 2 if i > 0 and j == 0 else 1))
            cin = w * _EXPANSION
    return out


def _block_shapes(cin: int, w: int, stride: int) -> dict[str, tuple[int, ...]]:
    shapes = {"conv1": (1, 1, cin, w), "bn1_g": (w,), "bn1_b": (w,),
              "conv2": (3, 3, w, w), "bn2_g": (w,), "bn2_b": (w,),
              "conv3": (1, 1, w, w * _EXPANSION), "bn3_g": (w * _EXPANSION,),
              "bn3_b": (w * _EXPANSION,)}
    if stride != 1 or cin != w * _EXPANSION:
        shapes |= {"proj": (1, 1, cin, w * _EXPANSION), "proj_bn_g": (w * _EXPANSION,),
                   "proj_bn_b": (w * _EXPANSION,)}
    return shapes


def param_shapes(c: ResNetConfig) -> Params:
    """The parameter pytree as ``jax.ShapeDtypeStruct`` leaves (no memory allocated)."""
    head_in = c.width * 2 ** (len(c.stage_sizes) - 1) * _EXPANSION
    return _layers.as_shapes({
        "stem": {"conv": (7, 7, 3, c.width), "bn_g": (c.width,), "bn_b": (c.width,)},
        "blocks": [_block_shapes(*b) for b in _blocks(c)],
        "head": (head_in, c.n_classes), "b_head": (c.n_classes,),
    }, c.dtype)


def batch_shapes(c: ResNetConfig) -> dict[str, jax.ShapeDtypeStruct]:
    """Images (NHWC) and integer class labels."""
    return {"images": jax.ShapeDtypeStruct((c.batch, c.image_size, c.image_size, 3), c.dtype),
            "labels": jax.ShapeDtypeStruct((c.batch,), jnp.int32)}


def init_params(c: ResNetConfig, key: jax.Array) -> Params:
    """Random parameters (normal, std 0.02; norm gains 1, biases 0)."""
    return _layers.init_params(param_shapes(c), key)


def init_batch(c: ResNetConfig, key: jax.Array) -> dict[str, jax.Array]:
    """Standard normal images and random labels."""
    k1, k2 = jax.random.split(key)
    shape = (c.batch, c.image_size, c.image_size, 3)
    return {"images": jax.random.normal(k1, shape).astype(c.dtype),
            "labels": jax.random.randint(k2, (c.batch,), 0, c.n_classes)}


def block(p: Params, x: jax.Array, stride: int) -> jax.Array:
    """One bottleneck block on NHWC ``x``."""
    h = jax.nn.relu(_layers.batch_norm(_layers.conv(x, p["conv1"]), p["bn1_g"], p["bn1_b"]))
    h = jax.nn.relu(_layers.batch_norm(_layers.conv(h, p["conv2"], stride), p["bn2_g"],
                                       p["bn2_b"]))
    h = _layers.batch_norm(_layers.conv(h, p["conv3"]), p["bn3_g"], p["bn3_b"])
    if "proj" in p:
        x = _layers.batch_norm(_layers.conv(x, p["proj"], stride), p["proj_bn_g"],
                               p["proj_bn_b"])
    return jax.nn.relu(x + h)


def _stem(p: Params, images: jax.Array) -> jax.Array:
    x = jax.nn.relu(_layers.batch_norm(_layers.conv(images, p["conv"], 2), p["bn_g"],
                                       p["bn_b"]))
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")


def make_loss(c: ResNetConfig, layer_policy: Callable | None = None) -> Callable:
    """``loss(params, batch) -> scalar`` mean cross-entropy.

    Args:
      c: the configuration.
      layer_policy: a ``jax.checkpoint`` policy applied to every bottleneck block, or None
        for no checkpoint.
    """
    blocks = [_layers.checkpointed(functools.partial(block, stride=stride), layer_policy)
              for _, _, stride in _blocks(c)]

    def loss(params: Params, batch: dict[str, jax.Array]) -> jax.Array:
        x = _stem(params["stem"], batch["images"])
        for fn, p in zip(blocks, params["blocks"], strict=True):
            x = fn(p, x)
        logits = x.mean(axis=(1, 2)) @ params["head"] + params["b_head"]
        return _layers.cross_entropy(logits, batch["labels"])

    return loss
