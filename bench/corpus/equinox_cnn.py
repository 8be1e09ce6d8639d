"""A residual CNN classifier in Equinox (``eqx.nn.Conv2d``, ``eqx.nn.GroupNorm``,
``eqx.nn.Linear``), channels-first per example and ``jax.vmap``-ed over the batch.

A 3x3 stem convolution, then stages of residual blocks (two 3x3 convolutions with group
norm and ReLU, a 1x1 projection shortcut where the shape changes), the first block of each
later stage striding by 2; global average pooling and a linear head with few classes. With
a layer policy every block is called through ``eqx.filter_checkpoint`` under that policy.
Functional form: ``eqx.partition`` into the float arrays and the static rest.
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
class EqxCNNConfig:
    """Stage ``i`` has ``blocks_per_stage`` blocks of ``widths[i]`` channels; group norm
    over ``groups`` groups."""

    widths: tuple[int, ...] = (64, 128, 256)
    blocks_per_stage: int = 2
    groups: int = 8
    image_size: int = 32
    n_classes: int = 10
    batch: int = 32
    dtype: Any = jnp.bfloat16


FULL = EqxCNNConfig()
TINY = EqxCNNConfig(widths=(8, 16), blocks_per_stage=1, groups=2, image_size=8, n_classes=5,
                    batch=4, dtype=jnp.float32)


class ResBlock(eqx.Module):
    """conv-norm-relu-conv-norm, plus the (projected) input, then ReLU."""

    conv1: eqx.nn.Conv2d
    norm1: eqx.nn.GroupNorm
    conv2: eqx.nn.Conv2d
    norm2: eqx.nn.GroupNorm
    proj: eqx.nn.Conv2d | None

    def __init__(self, c_in: int, c_out: int, stride: int, groups: int, dtype: Any,
                 key: jax.Array):
        k1, k2, k3 = jax.random.split(key, 3)
        self.conv1 = eqx.nn.Conv2d(c_in, c_out, 3, stride, padding=1, use_bias=False,
                                   dtype=dtype, key=k1)
        self.norm1 = eqx.nn.GroupNorm(groups, c_out, dtype=dtype)
        self.conv2 = eqx.nn.Conv2d(c_out, c_out, 3, 1, padding=1, use_bias=False, dtype=dtype,
                                   key=k2)
        self.norm2 = eqx.nn.GroupNorm(groups, c_out, dtype=dtype)
        self.proj = (eqx.nn.Conv2d(c_in, c_out, 1, stride, use_bias=False, dtype=dtype, key=k3)
                     if stride != 1 or c_in != c_out else None)

    def __call__(self, x: jax.Array) -> jax.Array:
        y = jax.nn.relu(self.norm1(self.conv1(x)))
        y = self.norm2(self.conv2(y))
        return jax.nn.relu(y + (x if self.proj is None else self.proj(x)))


class ResNet(eqx.Module):
    """Stem, residual blocks and head, for one CHW image."""

    stem: eqx.nn.Conv2d
    blocks: tuple[ResBlock, ...]
    head: eqx.nn.Linear

    def __init__(self, c: EqxCNNConfig, key: jax.Array):
        k_stem, k_head, *k_blocks = jax.random.split(key, 2 + len(c.widths) * c.blocks_per_stage)
        self.stem = eqx.nn.Conv2d(3, c.widths[0], 3, padding=1, dtype=c.dtype, key=k_stem)
        blocks, c_in = [], c.widths[0]
        for i, width in enumerate(c.widths):
            for j in range(c.blocks_per_stage):
                stride = 2 if i > 0 and j == 0 else 1
                blocks.append(ResBlock(c_in, width, stride, c.groups, c.dtype,
                                       k_blocks[len(blocks)]))
                c_in = width
        self.blocks = tuple(blocks)
        self.head = eqx.nn.Linear(c_in, c.n_classes, dtype=c.dtype, key=k_head)

    def __call__(self, x: jax.Array, layer_policy: Callable | None = None) -> jax.Array:
        x = jax.nn.relu(self.stem(x))
        for block in self.blocks:
            x = (block(x) if layer_policy is None
                 else eqx.filter_checkpoint(_call, policy=layer_policy)(block, x))
        return self.head(x.mean(axis=(1, 2)))


def _call(block: ResBlock, x: jax.Array) -> jax.Array:
    return block(x)



@functools.cache
def _static(c: EqxCNNConfig) -> Any:
    return eqx.partition(eqx.filter_eval_shape(ResNet, c, jax.random.key(0)), is_float_leaf)[1]


def make_loss(c: EqxCNNConfig, layer_policy: Callable | None = None) -> Callable:
    """``loss(params, batch)``: mean cross-entropy of the labels."""
    static = _static(c)

    def loss(params: Any, batch: dict[str, jax.Array]) -> jax.Array:
        model = eqx.combine(params, static)
        logits = jax.vmap(lambda x: model(x, layer_policy))(batch["images"])
        return cross_entropy(logits, batch["labels"])

    return loss


def init(c: EqxCNNConfig, key: jax.Array) -> tuple[Any, dict[str, jax.Array]]:
    """Equinox's initializers for the parameters; normal images (NCHW) and random labels."""
    k_params, k_x, k_labels = jax.random.split(key, 3)
    params, _ = eqx.partition(ResNet(c, k_params), eqx.is_inexact_array)
    images = jax.random.normal(k_x, (c.batch, 3, c.image_size, c.image_size), c.dtype)
    return params, {"images": images,
                    "labels": jax.random.randint(k_labels, (c.batch,), 0, c.n_classes)}


def describe(c: EqxCNNConfig) -> str:
    """Architecture, shapes and dtype."""
    n = c.image_size
    stages = " -> ".join(f"{w}x{n >> i}x{n >> i}" for i, w in enumerate(c.widths))
    return (f"Equinox residual CNN, {len(c.widths) * c.blocks_per_stage} blocks "
            f"(eqx.nn.Conv2d + eqx.nn.GroupNorm), stages {stages} (CHW), {c.n_classes}-class "
            f"head, batch {c.batch} (jax.vmap), {dtype_name(c.dtype)}")


def models() -> list:
    """``eqx-cnn`` and ``eqx-cnn-tiny``."""
    return registered({"eqx-cnn": FULL, "eqx-cnn-tiny": TINY}, sys.modules[__name__])
