"""A residual CNN classifier in Flax Linen (``nn.Conv``, ``nn.BatchNorm``, ``nn.Dense``), NHWC.

A 3x3 stem convolution, then stages of basic residual blocks (two 3x3 convolutions with
batch norm, ReLU, and a 1x1 projection shortcut where the shape changes), the first block
of each later stage striding by 2; global average pooling and a dense head. Batch norm runs
in training mode (statistics of the batch; the updated running statistics are dropped).
With a layer policy every block is an ``nn.remat`` of the block class.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bench.corpus._common import cross_entropy, dtype_name, registered


@dataclasses.dataclass(frozen=True)
class LinenCNNConfig:
    """Stage ``i`` has ``blocks_per_stage`` blocks of ``widths[i]`` channels."""

    widths: tuple[int, ...] = (64, 128, 256, 512)
    blocks_per_stage: int = 2
    image_size: int = 64
    n_classes: int = 10
    batch: int = 16
    dtype: Any = jnp.bfloat16


FULL = LinenCNNConfig()
TINY = LinenCNNConfig(widths=(8, 16), blocks_per_stage=1, image_size=8, n_classes=5, batch=4,
                      dtype=jnp.float32)


class ResidualBlock(nn.Module):
    """Two 3x3 convolutions with batch norm and a (projected) shortcut."""

    features: int
    strides: int
    dtype: Any

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        conv = lambda f, k, s, name: nn.Conv(f, (k, k), (s, s), use_bias=False, dtype=self.dtype,
                                             param_dtype=self.dtype, name=name)
        norm = lambda name: nn.BatchNorm(use_running_average=False, dtype=self.dtype,
                                         param_dtype=self.dtype, name=name)
        y = nn.relu(norm("bn1")(conv(self.features, 3, self.strides, "conv1")(x)))
        y = norm("bn2")(conv(self.features, 3, 1, "conv2")(y))
        if x.shape[-1] != self.features or self.strides != 1:
            x = norm("bn_proj")(conv(self.features, 1, self.strides, "proj")(x))
        return nn.relu(x + y)


class ResNet(nn.Module):
    """Stem, residual stages, pooling and head; ``layer_policy`` remats every block."""

    config: LinenCNNConfig
    layer_policy: Callable | None = None

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        c = self.config
        block_cls = (ResidualBlock if self.layer_policy is None
                     else nn.remat(ResidualBlock, policy=self.layer_policy))
        x = nn.Conv(c.widths[0], (3, 3), use_bias=False, dtype=c.dtype, param_dtype=c.dtype,
                    name="stem")(x)
        x = nn.relu(nn.BatchNorm(use_running_average=False, dtype=c.dtype, param_dtype=c.dtype,
                                 name="stem_bn")(x))
        for i, width in enumerate(c.widths):
            for j in range(c.blocks_per_stage):
                strides = 2 if i > 0 and j == 0 else 1
                x = block_cls(width, strides, c.dtype, name=f"stage{i}_block{j}")(x)
        x = x.mean(axis=(1, 2))
        return nn.Dense(c.n_classes, dtype=c.dtype, param_dtype=c.dtype, name="head")(x)


def _images(c: LinenCNNConfig) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((c.batch, c.image_size, c.image_size, 3), c.dtype)


def make_loss(c: LinenCNNConfig, layer_policy: Callable | None = None) -> Callable:
    """``loss(params, batch)``: mean cross-entropy of the labels."""
    model = ResNet(c, layer_policy)

    def loss(params: Any, batch: dict[str, jax.Array]) -> jax.Array:
        # The batch statistics are made afresh (mutable) and the updated ones dropped.
        logits, _ = model.apply({"params": params}, batch["images"], mutable=["batch_stats"])
        return cross_entropy(logits, batch["labels"])

    return loss


def init(c: LinenCNNConfig, key: jax.Array) -> tuple[Any, dict[str, jax.Array]]:
    """Flax's initializers for the parameters; normal images and random labels."""
    k_params, k_images, k_labels = jax.random.split(key, 3)
    images = jax.random.normal(k_images, _images(c).shape, c.dtype)
    params = ResNet(c).init(k_params, images)["params"]
    labels = jax.random.randint(k_labels, (c.batch,), 0, c.n_classes)
    return params, {"images": images, "labels": labels}


def describe(c: LinenCNNConfig) -> str:
    """Architecture, shapes and dtype."""
    n = c.image_size
    stages = " -> ".join(f"{n >> i}x{n >> i}x{w}" for i, w in enumerate(c.widths))
    return (f"Flax Linen residual CNN, {len(c.widths) * c.blocks_per_stage} basic blocks "
            f"(nn.Conv + nn.BatchNorm), stages {stages}, {c.n_classes}-class head, "
            f"batch {c.batch}, {dtype_name(c.dtype)}")


def models() -> list:
    """``linen-cnn`` and ``linen-cnn-tiny``."""
    return registered({"linen-cnn": FULL, "linen-cnn-tiny": TINY}, sys.modules[__name__])
